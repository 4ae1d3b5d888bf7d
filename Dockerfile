# One image for every process: worker, API, migrations (choose with the command).
#
# Two stages: the first builds the package into a virtual environment (with pip and the
# build tools), the second holds that environment only, runs as an unprivileged user and
# has nothing to compile with.
FROM python:3.11-slim AS build

WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY orquestador ./orquestador
COPY migrations ./migrations
# No [embedded] extra: a deployment connects to its own PostgreSQL (DATABASE_URL). The
# migrations ship inside the package (orquestador.migrations).
RUN python -m venv /opt/orquestador/venv \
    && /opt/orquestador/venv/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/orquestador/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim AS runtime

RUN useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin orquestador
COPY --from=build /opt/orquestador/venv /opt/orquestador/venv
WORKDIR /app
COPY gunicorn.conf.py ./

ENV PATH=/opt/orquestador/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    API_HOST=0.0.0.0 \
    API_PORT=8080
# A numeric user, so a platform that refuses root images can check it without /etc/passwd.
USER 10001:10001
# 8080: the API and its /metrics; 9100: the worker's metrics when WORKER_METRICS_PORT=9100.
EXPOSE 8080 9100
# One health check for every role, from the container's own switches: the API's
# /api/v1/healthz when REQUEST_API_ENABLED or FLOW_ADMIN_ENABLED is true, the worker's
# database when WORKER_ENABLED is; a one-shot container (migrate) has nothing to probe.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 CMD ["orquestador", "health"]
# SIGTERM drains the worker (WORKER_DRAIN_SECONDS) and lets gunicorn finish its requests;
# give `docker stop` a timeout above both (compose: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["orquestador"]
CMD ["api"]

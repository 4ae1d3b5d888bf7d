# One image for every process: worker, API, migrations (choose with the command).
FROM python:3.11-slim

RUN useradd --system --uid 10001 --home-dir /app orquestador
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orquestador ./orquestador
COPY migrations ./migrations
# No [embedded] extra: a deployment connects to its own PostgreSQL (DATABASE_URL).
RUN pip install --no-cache-dir .

USER orquestador
ENV API_HOST=0.0.0.0 \
    API_PORT=8080
EXPOSE 8080
# Probes what this container runs, from its switches: the API when REQUEST_API_ENABLED or
# FLOW_ADMIN_ENABLED is true, the worker's database when WORKER_ENABLED is; a one-shot
# container (migrate) has nothing to probe.
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s CMD ["orquestador", "health"]
ENTRYPOINT ["orquestador"]
CMD ["api"]

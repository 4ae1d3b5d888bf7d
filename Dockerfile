# One image for every process: worker, API, migrations (choose with the command).
FROM python:3.11-slim

RUN useradd --system --uid 10001 --home-dir /app orquestador
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orquestador ./orquestador
COPY migrations ./migrations
RUN pip install --no-cache-dir .

USER orquestador
ENV ORQUESTADOR_HOME=/app/.orquestador \
    API_HOST=0.0.0.0 \
    API_PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/api/v1/healthz', timeout=4)" || exit 1
ENTRYPOINT ["orquestador"]
CMD ["api"]

"""gunicorn settings of the API, for running gunicorn itself: `gunicorn -c gunicorn.conf.py`.

`orquestador api` applies the same settings (orquestador.serve.gunicorn_options) without
this file; both read the environment (API_HOST, API_PORT, API_WORKERS, API_THREADS,
LOG_LEVEL, LOG_FORMAT, PROMETHEUS_MULTIPROC_DIR, ...). gthread workers of API_THREADS
threads, of which agent long polls may hold AGENT_POLL_SHARE (the worker class tells the
app how many it runs); a graceful timeout above the worker's drain; access lines in
LOG_FORMAT with credential-like query values redacted; a clean Prometheus multiprocess
directory on start and dead workers marked on exit; forwarded headers believed from
TRUSTED_PROXIES only; /metrics on METRICS_BIND when it is set.
"""

from orquestador.config import Settings
from orquestador.logs import configure as _configure_logging
from orquestador.serve import gunicorn_options as _gunicorn_options

_settings = Settings.from_env()
_configure_logging(_settings.log_level, fmt=_settings.log_format)

# gunicorn reads this module's names: wsgi_app, bind, workers, worker_class, threads,
# graceful_timeout, accesslog, access_log_format, logger_class, the request-head
# limits, forwarded_allow_ips and the on_starting / when_ready / post_fork / child_exit /
# on_exit hooks.
globals().update(_gunicorn_options(_settings))

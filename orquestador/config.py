"""Settings: one frozen object built from the environment and validated once."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orquestador.domain.quotas import Quotas, parse_org_quotas
from orquestador.errors import ConfigError

if TYPE_CHECKING:
    # SQLAlchemy is imported where a URL is parsed: a command that reads no database
    # (the API's clients) starts without it.
    from sqlalchemy.engine import URL

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_HTTP_URL = re.compile(r"^https?://[^/\s?#]+(/\S*)?$")
_JWT_ALGORITHMS = {"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "EdDSA"}


def _env(name: str, default: str, section: str) -> Any:
    # The default is the raw environment text; from_env converts it like any value.
    return field(default=default, metadata={"env": name, "section": section})


@dataclass(frozen=True)
class Settings:
    """Every setting of the product; `.env.example` lists the same names and defaults."""

    database_url: str = _env("DATABASE_URL", "", "database")
    migration_database_url: str = _env("MIGRATION_DATABASE_URL", "", "database")
    # A direct connection (never through PgBouncer) for LISTEN and the maintenance lock,
    # both session state; empty: DATABASE_URL.
    listen_database_url: str = _env("LISTEN_DATABASE_URL", "", "database")
    # Each pool's bound (the API process's, the worker's); 0: sized for the threads.
    db_pool_size: int = _env("DB_POOL_SIZE", "0", "database")
    # Server-side prepared statements; false behind PgBouncer before 1.21.
    db_prepare: bool = _env("DB_PREPARE", "true", "database")
    runtime_database_role: str = _env("RUNTIME_DATABASE_ROLE", "", "database")
    platform_database_role: str = _env("PLATFORM_DATABASE_ROLE", "", "database")
    home: str = _env("ORQUESTADOR_HOME", ".orquestador", "local state")

    worker_enabled: bool = _env("WORKER_ENABLED", "false", "switches")
    request_api_enabled: bool = _env("REQUEST_API_ENABLED", "false", "switches")
    flow_admin_enabled: bool = _env("FLOW_ADMIN_ENABLED", "false", "switches")

    worker_concurrency: int = _env("WORKER_CONCURRENCY", "10", "worker")
    worker_batch: int = _env("WORKER_BATCH", "10", "worker")
    worker_poll_ms: int = _env("WORKER_POLL_MS", "500", "worker")
    worker_lease_seconds: int = _env("WORKER_LEASE_SECONDS", "60", "worker")
    worker_renew_seconds: int = _env("WORKER_RENEW_SECONDS", "15", "worker")
    worker_drain_seconds: int = _env("WORKER_DRAIN_SECONDS", "20", "worker")
    worker_id: str = _env("WORKER_ID", "", "worker")
    execution_max_attempts: int = _env("EXECUTION_MAX_ATTEMPTS", "10", "worker")
    worker_lock_timeout_ms: int = _env("WORKER_LOCK_TIMEOUT_MS", "2000", "worker")
    worker_statement_timeout_ms: int = _env("WORKER_STATEMENT_TIMEOUT_MS", "10000", "worker")
    adapter_abandon_grace_seconds: float = _env("ADAPTER_ABANDON_GRACE_SECONDS", "30", "worker")
    wait_max_seconds: int = _env("WAIT_MAX_SECONDS", "604800", "worker")
    max_continuations: int = _env("MAX_CONTINUATIONS", "50", "worker")
    # Shares of the free slots: "acme=3,globex=0.5"; an organization not named weighs 1.
    org_weights: str = _env("ORG_WEIGHTS", "", "worker")

    # Each organization's limits (docs/OPERATIONS.md#quotas); ORG_QUOTAS overrides them
    # per organization as JSON, e.g. {"acme": {"schedules": 500, "scheduleMinSeconds": 10}}.
    quota_schedules: int = _env("QUOTA_SCHEDULES", "100", "quotas")
    schedule_min_seconds: int = _env("SCHEDULE_MIN_SECONDS", "60", "quotas")
    quota_transitions_per_second: int = _env("QUOTA_TRANSITIONS_PER_SECOND", "50", "quotas")
    quota_transitions_burst: int = _env("QUOTA_TRANSITIONS_BURST", "200", "quotas")
    quota_open_executions: int = _env("QUOTA_OPEN_EXECUTIONS", "100000", "quotas")
    quota_bulk_items: int = _env("QUOTA_BULK_ITEMS", "100000", "quotas")
    quota_rollout_items: int = _env("QUOTA_ROLLOUT_ITEMS", "10000", "quotas")
    org_quotas: str = _env("ORG_QUOTAS", "", "quotas")

    retry_base_seconds: float = _env("RETRY_BASE_SECONDS", "1", "retries")
    retry_cap_seconds: float = _env("RETRY_CAP_SECONDS", "300", "retries")
    retry_after_min_seconds: float = _env("RETRY_AFTER_MIN_SECONDS", "1", "retries")
    retry_after_max_seconds: float = _env("RETRY_AFTER_MAX_SECONDS", "600", "retries")

    jwt_algorithms: str = _env("JWT_ALGORITHMS", "HS256", "tokens")
    jwt_secret: str = _env("JWT_SECRET", "", "tokens")
    jwt_public_key_file: str = _env("JWT_PUBLIC_KEY_FILE", "", "tokens")
    jwt_private_key_file: str = _env("JWT_PRIVATE_KEY_FILE", "", "tokens")
    jwt_issuer: str = _env("JWT_ISSUER", "orquestador", "tokens")
    jwt_audience: str = _env("JWT_AUDIENCE", "orquestador-api", "tokens")
    jwt_leeway_seconds: int = _env("JWT_LEEWAY_SECONDS", "30", "tokens")

    api_host: str = _env("API_HOST", "127.0.0.1", "api")
    api_port: int = _env("API_PORT", "8080", "api")
    api_workers: int = _env("API_WORKERS", "2", "api")
    api_threads: int = _env("API_THREADS", "4", "api")
    api_max_body_bytes: int = _env("API_MAX_BODY_BYTES", "1048576", "api")
    agent_poll_share: float = _env("AGENT_POLL_SHARE", "0.5", "api")
    execution_wait_share: float = _env("EXECUTION_WAIT_SHARE", "0.25", "api")
    trusted_proxies: str = _env("TRUSTED_PROXIES", "", "api")
    # HOST:PORT where the API serves /metrics instead of on API_PORT; empty: API_PORT.
    metrics_bind: str = _env("METRICS_BIND", "", "api")

    adapter_modules: str = _env("ADAPTER_MODULES", "", "adapters")
    integrations_file: str = _env("INTEGRATIONS_FILE", "", "adapters")
    log_level: str = _env("LOG_LEVEL", "INFO", "logs")
    log_format: str = _env("LOG_FORMAT", "text", "logs")

    machine_commands: str = _env("MACHINE_COMMANDS", "poweroff,reboot,reinstall", "machines")
    machine_command_retention_days: int = _env("MACHINE_COMMAND_RETENTION_DAYS", "30", "machines")
    agent_commands_file: str = _env("AGENT_COMMANDS_FILE", "", "machines")
    machine_token_days: int = _env("MACHINE_TOKEN_DAYS", "365", "machines")
    agent_kill_grace_seconds: float = _env("AGENT_KILL_GRACE_SECONDS", "10", "machines")
    # A command no wait waits for is handed to no agent after this long (SPEC 23).
    command_delivery_seconds: int = _env("COMMAND_DELIVERY_SECONDS", "900", "machines")
    # The most of a command's output kept (half its head, half its latest bytes).
    command_output_max_bytes: int = _env("COMMAND_OUTPUT_MAX_BYTES", "1048576", "machines")
    # An agent not seen (polling or reporting) for this long is offline.
    agent_offline_seconds: int = _env("AGENT_OFFLINE_SECONDS", "90", "machines")

    smtp_url: str = field(
        default="",
        repr=False,  # may carry the SMTP password
        metadata={"env": "SMTP_URL", "section": "e-mail"},
    )
    smtp_from: str = _env("SMTP_FROM", "orquestador@localhost", "e-mail")
    public_base_url: str = _env("PUBLIC_BASE_URL", "", "e-mail")
    simulation_retention_days: int = _env("SIMULATION_RETENTION_DAYS", "7", "retention")
    email_retention_days: int = _env("EMAIL_RETENTION_DAYS", "30", "retention")
    notice_retention_days: int = _env("NOTICE_RETENTION_DAYS", "90", "retention")
    schedule_fire_retention_days: int = _env("SCHEDULE_FIRE_RETENTION_DAYS", "30", "retention")
    bulk_retention_days: int = _env("BULK_RETENTION_DAYS", "30", "retention")
    history_retention_days: int = _env("HISTORY_RETENTION_DAYS", "90", "retention")
    history_retention_failed_days: int = _env("HISTORY_RETENTION_FAILED_DAYS", "365", "retention")

    maintenance_interval_seconds: int = _env("MAINTENANCE_INTERVAL_SECONDS", "60", "operations")
    worker_metrics_port: str = _env("WORKER_METRICS_PORT", "", "operations")

    # The standard OpenTelemetry names: traces go out over OTLP/HTTP only when the
    # endpoint is set (and the `otel` extra is installed); tracing.py reads them.
    otel_exporter_otlp_endpoint: str = _env("OTEL_EXPORTER_OTLP_ENDPOINT", "", "traces")
    # Empty: orquestador-api or orquestador-worker, by process.
    otel_service_name: str = _env("OTEL_SERVICE_NAME", "", "traces")

    # What `orquestador executions` talks to, and as whom; never read by the server.
    api_url: str = _env("ORQUESTADOR_API_URL", "", "command line client")
    api_token: str = field(
        default="",
        repr=False,  # a bearer token: kept out of any printed Settings
        metadata={"env": "ORQUESTADOR_TOKEN", "section": "command line client"},
    )

    def pool_size(self, threads: int) -> tuple[int, int]:
        """(pool_size, max_overflow) of a process whose `threads` use the database at once.

        DB_POOL_SIZE, when set, is a hard bound (no overflow); else the pool fits the threads
        and lends two more connections for a burst.
        """
        if self.db_pool_size:
            return self.db_pool_size, 0
        return threads, 2

    @property
    def statement_timeout_ms(self) -> int:
        """A worker statement's bound: as set, and never above a quarter of the lease (a
        statement that waits longer would outlive the lease it writes under)."""
        return max(1, min(self.worker_statement_timeout_ms, self.worker_lease_seconds * 250))

    @property
    def lock_timeout_ms(self) -> int:
        """How long a worker statement waits for a row lock; within the statement's bound."""
        return max(1, min(self.worker_lock_timeout_ms, self.statement_timeout_ms))

    @property
    def home_path(self) -> Path:
        return Path(self.home)

    @property
    def dev_secret_path(self) -> Path:
        """Where `orquestador dev` keeps its development signing key."""
        return self.home_path / "dev-jwt-secret"

    def signing_secret(self) -> str:
        """JWT_SECRET, else the development key `orquestador dev` left in ORQUESTADOR_HOME."""
        if self.jwt_secret:
            return self.jwt_secret
        try:
            return self.dev_secret_path.read_text().strip()
        except FileNotFoundError:
            return ""

    @property
    def adapter_module_names(self) -> list[str]:
        return [name.strip() for name in self.adapter_modules.split(",") if name.strip()]

    def quotas_for(self, org: str) -> Quotas:
        """The organization's limits: the QUOTA_* settings, then its ORG_QUOTAS entry."""
        defaults = Quotas(
            schedules=self.quota_schedules,
            schedule_min_seconds=self.schedule_min_seconds,
            transitions_per_second=self.quota_transitions_per_second,
            transitions_burst=self.quota_transitions_burst,
            open_executions=self.quota_open_executions,
            bulk_items=self.quota_bulk_items,
            rollout_items=self.quota_rollout_items,
        )
        return defaults.overridden(parse_org_quotas(self.org_quotas)[0].get(org, {}))

    @property
    def org_weight_map(self) -> dict[str, float]:
        """ORG_WEIGHTS as {organization: weight}; items `problems` refuses are left out."""
        return _org_weights(self.org_weights)[0]

    @property
    def machine_command_list(self) -> list[str]:
        return [name.strip() for name in self.machine_commands.split(",") if name.strip()]

    @property
    def trusted_proxy_networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """TRUSTED_PROXIES as networks (a bare address is a network of one); bad items skipped."""
        networks = []
        for item in self.trusted_proxies.split(","):
            with contextlib.suppress(ValueError):
                if item.strip():
                    networks.append(ip_network(item.strip(), strict=False))
        return tuple(networks)

    @property
    def forwarded_allow_ips(self) -> str:
        """TRUSTED_PROXIES as gunicorn's forwarded_allow_ips: each network written out
        (gunicorn refuses host bits in a network); empty: no peer, loopback included."""
        return ",".join(str(network) for network in self.trusted_proxy_networks)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """METRICS_BIND as (host, port); None when empty (or malformed: `problems` says)."""
        return _host_port(self.metrics_bind)

    @property
    def jwt_algorithm_list(self) -> list[str]:
        return [name.strip() for name in self.jwt_algorithms.split(",") if name.strip()]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read, convert and validate; raise ConfigError with one line per problem."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in fields(cls):
            name = f.metadata["env"]
            if f.name in overrides:
                values[f.name] = overrides[f.name]
                continue
            raw = environ.get(name, f.default).strip()
            try:
                values[f.name] = _convert(raw, f.type)
            except ValueError as exc:
                problems.append(f"{name}={raw!r}: {exc}")
                # Keep checking the rest so every problem is reported in one go.
                values[f.name] = _convert(f.default, f.type)
        settings = cls(**values)
        problems += settings.problems()
        if problems:
            raise ConfigError(problems)
        return settings

    def with_overrides(self, **changes: Any) -> Settings:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        settings = Settings(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        """One line per invalid setting."""
        problems: list[str] = []
        positive = (
            "worker_concurrency",
            "worker_batch",
            "worker_poll_ms",
            "worker_lease_seconds",
            "worker_renew_seconds",
            "execution_max_attempts",
            "worker_lock_timeout_ms",
            "worker_statement_timeout_ms",
            "wait_max_seconds",
            "machine_token_days",
            "command_delivery_seconds",
            "command_output_max_bytes",
            "agent_offline_seconds",
            "api_port",
            "api_workers",
            "api_threads",
            "api_max_body_bytes",
            "retry_base_seconds",
            "retry_cap_seconds",
            "retry_after_max_seconds",
            "maintenance_interval_seconds",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                problems.append(f"{_env_name(name)} must be greater than zero")
        for name in (
            "max_continuations",
            "quota_transitions_per_second",
            "quota_transitions_burst",
            "quota_open_executions",
            "quota_bulk_items",
            "quota_rollout_items",
            "quota_schedules",
            "schedule_min_seconds",
            "db_pool_size",
            "worker_drain_seconds",
            "adapter_abandon_grace_seconds",
            "agent_kill_grace_seconds",
            "jwt_leeway_seconds",
            "retry_after_min_seconds",
            "machine_command_retention_days",
            "simulation_retention_days",
            "email_retention_days",
            "notice_retention_days",
            "schedule_fire_retention_days",
            "bulk_retention_days",
            "history_retention_days",
            "history_retention_failed_days",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{_env_name(name)} must not be negative")
        if self.worker_renew_seconds * 2 >= self.worker_lease_seconds > 0:
            problems.append(
                f"WORKER_RENEW_SECONDS={self.worker_renew_seconds} must be below half of "
                f"WORKER_LEASE_SECONDS={self.worker_lease_seconds}, or a late heartbeat loses "
                "the lease while the action still runs"
            )
        if not 0 < self.agent_poll_share <= 1:
            problems.append(
                f"AGENT_POLL_SHARE={self.agent_poll_share} must be a share of the request "
                "threads above 0 and at most 1"
            )
        if not 0 <= self.execution_wait_share <= 1:
            problems.append(
                f"EXECUTION_WAIT_SHARE={self.execution_wait_share} must be a share of the "
                "request threads from 0 to 1"
            )
        for item in filter(None, (i.strip() for i in self.trusted_proxies.split(","))):
            try:
                ip_network(item, strict=False)
            except ValueError:
                problems.append(
                    f"TRUSTED_PROXIES: {item!r} is not an address or network (e.g. 10.0.0.5, "
                    "10.0.0.0/24, ::1)"
                )
        for problem in parse_org_quotas(self.org_quotas)[1]:
            problems.append(f"ORG_QUOTAS: {problem}")
        for item in _org_weights(self.org_weights)[1]:
            problems.append(
                f"ORG_WEIGHTS: {item!r} is not organization=weight with a weight above 0"
                " (e.g. acme=3,globex=0.5)"
            )
        if self.worker_lock_timeout_ms > self.worker_statement_timeout_ms:
            problems.append("WORKER_LOCK_TIMEOUT_MS must not be above WORKER_STATEMENT_TIMEOUT_MS")
        if self.retry_cap_seconds < self.retry_base_seconds:
            problems.append("RETRY_CAP_SECONDS must not be below RETRY_BASE_SECONDS")
        if self.retry_after_max_seconds < self.retry_after_min_seconds:
            problems.append("RETRY_AFTER_MAX_SECONDS must not be below RETRY_AFTER_MIN_SECONDS")
        for name in ("database_url", "migration_database_url", "listen_database_url"):
            problem = _postgres_url_problem(getattr(self, name))
            if problem:
                problems.append(f"{_env_name(name)}: {problem}")
        unknown = [a for a in self.jwt_algorithm_list if a not in _JWT_ALGORITHMS]
        if unknown or not self.jwt_algorithm_list:
            problems.append(
                f"JWT_ALGORITHMS must list algorithms among {', '.join(sorted(_JWT_ALGORITHMS))}"
                f" (got {self.jwt_algorithms!r}); 'none' is never accepted"
            )
        if self.jwt_public_key_file and not Path(self.jwt_public_key_file).is_file():
            problems.append(f"JWT_PUBLIC_KEY_FILE: no such file {self.jwt_public_key_file!r}")
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            problems.append("LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        if self.log_format not in {"text", "json"}:
            problems.append(f"LOG_FORMAT must be text or json (got {self.log_format!r})")
        if self.worker_metrics_port and not (
            self.worker_metrics_port.isdigit() and 0 < int(self.worker_metrics_port) < 65536
        ):
            problems.append("WORKER_METRICS_PORT must be a TCP port (1-65535) or empty (off)")
        if self.metrics_bind and _host_port(self.metrics_bind) is None:
            problems.append(
                "METRICS_BIND must be HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464) or empty"
                f" (/metrics on API_PORT); got {self.metrics_bind!r}"
            )
        if self.public_base_url and not _HTTP_URL.match(self.public_base_url):
            problems.append(
                "PUBLIC_BASE_URL must be an http:// or https:// URL, e.g. "
                "https://orquestador.example.com"
            )
        if self.otel_exporter_otlp_endpoint and not _HTTP_URL.match(
            self.otel_exporter_otlp_endpoint
        ):
            problems.append(
                "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL, e.g. "
                "http://otel-collector:4318"
            )
        if self.api_url and not _HTTP_URL.match(self.api_url):
            problems.append(
                "ORQUESTADOR_API_URL must be an http:// or https:// URL, e.g. "
                "http://127.0.0.1:8080/api/v1"
            )
        return problems


def _org_weights(raw: str) -> tuple[dict[str, float], list[str]]:
    """ORG_WEIGHTS text ("acme=3,globex=0.5") as {organization: weight}, and the rest."""
    weights: dict[str, float] = {}
    refused: list[str] = []
    for item in filter(None, (i.strip() for i in raw.split(","))):
        org, _, weight = item.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = 0.0
        if org.strip() and 0 < value < 1e6:
            weights[org.strip()] = value
        else:
            refused.append(item)
    return weights, refused


def _host_port(raw: str) -> tuple[str, int] | None:
    """`HOST:PORT` or `[IPv6]:PORT` as (host, port); None when empty or malformed."""
    host, separator, port = raw.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if host.startswith("[") else host
    if not separator or not host or (":" in host and not raw.strip().startswith("[")):
        return None
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _env_name(attribute: str) -> str:
    return next(f.metadata["env"] for f in fields(Settings) if f.name == attribute)


def environment_sections() -> dict[str, list[str]]:
    """Every environment variable read, by section, in the order `.env.example` lists them."""
    sections: dict[str, list[str]] = {}
    for f in fields(Settings):
        sections.setdefault(f.metadata["section"], []).append(f.metadata["env"])
    return sections


def _convert(raw: str, kind: Any) -> Any:
    if kind in (bool, "bool"):
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError("expected true or false")
    if kind in (int, "int"):
        try:
            return int(raw)
        except ValueError:
            raise ValueError("expected a whole number") from None
    if kind in (float, "float"):
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("expected a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("expected a finite number")
        return value
    return raw


def _postgres_url_problem(url: str) -> str | None:
    if not url:
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(_hosts_into_query(url))
    except (ArgumentError, ValueError):
        return (
            "not a database URL (expected postgresql://user@host/dbname, or "
            "postgresql://user@host1:port1,host2:port2/dbname?target_session_attrs=read-write)"
        )
    if parsed.get_backend_name() != "postgresql":
        return f"not a PostgreSQL URL (scheme {parsed.drivername!r})"
    return None


# scheme://[userinfo@]hostlist[/rest]: the parts of a libpq URI around its host list.
_URI_PARTS = re.compile(
    r"^(?P<scheme>[^:/]+://)(?:(?P<userinfo>[^@/]*)@)?(?P<hosts>[^/?]*)(?P<rest>.*)$"
)
# One host of the list: a bracketed IPv6 address or a name, then an optional port.
_HOST_PORT = re.compile(r"^(?P<host>\[[^\]]*\]|[^:]*)(?::(?P<port>\d*))?$")


def _hosts_into_query(url: str) -> str:
    """A libpq URI naming several hosts (`h1:p1,h2:p2`) rewritten with them in its query.

    libpq and psycopg read `postgresql://u@h1:5432,h2:5433/db`; SQLAlchemy's URL parser
    reads one host and port only, but both read `postgresql://u@/db?host=h1,h2&port=5432,5433`,
    which means the same to libpq. A URL with one host is returned as it is.
    """
    parts = _URI_PARTS.match(url)
    if parts is None or "," not in parts["hosts"]:
        return url
    hosts: list[str] = []
    ports: list[str] = []
    for item in parts["hosts"].split(","):
        found = _HOST_PORT.match(item)
        if found is None or not found["host"]:
            raise ValueError(f"host list item {item!r} is not host[:port]")
        hosts.append(found["host"].strip("[]"))
        ports.append(found["port"] or "")
    rest = parts["rest"]
    path, _, query = rest.partition("?")
    pairs = [("host", ",".join(hosts))]
    if any(ports):
        pairs.append(("port", ",".join(ports)))
    if query and any(p.split("=", 1)[0] in ("host", "port", "hostaddr") for p in query.split("&")):
        raise ValueError("hosts given both in the host list and in the query")
    query = "&".join(f"{k}={v}" for k, v in pairs) + (f"&{query}" if query else "")
    userinfo = f"{parts['userinfo']}@" if parts["userinfo"] is not None else ""
    return f"{parts['scheme']}{userinfo}{path or '/'}?{query}"


def sqlalchemy_url(url: str) -> URL:
    """Normalise any postgresql:// form, one host or a libpq host list, to psycopg 3."""
    from sqlalchemy.engine import make_url

    parsed = make_url(_hosts_into_query(url))
    return parsed.set(drivername="postgresql+psycopg")


def libpq_url(url: str | URL) -> str:
    """A URL psycopg itself connects with (no SQLAlchemy driver name), password kept.

    A host list stays in the query (`?host=h1,h2&port=p1,p2`), which libpq reads as
    the same list of hosts tried in order.
    """
    parsed = sqlalchemy_url(url) if isinstance(url, str) else url
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)

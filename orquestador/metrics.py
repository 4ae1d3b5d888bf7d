"""Prometheus metrics: every series the product exposes, defined once, here.

Callers import the object and update it; nothing else creates metrics. Which to use:

- ``count_move(status)``: when an execution moves into a status (SUCCEEDED, FAILED,
  RECONCILIATION_REQUIRED, CANCELLED, RETRY_WAIT, WAITING), once per move, by the process
  that made it (the worker's executor, reconciliation, cancel, bulk). It counts
  ``EXECUTIONS_TOTAL`` (moves: a wait's every round is one) and, for a final status,
  ``EXECUTIONS_FINISHED_TOTAL`` (ends: each execution once, by how it ended).
- ``ACTION_DURATION_SECONDS.labels(capability=..., outcome=...).observe(seconds)``:
  around each adapter call; ``outcome`` is one of ``ACTION_OUTCOMES`` (succeeded,
  failed, retry, not_ready, unknown, simulated). ``capability`` is the adapter's
  ``name@version`` (a bounded set; never an id or an input value).
- ``RETRIES_TOTAL.labels(capability=...).inc()``: when a retry is scheduled.
- ``RATE_LIMIT_WAITS_TOTAL.labels(capability=...).inc()``: when a call waits for its
  route's rate limit (no attempt spent).
- ``LEASE_LOST_TOTAL.inc()``: once per job that lost its lease: by the executor when a
  fenced write finds another holder (its run ends LEASE_LOST), else by the worker daemon
  when the heartbeat stopped the job (a renewal that no longer matched its row, or a
  lease it could not renew in time) and the job ended without writing.
- ``CLAIM_BATCH_SIZE.observe(n)``: after each claim statement that returned rows.
- ``QUEUE_DEPTH.labels(status=...).set(n)``, ``OLDEST_DUE_SECONDS.set(s)``,
  ``RECONCILIATION_REQUIRED.set(n)``, ``EMAIL_OUTBOX_DEPTH.set(n)``: sampled by the
  maintenance leader every 5 s (orquestador.worker.queue_gauges, between the maintenance
  passes, so they are never older than that); nobody else sets them, so the
  whole fleet exposes one consistent value: the others report 0, so ``max`` across
  workers in PromQL is the leader's value. ``MAINTENANCE_LEADER`` is 1 on the leader.
- ``HTTP_REQUESTS_TOTAL.labels(route=..., status=...)`` and
  ``HTTP_REQUEST_DURATION_SECONDS.labels(route=...)``: the API's request hooks only;
  ``route`` is the URL rule template (``/api/v1/executions/<execution_id>``), never the
  raw path, so ids do not explode the series count.

Under gunicorn the API runs in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): gauges
declare how values of several processes combine (``multiprocess_mode``).

- ``LISTENER_CONNECTED.set(0|1)`` and ``LISTENER_RECONNECTS_TOTAL.inc()``: the worker's
  ready listener (orquestador.worker.listener) only, as its LISTEN connection comes and
  goes; a failover shows as one reconnect.
"""

from __future__ import annotations

import os

from prometheus_client import Counter, Gauge, Histogram

from orquestador.domain.statuses import ExecutionStatus

# In multiprocess mode each metric opens its file in PROMETHEUS_MULTIPROC_DIR as it is
# made, so the directory must exist by now (gunicorn's start hook also empties it).
_MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
if _MULTIPROCESS_DIR:
    os.makedirs(_MULTIPROCESS_DIR, exist_ok=True)

NAMESPACE = "orquestador"

ACTION_OUTCOMES = ("succeeded", "failed", "retry", "not_ready", "unknown", "simulated")

EXECUTIONS_TOTAL = Counter(
    "executions_total",
    "Moves of executions into a status, by that status (a wait's rounds count each time).",
    ["status"],
    namespace=NAMESPACE,
)

# The statuses an execution ends in: each execution is counted once, by the one it ends in.
FINAL_STATUSES = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)

EXECUTIONS_FINISHED_TOTAL = Counter(
    "executions_finished_total",
    "Executions that ended, by their final status (each execution once).",
    ["status"],
    namespace=NAMESPACE,
)


def count_move(status: str) -> None:
    """An execution moved into `status`: a move, and when the status is final, an end."""
    EXECUTIONS_TOTAL.labels(status=status).inc()
    if status in FINAL_STATUSES:
        EXECUTIONS_FINISHED_TOTAL.labels(status=status).inc()


ACTION_DURATION_SECONDS = Histogram(
    "action_duration_seconds",
    "Time spent in one adapter call, by capability and outcome.",
    ["capability", "outcome"],
    namespace=NAMESPACE,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)

RATE_LIMIT_WAITS_TOTAL = Counter(
    "rate_limit_waits_total",
    "Calls that found their route's rate limit spent and went back to RETRY_WAIT, by capability.",
    ["capability"],
    namespace=NAMESPACE,
)
RETRIES_TOTAL = Counter(
    "retries_total",
    "Retries scheduled after a transient failure, by capability.",
    ["capability"],
    namespace=NAMESPACE,
)

SCHEDULE_FIRE_OUTCOMES = ("started", "missed", "refused")
SCHEDULE_FIRES_TOTAL = Counter(
    "schedule_fires_total",
    "Schedule fire times handled, by outcome: started an execution, missed (let go by the"
    " catch-up policy), or refused by the flow.",
    ["outcome"],
    namespace=NAMESPACE,
)

LEASE_LOST_TOTAL = Counter(
    "lease_lost_total",
    "Times a worker found it no longer held an execution's lease.",
    namespace=NAMESPACE,
)

CLAIM_BATCH_SIZE = Histogram(
    "claim_batch_size",
    "Executions taken by one claim statement (claims that found nothing are not counted).",
    namespace=NAMESPACE,
    buckets=(1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100),
)

QUEUE_DEPTH = Gauge(
    "queue_depth",
    "Unfinished executions by status, sampled by the maintenance leader.",
    ["status"],
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

OLDEST_DUE_SECONDS = Gauge(
    "oldest_due_seconds",
    "Age of the oldest execution that is due and not running, and not waiting for its"
    " concurrency key (0 when none).",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

RECONCILIATION_REQUIRED = Gauge(
    "reconciliation_required",
    "Executions waiting for an operator's reconciliation.",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

AGENTS_OFFLINE = Gauge(
    "agents_offline",
    "Machine agents seen once and silent for longer than AGENT_OFFLINE_SECONDS.",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

QUOTA_USE_RATIO = Gauge(
    "quota_use_ratio",
    "Per quota, the highest share of its limit any organization uses (1: one is at its "
    "limit): schedules held, transition tokens taken from the bucket, executions not ended.",
    ["quota"],
    namespace=NAMESPACE,
    multiprocess_mode="max",
)
# The quotas the gauge follows (the others are not a use that lasts).
GAUGED_QUOTAS = ("schedules", "transitionsBurst", "openExecutions")

EMAIL_OUTBOX_DEPTH = Gauge(
    "email_outbox_depth",
    "E-mails not yet delivered (pending in the outbox).",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

MAINTENANCE_LEADER = Gauge(
    "maintenance_leader",
    "1 while this worker holds the maintenance lock (sum over workers: 1 when healthy).",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

HTTP_REQUESTS_TOTAL = Counter(
    "http_requests_total",
    "HTTP requests answered by the API, by route template and status code.",
    ["route", "status"],
    namespace=NAMESPACE,
)

HTTP_REQUEST_DURATION_SECONDS = Histogram(
    "http_request_duration_seconds",
    "Time to answer an HTTP request, by route template.",
    ["route"],
    namespace=NAMESPACE,
)

# Statuses the queue gauges report, so a status that drained to zero reads 0, not absent.
QUEUE_STATUSES = (
    ExecutionStatus.PENDING,
    ExecutionStatus.RUNNING,
    ExecutionStatus.RETRY_WAIT,
    ExecutionStatus.WAITING,
    ExecutionStatus.RECONCILIATION_REQUIRED,
)

# The database's health as the product sees it, sampled by the maintenance leader.
DB_OLDEST_TRANSACTION_SECONDS = Gauge(
    "db_oldest_transaction_seconds",
    "Age of the oldest open transaction of the runtime role in this database (every role's"
    " with pg_read_all_stats): a long one holds back vacuum and the claim's index.",
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

DB_DEAD_TUPLES = Gauge(
    "db_dead_tuples",
    "Dead row versions not yet vacuumed, by hot table (a partitioned table's partitions summed).",
    ["table"],
    namespace=NAMESPACE,
    multiprocess_mode="max",
)

# The tables the protocol rewrites most: where bloat slows the claim and the pages.
HOT_TABLES = (
    "execution",
    "action_execution",
    "request",
    "audit_event",
    "action_attempt",
    "machine_command",
    "email_outbox",
)

LISTENER_CONNECTED = Gauge(
    "listener_connected",
    "1 while the worker's LISTEN connection is up and listening; polling covers the rest.",
    namespace=NAMESPACE,
    multiprocess_mode="min",
)

LISTENER_RECONNECTS_TOTAL = Counter(
    "listener_reconnects_total",
    "Times the worker's LISTEN connection was lost (or found on a read-only server) and"
    " opened again.",
    namespace=NAMESPACE,
)

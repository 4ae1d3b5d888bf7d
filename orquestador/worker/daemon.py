"""The worker process: scheduler, heartbeat, listener and executor threads, and shutdown."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from wsgiref.simple_server import WSGIServer

from sqlalchemy import Engine

from orquestador import tracing
from orquestador.actions import AdapterRegistry, load_registry
from orquestador.config import Settings, libpq_url
from orquestador.db.engine import make_engine
from orquestador.errors import ConfigError
from orquestador.metrics import LEASE_LOST_TOTAL
from orquestador.queue import Claim
from orquestador.redaction import error_line
from orquestador.worker.background import background_loops
from orquestador.worker.executor import Executor
from orquestador.worker.heartbeat import Heartbeat
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from orquestador.worker.leases import HeldLeases
from orquestador.worker.listener import ReadyListener, libpq_conninfo
from orquestador.worker.maintenance import MaintenanceLoop
from orquestador.worker.scheduler import Scheduler, Slots

log = logging.getLogger(__name__)

# How a job ends when it stops without committing anything (executor.run's reports).
_ENDED_WITHOUT_WRITING = frozenset(("ABANDONED", "LEFT_RUNNING", "ERROR"))

# Job threads check out a connection per execution, many times a second under load;
# a connection is pinged before use only after sitting idle this long.
PING_AFTER_IDLE_SECONDS = 5.0

# After the drain, every thread of the worker gets this long in all to end (a heartbeat
# round or a loop's statement under way; the listener looks at `stopped` every 0.5 s).
# One budget for them together, not one each: threads stuck on a database that vanished
# would otherwise add up past the service manager's TimeoutStopSec, and be killed
# mid-stop. The whole stop takes at most WORKER_DRAIN_SECONDS + this (30 s by default;
# the shipped unit allows 40).
STOP_GRACE_SECONDS = 10.0


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def join_all(threads: list[threading.Thread], deadline: float) -> list[threading.Thread]:
    """Join every started thread until one shared deadline; the ones still running."""
    for thread in threads:
        if thread.ident is not None:  # a worker stopped before start() has nothing to join
            thread.join(_remaining(deadline))
    return [thread for thread in threads if thread.is_alive()]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Worker:
    """One worker process's machinery; `start()`, then `request_stop()` and `join()`."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        registry: AdapterRegistry,
        *,
        hooks: WorkerHooks = NO_HOOKS,
        listen: bool = True,
    ) -> None:
        registry.check_timeouts_below(settings.worker_lease_seconds)
        self.settings = settings
        self.engine = engine
        self.worker_id = settings.worker_id or default_worker_id()
        self.hooks = hooks
        self.executor = Executor(registry, settings, hooks)
        self.wake = threading.Event()
        self.slots = Slots(settings.worker_concurrency, self.wake)
        self.leases = HeldLeases(settings.worker_lease_seconds)
        self.pool = ThreadPoolExecutor(
            max_workers=settings.worker_concurrency, thread_name_prefix="orquestador-job"
        )
        self.scheduler = Scheduler(
            engine,
            self.worker_id,
            batch=settings.worker_batch,
            poll_seconds=settings.worker_poll_ms / 1000,
            lease_seconds=settings.worker_lease_seconds,
            org_weights=settings.org_weight_map,
            slots=self.slots,
            submit=self._submit,
            wake=self.wake,
            hooks=hooks,
        )
        self.heartbeat = Heartbeat(
            engine,
            self.worker_id,
            self.leases,
            settings.worker_lease_seconds,
            settings.worker_renew_seconds,
            hooks=hooks,
        )
        # LISTEN is session state: a direct connection when PgBouncer fronts DATABASE_URL.
        listen_url = settings.listen_database_url or libpq_conninfo(engine.url)
        self.listener = ReadyListener(libpq_url(listen_url), self.wake) if listen else None
        self.loops = background_loops(settings, engine, self.worker_id)
        self.maintenance = next(loop for loop in self.loops if isinstance(loop, MaintenanceLoop))
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        self._drained_cleanly = False
        # What was still running when the stop budget ran out (threads stuck on a
        # database that vanished, jobs stuck in an adapter): left behind, not waited for.
        self.left_behind: list[str] = []
        self._stopper: threading.Thread | None = None
        self.metrics_server: WSGIServer | None = None

    # --- running jobs -----------------------------------------------------------

    def _submit(self, claim: Claim) -> None:
        held = self.leases.add(claim)
        try:
            future = self.pool.submit(self._run_job, claim, held.stop)
        except RuntimeError:  # the pool is shutting down: give the claim back at once
            self._job_done(claim, "ABANDONED")
            raise
        # The slot is given back once the job's function has returned, hooks included:
        # counting it free any earlier would let the scheduler claim work for a thread
        # that is still busy.
        future.add_done_callback(lambda done: self._job_done(claim, done.result()))

    def _run_job(self, claim: Claim, stop: threading.Event) -> str:
        try:
            return self.executor.run(self.engine, claim, stop)
        except Exception as exc:
            # A database failure mid-run: RUNNING and the checkpoints stay for recovery.
            log.warning(
                "job ended by %s; left for lease recovery", error_line(exc), extra=claim.log_extra
            )
            return "ERROR"

    def _job_done(self, claim: Claim, status: str) -> None:
        held = self.leases.remove(claim)
        # The executor counts a loss its own fenced write found (LEASE_LOST); a job the
        # heartbeat stopped ends without writing (ABANDONED, LEFT_RUNNING, ERROR) and is
        # counted here, once. A job that still committed its outcome lost nothing.
        if held is not None and held.lost and status in _ENDED_WITHOUT_WRITING:
            LEASE_LOST_TOTAL.inc()
        self.slots.give_back()
        if self.hooks.after_job:
            self.hooks.after_job(claim, status)

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        log.info("worker starting", extra={"worker_id": self.worker_id})
        self._start_metrics_server()
        self.heartbeat.start()
        if self.listener is not None:
            self.listener.start()
        self.scheduler.start()
        for loop in self.loops:
            loop.start()

    def _start_metrics_server(self) -> None:
        """Metrics, /healthz and /readyz on WORKER_METRICS_PORT (off when empty), on API_HOST.

        Started first: a busy port fails the start before any work is claimed.
        """
        port = self.settings.worker_metrics_port.strip()
        if not port:
            return
        import orquestador.metrics  # noqa: F401  every series is declared before the first scrape
        from orquestador.worker.probe import start_probe_server

        try:
            self.metrics_server = start_probe_server(
                self.settings.api_host, int(port), self.readiness
            )
        except OSError as error:
            # One line and exit status 2, not a traceback: a second worker on this host
            # needs a port of its own (or none).
            raise ConfigError(
                [
                    f"WORKER_METRICS_PORT={port}: cannot listen on {self.settings.api_host}:{port}"
                    f" ({error.strerror or error}); another process holds it: give this worker"
                    " a free port, or none"
                ]
            ) from None
        log.info(
            "worker metrics on http://%s:%d/metrics",
            self.settings.api_host,
            self.metrics_port,
            extra={"worker_id": self.worker_id},
        )

    def readiness(self) -> dict[str, bool]:
        """Each long-lived thread: running, and its last round reached the database."""
        threads = {
            "scheduler": self.scheduler.is_alive() and self.scheduler.healthy.is_set(),
            "heartbeat": self.heartbeat.is_alive() and self.heartbeat.healthy.is_set(),
        }
        if self.listener is not None:
            threads["listener"] = self.listener.is_alive() and self.listener.listening.is_set()
        for loop in self.loops:
            name = loop.name.removeprefix("orquestador-")
            threads[name] = loop.is_alive() and loop.healthy.is_set()
        return threads

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics server listens on (the real one when 0 was asked)."""
        if self.metrics_server is None:
            return None
        return int(self.metrics_server.server_port)

    def request_stop(self) -> None:
        """Warm stop: claim nothing more now; let jobs finish within the drain time."""
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        self.scheduler.stop()  # its wake is the shared one: a wait under way ends now
        if self.listener is not None:
            self.listener.stop()
        for loop in self.loops:
            loop.stop()
        self._stopper = threading.Thread(target=self._drain, name="orquestador-drain", daemon=True)
        self._stopper.start()

    def _drain(self) -> None:
        drained_by = time.monotonic() + self.settings.worker_drain_seconds
        stopped_by = drained_by + STOP_GRACE_SECONDS
        # A scheduler stuck in a claim (its database gone) is not waited for past the drain;
        # a claim it still gets after the pool shut down is given back (`_submit`).
        self.scheduler.join(_remaining(drained_by))
        # Leases keep being renewed while jobs finish on their own.
        self._drained_cleanly = self.slots.wait_idle(_remaining(drained_by))
        if not self._drained_cleanly:
            count = self.leases.signal_all()
            log.warning("drain time over; stopping %d job(s), leases left to expire", count)
        self.heartbeat.stop()
        # Nothing submitted is cancelled: a claim handed to the pool always runs, finds
        # its stop signal set, and gives its lease back at once instead of holding it.
        self.pool.shutdown(wait=False)
        self.executor.close()
        # The background threads end before "stopped" is reported, so that whoever
        # stops the database next (`orquestador dev`) never sees them fail on it.
        threads: list[threading.Thread] = [self.scheduler, self.heartbeat, *self.loops]
        if self.listener is not None:
            threads.append(self.listener)
        self.left_behind = [thread.name for thread in join_all(threads, stopped_by)]
        if not self.slots.wait_idle(0):
            self.left_behind.append("jobs")
        if self.left_behind:
            log.warning(
                "%s still running after the stop budget (%.0f s); left behind",
                ", ".join(self.left_behind),
                self.settings.worker_drain_seconds + STOP_GRACE_SECONDS,
                extra={"worker_id": self.worker_id},
            )
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        log.info("worker stopped", extra={"worker_id": self.worker_id})
        self._stopped.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the drain is over; True when stopped. Does not wait for hung adapters.

        Once it returns True, the scheduler, heartbeat, listener and loop threads have
        ended, except those named in `left_behind` (stuck past the stop budget).
        """
        return self._stopped.wait(timeout)

    def stop(self, timeout: float | None = None) -> bool:
        self.request_stop()
        return self.join(timeout)

    @property
    def drained_cleanly(self) -> bool:
        return self._drained_cleanly


def build_worker(settings: Settings) -> Worker:
    """A worker with the registry of ADAPTER_MODULES and an engine sized for its threads."""
    registry = load_registry(settings)
    pool_size, max_overflow = settings.pool_size(settings.worker_concurrency + 2)
    engine = make_engine(
        settings.database_url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        prepare=settings.db_prepare,
        application_name="orquestador-worker",
        ping_after_idle_seconds=PING_AFTER_IDLE_SECONDS,
        hide_parameters=True,  # errors in logs never carry inputs or outputs
        # No protocol transaction waits for a lock or a statement without bound: a row
        # someone else holds fails that one job (left to lease recovery), not the worker.
        lock_timeout_ms=settings.lock_timeout_ms,
        statement_timeout_ms=settings.statement_timeout_ms,
    )
    return Worker(settings, engine, registry)


def run_worker(settings: Settings) -> int:
    """The `orquestador worker` daemon (settings already checked); the exit status."""
    tracing.configure(settings, "orquestador-worker")
    worker = build_worker(settings)
    signals = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("signal %s: warm stop", signal.Signals(signum).name)
            worker.request_stop()
        else:
            log.warning("second signal: exiting at once")
            os._exit(130)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.start()
    # A short wait in a loop keeps the main thread ready to run signal handlers.
    while not worker.join(0.5):
        pass
    status = 0 if worker.drained_cleanly else 1
    if worker.left_behind:
        # Exiting normally would wait for the job threads (the pool joins them at exit)
        # and for connections that never answer: the stop budget is over, so go now.
        logging.shutdown()
        os._exit(status)
    worker.engine.dispose()
    tracing.shutdown()  # the spans still batched go out before the process does
    return status

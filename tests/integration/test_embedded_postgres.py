"""Integration tests for the embedded PostgreSQL wrapper, against real server binaries."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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

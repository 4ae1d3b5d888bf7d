"""The embedded PostgreSQL of a parallel run: one server that every xdist worker shares.

The controller names a folder for the run and hands it to each worker; the first worker
that needs a database starts the server there under a file lock, the others find it, and
the controller stops it once every worker has finished.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orquestador.db.embedded import EmbeddedPostgres, throwaway_folder

# The key a worker finds the run's folder under in its workerinput.
WORKER_INPUT_KEY = "orquestador_test_pg_folder"


def new_folder() -> Path:
    """In memory where there is room: the server runs with fsync off, thrown away after."""
    return throwaway_folder("orquestador-test-pg-")


def server_in(folder: Path) -> EmbeddedPostgres:
    return EmbeddedPostgres(folder / "pgdata", fsync=False)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_server(folder: Path) -> EmbeddedPostgres:
    """The run's server, started by whichever worker asks first; start() reuses a live one."""
    server = server_in(folder)
    with _locked(folder / "start.lock"):
        server.start()
    return server


def remove(folder: Path) -> None:
    """Stop the run's server, if a worker started one, and delete its files."""
    try:
        server_in(folder).stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

"""The embedded server of a parallel test run: one for every worker, gone after the run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests import shared_server
from tests.db_support import TestServer


def test_workers_that_ask_at_once_share_one_server() -> None:
    folder = shared_server.new_folder()
    both_ask = threading.Barrier(2, timeout=60)
    urls: list[str] = []
    failures: list[BaseException] = []

    def a_worker() -> None:
        both_ask.wait()
        try:
            urls.append(shared_server.shared_server(folder).url())
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    try:
        workers = [threading.Thread(target=a_worker) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        assert not failures
        assert len(urls) == 2 and urls[0] == urls[1]
        assert (folder / "pgdata" / "postmaster.pid").exists()
    finally:
        shared_server.remove(folder)
    assert not folder.exists()


def test_a_parallel_run_uses_the_run_s_server(
    request: pytest.FixtureRequest, pg_server: TestServer
) -> None:
    folder = getattr(request.config, "workerinput", {}).get(shared_server.WORKER_INPUT_KEY)
    if folder is None or os.environ.get("ORQUESTADOR_TEST_DATABASE_URL"):
        pytest.skip("not a parallel run on the embedded server")
    socket_dir = shared_server.server_in(Path(folder)).socket_dir
    assert pg_server.admin_url.query["host"] == str(socket_dir)

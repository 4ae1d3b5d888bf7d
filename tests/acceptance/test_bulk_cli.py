"""`orquestador executions bulk` as an operator runs it: a real process against a real API server,
with a worker's bulk loop acting on the items."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine

from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.worker.bulk_runner import BulkRunner
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.bulk_support import arrange, audits, publish, statuses, table_counts
from tests.integration.worker_support import ORG

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "bulk-cli-test-secret-" + "0123456789abcdef" * 3


@dataclass
class Server:
    url: str
    settings: Settings

    def env(self, *scopes: str) -> dict[str, str]:
        token = mint_token(
            self.settings,
            sub="carol",
            org=ORG,
            scopes=list(scopes or ("executions:cancel", "executions:reconcile")),
        )
        base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
        return {**base, "ORQUESTADOR_API_URL": self.url, "ORQUESTADOR_TOKEN": token}


@pytest.fixture
def server(database: TestDatabase, runtime_engine: Engine) -> Iterator[Server]:
    """The API on a loopback port, and the bulk loop of a worker beside it."""
    runner = BulkRunner(runtime_engine, claims_budget=10, chunk_items=4, interval_seconds=0.1)
    with served_api(database, SECRET) as (url, settings):
        runner.start()
        try:
            yield Server(url, settings)
        finally:
            runner.stop()
            runner.join(10)


def _bulk(server: Server, *args: str, stdin: Any = subprocess.DEVNULL, scopes: tuple = ()):
    return subprocess.run(
        [*ORQUESTADOR, "executions", "bulk", *args],
        env=server.env(*scopes),
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_yes_previews_starts_and_reports_each_refused_item(
    server: Server, owner_engine: Engine
) -> None:
    flow = publish(owner_engine)
    pending = arrange(owner_engine, flow, 13)
    running = arrange(owner_engine, flow, 1, status="RUNNING")
    parked = arrange(
        owner_engine, flow, 1, status="RECONCILIATION_REQUIRED", error_code="UNCERTAIN_OUTCOME"
    )

    result = _bulk(
        server, "--flow", str(flow), "--action", "cancel", "--reason", "maintenance", "--yes"
    )

    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "15 executions match; a bulk cancel acts on each"
    assert lines[1].split() == ["ID", "STATUS", "ERROR", "FLOW", "MACHINE", "CREATED", "CANCEL"]
    assert "... and 5 more" in lines
    assert any(line.startswith("bulk ") and "15 executions" in line for line in lines)
    # A RUNNING one is not cut mid-call: it stops when its step's call returns.
    assert (
        "done: 15 of 15; 13 cancelled, 1 to stop when their step's call returns, 1 refused" in lines
    )
    assert any(line.split()[:2] == [str(parked[0]), "NOT_CANCELLABLE"] for line in lines)
    assert statuses(owner_engine, running) == {running[0]: "RUNNING"}
    assert set(statuses(owner_engine, pending).values()) == {"CANCELLED"}
    assert all(len(rows) == 1 for rows in audits(owner_engine, "EXECUTION_CANCELLED").values())


def test_everything_acted_on_exits_0_and_json_prints_the_progress(
    server: Server, owner_engine: Engine
) -> None:
    flow = publish(owner_engine)
    arrange(owner_engine, flow, 3)
    result = _bulk(
        server, "--status", "PENDING", "--action", "cancel", "--reason", "r", "--yes", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert '"status": "DONE"' in result.stdout and '"succeeded": 3' in result.stdout


def test_without_a_terminal_or_yes_nothing_is_started(server: Server, owner_engine: Engine):
    arrange(owner_engine, publish(owner_engine), 2)
    result = _bulk(server, "--status", "PENDING", "--action", "cancel", "--reason", "r")
    assert result.returncode == 2
    assert "add --yes" in result.stderr
    assert "2 executions match" in result.stdout
    assert table_counts(owner_engine) == (0, 0)


def _on_a_terminal(server: Server, answer: bytes, *args: str) -> subprocess.CompletedProcess:
    """The command with its standard input on a terminal that types `answer`."""
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer)
        return _bulk(server, *args, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)


def test_on_a_terminal_it_asks_and_only_yes_starts_it(server: Server, owner_engine: Engine):
    pending = arrange(owner_engine, publish(owner_engine), 2)
    args = ("--status", "PENDING", "--action", "cancel", "--reason", "r")

    declined = _on_a_terminal(server, b"no\n", *args)
    assert declined.returncode == 1
    assert "Type yes to go on" in declined.stderr and "nothing done" in declined.stderr
    assert table_counts(owner_engine) == (0, 0)

    accepted = _on_a_terminal(server, b"yes\n", *args)
    assert accepted.returncode == 0, accepted.stderr
    assert "done: 2 of 2; 2 cancelled, 0 refused" in accepted.stdout
    assert set(statuses(owner_engine, pending).values()) == {"CANCELLED"}


def test_nothing_matching_starts_nothing_and_no_filter_is_a_usage_error(
    server: Server, owner_engine: Engine
) -> None:
    nothing = _bulk(server, "--error-code", "NOBODY", "--action", "retry", "--reason", "r", "--yes")
    assert nothing.returncode == 0
    assert nothing.stdout.strip() == "no execution matches: nothing to do"
    no_filter = _bulk(server, "--action", "cancel", "--reason", "r", "--yes")
    assert no_filter.returncode == 2 and "needs a filter" in no_filter.stderr
    assert table_counts(owner_engine) == (0, 0)


def test_the_server_s_refusal_exits_1_with_its_problem(server: Server) -> None:
    result = _bulk(
        server,
        *("--status", "PENDING", "--action", "retry", "--reason", "r", "--yes"),
        scopes=("executions:cancel",),
    )
    assert result.returncode == 1
    assert "refused (403 INSUFFICIENT_SCOPE)" in result.stderr
    bad_instant = _bulk(
        server, "--created-after", "yesterday", "--action", "cancel", "--reason", "r", "--yes"
    )
    assert bad_instant.returncode == 1
    assert "/filter/createdAfter" in bad_instant.stderr


def _terminal_output(controller: int) -> str:
    """What the command wrote to its terminal, once it has ended."""
    os.set_blocking(controller, False)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except (BlockingIOError, OSError):  # nothing more; OSError once the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_on_a_terminal_the_progress_is_a_bar(server: Server, owner_engine: Engine) -> None:
    arrange(owner_engine, publish(owner_engine), 6)
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"yes\n")
        result = subprocess.run(
            [
                *ORQUESTADOR,
                "executions",
                "bulk",
                *("--status", "PENDING", "--action", "cancel"),
                *("--reason", "r"),
            ],
            env=server.env(),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=60,
        )
        shown = _terminal_output(controller)
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 0, shown
    assert "Type yes to go on" in shown
    assert f"[{'#' * 30}] 6/6  6 cancelled, 0 refused" in shown
    assert "done: 6 of 6; 6 cancelled, 0 refused" in result.stdout


def test_a_cancel_that_parks_is_said_as_what_took_effect_and_warned_of_before(
    server: Server, owner_engine: Engine
) -> None:
    flow = publish(owner_engine)
    arrange(owner_engine, flow, 2, status="RETRY_WAIT")
    (written,) = arrange(owner_engine, flow, 1, status="RETRY_WAIT", checkpoint="SUCCEEDED")

    result = _bulk(server, "--flow", str(flow), "--action", "cancel", "--reason", "outage", "--yes")

    # Nothing refused: everything took effect, the park included.
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    done = lines.index("done: 3 of 3; 2 cancelled, 1 parked for a decision, 0 refused")
    (previewed,) = [line for line in lines[:done] if line.startswith(str(written))]
    assert previewed.split()[-1] == "PARKS"
    assert (
        "warning: a cancel parks 1 of them for a decision instead of ending it: a write was "
        "done or may have been (PARKS above)"
    ) in lines[:done]
    (parked,) = [line for line in lines[done:] if line.startswith(str(written))]
    assert "parked for a decision: a write was done or may have been" in parked
    assert "CANCELLED_AFTER_WRITES" not in result.stdout

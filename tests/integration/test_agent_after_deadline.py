"""A reboot the flow gave up on is never run: the agent that comes back after the wait's
deadline finds nothing, and the execution page says the command was never delivered."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from orquestador.actions import AdapterRegistry
from orquestador.actions.builtin import register_builtins
from orquestador.api.tokens import mint_token
from orquestador.worker.daemon import Worker
from tests.integration.test_agent_process import NEXT, ApiServer, running_agent
from tests.integration.worker_support import (
    ORG,
    OWNER,
    audit,
    decommission,
    execution,
    settings,
    start_execution,
    status_is,
    wait_until,
)


@pytest.fixture
def api(database) -> Iterator[ApiServer]:
    server = ApiServer(database.runtime_dsn)
    server.start()
    try:
        yield server
    finally:
        server.dispose()


@pytest.fixture
def worker(database, runtime_engine: Engine) -> Iterator[Worker]:
    configured = settings(database_url=database.runtime_dsn)
    registry = AdapterRegistry()
    register_builtins(registry, configured)
    running = Worker(configured, runtime_engine, registry)
    running.start()
    yield running
    running.stop(timeout=30)


def command_row(engine: Engine, execution_id) -> tuple:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, sent_at, deliver_by FROM machine_command WHERE external_key = :key"
            ),
            {"key": f"{execution_id}:send"},
        ).one()


def test_an_agent_started_after_the_wait_s_deadline_never_runs_the_command(
    api: ApiServer, worker: Worker, runtime_engine: Engine, tmp_path: Path
) -> None:
    ran = tmp_path / "powered-off"
    commands = tmp_path / "agent-commands.toml"
    commands.write_text(f'[poweroff]\nargv = ["touch", "{ran}"]\ntimeout_seconds = 10\n')
    # The machine's agent is down: the flow waits a second for its poweroff, then gives up.
    execution_id = start_execution(runtime_engine, decommission(1), {"machineId": "m-1"})
    wait_until(
        status_is(runtime_engine, execution_id, "FAILED", "SUCCEEDED"),
        what="the wait's deadline to pass",
    )
    [exit_row] = audit(runtime_engine, execution_id, "STEP_ERROR_EXIT")
    assert exit_row.detail["errorCode"] == "WAIT_DEADLINE_EXCEEDED"
    assert exit_row.detail["observed"]["wait"]["status"] == "expired"
    status, sent_at, _ = command_row(runtime_engine, execution_id)
    assert (status, sent_at) == ("expired", None)

    # The agent comes back and polls, again and again: it is handed nothing.
    polls = api.answers[(NEXT, 204)]
    with running_agent(api, commands, org=ORG) as agent:
        wait_until(lambda: api.answers[(NEXT, 204)] >= polls + 2, what="two empty polls")
        agent.process.terminate()
        agent.process.wait(15)
    assert not ran.exists()
    assert api.answers[(NEXT, 200)] == 0
    assert command_row(runtime_engine, execution_id)[:2] == ("expired", None)
    assert execution(runtime_engine, execution_id).result["toState"] == "attention"

    # The page says so, then and now.
    client = api.app.test_client()
    signed = client.post(
        "/ui/login",
        data={"token": mint_token(api.settings, sub=OWNER, org=ORG, scopes=["requests:read"])},
        headers={"Origin": "http://localhost"},
    )
    assert signed.status_code == 303
    page = client.get(f"/ui/executions/{execution_id}").get_data(as_text=True)
    words = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert re.search(
        r"Then, when the flow decided .* Status expired \(never delivered: no agent took it"
        r" before its deliver-by time\) .* Now Status expired \(never delivered",
        words,
    ), words

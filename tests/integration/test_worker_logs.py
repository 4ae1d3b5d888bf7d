"""Every worker line names what it is about, and a missing grant is one clear line with backoff."""

from __future__ import annotations

import logging
import re

from sqlalchemy import text

from orquestador.actions import Effect, TransientError
from orquestador.worker.daemon import Worker
from orquestador.worker.executor import Executor
from tests.db_support import RUNTIME_ROLE
from tests.integration.worker_support import RecordingAdapter as Double
from tests.integration.worker_support import (
    action,
    flow_definition,
    registry_of,
    run_once,
    settings,
    start_execution,
    wait_until,
)


def test_an_action_failure_line_names_execution_action_capability_and_error(runtime_engine, caplog):
    secret = "s3cr3t-value-1234"

    def refuse(ctx):
        raise TransientError(f"provider busy for {ctx.inputs['key']}")

    write = Double("test.write", Effect.IDEMPOTENT_WRITE, output=refuse)
    definition = flow_definition([action("w", "test.write", input={"key": {"from": "/data/k"}})])
    eid = start_execution(runtime_engine, definition, {"k": secret})
    with caplog.at_level(logging.INFO, logger="orquestador"):
        assert run_once(runtime_engine, Executor(registry_of(write), settings())) == "RETRY_WAIT"

    (line,) = [r for r in caplog.records if r.getMessage().startswith("action failed")]
    assert line.execution_id == str(eid)
    assert (line.action_id, line.capability, line.error) == ("w", "test.write@1", "TransientError")
    assert line.getMessage() == "action failed transiently: provider busy for [input]"
    assert all(secret not in r.getMessage() for r in caplog.records)
    assert all(secret not in str(r.__dict__) for r in caplog.records)


def test_a_missing_grant_is_one_line_per_try_with_a_growing_wait(
    runtime_engine, owner_engine, caplog
):
    with owner_engine.begin() as conn:
        conn.execute(text(f"REVOKE UPDATE ON execution FROM {RUNTIME_ROLE}"))
    worker = Worker(settings(worker_poll_ms=50), runtime_engine, registry_of(), listen=False)
    with caplog.at_level(logging.INFO, logger="orquestador"):
        worker.start()
        try:
            wait_until(
                lambda: len([r for r in caplog.records if "claim failed" in r.getMessage()]) >= 3,
                what="three failed claims",
            )
        finally:
            worker.stop(30)
    lines = [r.getMessage() for r in caplog.records if "claim failed" in r.getMessage()]
    for line in lines:
        assert line.startswith("claim failed: InsufficientPrivilege: permission denied")
        assert "orquestador migrate grant" in line and "orquestador check" in line
    waits = [float(re.search(r"next try in ([0-9.]+) s", line).group(1)) for line in lines]
    assert waits[:3] == sorted(waits[:3]) and waits[2] > waits[0]

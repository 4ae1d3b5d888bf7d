"""The benchmark's pure-SQL baseline is the worker's own protocol, and still runs on our schema."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, pool, text

from benchmarks import protocol_script

BENCHMARKS = Path(protocol_script.__file__).resolve().parent


def test_the_checked_in_script_is_the_generated_one():
    # The benchmark generates the script when it runs; the copy in the repository is
    # for reading, and must say what actually runs.
    assert protocol_script.SCRIPT_FILE.read_text() == protocol_script.script(), (
        "regenerate with: python benchmarks/protocol_script.py --write"
    )


def test_the_script_carries_the_queue_statements_verbatim():
    from orquestador.queue import checkpoints, claims, outcomes

    script = protocol_script.script()
    for clause in (
        claims._CLAIM,
        checkpoints._RECORD_SUCCESS,
        outcomes._LOCK_REQUEST,
        outcomes._LOCK_EXECUTION,
        outcomes._COMPLETE,
    ):
        assert protocol_script.sql(clause) in script


def test_pgbench_runs_the_script_to_completed_transitions(database):
    pgbench, psql = shutil.which("pgbench"), shutil.which("psql")
    if not (pgbench and psql):
        pytest.skip("pgbench and psql are not installed")
    target = database.owner_url.set(drivername="postgresql").render_as_string(hide_password=False)
    subprocess.run(
        [
            psql,
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "nrows=10",
            "-v",
            "definition=" + json.dumps(protocol_script.flow_definition()),
            "-d",
            target,
            "-f",
            str(BENCHMARKS / "baseline_setup.sql"),
        ],
        check=True,
        capture_output=True,
    )
    script = BENCHMARKS / "baseline_protocol.pgb"
    run = subprocess.run(
        [
            pgbench,
            *("-n", "-M", "prepared", "-c", "2", "-t", "3"),
            *protocol_script.pgbench_defines(),
            *("-f", str(script), target),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]

    engine = create_engine(database.owner_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            statuses = dict(
                conn.execute(text("SELECT status, count(*) FROM execution GROUP BY 1")).all()
            )
            succeeded = conn.execute(
                text("SELECT count(*) FROM action_execution WHERE status = 'SUCCEEDED'")
            ).scalar_one()
            audited = conn.execute(
                text("SELECT count(*) FROM audit_event WHERE kind = 'TRANSITION_COMPLETED'")
            ).scalar_one()
            moved = conn.execute(
                text(
                    "SELECT count(*) FROM request WHERE state = 'done' AND revision = 3 "
                    "AND busy_execution_id IS NULL"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    assert statuses == {"SUCCEEDED": 6, "PENDING": 4}
    assert (succeeded, audited, moved) == (6, 6, 6)

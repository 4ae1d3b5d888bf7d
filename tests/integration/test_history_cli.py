"""`orquestador history export --before DATE` as an operator runs it, into a real file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, text

from tests.integration.worker_support import (
    ORG,
    accept_transition,
    create_request,
    flow_definition,
    publish_flow,
)

ROOT = Path(__file__).resolve().parents[2]


def export(database, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ
    }
    environment["DATABASE_URL"] = database.runtime_dsn
    with out.open("w") as stdout:
        return subprocess.run(
            [sys.executable, "-m", "orquestador.cli", "history", "export", *args],
            cwd=ROOT,
            env=environment,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )


def test_export_writes_every_row_before_the_date_one_a_line(
    database, owner_engine: Engine, tmp_path: Path
) -> None:
    execution_id = accept_transition(
        owner_engine, create_request(owner_engine, publish_flow(owner_engine, flow_definition([])))
    )
    with owner_engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_event"))
        conn.execute(
            text(
                "INSERT INTO audit_event (org_id, kind, execution_id, detail, created_at)"
                " VALUES (:org, 'OLD', :id, '{\"n\": 1, \"é\": \"ü\"}', '2026-01-10T12:00:00Z'),"
                " (:org, 'EDGE', NULL, '{}', '2026-02-01T00:00:00Z'),"
                " (:org, 'NEW', :id, '{}', '2026-02-03T00:00:00Z')"
            ),
            {"org": ORG, "id": execution_id},
        )
        conn.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " VALUES (:id, 'a', 'FAILED', 2, 1, 'h', :key, 'READ_ONLY', 'test.read', 1)"
            ),
            {"id": execution_id, "key": f"{execution_id}:a"},
        )
        conn.execute(
            text(
                "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                " status, error_code, message, started_at, finished_at) VALUES"
                " (:id, 'a', 1, 1, 'FAILED', 'E', 'timed out', '2026-01-20T00:00:00Z', NULL),"
                " (:id, 'a', 2, 1, 'FAILED', 'E', NULL, '2026-03-01T00:00:00Z', NULL)"
            ),
            {"id": execution_id},
        )
    out = tmp_path / "history.jsonl"

    done = export(database, out, "--before", "2026-02-01")

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(line["table"], line.get("kind")) for line in lines] == [
        ("audit_event", "OLD"),
        ("action_attempt", None),
    ]
    audit, attempt = lines
    assert audit["detail"] == {"n": 1, "é": "ü"} and audit["execution_id"] == str(execution_id)
    assert audit["created_at"] == "2026-01-10T12:00:00+00:00"
    assert attempt == {
        "table": "action_attempt",
        "execution_id": str(execution_id),
        "action_id": "a",
        "attempt": 1,
        "fencing_token": 1,
        "status": "FAILED",
        "error_code": "E",
        "message": "timed out",
        "started_at": "2026-01-20T00:00:00+00:00",
        "finished_at": None,
    }
    assert "audit_event: 1 rows, action_attempt: 1 rows" in done.stderr

    # An offset moves the bound: the row at midnight UTC is before 01:00+00:00.
    later = export(database, out, "--before", "2026-02-01T01:00:00+00:00")
    assert later.returncode == 0, later.stderr
    assert [json.loads(line)["kind"] for line in out.read_text().splitlines()[:2]] == [
        "OLD",
        "EDGE",
    ]


def test_a_bad_date_exits_2_and_writes_nothing(database, tmp_path: Path) -> None:
    out = tmp_path / "history.jsonl"
    for bad in ("2026-13-01", "yesterday", "2026-02-01T10:00"):
        refused = export(database, out, "--before", bad)
        assert refused.returncode == 2, bad
        assert "--before" in refused.stderr and bad in refused.stderr
        assert out.read_text() == ""

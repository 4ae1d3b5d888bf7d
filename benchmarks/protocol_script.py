"""The worker's protocol in pure SQL, generated from the statements the worker runs.

`script()` is a pgbench script that runs, per execution, the statements a worker
runs for a one-action transition, with the same transaction boundaries, on the
product's schema (`baseline_setup.sql` fills a database migrated the usual way).
The SQL is taken from the `text()` constants in `orquestador.queue` when the
benchmark runs, so it cannot drift from what the worker sends; only the bind
parameters are mapped to pgbench variables (`\\gset` after the claim, `-D` for the
values that are the same for every execution).

    python benchmarks/protocol_script.py          # print the script and its -D values
    python benchmarks/protocol_script.py --write  # refresh baseline_protocol.pgb
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from sqlalchemy import TextClause

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orquestador.queue import checkpoints, claims, outcomes  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT_FILE = HERE / "baseline_protocol.pgb"

ACTION_ID = "a0"

# Bind parameters that take their value from the claim's RETURNING (`\gset c_`). The
# external key is "<execution id>:<action id>" in the worker; pgbench cannot join
# strings, so the execution id itself stands in (as unique: one action per execution).
FROM_CLAIM = {
    "execution_id": "c_id",
    "token": "c_fencing_token",
    "request_id": "c_request_id",
    "external_key": "c_id",
}

# The same for every execution: what the worker would send for the benchmark's flow.
CONSTANTS: dict[str, object] = {
    "owner": "bench-baseline",
    "limit": 1,
    "lease_seconds": 60.0,
    "weights": {},
    "action_id": ACTION_ID,
    "attempt": 1,
    "input_hash": "0" * 64,
    "effect": "IDEMPOTENT_WRITE",
    "capability": "bench.noop",
    "adapter_version": 1,
    "output": {"ok": True},
    # A safe step writes no RUNNING checkpoint: its start comes with its success. The
    # value does not matter to the cost; the worker sends the database's time then.
    "started_at": "2026-01-01T00:00:00+00:00",
    "actor": outcomes.WORKER_ACTOR,
    "data": {},
    "state": "done",
    "detail": {
        "actionIds": [ACTION_ID],
        "hitPolicy": None,
        "ruleIds": [],
        "toState": "done",
        "outcome": None,
    },
    "result": {"outcome": None, "toState": "done", "ruleIds": [], "hitPolicy": None},
}

_BIND = re.compile(r"(?<![:\w]):(\w+)")


def flow_definition(actions: int = 1) -> dict[str, object]:
    """The benchmark flow: `actions` no-op actions a0, a1, ...; one for `baseline_setup.sql`."""
    return {
        "key": f"bench-{actions}",
        "trigger": "manual",
        "dataSchema": {"type": "object"},
        "initialState": "new",
        "states": ["new", "done"],
        "transitions": [
            {
                "id": "go",
                "from": ["new"],
                "to": "done",
                "actions": [
                    {
                        "id": f"a{i}",
                        "capability": "bench.noop",
                        "version": 1,
                        "input": {"n": {"const": i}},
                    }
                    for i in range(actions)
                ],
            }
        ],
    }


def sql(clause: TextClause) -> str:
    """The statement's text on one line, comments dropped, binds named as pgbench variables."""
    lines = [re.sub(r"--.*$", "", line) for line in clause.text.splitlines()]
    flat = " ".join(" ".join(lines).split())
    return _BIND.sub(lambda m: ":" + FROM_CLAIM.get(m.group(1), m.group(1)), flat)


def steps() -> list[tuple[str, list[str]]]:
    """Per execution, in order: (what, commands). Mirrors `orquestador/worker/executor.py`
    for a first attempt, whose claim also reads what the separate load would. The
    benchmark's step is an idempotent write with nothing riding before it: it writes no
    RUNNING checkpoint (SPEC 28), and its whole attempt rides in the finish's
    transaction, written before the finish's checks."""
    return [
        (
            "claim, batch 1, returning the loaded execution (autocommit; queue/claims.py)",
            [sql(claims._CLAIM), "\\gset c_"],
        ),
        ("(no RUNNING checkpoint; the adapter is a no-op)", []),
        (
            "finish, one transaction (queue/outcomes.py): BEGIN, lock request, lock execution, "
            "the step's whole attempt SUCCEEDED (queue/checkpoints.py) and complete in one "
            "round trip, then COMMIT",
            [
                "\\startpipeline",
                "BEGIN;",
                sql(outcomes._LOCK_REQUEST) + ";",
                sql(outcomes._LOCK_EXECUTION) + ";",
                sql(checkpoints._RECORD_SUCCESS) + ";",
                sql(outcomes._COMPLETE) + ";",
                "\\endpipeline",
                "COMMIT;",
            ],
        ),
    ]


def script() -> str:
    out = [
        "-- The worker's one-action transition in pure SQL, generated by",
        "-- benchmarks/protocol_script.py from the statements in orquestador/queue.",
        "-- Variables: the claim's RETURNING (\\gset c_) and pgbench -D, see variables().",
    ]
    for what, commands in steps():
        out.append(f"-- {what}")
        out.extend(commands)
    return "\n".join(out) + "\n"


def variables() -> dict[str, str]:
    """The `-D name=value` pairs; JSON values as their text."""
    return {
        name: value if isinstance(value, str) else json.dumps(value)
        for name, value in CONSTANTS.items()
    }


def pgbench_defines() -> list[str]:
    return [arg for name, value in variables().items() for arg in ("-D", f"{name}={value}")]


def main() -> int:
    text = script()
    if "--write" in sys.argv[1:]:
        SCRIPT_FILE.write_text(text)
        return 0
    sys.stdout.write(text)
    for name, value in variables().items():
        print(f"-- -D {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

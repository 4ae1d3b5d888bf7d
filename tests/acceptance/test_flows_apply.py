"""`orquestador flows apply DIR`: a folder of real files made the published flows, idempotently."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orquestador.api.tokens import mint_token
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.api_support import DECOMMISSION

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "flows-apply-test-secret-" + "0123456789abcdef" * 3
ORG = "acme"


@pytest.fixture
def env(database: TestDatabase) -> Iterator[dict[str, str]]:
    with served_api(database, SECRET) as (url, configured):
        token = mint_token(configured, sub="author", org=ORG, scopes=["flows:admin"])
        yield {"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}


def _apply(folder: Path, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "flows", "apply", str(folder), *extra],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def _write(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")


def _ids(engine: Engine) -> dict[tuple[str, int], str]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT key, version, id FROM flow WHERE org_id = :org"), {"org": ORG}
        )
        return {(row.key, row.version): str(row.id) for row in rows}


def _versions(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT key, version FROM flow WHERE org_id = :org ORDER BY key, version"),
            {"org": ORG},
        )
        return [(row.key, row.version) for row in rows]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "flows"
    _write(folder / "decommission.json", DECOMMISSION)
    _write(folder / "review" / "disk.json", {**DECOMMISSION, "key": "disk-review"})
    # The cases of `flows test` live beside their flow and are no flow.
    _write(folder / "decommission.cases.json", {"cases": []})
    return folder


def test_a_folder_is_published_once_and_a_second_apply_changes_nothing(
    tmp_path: Path, env: dict[str, str], runtime_engine: Engine
) -> None:
    folder = _folder(tmp_path)

    first = _apply(folder, env=env)
    second = _apply(folder, env=env)

    ids = _ids(runtime_engine)
    assert first.returncode == 0, first.stderr
    # Each line names what was published, and its id to start it or bind it by.
    assert first.stdout.splitlines() == [
        f"created      decommission v1  {folder / 'decommission.json'}"
        f"  id {ids['decommission', 1]}",
        f"created      disk-review v1  {folder / 'review' / 'disk.json'}"
        f"  id {ids['disk-review', 1]}",
        "2 flows: 2 created, 0 unchanged",
    ]
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0] == (
        f"unchanged    decommission v1  {folder / 'decommission.json'}  id {ids['decommission', 1]}"
    )
    assert second.stdout.splitlines()[-1] == "2 flows: 0 created, 2 unchanged"
    assert _versions(runtime_engine) == [("decommission", 1), ("disk-review", 1)]


def test_only_a_changed_file_becomes_a_version_and_layout_is_no_change(
    tmp_path: Path, env: dict[str, str], runtime_engine: Engine
) -> None:
    folder = _folder(tmp_path)
    assert _apply(folder, env=env).returncode == 0
    # Another key order and spacing is the same flow; a new state is not.
    relaid = dict(reversed(list(DECOMMISSION.items())))
    (folder / "decommission.json").write_text(json.dumps(relaid), encoding="utf-8")
    changed = copy.deepcopy(DECOMMISSION)
    changed["key"] = "disk-review"
    changed["transitions"][0]["actions"][1]["input"]["deadlineSeconds"]["const"] = 60
    _write(folder / "review" / "disk.json", changed)

    planned = _apply(folder, "--dry-run", env=env)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.splitlines()[1] == (
        f"would create disk-review v2  {folder / 'review' / 'disk.json'}"
    )
    assert planned.stdout.splitlines()[-1] == "2 flows: 1 to create, 1 unchanged"
    assert _versions(runtime_engine) == [("decommission", 1), ("disk-review", 1)]

    applied = _apply(folder, "--json", env=env)
    assert applied.returncode == 0, applied.stderr
    flows = json.loads(applied.stdout)["flows"]
    assert [(f["key"], f["action"], f["version"]) for f in flows] == [
        ("decommission", "unchanged", 1),
        ("disk-review", "create", 2),
    ]
    assert _versions(runtime_engine) == [
        ("decommission", 1),
        ("disk-review", 1),
        ("disk-review", 2),
    ]


def test_a_file_publishing_refuses_is_reported_and_the_others_are_applied(
    tmp_path: Path, env: dict[str, str], runtime_engine: Engine
) -> None:
    folder = _folder(tmp_path)
    _write(folder / "broken.json", {**DECOMMISSION, "key": "broken", "initialState": "nowhere"})

    run = _apply(folder, env=env)

    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert f"refused      broken  {folder / 'broken.json'}" in lines
    assert "  problem: /initialState: unknown state 'nowhere'" in lines
    assert lines[-1] == "3 flows: 2 created, 0 unchanged, 1 refused"
    assert _versions(runtime_engine) == [("decommission", 1), ("disk-review", 1)]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", 'not a flow definition: no "key"'),
        (json.dumps({**DECOMMISSION}), "the key 'decommission' is"),
    ],
    ids=["not-json", "no-key", "same-key-twice"],
)
def test_a_folder_with_a_file_that_is_no_flow_publishes_nothing(
    tmp_path: Path, env: dict[str, str], runtime_engine: Engine, content: str, said: str
) -> None:
    folder = _folder(tmp_path)
    (folder / "zz-odd.json").write_text(content, encoding="utf-8")

    run = _apply(folder, env=env)

    assert run.returncode == 2
    assert f"orquestador: {folder / 'zz-odd.json'}: {said}" in run.stderr
    assert "Traceback" not in run.stderr
    assert _versions(runtime_engine) == []


def test_a_token_without_flows_admin_stops_at_the_first_call(
    tmp_path: Path, database: TestDatabase, runtime_engine: Engine
) -> None:
    with served_api(database, SECRET) as (url, configured):
        token = mint_token(configured, sub="author", org=ORG, scopes=["requests:read"])
        run = _apply(
            _folder(tmp_path), env={"ORQUESTADOR_API_URL": url, "ORQUESTADOR_TOKEN": token}
        )

    assert run.returncode == 1
    assert run.stderr.startswith("orquestador: refused (403 ")
    assert run.stdout == ""
    assert _versions(runtime_engine) == []

"""Every example in README.md and docs/ works as printed, or says in the document why it is not run.

The roles a block can have are listed in `tests/acceptance/docs_examples.py`. Shell
examples run against a real `orquestador dev` of the document's own, on a fresh test
database, with the adapter modules the document declares, and with curl wrapped by a
recorder so that the answers a document shows can be compared with the answers the
server gave.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from orquestador.actions import load_registry
from orquestador.authoring.cases import parse_cases
from orquestador.config import Settings
from orquestador.db.engine import make_engine
from orquestador.domain.decision import evaluate, result_as_json
from tests.acceptance.docs_examples import (
    ROOT,
    Block,
    Matcher,
    Response,
    adapter_file_problem,
    adapter_modules,
    declares_trace_collector,
    documents,
    integrations_environment,
    integrations_file,
    machine_agent,
    parse_json,
    read_blocks,
    unaccounted,
)
from tests.db_support import TestDatabase
from tests.integration.route_provider import RouteProvider
from tests.trace_support import OtlpReceiver, trace_tree

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
BLOCKS = {document: read_blocks(document) for document in documents()}
ALL_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks]

# Behaves as curl and keeps each answer: the headers (-D) and what curl printed, in
# calls/<block>/<n>/, n counting the block's calls. mkdir claims n, so that calls a
# block runs at the same time (`curl ... &`) each keep their own answer.
CURL_RECORDER = """#!/usr/bin/env bash
set -u
calls="$DOCS_TEST_RECORD/calls/$DOCS_TEST_BLOCK"
mkdir -p "$calls"
n=1
until mkdir "$calls/$n" 2>/dev/null; do n=$((n + 1)); done
"$DOCS_TEST_CURL" -D "$calls/$n/headers" "$@" | tee "$calls/$n/body"
exit "${PIPESTATUS[0]}"
"""


def _with_role(*kinds: tuple[str, str | None]) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.runs and block.kind in kinds]


def _ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


# --- the convention itself -------------------------------------------------------------


def test_every_block_is_run_or_says_why_not() -> None:
    problems = [problem for block in ALL_BLOCKS if (problem := unaccounted(block))]
    assert not problems, "\n".join(problems)


def test_an_unmarked_block_is_reported_and_a_marked_one_is_not() -> None:
    document = ROOT / "docs" / "EXAMPLE.md"
    blocks = read_blocks(
        document,
        "```json\n{}\n```\n\n<!-- not run: needs a machine -->\n\n```json\n{}\n```\n"
        "```json output\n{}\n```\n````text\n```\n````\n"
        '```sh\npip install .\n```\n```sh run\ncurl "$API/readyz"\n```\n',
    )

    assert [(b.line, b.not_run) for b in blocks] == [
        (1, None),
        (7, "needs a machine"),
        (10, None),
        (13, None),
        (16, None),
        (19, None),
    ]
    assert [unaccounted(b) is None for b in blocks] == [False, True, True, True, False, True]
    assert blocks[3].text == "```\n"
    assert [b.runs for b in blocks[4:]] == [False, True]


def test_a_document_declares_its_adapter_modules_by_file_name() -> None:
    blocks = read_blocks(
        ROOT / "docs" / "EXAMPLE.md",
        "```python adapter file=acme.py\n```\n```python adapter\n```\n"
        "<!-- not run: an old version -->\n```python adapter file=old.py\n```\n"
        "```python adapter file=not-a-module.py\n```\n",
    )

    assert adapter_modules(blocks) == ["acme"]
    assert [adapter_file_problem(b) is None for b in blocks] == [True, True, True, False]


@pytest.mark.parametrize(
    "block",
    [b for b in ALL_BLOCKS if b.kind == ("python", "adapter") and "file" in b.attributes],
    ids=_ids([b for b in ALL_BLOCKS if b.kind == ("python", "adapter") and "file" in b.attributes]),
)
def test_adapter_files_are_modules_a_server_can_import(block: Block) -> None:
    assert adapter_file_problem(block) is None, adapter_file_problem(block)


def test_a_document_declares_its_integrations_file_by_a_comment() -> None:
    document = ROOT / "docs" / "EXAMPLE.md"
    marked = "text\n<!-- integrations file: docs/examples/integrations.toml -->\n"

    assert integrations_file(document, marked) == ROOT / "docs/examples/integrations.toml"
    assert integrations_file(document, "<!-- integrations file: /etc/x.toml -->\n") is None
    assert integrations_environment(
        'url = "${BILLING_URL}/v1"\nheaders = { A = "${BILLING_TOKEN}", B = "${BILLING_URL}" }',
        "http://127.0.0.1:9",
    ) == {"BILLING_TOKEN": "docs-secret", "BILLING_URL": "http://127.0.0.1:9"}


@pytest.mark.parametrize(
    "document",
    [d for d in BLOCKS if integrations_file(d)],
    ids=[str(d.relative_to(ROOT)) for d in BLOCKS if integrations_file(d)],
)
def test_a_declared_integrations_file_exists(document: Path) -> None:
    assert integrations_file(document).is_file(), integrations_file(document)


def test_a_document_declares_its_machine_agent_by_a_comment() -> None:
    document = ROOT / "docs" / "EXAMPLE.md"
    marked = "text\n<!-- machine agent: m-1 commands file: agent-commands.toml -->\n"

    assert machine_agent(document, marked) == ("m-1", "agent-commands.toml")
    assert machine_agent(document, "<!-- machine agent: m-1 commands file: /etc/x.toml -->") is None


@pytest.mark.parametrize(
    "document",
    [d for d in BLOCKS if machine_agent(d)],
    ids=[str(d.relative_to(ROOT)) for d in BLOCKS if machine_agent(d)],
)
def test_a_declared_agent_commands_file_is_a_saved_block(document: Path) -> None:
    _, name = machine_agent(document)
    assert any(block.attributes.get("file") == name for block in ALL_BLOCKS), name


def test_the_matcher_binds_elided_ids_and_accepts_any_timestamp() -> None:
    matcher = Matcher()
    sample = {"id": "0b6c…", "at": "2030-01-01T00:00:00Z", "items": [1]}
    actual = {"id": "f-1", "at": "2026-12-01T00:21:54.07Z", "items": [1], "more": 0}

    assert matcher.value(sample, actual, "") is None
    assert matcher.value("/api/v1/flows/0b6c…", "/api/v1/flows/f-1", "") is None
    assert matcher.value("/api/v1/flows/0b6c…", "/api/v1/flows/f-2", "") is not None
    assert matcher.value({"items": [1]}, {"items": [1, 2]}, "") is not None
    assert matcher.value(1, True, "") is not None


# --- blocks that need no server ---------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [b for b in ALL_BLOCKS if b.language == "json"],
    ids=_ids([b for b in ALL_BLOCKS if b.language == "json"]),
)
def test_json_blocks_parse(block: Block) -> None:
    parse_json(block)


@pytest.mark.parametrize(
    "block",
    _with_role(("json", "cases")),
    ids=_ids(_with_role(("json", "cases"))),
)
def test_cases_blocks_are_of_the_cases_format(block: Block) -> None:
    parse_cases(parse_json(block))


@pytest.mark.parametrize(
    "example", sorted((ROOT / "docs" / "examples").glob("*.toml")), ids=lambda p: p.name
)
def test_integration_files_load(example: Path) -> None:
    """An example INTEGRATIONS_FILE passes the product's own check, its ${NAME}s set."""
    from orquestador.integrations.routes import route_file_problems

    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", example.read_text()))
    environ = {n: "https://provider.example" if n.endswith("_URL") else "set" for n in names}
    routes, problems = route_file_problems(example, environ, lease_seconds=60)
    assert problems == []
    assert routes


@dataclass
class DecisionExample:
    table: Block
    context: Block
    result: Block | None


def _decision_examples() -> list[DecisionExample]:
    examples = []
    for blocks in BLOCKS.values():
        context = None
        for position, block in enumerate(blocks):
            if not block.runs:
                continue
            if block.role == "context":
                context = block
            elif block.role == "decision":
                assert context is not None, f"{block.where}: no json context block before it"
                after = [b for b in blocks[position + 1 :] if b.runs]
                result = after[0] if after and after[0].role == "result" else None
                examples.append(DecisionExample(block, context, result))
    return examples


@pytest.mark.parametrize(
    "example",
    _decision_examples(),
    ids=[example.table.where for example in _decision_examples()],
)
def test_decision_tables_give_the_results_printed(example: DecisionExample) -> None:
    result = result_as_json(evaluate(parse_json(example.table), parse_json(example.context)))

    if example.result is not None:
        assert result == parse_json(example.result), example.result.where


@pytest.mark.parametrize(
    "block", _with_role(("python", "adapter")), ids=_ids(_with_role(("python", "adapter")))
)
def test_adapter_modules_load(block: Block, tmp_path: Path, monkeypatch) -> None:
    name = f"docs_adapter_{block.line}"
    (tmp_path / f"{name}.py").write_text(block.text, "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    built_in = len(load_registry(Settings.from_env({})).adapters())
    try:
        registry = load_registry(Settings.from_env({}, adapter_modules=name))
    finally:
        sys.modules.pop(name, None)

    assert len(registry.adapters()) > built_in


@pytest.mark.parametrize(
    "block", _with_role(("sql", "query")), ids=_ids(_with_role(("sql", "query")))
)
def test_sql_queries_run_as_the_owner(block: Block, database: TestDatabase) -> None:
    engine = make_engine(database.owner_dsn)
    try:
        with engine.connect() as connection:
            for statement in filter(str.strip, re.split(r";\s*(?:\n|$)", block.text)):
                names = set(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", statement))
                connection.execute(text(statement), {name: uuid.uuid4() for name in names})
    finally:
        engine.dispose()


# --- shell examples against a running `orquestador dev` ---------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _base_environment() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "ORQUESTADOR_EMBEDDED_PG_USER")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    # `orquestador` as a reader has it: the console script next to this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@dataclass
class DevServer:
    folder: Path
    api: str
    token: str
    output: list[str]


@contextmanager
def _running_dev(
    database: TestDatabase, folder: Path, settings: dict[str, str]
) -> Iterator[DevServer]:
    """`orquestador dev` on the test database, in `folder`; API and token from its banner."""
    env = _base_environment()
    env.update(
        DATABASE_URL=database.runtime_dsn,
        MIGRATION_DATABASE_URL=database.owner_dsn,
        API_PORT=str(_free_port()),
        **settings,
    )
    process = subprocess.Popen(
        [*ORQUESTADOR, "dev"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    banner: dict[str, str] = {}
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            found = re.match(r"^\s+(API|token):\s+(\S+)\s*$", line)
            if found:
                banner[found[1]] = found[2]
            if "API" in banner and "token" in banner:
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(90)
        if "API" not in banner or "token" not in banner:
            pytest.fail("orquestador dev printed no API and token lines:\n" + "".join(output))
        yield DevServer(folder, banner["API"], banner["token"], output)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        reader.join(10)
    assert process.returncode == 0, "".join(output)


@contextmanager
def _running_agent(server: DevServer, machine: str, commands_file: str) -> Iterator[None]:
    """`orquestador agent` for `machine`, with a token minted as a reader mints it."""
    from orquestador.dev import DEV_ORG

    env = _base_environment()
    minted = subprocess.run(
        [*ORQUESTADOR, "token", "--machine", machine, "--org", DEV_ORG],
        cwd=server.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert minted.returncode == 0, minted.stderr
    env.update(
        ORQUESTADOR_API_URL=server.api,
        ORQUESTADOR_TOKEN=minted.stdout.strip(),
        AGENT_COMMANDS_FILE=commands_file,
    )
    log = server.folder / f"agent-{machine}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [*ORQUESTADOR, "agent"],
            cwd=server.folder,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, log.read_text()


def _dev_settings(document: Path) -> dict[str, str]:
    """How a reader starts the document's server: with the adapter modules it declares."""
    modules = adapter_modules(BLOCKS[document])
    return {"ADAPTER_MODULES": ",".join(modules), "PYTHONPATH": "."} if modules else {}


def _write_files(folder: Path) -> None:
    for block in ALL_BLOCKS:
        if "file" in block.attributes:
            saved = folder / block.attributes["file"]
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(block.text, "utf-8")


def _post_json(url: str, token: str, body: object) -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _server_documents() -> list[Path]:
    return [
        document
        for document, blocks in BLOCKS.items()
        if any(b.runs and b.kind in {("sh", "run"), ("json", "flow")} for b in blocks)
    ]


@pytest.mark.parametrize(
    "document", _server_documents(), ids=[str(d.relative_to(ROOT)) for d in _server_documents()]
)
def test_examples_run_against_a_dev_server(
    document: Path, database: TestDatabase, tmp_path: Path
) -> None:
    folder = tmp_path / "reader"
    folder.mkdir()
    _write_files(folder)
    blocks = [block for block in BLOCKS[document] if block.runs]
    settings = _dev_settings(document)
    with ExitStack() as stack:
        routes = integrations_file(document)
        shared: dict[str, str] = {}
        if routes is not None:
            # The provider double first, so the routes' ${NAME}_URLs point at it.
            provider = stack.enter_context(RouteProvider().serve())
            shutil.copyfile(routes, folder / routes.name)
            shared = integrations_environment(routes.read_text("utf-8"), provider.url)
            settings = {**settings, "INTEGRATIONS_FILE": routes.name, **shared}
        collector = None
        if declares_trace_collector(document):
            # Before the server, so that it is still there when the server exports at exit.
            collector = stack.enter_context(OtlpReceiver().serve())
            settings = {**settings, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        server = stack.enter_context(_running_dev(database, folder, settings))
        agent = machine_agent(document)
        if agent is not None:
            # Entered after the server, so it stops first, as a reader stops it.
            stack.enter_context(_running_agent(server, *agent))
        _publish_flows(blocks, server)
        shell = [block for block in blocks if block.kind == ("sh", "run")]
        if not shell:
            return
        record = tmp_path / f"record-{document.stem}"
        _run_shell(shell, server, record, shared)
    problems = _compare_answers(blocks, shell, record, collector)
    assert not problems, "\n".join(problems)


def _publish_flows(blocks: list[Block], server: DevServer) -> None:
    flows = [block for block in blocks if block.kind == ("json", "flow")]
    if not flows:
        return
    # A caller of its own, so that what the shell examples publish starts at version 1.
    minted = subprocess.run(
        [*ORQUESTADOR, "token", "--sub", "docs", "--org", "docs-flows", "--scope", "flows:admin"],
        cwd=server.folder,
        env=_base_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert minted.returncode == 0, minted.stderr
    for block in flows:
        status, body = _post_json(f"{server.api}/flows", minted.stdout.strip(), parse_json(block))
        assert status == 201, f"{block.where}: publishing answered {status}: {body}"
        assert isinstance(body, dict) and "warnings" not in body, f"{block.where}: {body}"


def _run_shell(
    shell: list[Block], server: DevServer, record: Path, shared: dict[str, str] | None = None
) -> None:
    real_curl, jq = shutil.which("curl"), shutil.which("jq")
    assert real_curl and jq, "the shell examples use curl and jq; install both"
    (record / "bin").mkdir(parents=True)
    recorder = record / "bin" / "curl"
    recorder.write_text(CURL_RECORDER)
    recorder.chmod(0o755)
    lines = ["set -euo pipefail"]
    for index, block in enumerate(shell):
        lines += [
            f"export DOCS_TEST_BLOCK={index}",
            f"echo '== {block.where}' >&2",
            "{",
            block.text.rstrip("\n"),
            f'}} > "$DOCS_TEST_RECORD/{index}.out"',
        ]
    (record / "home").mkdir()
    env = _base_environment()
    env.update(
        # A home of their own, and no database server reachable by default.
        HOME=str(record / "home"),
        PGHOST=str(record / "no-database-server-here"),
        PATH=os.pathsep.join([str(record / "bin"), env["PATH"]]),
        API=server.api,
        TOKEN=server.token,
        DOCS_TEST_RECORD=str(record),
        DOCS_TEST_CURL=real_curl,
        **(shared or {}),
    )
    try:
        ran = subprocess.run(
            ["bash", "-c", "\n".join(lines) + "\n"],
            cwd=server.folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"the shell examples did not end within 180 s:\n{expired.stderr}{_server_tail(server)}"
        )
    if ran.returncode != 0:
        failed = ran.stderr.rsplit("== ", 1)[-1]
        pytest.fail(
            f"a shell example failed (exit {ran.returncode}) at {failed}{_server_tail(server)}"
        )


def _server_tail(server: DevServer) -> str:
    agents = "".join(
        f"\n{log.name}'s last lines:\n" + "\n".join(log.read_text().splitlines()[-10:])
        for log in sorted(server.folder.glob("agent-*.log"))
    )
    return "\nthe dev server's last lines:\n" + "".join(server.output[-20:]) + agents


def _compare_answers(
    blocks: list[Block], shell: list[Block], record: Path, collector: OtlpReceiver | None = None
) -> list[str]:
    matcher = Matcher()
    problems = []
    last_shell = None
    for block in blocks:
        if block.kind == ("sh", "run"):
            last_shell = shell.index(block)
            continue
        if block.kind not in {
            ("http", None),
            ("json", "output"),
            ("text", "output"),
            ("text", "trace"),
        }:
            continue
        if last_shell is None:
            problems.append(f"{block.where}: an answer with no shell block before it")
            continue
        if block.kind == ("text", "trace"):
            trace_id = (record / f"{last_shell}.out").read_text().strip()
            if collector is None:
                problem = "a trace, but the document declares no <!-- trace collector -->"
            else:
                lines = trace_tree([span for _, span in collector.spans()], trace_id)
                shown = block.text.rstrip("\n").splitlines()
                problem = None if lines == shown else f"the trace {trace_id} was {lines!r}"
        elif block.kind == ("text", "output"):
            lines = (record / f"{last_shell}.out").read_text().rstrip("\n").splitlines()
            shown = block.text.rstrip("\n").splitlines()
            problem = None if lines == shown else f"the shell block printed {lines!r}"
        elif block.kind == ("json", "output"):
            printed = (record / f"{last_shell}.out").read_text()
            try:
                actual = json.loads(printed)
            except ValueError:
                problems.append(f"{block.where}: the shell block printed no JSON: {printed!r}")
                continue
            problem = matcher.value(parse_json(block), actual, "output")
        else:
            calls = sorted(
                (call.parent for call in (record / "calls" / str(last_shell)).glob("*/headers")),
                key=lambda call: int(call.name),
            )
            if not calls:
                problems.append(f"{block.where}: the shell block before it made no curl call")
                continue
            actual_response = Response.from_curl(
                (calls[-1] / "headers").read_text(), (calls[-1] / "body").read_text()
            )
            problem = matcher.response(Response.from_sample(block.text), actual_response)
        if problem:
            problems.append(f"{block.where}: {problem}")
    return problems

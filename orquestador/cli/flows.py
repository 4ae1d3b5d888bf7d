"""`orquestador flows`: the published flows by key (`list`, `show`), a flow's transition as a
dry run, every path included; a flow file checked before it is published (`lint`, `test`),
a folder of them published (`apply`).

A client of the HTTP API like `orquestador executions`: it starts the dry run (scope
`flows:admin`), follows it to its end (`requests:read`), and prints where it ended and
what a real run would have done. `--outcomes` makes steps answer a decision, an error, a
passed deadline or a given output, so error exits and rejections can be tried without
anyone's help.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.output import (
    EXIT_USAGE,
    UsageProblem,
    json_argument,
    print_fields,
    print_json,
    print_table,
)
from orquestador.client import ApiError, Client
from orquestador.config import Settings
from orquestador.domain.statuses import UNFINISHED, ExecutionStatus
from orquestador.wording import counted

if TYPE_CHECKING:
    from orquestador.authoring.apply import Change

# Statuses a dry run still moves on from.


def add_flows_command(command: CommandFactory) -> None:
    """Register `flows` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "flows",
        "list, show and try published flows through the HTTP API (needs flows:admin, and "
        "requests:read to follow the dry run)",
    )
    listing = action(
        "list", "every published flow: its key, each version and its id, newest first", _list
    )
    listing.add_argument("--key", metavar="KEY", help="only the versions of this key")
    show = action(
        "show",
        "one flow: a key's latest version, or a version by its id; its states, transitions "
        "and other versions",
        _show,
    )
    show.add_argument("flow", metavar="KEY|ID", help="a flow key (its latest version) or id")
    dry_run = action(
        "dry-run",
        "run a transition of a published flow as a dry run, nothing sent, and wait for its end",
        _dry_run,
    )
    dry_run.add_argument(
        "flow", metavar="KEY|ID", help="a flow key (its latest version) or a version's id"
    )
    dry_run.add_argument("--transition", required=True, help="the transition to run")
    dry_run.add_argument(
        "--data", required=True, metavar="JSON", help="the request's data (JSON, or @FILE)"
    )
    dry_run.add_argument("--state", help="the state to start in (default: initialState)")
    dry_run.add_argument(
        "--outcomes",
        metavar="JSON",
        help="per action id, the answer its step gives (JSON, or @FILE), e.g. "
        '\'{"ok": {"decision": "rejected"}}\'; also {"error": "CODE"}, {"deadline": true} '
        'and {"output": {...}}',
    )
    lint = action(
        "lint",
        "check a flow file without publishing it: what publishing refuses or warns about, "
        "states nothing reaches, transitions that can never run",
        _lint,
        epilog="Exit status: 0 clean, 1 findings (one line each: file, JSON path, what), "
        "2 the file cannot be read. Needs no server: capabilities are not checked.",
    )
    lint.add_argument("file", metavar="FLOW.json", help="the flow definition file")
    apply = action(
        "apply",
        "publish every flow file of a folder whose content differs from its key's latest "
        "version; leave the rest",
        _apply,
    )
    apply.add_argument(
        "folder",
        metavar="DIR",
        help="the folder: every *.json under it is a flow file, but *.cases.json",
    )
    apply.add_argument(
        "--dry-run", action="store_true", help="say what would be published, publish nothing"
    )
    test = action(
        "test",
        "play a flow file's cases on a throwaway engine, each a dry run checked against "
        "what it expects",
        _test,
        epilog="Exit status: 0 every case passed, 1 a case failed (each is named) or the "
        "flow cannot be published, 2 a file cannot be read or is not of its format. The "
        "engine runs on an embedded PostgreSQL in a temporary folder, or, when "
        "DATABASE_URL is set, on a new database of that server, dropped afterwards; the "
        "adapters and integrations are the ones the settings configure.",
    )
    test.add_argument("file", metavar="FLOW.json", help="the flow definition file")
    test.add_argument(
        "--cases", required=True, metavar="CASES.json", help="the cases to play (JSON)"
    )
    test.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report there")
    test.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a case may take to end (default: 30)",
    )
    dry_run.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the end (default: 60)",
    )


class _Unreadable(Exception):
    """A file the command cannot read (exit 2); the message says which and why."""


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Unreadable(f"{path}: cannot be read ({exc.__class__.__name__})") from None


def _lint(args: argparse.Namespace) -> int:
    """Every finding in the flow file, one line each: exit 1 when there is one."""
    from orquestador.domain.json_text import parse_json
    from orquestador.domain.lint import lint_definition

    path = Path(args.file)
    try:
        text = _read_text(path)
    except _Unreadable as problem:
        print(f"orquestador: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        definition = parse_json(text)
    except ValueError as exc:
        print(f"{path}: not JSON: {exc}")
        return 1
    findings = lint_definition(definition)
    for finding in findings:
        print(f"{path}: {finding.path or '/'}: {finding.message}")
    if not findings:
        # Silence would leave a person wondering whether anything was checked.
        print(f"{path}: ok: no findings")
    return 1 if findings else 0


def _test(args: argparse.Namespace) -> int:
    """Every case played; one line each, then the count: exit 1 when one failed."""
    from orquestador.authoring.cases import CasesInvalid, parse_cases
    from orquestador.authoring.junit import write_junit
    from orquestador.authoring.rehearsal_engine import rehearsal_engine

    flow_path, cases_path = Path(args.file), Path(args.cases)
    try:
        definition = _json_file(flow_path)
        cases = parse_cases(_json_file(cases_path))
    except _Unreadable as problem:
        print(f"orquestador: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except CasesInvalid as problem:
        for line in str(problem).splitlines():
            print(f"orquestador: {cases_path}: {line}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings.from_env()
    with rehearsal_engine(settings) as engine:
        flow_id, refused = engine.publish(definition)
        if flow_id is None:
            print(f"{flow_path}: cannot be published:")
            for line in refused:
                print(f"  {line}")
            return 1
        played = engine.play(flow_id, cases, args.timeout)
    for run in played:
        if run.passed:
            print(f"PASS  {run.case.name}")
        else:
            ended = f" (it ended {run.ended.said()})" if run.ended is not None else ""
            print(f"FAIL  {run.case.name}: {'; '.join(run.reasons)}{ended}")
    failed = [run.case.name for run in played if not run.passed]
    print(
        f"{counted(len(played), 'case')}: {len(played) - len(failed)} passed, {len(failed)} failed"
    )
    if args.junit:
        write_junit(Path(args.junit), flow_path.stem, played)
    return 1 if failed else 0


def _apply(client: Client, args: argparse.Namespace) -> int:
    """Each file's change on a line, then the count: exit 1 when publishing refused one."""
    from orquestador.authoring.apply import FolderInvalid, flow_files, plan

    try:
        files = flow_files(Path(args.folder))
    except FolderInvalid as problem:
        raise UsageProblem(str(problem).replace("\n", "\norquestador: ")) from None

    def latest(key: str) -> dict[str, Any] | None:
        versions = client.list_flows(key=key)["items"]
        return client.get_flow(versions[0]["id"]) if versions else None

    applied = []
    for change in plan(files, latest):
        row = _applied(client, change, dry_run=args.dry_run)
        applied.append(row)
        if not args.json:
            _print_applied(row, dry_run=args.dry_run)
    if args.json:
        print_json({"dryRun": args.dry_run, "flows": applied})
    else:
        counts = {action: sum(row["action"] == action for row in applied) for action in _SAID}
        said = {**_SAID, "create": "to create" if args.dry_run else "created"}
        print(
            f"{counted(len(applied), 'flow')}: "
            + ", ".join(
                f"{counts[action]} {said[action]}"
                for action in _SAID
                if counts[action] or action != "refused"
            )
        )
    return 1 if any(row["action"] == "refused" for row in applied) else 0


_SAID = {"create": "created", "unchanged": "unchanged", "refused": "refused"}


def _applied(client: Client, change: Change, *, dry_run: bool) -> dict[str, Any]:
    """The change made (unless `dry_run`), as `--json` prints it. Only a definition
    publishing refuses (422) is this file's refusal; any other answer stops the command."""
    row: dict[str, Any] = {
        "file": str(change.file.path),
        "key": change.file.key,
        "action": change.action,
        "version": change.version,
        "id": change.flow_id,
    }
    if change.action != "create" or dry_run:
        return row
    try:
        created = client.publish_flow(change.file.definition)
    except ApiError as refusal:
        if refusal.status != 422:
            raise
        return {**row, "action": "refused", "problems": (refusal.problem or {}).get("problems")}
    return {
        **row,
        "version": created["version"],
        "id": created["id"],
        "warnings": created.get("warnings") or [],
    }


def _print_applied(row: dict[str, Any], *, dry_run: bool) -> None:
    refused = row["action"] == "refused"
    said = "would create" if dry_run and row["action"] == "create" else _SAID[row["action"]]
    version = "" if refused else f" v{row['version']}"
    # The version's id, to start it or bind it by (none yet for one still to create).
    known = f"  id {row['id']}" if row.get("id") else ""
    print(f"{said:<12} {row['key']}{version}  {row['file']}{known}")
    for item in row.get("problems") or row.get("warnings") or []:
        kind = "problem" if refused else "warning"
        print(f"  {kind}: {item.get('path') or '/'}: {item.get('message')}")


def _json_file(path: Path) -> Any:
    from orquestador.domain.json_text import parse_json

    try:
        return parse_json(_read_text(path))
    except ValueError as exc:
        raise _Unreadable(f"{path}: not JSON: {exc}") from None


def _list(client: Client, args: argparse.Namespace) -> int:
    found = client.list_flows(key=args.key)
    if args.json:
        print_json(found)
        return 0
    items = found.get("items", [])
    if not items:
        print(f"no flow has the key {args.key}" if args.key else "no flows published")
        return 0
    print_table(
        ("KEY", "VERSION", "ID", "TRIGGER", "PUBLISHED"),
        [
            (item["key"], item["version"], item["id"], item["trigger"], item["createdAt"])
            for item in items
        ],
    )
    return 0


def _show(client: Client, args: argparse.Namespace) -> int:
    flow = client.get_flow(args.flow)
    if args.json:
        print_json(flow)
        return 0
    definition = flow.get("definition") or {}
    versions = client.list_flows(key=flow["key"]).get("items", [])
    newest = versions[0]["version"] if versions else flow["version"]
    print_fields(
        [
            ("flow", f"{flow['key']} v{flow['version']}"),
            ("id", flow["id"]),
            ("latest", "yes" if flow["version"] == newest else f"no: v{newest} is"),
            ("trigger", flow["trigger"]),
            ("initial state", definition.get("initialState")),
            ("states", ", ".join(definition.get("states") or [])),
            ("published", f"{flow['createdAt']} by {flow['createdBy']}"),
        ]
    )
    transitions = definition.get("transitions") or []
    if transitions:
        print()
        print_table(
            ("TRANSITION", "FROM", "TO", "ACTIONS"),
            [
                (
                    t.get("id"),
                    ", ".join(t.get("from") or []),
                    t.get("to") or ("the decision table's" if t.get("decision") else None),
                    ", ".join(
                        f"{a.get('id')} ({a.get('capability')})" for a in t.get("actions") or []
                    ),
                )
                for t in transitions
            ],
        )
    if len(versions) > 1:
        print("\nversions")
        for version in versions:
            print(f"  v{version['version']}  {version['id']}  {version['createdAt']}")
    starting = [
        t.get("id") for t in transitions if definition.get("initialState") in (t.get("from") or [])
    ]
    if starting:
        print(f"\nstart it: orquestador run {flow['key']} {starting[0]} --data JSON [--wait]")
    return 0


def _dry_run(client: Client, args: argparse.Namespace) -> int:
    accepted = client.start_dry_run(
        args.flow,
        args.transition,
        json_argument(args.data, "--data"),
        state=args.state,
        outcomes=None if args.outcomes is None else json_argument(args.outcomes, "--outcomes"),
    )
    execution_id = accepted["executionId"]
    give_up_at = time.monotonic() + args.timeout
    done: list[dict[str, Any]] = []
    while True:
        # The server holds each wait until the dry run ends (a dry run asks no approver);
        # a state that continues by itself is followed into its continuation.
        view = client.wait_execution(execution_id, max(0.0, give_up_at - time.monotonic()))
        done += view.get("wouldHaveDone") or []
        if view["status"] == ExecutionStatus.SUCCEEDED and view.get("continuedBy"):
            execution_id = view["continuedBy"]
            continue
        break
    if view["status"] in UNFINISHED:
        raise UsageProblem(
            f"the dry run {execution_id} is still {view['status']} after {args.timeout:g} s;"
            f" 'orquestador executions wait {execution_id}' follows it"
        )
    if args.json:
        print_json(view)
        return 0
    print_fields(
        [
            ("dry run", accepted["executionId"]),
            ("status", view["status"]),
            ("to state", view.get("toState")),
            ("error", view.get("errorCode")),
        ]
    )
    if done:
        print()
        print_table(
            ("ACTION", "CAPABILITY", "WOULD HAVE"),
            [(item["actionId"], item["capability"], item["summary"]) for item in done],
        )
    return 0

"""`orquestador schedules`: put, show, list and delete schedules over the HTTP API.

A client of the API like `orquestador executions` (the same settings, the same exit
status: 0 done, 1 refused by the server with its problem printed, 2 usage or
configuration).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orquestador.config import Settings
from orquestador.domain.schedule_times import CATCH_UP_POLICIES
from orquestador.executions_cli import (
    CLIENT_SETTINGS,
    EXIT_REFUSED,
    EXIT_USAGE,
    ApiClient,
    Refused,
    UsageProblem,
)

CommandFactory = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]


def add_schedules_command(command: CommandFactory) -> None:
    """Register `schedules` and its actions with the main parser's command factory."""
    parser = command(
        "schedules",
        "put, show, list and delete schedules through the HTTP API (needs plans:admin)",
        CLIENT_SETTINGS,
    )
    actions = parser.add_subparsers(title="actions", required=True, metavar="ACTION")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument(
        "--json", action="store_true", help="print the API's JSON answer, for scripts"
    )

    def action(name: str, summary: str, run: Callable[..., int]) -> argparse.ArgumentParser:
        sub = actions.add_parser(
            name,
            parents=[output],
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog="Exit status: 0 done, 1 refused by the server (its problem is printed), "
            "2 usage or configuration. Settings: see 'orquestador schedules --help'.",
        )
        sub.set_defaults(handler=functools.partial(_run, run))
        return sub

    put = action("put", "create a schedule, or replace it whole", _put)
    put.add_argument("schedule", metavar="ID", help="your id for the schedule")
    put.add_argument("--flow", required=True, metavar="ID", help="a flow with trigger schedule")
    when = put.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='five fields, e.g. "30 2 * * *"')
    when.add_argument("--every", type=int, metavar="SECONDS", help="a fire every N seconds")
    put.add_argument("--timezone", default="UTC", help="an IANA time zone (default: UTC)")
    put.add_argument("--data", metavar="JSON", help="passed to each fire (JSON, or @FILE)")
    put.add_argument(
        "--catch-up",
        choices=CATCH_UP_POLICIES,
        default="skip",
        help="after downtime: skip the late fire times, start one, or all (default: skip)",
    )
    put.add_argument("--paused", action="store_true", help="put it paused: it never fires")

    show = action("show", "one schedule and where its firing stands", _show)
    show.add_argument("schedule", metavar="ID")

    action("list", "the organization's schedules", _list)

    delete = action("delete", "delete a schedule (what it started stays)", _delete)
    delete.add_argument("schedule", metavar="ID")


def _run(action: Callable[[ApiClient, argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        client = ApiClient.from_settings(Settings.from_env())
        return action(client, args)
    except UsageProblem as problem:
        print(f"orquestador: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as refused:
        _print_refusal(refused, as_json=args.json)
        return EXIT_REFUSED


def _path(schedule_id: str) -> str:
    # An id is one path segment, whatever it contains.
    return f"/schedules/{quote(schedule_id, safe='')}"


def _put(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "flowId": args.flow,
        "timezone": args.timezone,
        "catchUp": args.catch_up,
        "paused": args.paused,
    }
    if args.cron is not None:
        body["cron"] = args.cron
    else:
        body["everySeconds"] = args.every
    if args.data is not None:
        body["data"] = _json_argument(args.data, "--data")
    _print_schedule(client.put(_path(args.schedule), body), as_json=args.json)
    return 0


def _show(client: ApiClient, args: argparse.Namespace) -> int:
    _print_schedule(client.get(_path(args.schedule)), as_json=args.json)
    return 0


def _list(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.get("/schedules")
    if args.json:
        _print_json(answer)
        return 0
    rows = [
        (
            s["id"],
            s.get("cron") or f"every {s['everySeconds']}s",
            s["timezone"],
            s["catchUp"],
            "paused" if s["paused"] else s["nextFireAt"],
            s["lastFiredAt"],
            s["missed"],
        )
        for s in answer["items"]
    ]
    headers = ("ID", "WHEN", "TIMEZONE", "CATCH-UP", "NEXT FIRE", "LAST FIRED", "MISSED")
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _delete(client: ApiClient, args: argparse.Namespace) -> int:
    client.delete(_path(args.schedule))
    if not args.json:
        print(f"schedule {args.schedule} deleted")
    return 0


def _json_argument(text: str, option: str) -> Any:
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise UsageProblem(f"{option}: cannot read {text[1:]}: {error.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageProblem(f"{option} is not valid JSON: {error}") from None


def _print_schedule(view: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        _print_json(view)
        return
    when = view.get("cron") or f"every {view['everySeconds']} seconds"
    fields = [
        ("schedule", view["id"]),
        ("flow", view["flowId"]),
        ("when", when),
        ("timezone", view["timezone"]),
        ("catch-up", view["catchUp"]),
        ("paused", "yes" if view["paused"] else "no"),
        ("next fire", view["nextFireAt"]),
        ("last fired", view["lastFiredAt"]),
        ("missed", view["missed"]),
        ("data", json.dumps(view["data"], ensure_ascii=False)),
    ]
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name.ljust(width)}  {_cell(value)}")


def _print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, ensure_ascii=False))


def _print_refusal(refused: Refused, *, as_json: bool) -> None:
    problem = refused.problem or {}
    if as_json and problem:
        _print_json(problem)
    code = problem.get("code") or f"HTTP_{refused.status}"
    detail = problem.get("detail") or (refused.text.strip().splitlines() or [""])[0]
    print(
        f"orquestador: refused ({refused.status} {code})" + (f": {detail}" if detail else ""),
        file=sys.stderr,
    )
    for item in problem.get("problems", []) or []:
        if isinstance(item, dict):
            print(f"  {item.get('path') or '/'}: {item.get('message')}", file=sys.stderr)


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)

"""What every command prints and exits with: exit statuses, usage problems, refusals,
fields, tables and JSON arguments."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orquestador.client import ApiError

EXIT_REFUSED = 1
EXIT_USAGE = 2
# A command that follows an execution (`run --wait`, `executions wait`) also ends with
# these: 0 it SUCCEEDED, 1 it FAILED or was CANCELLED, 2 refused or bad input.
EXIT_PARKED = 3  # it waits for a person: parked for a decision, or on an approval
EXIT_TIMED_OUT = 4  # it had not settled when the wait's time was up

# The audit's detail is wrapped to this width under its row, never cut.
AUDIT_DETAIL_WIDTH = 100


class UsageProblem(Exception):
    """The command cannot ask the server: a usage or configuration problem (exit 2)."""


class CommandFailed(Exception):
    """A command cannot go on; its message is printed as one line, with this exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def json_argument(text: str, option: str) -> Any:
    """An option's JSON, given inline or as @FILE."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise UsageProblem(f"{option}: cannot read {text[1:]}: {error.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageProblem(f"{option} is not valid JSON: {error}") from None


def one_line(error: BaseException) -> str:
    """The first line of an error (a database error's driver message, not SQLAlchemy's)."""
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return text[0] if text else type(error).__name__


def loopback(host: str) -> str:
    """Where a server bound to `host` answers from this machine."""
    # A server bound to every address answers on loopback.
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, ensure_ascii=False))


def print_refusal(refused: ApiError, *, as_json: bool) -> None:
    problem = refused.problem or {}
    if as_json and problem:
        print_json(problem)
    code = problem.get("code") or f"HTTP_{refused.status}"
    detail = problem.get("detail") or (refused.text.strip().splitlines() or [""])[0]
    print(
        f"orquestador: refused ({refused.status} {code})" + (f": {detail}" if detail else ""),
        file=sys.stderr,
    )
    for item in problem.get("problems", []) or []:
        if isinstance(item, dict):
            print(f"  {item.get('path') or '/'}: {item.get('message')}", file=sys.stderr)


def print_fields(
    fields: Iterable[tuple[str, Any]], *, indent: str = "", skip_empty: bool = False
) -> None:
    rows = [(name, value) for name, value in fields if not (skip_empty and value is None)]
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        print(f"{indent}{name.ljust(width)}  {cell(value)}")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[cell(value) for value in row] for row in rows]
    widths = [
        max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)
    ]
    for row in [list(headers), *cells]:
        print(
            "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        )


def cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def printable_line(text: str) -> str:
    """A line of a machine's output as safe to print: a control character (an escape
    sequence that would move the cursor or retitle the terminal) shows as `?`."""
    return "".join(c if c == "\t" or c.isprintable() else "?" for c in text)


def print_wrapped(text: str, *, indent: str) -> None:
    # Long words (a key, an id) are broken, never dropped: every character is printed.
    for line in textwrap.wrap(
        text,
        width=AUDIT_DETAIL_WIDTH,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
    ):
        print(line)


def flow_filter(text: str) -> tuple[str, str]:
    """A `--flow` option as a filter: a version's id names that version (`flowId`),
    anything else a key, every version of it (`flowKey`)."""
    try:
        return "flowId", str(uuid.UUID(text))
    except ValueError:
        return "flowKey", text


def flow_name(view: dict[str, Any]) -> str | None:
    if not view.get("flowKey"):
        return None
    return f"{view['flowKey']} v{view['flowVersion']}"

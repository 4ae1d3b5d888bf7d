"""`orquestador decide`: a decision table evaluated against a context, with no flow."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orquestador.cli.api_commands import CommandFactory
from orquestador.cli.output import CommandFailed


def add_decide_command(command: CommandFactory) -> None:
    """Register `decide` with the main parser's command factory."""
    decide = command("decide", "evaluate a decision table against a context", ())
    decide.add_argument("--table", required=True, type=Path, help="the table (JSON)")
    decide.add_argument("--context", required=True, type=Path, help='{"data": ...} (JSON)')
    decide.set_defaults(handler=_decide)


def _decide(args: argparse.Namespace) -> int:
    from orquestador.domain.decision import evaluate, result_as_json
    from orquestador.domain.errors import DomainError

    table = _read_json(args.table, "--table")
    context = _read_json(args.context, "--context")
    if not isinstance(context, dict):
        raise CommandFailed('--context must hold a JSON object such as {"data": {...}}', 2)
    try:
        result = evaluate(table, context)
    except DomainError as error:
        print(f"{error.code}: {error.message}", file=sys.stderr)
        return 1
    print(json.dumps(result_as_json(result), indent=2, sort_keys=True))
    return 0


def _read_json(path: Path, option: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CommandFailed(f"{option}: cannot read {path}: {error.strerror}", 2) from error
    except ValueError as error:
        raise CommandFailed(f"{option}: {path} is not valid JSON: {error}", 2) from error

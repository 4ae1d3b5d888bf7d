"""The one map from an exception to what the command line prints and its exit status.

`main` runs every command's handler under `exit_status`: the first row whose exception
the error is an instance of says the status (so a subclass sits above its base). An
error no row names is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from orquestador.cli.api_commands import unanswered
from orquestador.cli.output import (
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandFailed,
    UsageProblem,
    one_line,
    print_refusal,
)
from orquestador.client import ApiError, ClientError
from orquestador.errors import ConfigError, OrquestadorError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell says of a command stopped by Ctrl-C


def _say(line: str) -> None:
    print(f"orquestador: {line}", file=sys.stderr)


def _config(error: ConfigError, _: argparse.Namespace) -> int:
    for problem in error.problems:
        _say(problem)
    return EXIT_USAGE


def _failed(error: CommandFailed, _: argparse.Namespace) -> int:
    _say(str(error))
    return error.status


def _usage(error: UsageProblem, _: argparse.Namespace) -> int:
    _say(str(error))
    return EXIT_USAGE


def _refused(error: ApiError, args: argparse.Namespace) -> int:
    # A command that follows an execution (`run`, `executions wait`) says "refused or bad
    # input" with 2, as its epilog lists; it sets `refused_exit`.
    print_refusal(error, as_json=bool(getattr(args, "json", False)))
    return int(getattr(args, "refused_exit", EXIT_REFUSED))


def _unanswered(error: ClientError, _: argparse.Namespace) -> int:
    _say(unanswered(error))
    return EXIT_USAGE


def _product(error: OrquestadorError, _: argparse.Namespace) -> int:
    _say(error.message)
    return 1


def _interrupted(_: KeyboardInterrupt, __: argparse.Namespace) -> int:
    return EXIT_INTERRUPTED


# Each row's function takes an instance of the row's exception.
Row = tuple[type[BaseException], Callable[[Any, argparse.Namespace], int]]

# Subclasses above their bases: ConfigError before OrquestadorError, ApiError before
# ClientError.
EXITS: tuple[Row, ...] = (
    (ConfigError, _config),
    (CommandFailed, _failed),
    (UsageProblem, _usage),
    (ApiError, _refused),
    (ClientError, _unanswered),
    (OrquestadorError, _product),
    (KeyboardInterrupt, _interrupted),
)


def exit_status(error: BaseException, args: argparse.Namespace) -> int | None:
    """Print what the command line says of `error`; its exit status, or None when no row
    (nor the database's errors) names it."""
    for kind, say in EXITS:
        if isinstance(error, kind):
            return say(error, args)
    said = _database_error(error)
    if said is None:
        return None
    _say(said)
    return 1


def _database_error(error: BaseException) -> str | None:
    """One line for a database error, else None. Only a command that touched a database
    imported the modules its errors come from: a client of the API starts without them."""
    embedded, sqlalchemy_exc = (
        sys.modules.get("orquestador.db.embedded"),
        sys.modules.get("sqlalchemy.exc"),
    )
    if embedded is not None and isinstance(error, embedded.EmbeddedPostgresError):
        return f"embedded PostgreSQL: {error}"
    if sqlalchemy_exc is not None and isinstance(error, sqlalchemy_exc.SQLAlchemyError):
        return f"database error: {one_line(error)}"
    return None

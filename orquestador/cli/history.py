"""`orquestador history export --before DATE`: the history as JSON lines before it is dropped."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from orquestador.cli.database import direct_engine
from orquestador.config import Settings
from orquestador.errors import ConfigError

CommandFactory = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]

HISTORY_SETTINGS = ("DATABASE_URL", "MIGRATION_DATABASE_URL", "ORQUESTADOR_HOME")


def add_history_command(command: CommandFactory) -> None:
    history = command(
        "history",
        "the history tables (audit rows and attempts): export them before retention drops them",
        HISTORY_SETTINGS,
    )
    actions = history.add_subparsers(title="actions", required=True, metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="write every audit row and attempt dated before DATE as JSON lines to stdout",
        description="Write every audit row (created_at) and attempt (started_at) dated before "
        'DATE to standard output, one JSON object a line with its table under "table"; '
        "progress goes to standard error. Reads as DATABASE_URL's role (else "
        "MIGRATION_DATABASE_URL's), from one snapshot.",
    )
    export.add_argument(
        "--before",
        required=True,
        type=parse_before,
        metavar="DATE",
        help="YYYY-MM-DD (midnight UTC) or an ISO 8601 time with its offset",
    )
    export.set_defaults(handler=_export)


def parse_before(value: str) -> datetime:
    """DATE as an aware time: a bare date is midnight UTC, a time needs its offset."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a date: {value!r} (YYYY-MM-DD, or an ISO 8601 time with its offset)"
        ) from None
    if moment.tzinfo is None:
        if len(value.strip()) > 10:
            raise argparse.ArgumentTypeError(
                f"{value!r} has no offset: add one (e.g. +00:00) or give a date alone"
            )
        moment = moment.replace(tzinfo=UTC)
    return moment


def _export(args: argparse.Namespace) -> int:
    from sqlalchemy import text

    from orquestador.history.export import export_history

    settings = Settings.from_env()

    def progress(table: str, rows: int) -> None:
        print(f"orquestador: {table}: {rows} rows so far", file=sys.stderr, flush=True)

    url = settings.database_url or settings.migration_database_url
    with (
        direct_engine(settings, url) as engine,
        engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn,
    ):
        if conn.execute(text("SELECT to_regclass('audit_event')")).scalar() is None:
            raise ConfigError(["the database has no history yet: run 'orquestador migrate'"])
        conn.execute(text("SET TRANSACTION READ ONLY"))
        try:
            counts = export_history(conn, args.before, sys.stdout, progress=progress)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): what it read is all it wanted.
            sys.stderr.write("orquestador: standard output closed; export stopped\n")
            return 1
    summary = ", ".join(f"{table}: {rows} rows" for table, rows in counts.items())
    print(
        f"orquestador: exported before {args.before.isoformat()}: {summary}",
        file=sys.stderr,
    )
    return 0

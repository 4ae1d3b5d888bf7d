"""The one command line: dev, migrate, worker, api, token, check, decide."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from orquestador.config import Settings
from orquestador.db.embedded import EmbeddedPostgresError
from orquestador.errors import ConfigError, OrquestadorError

log = logging.getLogger("orquestador")

EXIT_USAGE = 2


class CommandFailed(Exception):
    """A command cannot go on; its message is printed as one line, with this exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as error:
        for problem in error.problems:
            print(f"orquestador: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as error:
        print(f"orquestador: {error}", file=sys.stderr)
        return error.status
    except OrquestadorError as error:
        print(f"orquestador: {error.message}", file=sys.stderr)
        return 1
    except EmbeddedPostgresError as error:
        print(f"orquestador: embedded PostgreSQL: {error}", file=sys.stderr)
        return 1
    except SQLAlchemyError as error:
        print(f"orquestador: database error: {_one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orquestador", description="Durable workflow orchestrator on PostgreSQL."
    )
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    dev = commands.add_parser(
        "dev", help="embedded database, migrations, worker and API in one process"
    )
    dev.set_defaults(handler=_dev)

    migrate = commands.add_parser("migrate", help="apply or inspect database migrations")
    migrate.add_argument(
        "action", nargs="?", default="upgrade", choices=("upgrade", "downgrade", "current")
    )
    migrate.add_argument("revision", nargs="?", help="target revision (upgrade: default head)")
    migrate.set_defaults(handler=_migrate)

    worker = commands.add_parser("worker", help="run the worker daemon (WORKER_ENABLED=true)")
    worker.set_defaults(handler=_worker)

    api = commands.add_parser("api", help="serve the HTTP API with gunicorn")
    api.set_defaults(handler=_api)

    token = commands.add_parser("token", help="mint a JWT with the configured signing key")
    token.add_argument("--sub", required=True, help="subject (the caller's user id)")
    token.add_argument("--org", required=True, help="organization id")
    token.add_argument("--scope", default="", help='space separated, e.g. "requests:read"')
    token.add_argument("--ttl", type=int, default=3600, help="seconds until expiry")
    token.set_defaults(handler=_token)

    check = commands.add_parser("check", help="validate configuration and database reachability")
    check.set_defaults(handler=_check)

    decide = commands.add_parser("decide", help="evaluate a decision table against a context")
    decide.add_argument("--table", required=True, type=Path, help="the table (JSON)")
    decide.add_argument("--context", required=True, type=Path, help='{"data": ...} (JSON)')
    decide.set_defaults(handler=_decide)
    return parser


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Alembic announces each of its plugins at INFO; nobody needs that on every start.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _dev(args: argparse.Namespace) -> int:
    from orquestador.dev import run_dev

    settings = Settings.from_env()
    configure_logging(settings)
    return run_dev(settings)


def _migrate(args: argparse.Namespace) -> int:
    from orquestador.db import migrate

    settings = Settings.from_env()
    configure_logging(settings)
    url = settings.migration_database_url
    role = migrate.runtime_role_for(settings.database_url, settings.runtime_database_role)
    local = None
    if not url:
        if settings.database_url:
            raise CommandFailed("MIGRATION_DATABASE_URL is not set (the owner role migrates)", 2)
        from orquestador.db.local import start_local_database

        local = start_local_database(settings.home_path)
        url, role = local.migration_url, local.runtime_role
    try:
        if args.action == "current":
            print(migrate.current_revision(url) or "base")
            return 0
        if args.action == "downgrade" and not args.revision:
            raise CommandFailed("downgrade needs a target revision, e.g. 'base' or '0003'", 2)
        config = migrate.alembic_config(url=url, runtime_role=role)
        if args.action == "upgrade":
            migrate.upgrade(config, args.revision or "head")
        else:
            migrate.downgrade(config, args.revision)
        print(f"database at revision {migrate.current_revision(url) or 'base'}")
        return 0
    finally:
        if local is not None:
            local.server.stop()


def _worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    configure_logging(settings)
    if not settings.worker_enabled:
        raise CommandFailed("WORKER_ENABLED is not true; set it to run the worker", 2)
    if not settings.database_url:
        raise CommandFailed("DATABASE_URL is not set (the runtime role's connection)", 2)
    from orquestador.worker.daemon import run_worker

    return run_worker(settings)


def _api(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    configure_logging(settings)
    if not settings.database_url:
        raise CommandFailed("DATABASE_URL is not set (the runtime role's connection)", 2)
    from orquestador.serve import serve_with_gunicorn

    return serve_with_gunicorn(settings)


def _token(args: argparse.Namespace) -> int:
    from orquestador.api.tokens import mint_token

    settings = Settings.from_env()
    if not settings.signing_secret() and not settings.jwt_private_key_file:
        raise CommandFailed(
            "no signing key: set JWT_SECRET (or JWT_PRIVATE_KEY_FILE), or run "
            "'orquestador dev' once in this folder to create a development key",
            2,
        )
    if args.ttl <= 0:
        raise CommandFailed("--ttl must be greater than zero", 2)
    print(
        mint_token(
            settings, sub=args.sub, org=args.org, scopes=args.scope.split(), ttl_seconds=args.ttl
        )
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from orquestador.db.health import unreachable_databases

    settings = Settings.from_env()
    problems = unreachable_databases(settings)
    for problem in problems:
        print(f"orquestador: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        "configuration is valid"
        + (
            ""
            if settings.database_url
            else "; no DATABASE_URL: 'orquestador dev' embeds PostgreSQL"
        )
    )
    return 0


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


def _one_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return text[0] if text else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())

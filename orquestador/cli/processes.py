"""The commands that run the product: dev, migrate, worker, api and the reference agent."""

from __future__ import annotations

import argparse
from typing import Any

from orquestador.cli.api_commands import CommandFactory
from orquestador.cli.output import CommandFailed
from orquestador.cli.settings_read import (
    AGENT_SETTINGS,
    ALL_SETTINGS,
    API_SETTINGS,
    MIGRATE_SETTINGS,
    WORKER_SETTINGS,
)
from orquestador.config import Settings
from orquestador.errors import ConfigError


def add_process_commands(command: CommandFactory) -> None:
    """Register dev, migrate, worker, api and agent with the main parser's command factory."""
    dev = command(
        "dev",
        "embedded database, migrations, worker and API in one process",
        ALL_SETTINGS,
    )
    dev.set_defaults(handler=_dev)

    migrate = command(
        "migrate",
        "apply or inspect database migrations; grant the runtime role its privileges",
        MIGRATE_SETTINGS,
    )
    migrate.add_argument(
        "action",
        nargs="?",
        default="upgrade",
        choices=("upgrade", "downgrade", "current", "grant"),
        help="upgrade (default; re-grants at head), downgrade REV, current, or grant: "
        "re-apply the runtime role's grants (idempotent)",
    )
    migrate.add_argument("revision", nargs="?", help="target revision (upgrade: default head)")
    migrate.add_argument(
        "--no-runtime-grants",
        action="store_true",
        help="upgrade without granting anything to a runtime role (grant later with "
        "'orquestador migrate grant')",
    )
    migrate.set_defaults(handler=_migrate)

    worker = command("worker", "run the worker daemon (WORKER_ENABLED=true)", WORKER_SETTINGS)
    worker.set_defaults(handler=_worker)

    api = command("api", "serve the HTTP API with gunicorn", API_SETTINGS)
    api.set_defaults(handler=_api)

    agent = command(
        "agent",
        "the reference machine agent: take this machine's commands, run them from "
        "AGENT_COMMANDS_FILE, report their status",
        AGENT_SETTINGS,
    )
    agent.add_argument(
        "--check",
        action="store_true",
        help="validate AGENT_COMMANDS_FILE and exit (0 valid, 2 with one line per problem)",
    )
    agent.add_argument(
        "--wait",
        type=float,
        default=20,
        metavar="SECONDS",
        help="how long each long poll waits on the API for a command, 0 to 30 "
        "(default: %(default)g)",
    )
    agent.set_defaults(handler=_agent)


def configure_logging(settings: Settings) -> None:
    from orquestador.logs import configure

    configure(settings.log_level, fmt=settings.log_format)


def _dev(args: argparse.Namespace) -> int:
    from orquestador.dev import run_dev

    settings = Settings.from_env()
    configure_logging(settings)
    return run_dev(settings)


def _migrate(args: argparse.Namespace) -> int:
    from orquestador.db import migrate

    settings = Settings.from_env()
    configure_logging(settings)
    if args.action in ("current", "downgrade", "grant") and args.no_runtime_grants:
        raise CommandFailed(f"--no-runtime-grants applies to upgrade, not {args.action}", 2)
    if args.action == "downgrade" and not args.revision:
        raise CommandFailed("downgrade needs a target revision, e.g. 'base' or '0003'", 2)
    url = settings.migration_database_url
    role = migrate.runtime_role_for(settings.database_url, settings.runtime_database_role)
    if url and not role and args.action in ("upgrade", "grant") and not args.no_runtime_grants:
        raise CommandFailed(
            "no runtime role to grant: set RUNTIME_DATABASE_ROLE (or DATABASE_URL, whose user "
            "is the runtime role), or pass --no-runtime-grants to migrate without grants",
            2,
        )
    local = None
    if not url:
        if settings.database_url:
            raise CommandFailed("MIGRATION_DATABASE_URL is not set (the owner role migrates)", 2)
        from orquestador.db.local import start_local_database

        local = start_local_database(settings.home_path)
        url, role = local.migration_url, local.runtime_role
    try:
        if args.no_runtime_grants:
            role = None
        elif role and args.action in ("upgrade", "grant") and not migrate.role_exists(url, role):
            raise CommandFailed(
                f"runtime role {role!r} does not exist: create it first "
                "(docs/deploy/create-runtime-role.sql) or set RUNTIME_DATABASE_ROLE",
                2,
            )
        if args.action == "current":
            print(migrate.current_revision(url) or "base")
            return 0
        if args.action == "grant":
            return _grant(migrate, url, role)
        config = migrate.alembic_config(url=url, runtime_role=role)
        if args.action == "upgrade":
            migrate.upgrade(config, args.revision or "head")
        else:
            migrate.downgrade(config, args.revision)
        revision = migrate.current_revision(url)
        print(f"database at revision {revision or 'base'}")
        if args.action == "upgrade" and role and revision == migrate.head_revision():
            # The migrations grant as they create; this repairs a database migrated before
            # the role existed or without it, so a second `migrate` fixes what the first missed.
            tables = migrate.grant_runtime_role(url, role)
            print(f"runtime role {role!r}: grants in place on {len(tables)} tables")
        elif args.action == "upgrade" and not role:
            print("runtime grants skipped: grant them with 'orquestador migrate grant'")
        return 0
    finally:
        # A server this command found running (a dev's, or one a killed dev left) keeps running.
        if local is not None and local.server.adopted_pid is None:
            local.server.stop()


def _grant(migrate: Any, url: str, role: str | None) -> int:
    assert role, "checked by _migrate"
    revision, head = migrate.current_revision(url), migrate.head_revision()
    if revision != head:
        raise CommandFailed(
            f"database at revision {revision or 'base'}, not {head}: run "
            "'orquestador migrate upgrade' (it grants as it goes)"
        )
    tables = migrate.grant_runtime_role(url, role)
    print(f"runtime role {role!r}: grants in place on {len(tables)} tables")
    return 0


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


def _agent(args: argparse.Namespace) -> int:
    from orquestador.agent import load_commands, run_agent

    settings = Settings.from_env()
    configure_logging(settings)
    problems = []
    if not settings.agent_commands_file:
        problems.append("AGENT_COMMANDS_FILE is not set (the TOML file of commands to run)")
        commands = None
    else:
        commands, file_problems = load_commands(settings.agent_commands_file)
        problems += file_problems
    # The agent's token is ORQUESTADOR_TOKEN, which goes only to ORQUESTADOR_API_URL: never
    # to a URL a folder's dev record names (anyone can leave such a file in a folder).
    api_url = settings.api_url
    if not args.check:
        if not api_url:
            problems.append(
                "ORQUESTADOR_API_URL is not set, e.g. http://127.0.0.1:8080/api/v1 (the agent "
                "sends its ORQUESTADOR_TOKEN only there)"
            )
        if not settings.api_token:
            problems.append(
                "ORQUESTADOR_TOKEN is not set (an agent token: orquestador machines enroll M "
                "--org O)"
            )
    if not 0 <= args.wait <= 30:
        problems.append("--wait must be from 0 to 30 seconds")
    if problems:
        raise ConfigError(problems)
    assert commands is not None
    if args.check:
        print(f"{settings.agent_commands_file}: {len(commands)} commands, valid")
        return 0
    return run_agent(
        api_url,
        settings.api_token,
        commands,
        poll_wait_seconds=args.wait,
        kill_grace_seconds=settings.agent_kill_grace_seconds,
    )

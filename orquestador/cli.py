"""The one command line: dev, migrate, worker, api, token, check, health, decide, agent, ..."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from orquestador.approvals_cli import add_approvals_command
from orquestador.bulk_cli import add_bulk_action
from orquestador.config import Settings, environment_sections
from orquestador.db.embedded import EmbeddedPostgresError
from orquestador.dev_address import recorded_dev_api
from orquestador.errors import ConfigError, OrquestadorError
from orquestador.executions_cli import add_executions_command
from orquestador.flows_cli import add_flows_command
from orquestador.history_cli import add_history_command
from orquestador.machines_cli import add_machines_command
from orquestador.schedules_cli import add_schedules_command

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
        prog="orquestador",
        description="Durable workflow orchestrator on PostgreSQL.",
        epilog="Every setting comes from the environment; .env.example lists each one with "
        "its default. 'orquestador COMMAND --help' names the ones a command reads.",
    )
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def command(name: str, summary: str, reads: Sequence[str]) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=_settings_epilog(reads),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

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

    token = command("token", "mint a JWT with the configured signing key", TOKEN_SETTINGS)
    who = token.add_mutually_exclusive_group(required=True)
    who.add_argument("--sub", help="subject (the caller's user id)")
    who.add_argument(
        "--machine",
        metavar="MACHINE_ID",
        help="a machine agent's token for trying things out: sub machine:MACHINE_ID, scope "
        "agent (no --scope), at most a day; a lasting one: orquestador machines enroll",
    )
    token.add_argument("--org", required=True, help="organization id")
    token.add_argument("--scope", default="", help='space separated, e.g. "requests:read"')
    token.add_argument(
        "--ttl",
        "--lifetime",
        dest="ttl",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="lifetime of the token in seconds (default: %(default)s)",
    )
    token.add_argument(
        "--link",
        action="store_true",
        help="print a one-time sign-in link to the pages instead (valid 60 s), asked of the "
        "API at ORQUESTADOR_API_URL (or this folder's dev server) for --sub, --org, --scope",
    )
    token.add_argument(
        "--next", metavar="PAGE", help="with --link: the page to land on, under /ui/"
    )
    token.set_defaults(handler=_token)

    check = command(
        "check",
        "validate every setting, the integrations file, database reachability and the runtime "
        "role's privileges",
        ALL_SETTINGS,
    )
    check.set_defaults(handler=_check)

    health = command(
        "health",
        "probe what this host runs (container health checks): the API when an API switch is "
        "on, the worker's database when WORKER_ENABLED is",
        HEALTH_SETTINGS,
    )
    health.set_defaults(handler=_health)

    decide = command("decide", "evaluate a decision table against a context", ())
    decide.add_argument("--table", required=True, type=Path, help="the table (JSON)")
    decide.add_argument("--context", required=True, type=Path, help='{"data": ...} (JSON)')
    decide.set_defaults(handler=_decide)

    add_bulk_action(add_executions_command(command))
    add_approvals_command(command)
    add_flows_command(command)
    add_machines_command(command)
    add_schedules_command(command)
    add_history_command(command)

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
    return parser


# The settings each command reads (besides validating all of them, as every command does).
ALL_SETTINGS: tuple[str, ...] = tuple(
    name for names in environment_sections().values() for name in names
)
_ADAPTERS_AND_LOGS = (
    "ADAPTER_MODULES",
    "INTEGRATIONS_FILE",
    "MACHINE_COMMANDS",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
MIGRATE_SETTINGS = (
    "MIGRATION_DATABASE_URL",
    "RUNTIME_DATABASE_ROLE",
    "PLATFORM_DATABASE_ROLE",
    "DATABASE_URL",
    "ORQUESTADOR_HOME",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
WORKER_SETTINGS = (
    "DATABASE_URL",
    "WORKER_ENABLED",
    *environment_sections()["worker"],
    *environment_sections()["retries"],
    *environment_sections()["e-mail"],
    *environment_sections()["retention"],
    *environment_sections()["operations"],
    *environment_sections()["traces"],
    "MACHINE_COMMAND_RETENTION_DAYS",
    *_ADAPTERS_AND_LOGS,
)
API_SETTINGS = (
    "DATABASE_URL",
    "ORQUESTADOR_HOME",
    "REQUEST_API_ENABLED",
    "FLOW_ADMIN_ENABLED",
    *[name for name in environment_sections()["tokens"] if name != "JWT_PRIVATE_KEY_FILE"],
    *environment_sections()["api"],
    *environment_sections()["traces"],
    *_ADAPTERS_AND_LOGS,
)
TOKEN_SETTINGS = (
    "JWT_SECRET",
    "JWT_PRIVATE_KEY_FILE",
    "ORQUESTADOR_HOME",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
    "ORQUESTADOR_API_URL",
)
AGENT_SETTINGS = (
    "ORQUESTADOR_API_URL",
    "ORQUESTADOR_TOKEN",
    "AGENT_COMMANDS_FILE",
    "LOG_LEVEL",
    "LOG_FORMAT",
)
HEALTH_SETTINGS = (
    "REQUEST_API_ENABLED",
    "FLOW_ADMIN_ENABLED",
    "API_HOST",
    "API_PORT",
    "WORKER_ENABLED",
    "DATABASE_URL",
)


def _settings_epilog(names: Sequence[str]) -> str:
    if not names:
        return "Reads no setting."
    known = {
        name: section for section, all_names in environment_sections().items() for name in all_names
    }
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"not settings: {unknown}")
    by_section: dict[str, list[str]] = {}
    for name in names:
        by_section.setdefault(known[name], []).append(name)
    lines = [
        textwrap.fill(
            ", ".join(section_names),
            width=79,
            initial_indent=f"  {section}: ",
            subsequent_indent=" " * (4 + len(section)),
            break_on_hyphens=False,
        )
        for section, section_names in by_section.items()
    ]
    return "settings read (environment variables; .env.example has defaults):\n" + "\n".join(lines)


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


def _token(args: argparse.Namespace) -> int:
    from orquestador.api.tokens import mint_token

    settings = Settings.from_env()
    if args.ttl <= 0:
        raise CommandFailed("--ttl must be greater than zero", 2)
    if args.machine is not None:
        from orquestador.api.auth import SCOPE_AGENT, identity_claim_problem
        from orquestador.machines.credentials import MAX_AD_HOC_SECONDS

        if args.scope:
            raise CommandFailed("--machine mints an agent token (scope agent); drop --scope", 2)
        if args.link:
            raise CommandFailed("--link signs a person in to the pages: use --sub", 2)
        if args.ttl > MAX_AD_HOC_SECONDS:
            # The API refuses a longer one that nobody enrolled: it could not be revoked.
            raise CommandFailed(
                f"--machine tokens last at most {MAX_AD_HOC_SECONDS} seconds (a day); enrol "
                "the machine for a long-lived, revocable one: orquestador machines enroll "
                f"{args.machine} --org {args.org}",
                2,
            )
        problem = identity_claim_problem(args.machine) or (
            "must not contain spaces" if any(c.isspace() for c in args.machine) else None
        )
        if problem:
            raise CommandFailed(f"--machine {problem}", 2)
        sub, scopes = f"machine:{args.machine}", [SCOPE_AGENT]
    else:
        sub, scopes = args.sub, args.scope.split()
    if not settings.signing_secret() and not settings.jwt_private_key_file:
        raise CommandFailed(
            f"no signing key: JWT_SECRET is not set and there is no development key at "
            f"{settings.dev_secret_path.resolve()} (ORQUESTADOR_HOME={settings.home}); set "
            "JWT_SECRET (or JWT_PRIVATE_KEY_FILE), or ORQUESTADOR_HOME to the .orquestador "
            "folder of the project where 'orquestador dev' ran",
            2,
        )
    if args.link:
        return _sign_in_link(settings, sub, args.org, scopes, args.next)
    print(mint_token(settings, sub=sub, org=args.org, scopes=scopes, ttl_seconds=args.ttl))
    return 0


def _sign_in_link(
    settings: Settings, sub: str, org: str, scopes: list[str], next_page: str | None
) -> int:
    """Ask the API for a one-time sign-in link, as a panel would, with a minute-long token
    for auth:link and the scopes handed on; print its URL."""
    import dataclasses

    from orquestador.api.auth import SCOPE_AUTH_LINK
    from orquestador.api.tokens import mint_token
    from orquestador.client import ApiError, ClientError
    from orquestador.executions_cli import (
        UsageProblem,
        client_from_settings,
        print_refusal,
        unanswered,
    )

    service = mint_token(
        settings, sub=f"{sub} (link)", org=org, scopes=[SCOPE_AUTH_LINK, *scopes], ttl_seconds=60
    )
    try:
        client = client_from_settings(dataclasses.replace(settings, api_token=service))
        answer = client.create_sign_in_link(sub, org, " ".join(scopes), next_page)
    except UsageProblem as problem:
        raise CommandFailed(str(problem), 2) from None
    except ApiError as refused:
        print_refusal(refused, as_json=False)
        return 1
    except ClientError as error:
        raise CommandFailed(unanswered(error), 2) from None
    print(answer["url"])
    return 0


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
    # In the folder of a running `orquestador dev`, its API unless one is named.
    api_url = settings.api_url or recorded_dev_api(settings.home_path) or ""
    if not args.check:
        if not api_url:
            problems.append("ORQUESTADOR_API_URL is not set, e.g. http://127.0.0.1:8080/api/v1")
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


def _check(args: argparse.Namespace) -> int:
    import os

    from orquestador.db.health import runtime_privilege_problems, unreachable_databases

    settings = Settings.from_env()
    if settings.integrations_file:
        from orquestador.integrations.routes import route_file_problems

        _, route_problems = route_file_problems(
            settings.integrations_file, os.environ, settings.worker_lease_seconds
        )
        for problem in route_problems:
            print(f"orquestador: {problem}", file=sys.stderr)
        if route_problems:
            return 2
    if settings.smtp_url:
        from orquestador.errors import ConfigError
        from orquestador.notices.smtp import SmtpTarget

        try:
            SmtpTarget.parse(settings.smtp_url)
        except ConfigError as exc:
            for problem in exc.problems:
                print(f"orquestador: {problem}", file=sys.stderr)
            return 2
    problems = unreachable_databases(settings)
    if settings.database_url and not any(p.startswith("DATABASE_URL:") for p in problems):
        problems += runtime_privilege_problems(settings)
    for problem in problems:
        print(f"orquestador: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        "configuration is valid"
        + (
            "; the runtime role holds every privilege the worker and the API use"
            if settings.database_url
            else "; no DATABASE_URL: 'orquestador dev' embeds PostgreSQL"
        )
    )
    return 0


def _health(args: argparse.Namespace) -> int:
    from orquestador.db.health import connection_problem

    settings = Settings.from_env()
    probed = []
    if settings.request_api_enabled or settings.flow_admin_enabled:
        url = f"http://{_local_address(settings.api_host)}:{settings.api_port}/api/v1/healthz"
        try:
            with urllib.request.urlopen(url, timeout=4) as response:
                response.read()
        except (OSError, ValueError) as error:
            raise CommandFailed(f"API: no answer from {url}: {_one_line(error)}") from None
        probed.append("API")
    if settings.worker_enabled:
        if not settings.database_url:
            raise CommandFailed("worker: DATABASE_URL is not set", 2)
        problem = connection_problem(settings.database_url)
        if problem:
            raise CommandFailed(f"worker: DATABASE_URL: {problem}")
        probed.append("worker database")
    print(f"healthy: {', '.join(probed)}" if probed else "nothing to probe: no switch is on")
    return 0


def _local_address(host: str) -> str:
    # A server bound to every address answers on loopback.
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


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

"""`orquestador check` and `orquestador health`: is this configuration, and what it runs, sound."""

from __future__ import annotations

import argparse
import sys
import urllib.request

from orquestador.cli.api_commands import CommandFactory
from orquestador.cli.output import CommandFailed, loopback, one_line
from orquestador.cli.settings_read import ALL_SETTINGS, HEALTH_SETTINGS
from orquestador.config import Settings


def add_check_commands(command: CommandFactory) -> None:
    """Register `check` and `health` with the main parser's command factory."""
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
        url = f"http://{loopback(settings.api_host)}:{settings.api_port}/api/v1/healthz"
        try:
            with urllib.request.urlopen(url, timeout=4) as response:
                response.read()
        except (OSError, ValueError) as error:
            raise CommandFailed(f"API: no answer from {url}: {one_line(error)}") from None
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

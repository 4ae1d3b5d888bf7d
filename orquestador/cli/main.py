"""The one command line: dev, migrate, worker, api, token, check, health, decide, run, ..."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence

from orquestador.cli.approvals import add_approvals_command
from orquestador.cli.bulk import add_bulk_action
from orquestador.cli.checks import add_check_commands
from orquestador.cli.decide import add_decide_command
from orquestador.cli.executions import add_executions_command
from orquestador.cli.exits import exit_status
from orquestador.cli.flows import add_flows_command
from orquestador.cli.history import add_history_command
from orquestador.cli.machines import add_machines_command
from orquestador.cli.notices import add_notices_command
from orquestador.cli.processes import add_process_commands
from orquestador.cli.quotas import add_quotas_command
from orquestador.cli.rollouts import add_rollouts_command
from orquestador.cli.run import add_run_command, add_wait_action
from orquestador.cli.schedules import add_schedules_command
from orquestador.cli.settings_read import settings_epilog
from orquestador.cli.tokens import add_token_command

log = logging.getLogger("orquestador")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BaseException as error:  # KeyboardInterrupt too: one table says what each is
        status = exit_status(error, args)
        if status is None:
            raise
        return status


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
            epilog=settings_epilog(reads),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    add_process_commands(command)
    add_token_command(command)
    add_check_commands(command)
    add_decide_command(command)
    add_run_command(command)
    executions = add_executions_command(command)
    add_bulk_action(executions)
    add_wait_action(executions)
    add_approvals_command(command)
    add_rollouts_command(command)
    add_flows_command(command)
    add_machines_command(command)
    add_schedules_command(command)
    add_notices_command(command)
    add_quotas_command(command)
    add_history_command(command)
    return parser

"""The commands that are clients of the HTTP API: how their client is built (the
environment's URL and token, else the folder's `orquestador dev`), how their actions are
registered, and how a refusal or a server that does not answer becomes an exit status."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence

from orquestador.cli.output import (
    EXIT_REFUSED,
    EXIT_USAGE,
    UsageProblem,
    loopback,
    print_refusal,
)
from orquestador.client import API_PATH, ApiError, Client, ClientError, NotTheApi, RequestNotSent
from orquestador.config import Settings
from orquestador.dev_address import recorded_dev_api

DEV_TOKEN_SECONDS = 300
DEV_EXTRA_SCOPES = ("executions:reconcile", "executions:cancel")
# What the command reads, for its --help.
CLIENT_SETTINGS = (
    "ORQUESTADOR_API_URL",
    "ORQUESTADOR_TOKEN",
    "ORQUESTADOR_HOME",
    "API_HOST",
    "API_PORT",
    "JWT_SECRET",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
)

CommandFactory = Callable[[str, str, Sequence[str]], argparse.ArgumentParser]


ClientAction = Callable[..., argparse.ArgumentParser]


def client_actions(command: CommandFactory, name: str, summary: str) -> ClientAction:
    """Register a command of API client actions; the factory of its actions.

    Each action takes `--json`, runs through `run_client_action` and says its exit status.
    """
    parser = command(name, summary, CLIENT_SETTINGS)
    actions = parser.add_subparsers(title="actions", required=True, metavar="ACTION")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument(
        "--json", action="store_true", help="print the API's JSON answer, for scripts"
    )

    def action(
        name_: str, about: str, run: Callable[..., int], *, epilog: str | None = None
    ) -> argparse.ArgumentParser:
        """An action; one given its own `epilog` runs locally, `run(args)`, with no API."""
        sub = actions.add_parser(
            name_,
            parents=[] if epilog else [output],
            help=about,
            description=about[0].upper() + about[1:] + ".",
            epilog=epilog
            or "Exit status: 0 done, 1 refused by the server (its problem is printed), "
            f"2 usage or configuration. Settings: see 'orquestador {name} --help'.",
        )
        sub.set_defaults(handler=run if epilog else functools.partial(run_client_action, run))
        return sub

    return action


def run_client_action(
    action: Callable[[Client, argparse.Namespace], int],
    args: argparse.Namespace,
    *,
    refused: int = EXIT_REFUSED,
) -> int:
    """Run `action` with a client of the settings' API; a refusal exits `refused`."""
    try:
        client = client_from_settings(Settings.from_env())
        return action(client, args)
    except UsageProblem as problem:
        print(f"orquestador: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as refusal:
        print_refusal(refusal, as_json=args.json)
        return refused
    except ClientError as error:
        print(f"orquestador: {unanswered(error)}", file=sys.stderr)
        return EXIT_USAGE


def client_from_settings(settings: Settings) -> Client:
    """A client of the API that ORQUESTADOR_API_URL and ORQUESTADOR_TOKEN name, else of the
    `orquestador dev` of this folder with a development token."""
    url, token = settings.api_url, settings.api_token
    dev_key = settings.dev_secret_path
    in_dev_folder = dev_key.is_file()
    if not url:
        # The dev server running for this folder, on whatever port it bound.
        url = recorded_dev_api(settings.home_path) or ""
    if not url and in_dev_folder:
        url = f"http://{loopback(settings.api_host)}:{settings.api_port}{API_PATH}"
    if not token and in_dev_folder:
        token = _development_token(settings)
    missing = [
        name
        for name, value in (("ORQUESTADOR_API_URL", url), ("ORQUESTADOR_TOKEN", token))
        if not value
    ]
    if missing:
        raise UsageProblem(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, "
            "and this is no folder where "
            f"'orquestador dev' ran (no development key at {dev_key.resolve()}): set "
            f"{' and '.join(missing)}, or run the command in that folder"
        )
    return Client(url, token)


def unanswered(error: ClientError) -> str:
    """What the command says of a call that gave no answer to use (exit 2)."""
    if isinstance(error, RequestNotSent):
        return f"ORQUESTADOR_API_URL: {error.reason}"
    if isinstance(error, NotTheApi):
        return f"{error}: is ORQUESTADOR_API_URL the orquestador API?"
    return str(error)


def _development_token(settings: Settings) -> str:
    from orquestador.api.tokens import mint_token
    from orquestador.dev import DEV_ORG, DEV_SCOPES, DEV_SUBJECT

    return mint_token(
        settings,
        sub=DEV_SUBJECT,
        org=DEV_ORG,
        scopes=[*DEV_SCOPES, *DEV_EXTRA_SCOPES],
        ttl_seconds=DEV_TOKEN_SECONDS,
    )

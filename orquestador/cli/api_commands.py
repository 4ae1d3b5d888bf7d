"""The commands that are clients of the HTTP API: how their client is built (the
environment's URL and token, else the folder's `orquestador dev`), how their actions are
registered, and how a refusal or a server that does not answer becomes an exit status."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence

from orquestador.cli.output import UsageProblem, loopback
from orquestador.client import API_PATH, Client, ClientError, NotTheApi, RequestNotSent
from orquestador.config import Settings
from orquestador.dev_address import trusted_dev_api

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

    Each action takes `--json`, runs `with_client` and says its exit status.
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
        sub.set_defaults(handler=run if epilog else functools.partial(with_client, run))
        return sub

    return action


def with_client(
    action: Callable[[Client, argparse.Namespace], int], args: argparse.Namespace
) -> int:
    """Run `action` with a client of the settings' API. What a refusal or a server that
    does not answer exits with is the command line's one table's (`cli.exits`)."""
    return action(client_from_settings(Settings.from_env()), args)


def client_from_settings(settings: Settings, *, minted: str | None = None) -> Client:
    """A client of the API that ORQUESTADOR_API_URL names, with ORQUESTADOR_TOKEN; else of
    the `orquestador dev` of this folder, with a development token.

    ORQUESTADOR_TOKEN goes only to ORQUESTADOR_API_URL: a dev server is found through a
    file anyone can leave in a folder, so it gets only a token minted here with the
    folder's development key. `minted` is such a token a command made for itself.
    """
    dev_key = settings.dev_secret_path
    in_dev_folder = dev_key.is_file()
    if settings.api_url:
        token = minted or settings.api_token
        if not token and in_dev_folder:
            token = _development_token(settings)
        if not token:
            raise UsageProblem(
                "ORQUESTADOR_TOKEN is not set, and this is no folder where 'orquestador dev' "
                f"ran (no development key at {dev_key.resolve()}): set ORQUESTADOR_TOKEN"
            )
        return Client(settings.api_url, token)
    if not in_dev_folder:
        missing = (
            "ORQUESTADOR_API_URL is not set (ORQUESTADOR_TOKEN is sent only to ORQUESTADOR_API_URL)"
            if settings.api_token
            else "ORQUESTADOR_API_URL and ORQUESTADOR_TOKEN are not set"
        )
        raise UsageProblem(
            f"{missing}, and this is no folder where 'orquestador dev' ran (no development "
            f"key at {dev_key.resolve()}): set ORQUESTADOR_API_URL and ORQUESTADOR_TOKEN, or "
            "run the command in that folder"
        )
    # The dev server running for this folder, on whatever port it bound.
    url = trusted_dev_api(settings.home_path, dev_key) or (
        f"http://{loopback(settings.api_host)}:{settings.api_port}{API_PATH}"
    )
    return Client(url, minted or _development_token(settings))


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

"""`orquestador token`: a JWT minted with the configured key, or a one-time sign-in link."""

from __future__ import annotations

import argparse

from orquestador.cli.api_commands import CommandFactory, client_from_settings
from orquestador.cli.output import CommandFailed
from orquestador.cli.settings_read import TOKEN_SETTINGS
from orquestador.config import Settings


def add_token_command(command: CommandFactory) -> None:
    """Register `token` with the main parser's command factory."""
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


def _token(args: argparse.Namespace) -> int:
    from orquestador.api.tokens import mint_token

    settings = Settings.from_env()
    if args.ttl <= 0:
        raise CommandFailed("--ttl must be greater than zero", 2)
    if args.machine is not None:
        from orquestador.api.claims import SCOPE_AGENT, identity_claim_problem
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
    from orquestador.api.claims import SCOPE_AUTH_LINK
    from orquestador.api.tokens import mint_token

    service = mint_token(
        settings, sub=f"{sub} (link)", org=org, scopes=[SCOPE_AUTH_LINK, *scopes], ttl_seconds=60
    )
    # A refusal (1) or no answer (2) is said as every client command says it (cli.exits).
    client = client_from_settings(settings, minted=service)
    answer = client.create_sign_in_link(sub, org, " ".join(scopes), next_page)
    print(answer["url"])
    return 0

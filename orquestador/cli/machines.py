"""`orquestador machines`: enrol a machine's agent, list its credentials, revoke them.

These are an operator's actions on the database as its owner (MIGRATION_DATABASE_URL),
as `migrate` is: the runtime role the API connects with may read credentials and revoke
them (`DELETE /api/v1/machines/M/credentials`), never create one. With neither database
URL set, the embedded database of `orquestador dev` (ORQUESTADOR_HOME) is used.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orquestador.cli.api_commands import CommandFactory
from orquestador.cli.database import direct_engine
from orquestador.config import Settings
from orquestador.errors import ConfigError, OrquestadorError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from orquestador.machines.credentials import Credential

MACHINES_SETTINGS = (
    "MIGRATION_DATABASE_URL",
    "DATABASE_URL",
    "ORQUESTADOR_HOME",
    "JWT_SECRET",
    "JWT_PRIVATE_KEY_FILE",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
    "MACHINE_TOKEN_DAYS",
    "AGENT_OFFLINE_SECONDS",
)
SECONDS_PER_DAY = 86400


class CredentialRefused(OrquestadorError):
    """The machine has no such credential."""


def add_machines_command(command: CommandFactory) -> None:
    """Register `machines` and its actions with the main parser's command factory."""
    parser = command(
        "machines",
        "enrol a machine's agent (a long-lived, revocable token), list and revoke its credentials",
        MACHINES_SETTINGS,
    )
    actions = parser.add_subparsers(title="actions", required=True, metavar="ACTION")

    def action(name: str, summary: str, run: Callable[[argparse.Namespace], int]) -> Any:
        sub = actions.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog="Exit status: 0 done, 1 refused (no such machine or credential, the "
            "database), 2 usage or configuration. Settings: see 'orquestador machines --help'.",
        )
        sub.add_argument("--org", required=True, help="the machine's organization")
        sub.set_defaults(handler=run)
        return sub

    enroll = action(
        "enroll",
        "issue an agent token for a machine and store its id; prints the token",
        _enroll,
    )
    enroll.add_argument("machine", metavar="MACHINE_ID")
    enroll.add_argument(
        "--days",
        type=int,
        metavar="N",
        help="days the token stays valid (default: MACHINE_TOKEN_DAYS, 365)",
    )

    revoke = action(
        "revoke",
        "revoke a machine's credentials (all that are valid, or one): the API refuses "
        "their tokens from the next request on",
        _revoke,
    )
    revoke.add_argument("machine", metavar="MACHINE_ID")
    revoke.add_argument(
        "--credential", metavar="ID", help="only this credential (as 'machines list' shows it)"
    )

    listing = action("list", "the organization's credentials, of one machine or all", _list)
    listing.add_argument("machine", metavar="MACHINE_ID", nargs="?")


def _enroll(args: argparse.Namespace) -> int:
    from orquestador.api.claims import SCOPE_AGENT
    from orquestador.api.tokens import mint_token
    from orquestador.machines.credentials import record_enrolment

    settings = Settings.from_env()
    machine, org = _machine_and_org(args)
    days = settings.machine_token_days if args.days is None else args.days
    if days <= 0:
        raise ConfigError(["--days must be greater than zero"])
    if not settings.signing_secret() and not settings.jwt_private_key_file:
        raise ConfigError(
            [
                "no signing key: set JWT_SECRET (or JWT_PRIVATE_KEY_FILE), or ORQUESTADOR_HOME "
                "to the .orquestador folder of the project where 'orquestador dev' ran"
            ]
        )
    credential_id = uuid.uuid4().hex
    issued_at = int(time.time())
    ttl = days * SECONDS_PER_DAY
    # Minted before the row commits: a key that cannot sign leaves no credential behind.
    token = mint_token(
        settings,
        sub=f"machine:{machine}",
        org=org,
        scopes=[SCOPE_AGENT],
        ttl_seconds=ttl,
        token_id=credential_id,
        issued_at=issued_at,
    )
    with _owner_connection(settings) as conn:
        credential = record_enrolment(
            conn,
            credential_id=credential_id,
            org_id=org,
            machine_id=machine,
            issued_at=issued_at,
            expires_at=issued_at + ttl,
            issued_by=_operator(),
        )
    print(token)
    print(
        f"enrolled machine {machine} of {org}: credential {credential.id}, valid until "
        f"{_when(credential.expires_at)}; revoke it with: orquestador machines revoke "
        f"{machine} --org {org}",
        file=sys.stderr,
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from orquestador.machines.credentials import MachineNotEnrolled, revoke_credentials

    settings = Settings.from_env()
    machine, org = _machine_and_org(args)
    with _owner_connection(settings) as conn:
        try:
            revoked = revoke_credentials(
                conn,
                org_id=org,
                machine_id=machine,
                revoked_by=_operator(),
                credential_id=args.credential,
            )
        except MachineNotEnrolled:
            which = f"no credential {args.credential}" if args.credential else "no credential"
            raise CredentialRefused(
                f"machine {machine} of {org} has {which} ('orquestador machines list --org "
                f"{org}' shows what there is)"
            ) from None
    if not revoked:
        print(f"nothing to revoke: every credential of machine {machine} of {org} is revoked")
        return 0
    for credential in revoked:
        print(f"revoked credential {credential.id} of machine {machine} of {org}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from orquestador.machines.credentials import credentials_of
    from orquestador.machines.liveness import agent_of, agents_seen

    settings = Settings.from_env()
    org = args.org
    with _owner_connection(settings) as conn:
        found = credentials_of(conn, org_id=org, machine_id=args.machine)
        # Each machine's agent as its polls and reports last showed it (SPEC 23).
        seen = agents_seen(
            conn,
            org_id=org,
            machine_ids=[c.machine_id for c in found],
            offline_seconds=settings.agent_offline_seconds,
        )
    if not found:
        print(f"no enrolled machine credentials in {org}", file=sys.stderr)
        return 0
    now = datetime.now().astimezone()
    print("MACHINE\tCREDENTIAL\tISSUED\tEXPIRES\tSTATE\tAGENT")
    for credential in found:
        agent = agent_of(seen, credential.machine_id, settings.agent_offline_seconds)
        print(
            "\t".join(
                (
                    credential.machine_id,
                    credential.id,
                    _when(credential.issued_at),
                    _when(credential.expires_at),
                    _state(credential, now),
                    agent.in_words(),
                )
            )
        )
    return 0


def _state(credential: Credential, now: datetime) -> str:
    if credential.revoked_at is not None:
        return f"revoked {_when(credential.revoked_at)} by {credential.revoked_by}"
    return "expired" if credential.expires_at <= now else "valid"


def _machine_and_org(args: argparse.Namespace) -> tuple[str, str]:
    from orquestador.api.claims import identity_claim_problem

    problems = []
    machine_problem = identity_claim_problem(args.machine) or (
        "must not contain spaces" if any(c.isspace() for c in args.machine) else None
    )
    if machine_problem:
        problems.append(f"MACHINE_ID {machine_problem}")
    org_problem = identity_claim_problem(args.org)
    if org_problem:
        problems.append(f"--org {org_problem}")
    if problems:
        raise ConfigError(problems)
    return args.machine, args.org


def _operator() -> str:
    """Who did it, for revoked_by and the audit: the operating system's user name."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _when(moment: datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M %Z")


@contextmanager
def _owner_connection(settings: Settings) -> Iterator[Connection]:
    """One transaction as the owner role; the embedded dev database is left as found."""
    url = settings.migration_database_url
    if not url and settings.database_url:
        raise ConfigError(
            [
                "MIGRATION_DATABASE_URL is not set: enrolling and revoking machines is done as "
                "the owner role (the API's role may only revoke, through DELETE "
                "/api/v1/machines/M/credentials)"
            ]
        )
    from sqlalchemy import text

    with direct_engine(settings, url) as engine, engine.begin() as conn:
        if conn.execute(text("SELECT to_regclass('machine_credential')")).scalar() is None:
            raise ConfigError(
                ["the database has no machine credentials yet: run 'orquestador migrate'"]
            )
        yield conn

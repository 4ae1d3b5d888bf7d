"""Machine credentials: an enrolled agent token counts until it is revoked, from the next
request on; an agent token nobody enrolled may live a day at most; revoking over HTTP
needs machines:admin, is audited, and a foreign machine is the same 404 as a missing one."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError
from werkzeug.test import TestResponse

from orquestador.api.agent_routes import POLL_SHARE_EXTENSION
from orquestador.api.tokens import mint_token
from orquestador.machines import create_command, next_command
from orquestador.machines.credentials import (
    MAX_AD_HOC_SECONDS,
    credentials_of,
    record_enrolment,
    revoke_credentials,
)
from tests.integration.api_support import (
    ORG,
    OTHER_ORG,
    Api,
    bearer,
    problem,
    raw_token,
    running_api,
)

AUTH_LOGGER = "orquestador.api.auth"
ADMIN = {"sub": "ops-ana", "scopes": ["machines:admin"]}
YEAR = 365 * 86400


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def enroll(
    api: Api, owner_engine: Engine, machine: str = "m-1", org: str = ORG, ttl: int = YEAR
) -> tuple[str, str]:
    """What `orquestador machines enroll` does: a stored credential and its token."""
    credential_id, issued_at = uuid.uuid4().hex, int(time.time())
    with owner_engine.begin() as conn:
        record_enrolment(
            conn,
            credential_id=credential_id,
            org_id=org,
            machine_id=machine,
            issued_at=issued_at,
            expires_at=issued_at + ttl,
            issued_by="cli:test",
        )
    token = mint_token(
        api.settings,
        sub=f"machine:{machine}",
        org=org,
        scopes=["agent"],
        ttl_seconds=ttl,
        token_id=credential_id,
        issued_at=issued_at,
    )
    return credential_id, token


def take(api: Api, token: str) -> TestResponse:
    return api.client().post("/api/v1/agent/commands/next?wait=0", headers=bearer(token))


def revoke_over_http(api: Api, machine: str, **who: object) -> TestResponse:
    return api.client().delete(
        f"/api/v1/machines/{machine}/credentials", headers=api.headers(**{**ADMIN, **who})
    )


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == AUTH_LOGGER]


def test_an_enrolled_token_counts_until_revoked_then_is_refused_from_the_next_request(
    api: Api, owner_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    _, token = enroll(api, owner_engine)
    _, other = enroll(api, owner_engine, machine="m-2")
    assert take(api, token).status_code == 204

    revoked = revoke_over_http(api, "m-1")

    assert revoked.status_code == 200, revoked.get_data(as_text=True)
    with caplog.at_level(logging.INFO, logger=AUTH_LOGGER):
        refused = take(api, token)
    assert refused.status_code == 401
    assert problem(refused)["code"] == "UNAUTHENTICATED"
    assert refusals(caplog) == ["refused a bearer token: machine credential revoked"]
    assert take(api, other).status_code == 204  # another machine's credential still counts


def test_a_revocation_on_the_command_line_counts_at_once_too(
    api: Api, owner_engine: Engine
) -> None:
    old, old_token = enroll(api, owner_engine)
    new, new_token = enroll(api, owner_engine)  # a rotation: two valid at once

    with owner_engine.begin() as conn:
        revoked = revoke_credentials(
            conn, org_id=ORG, machine_id="m-1", revoked_by="cli:test", credential_id=old
        )

    assert [c.id for c in revoked] == [old]
    assert take(api, old_token).status_code == 401
    assert take(api, new_token).status_code == 204
    with owner_engine.connect() as conn:
        states = {c.id: c.revoked_by for c in credentials_of(conn, org_id=ORG, machine_id="m-1")}
    assert states == {old: "cli:test", new: None}


def test_a_credential_names_one_machine_of_one_organization(
    api: Api, owner_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    credential_id, _ = enroll(api, owner_engine)
    now = int(time.time())
    # Signed with the right key, but its id is m-1's credential.
    borrowed = [
        raw_token(
            api.settings,
            sub=f"machine:{machine}",
            org=org,
            scope="agent",
            jti=credential_id,
            iat=now,
            exp=now + 600,
        )
        for machine, org in (("m-2", ORG), ("m-1", OTHER_ORG))
    ]

    with caplog.at_level(logging.INFO, logger=AUTH_LOGGER):
        answers = [take(api, token).status_code for token in borrowed]

    assert answers == [401, 401]
    assert refusals(caplog) == ["refused a bearer token: machine credential of another machine"] * 2


def test_an_agent_token_nobody_enrolled_lives_a_day_at_most(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    now = int(time.time())
    agent = {"sub": "machine:m-1", "scope": "agent", "jti": uuid.uuid4().hex}
    day = raw_token(api.settings, **agent, iat=now, exp=now + MAX_AD_HOC_SECONDS)
    longer = raw_token(api.settings, **agent, iat=now, exp=now + MAX_AD_HOC_SECONDS + 1)
    undated = raw_token(api.settings, **agent, iat=None, exp=now + 600)

    with caplog.at_level(logging.INFO, logger=AUTH_LOGGER):
        answers = [take(api, token).status_code for token in (day, longer, undated)]

    assert answers == [204, 401, 401]
    assert refusals(caplog) == [
        "refused a bearer token: agent token not enrolled and valid for more than 24 hours",
        "refused a bearer token: agent token not enrolled and without iat",
    ]


def test_revoking_over_http_is_audited_and_repeating_it_changes_nothing(
    api: Api, owner_engine: Engine
) -> None:
    first, _ = enroll(api, owner_engine)
    second, _ = enroll(api, owner_engine)

    answer = revoke_over_http(api, "m-1")
    again = revoke_over_http(api, "m-1")

    body = answer.get_json()
    assert body["machineId"] == "m-1"
    assert sorted(c["id"] for c in body["revoked"]) == sorted([first, second])
    assert all(c["revokedAt"] and c["expiresAt"] and c["issuedAt"] for c in body["revoked"])
    assert again.status_code == 200 and again.get_json() == {"machineId": "m-1", "revoked": []}
    with owner_engine.connect() as conn:
        audit = conn.execute(
            text(
                "SELECT kind, actor, detail FROM audit_event WHERE kind LIKE 'MACHINE%' ORDER BY id"
            )
        ).all()
        revoked_by = conn.execute(
            text("SELECT DISTINCT revoked_by FROM machine_credential")
        ).scalars()
        assert set(revoked_by) == {"ops-ana"}
    kinds = [(kind, actor) for kind, actor, _ in audit]
    assert kinds == [
        ("MACHINE_ENROLLED", "cli:test"),
        ("MACHINE_ENROLLED", "cli:test"),
        ("MACHINE_CREDENTIALS_REVOKED", "ops-ana"),
    ]
    assert sorted(audit[-1].detail["credentialIds"]) == sorted([first, second])


def test_a_foreign_or_unknown_machine_is_the_same_404_and_nothing_is_revoked(
    api: Api, owner_engine: Engine
) -> None:
    _, theirs = enroll(api, owner_engine, machine="m-9", org=OTHER_ORG)

    foreign = revoke_over_http(api, "m-9")  # ORG's caller, OTHER_ORG's machine
    missing = revoke_over_http(api, "m-never")
    malformed = revoke_over_http(api, "m%201")  # a space: no agent token can name it

    assert foreign.status_code == missing.status_code == malformed.status_code == 404
    assert foreign.get_data() == missing.get_data() == malformed.get_data()
    assert take(api, theirs).status_code == 204


def test_revoking_needs_the_machines_admin_scope(api: Api, owner_engine: Engine) -> None:
    _, token = enroll(api, owner_engine)

    refused = revoke_over_http(api, "m-1", scopes=["requests:write", "agent"])

    assert refused.status_code == 403
    assert problem(refused)["code"] == "INSUFFICIENT_SCOPE"
    assert take(api, token).status_code == 204


def test_without_the_database_an_agent_hears_503_not_401(database) -> None:
    # The credential check reads the database: an agent told 401 would stop for good.
    with running_api(
        "postgresql://nobody@127.0.0.1:9/nothing", request_api_enabled=True
    ) as unreachable:
        token = mint_token(
            unreachable.settings, sub="machine:m-1", org=ORG, scopes=["agent"], token_id="x"
        )

        answer = take(unreachable, token)

    assert answer.status_code == 503
    assert problem(answer)["code"] == "DATABASE_UNAVAILABLE"


def test_the_runtime_role_may_revoke_but_never_create_nor_change_a_credential(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    credential_id, _ = enroll(api, owner_engine)
    forbidden = [
        "INSERT INTO machine_credential (id, org_id, machine_id, issued_at, expires_at,"
        " issued_by) VALUES ('forged', 'org-a', 'm-1', now(), now() + interval '9 years', 'x')",
        "UPDATE machine_credential SET expires_at = now() + interval '9 years'",
        "UPDATE machine_credential SET machine_id = 'm-2'",
        "UPDATE machine_credential SET org_id = 'org-b'",
        "DELETE FROM machine_credential",
    ]
    for statement in forbidden:
        with pytest.raises(ProgrammingError) as raised, runtime_engine.begin() as conn:
            conn.execute(text(statement))
        assert getattr(raised.value.orig, "sqlstate", None) == "42501", statement

    with runtime_engine.begin() as conn:
        revoked = revoke_credentials(conn, org_id=ORG, machine_id="m-1", revoked_by="ops-ana")
    assert [c.id for c in revoked] == [credential_id]


def test_an_enrolment_is_audited_without_the_token(api: Api, owner_engine: Engine) -> None:
    credential_id, token = enroll(api, owner_engine)

    with owner_engine.connect() as conn:
        stored = json.dumps(
            [
                list(map(str, row))
                for table in ("machine_credential", "audit_event")
                for row in conn.execute(text(f"SELECT * FROM {table}"))
            ]
        )

    assert credential_id in stored
    assert token not in stored and token.split(".")[2] not in stored


def test_the_runtime_role_cannot_take_a_revocation_back(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    credential_id, token = enroll(api, owner_engine)
    assert revoke_over_http(api, "m-1").status_code == 200

    # The column grant that lets the API revoke would also set the revocation back.
    for change in ("revoked_at = NULL, revoked_by = NULL", "revoked_by = 'someone else'"):
        with (
            pytest.raises(ProgrammingError, match="a revoked machine credential stays revoked"),
            runtime_engine.begin() as conn,
        ):
            conn.execute(
                text(f"UPDATE machine_credential SET {change} WHERE id = :id"),
                {"id": credential_id},
            )

    assert take(api, token).status_code == 401


# --- revocation reaches polls already open ----------------------------------------------


def _pending_command(engine: Engine, machine: str = "m-1") -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=ORG,
            machine_id=machine,
            command="poweroff",
            args=[],
            external_key=f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def _status(engine: Engine, command_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()


def test_revoking_ends_the_machine_s_open_poll_at_once_and_hands_it_nothing(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    _, token = enroll(api, owner_engine)
    answers: list[tuple[TestResponse, float]] = []

    def poll() -> None:
        started = time.monotonic()
        answer = api.client().post("/api/v1/agent/commands/next?wait=25", headers=bearer(token))
        answers.append((answer, time.monotonic() - started))

    poller = threading.Thread(target=poll)
    poller.start()
    assert api.app.extensions[POLL_SHARE_EXTENSION].wait_until_held(1, timeout=10)

    assert revoke_over_http(api, "m-1").status_code == 200
    poller.join(10)
    command_id = _pending_command(runtime_engine)

    assert not poller.is_alive(), "the revoked agent's poll is still open"
    (answer, seconds) = answers[0]
    assert answer.status_code == 204 and seconds < 10
    assert take(api, token).status_code == 401
    assert _status(runtime_engine, command_id) == "pending"


def test_the_claim_itself_refuses_a_credential_revoked_after_its_poll_began(
    api: Api, owner_engine: Engine, runtime_engine: Engine
) -> None:
    revoked_id, _ = enroll(api, owner_engine)
    valid_id, _ = enroll(api, owner_engine)
    command_id = _pending_command(runtime_engine)
    elsewhere = _pending_command(runtime_engine, machine="m-2")
    # The poll was authenticated before this revocation: only its claim can still refuse.
    with owner_engine.begin() as conn:
        revoke_credentials(
            conn, org_id=ORG, machine_id="m-1", revoked_by="cli:test", credential_id=revoked_id
        )

    refused = next_command(
        runtime_engine, org_id=ORG, machine_id="m-1", wait_seconds=0, credential_id=revoked_id
    )
    foreign = next_command(
        runtime_engine, org_id=ORG, machine_id="m-2", wait_seconds=0, credential_id=valid_id
    )
    assert refused is None and foreign is None  # nor m-1's credential on another machine
    assert _status(runtime_engine, command_id) == _status(runtime_engine, elsewhere) == "pending"
    taken = next_command(
        runtime_engine, org_id=ORG, machine_id="m-1", wait_seconds=0, credential_id=valid_id
    )
    assert taken is not None and str(taken.id) == command_id

"""The agent API over HTTP: each agent sees only its own machine's commands in its own org."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from api_support import ORG, OTHER_ORG, Api, problem, running_api
from sqlalchemy import Connection, Engine, make_url, text
from werkzeug.test import TestResponse

from orquestador.api import agent_routes
from orquestador.api.agent_routes import POLL_SHARE_EXTENSION, PollShare
from orquestador.api.openapi.document import openapi_document
from orquestador.db.engine import make_engine
from orquestador.machines import create_command, next_command
from orquestador.machines.bell import CommandBell, OpenPoll, announce_poll, stop_polls


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def agent(api: Api, machine: str = "m-1", org: str = ORG) -> dict[str, str]:
    return api.headers(sub=f"machine:{machine}", org=org, scopes=["agent"])


def command(engine: Engine, machine: str = "m-1", org: str = ORG, key: str | None = None) -> str:
    with engine.begin() as conn:
        row = create_command(
            conn,
            org_id=org,
            machine_id=machine,
            command="poweroff",
            args=["--now"],
            external_key=key or f"{uuid.uuid4()}:send",
        )
    return str(row.id)


def take(api: Api, headers: dict[str, str], wait: str = "0"):
    return api.client().post(f"/api/v1/agent/commands/next?wait={wait}", headers=headers)


def report(api: Api, headers: dict[str, str], command_id: str, **body):
    return api.client().post(
        f"/api/v1/agent/commands/{command_id}/status", json=body, headers=headers
    )


def status_of(engine: Engine, command_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status FROM machine_command WHERE id = :id"), {"id": command_id}
        ).scalar_one()


def test_the_agent_takes_its_command_once_then_gets_204(api: Api, runtime_engine: Engine) -> None:
    command_id = command(runtime_engine)

    first = take(api, agent(api))
    second = take(api, agent(api))

    assert first.status_code == 200
    answer = first.get_json()
    # How long it had left when handed out: the agent refuses to start it any later.
    within = answer.pop("deliverWithinSeconds")
    assert 0 < within <= 900 and answer.pop("deliverBy")
    assert answer == {"id": command_id, "command": "poweroff", "args": ["--now"]}
    assert status_of(runtime_engine, command_id) == "sent"
    assert second.status_code == 204 and second.get_data() == b""


def test_another_machine_or_organization_never_sees_the_command(
    api: Api, runtime_engine: Engine
) -> None:
    command_id = command(runtime_engine)
    strangers = [agent(api, machine="m-2"), agent(api, org=OTHER_ORG)]

    for headers in strangers:
        assert take(api, headers).status_code == 204
    assert take(api, agent(api)).status_code == 200
    for headers in strangers:
        refused = report(api, headers, command_id, status="running")
        assert refused.status_code == 404
        missing = report(api, headers, str(uuid.uuid4()), status="running")
        assert refused.get_data() == missing.get_data()
    assert status_of(runtime_engine, command_id) == "sent"


def test_statuses_move_forward_and_a_different_final_status_is_409(
    api: Api, runtime_engine: Engine
) -> None:
    command_id = command(runtime_engine)
    headers = agent(api)
    assert report(api, headers, command_id, status="running").status_code == 409  # not sent
    take(api, headers)

    running = report(api, headers, command_id, status="running")
    done = report(api, headers, command_id, status="succeeded", exitCode=0, output="bye")
    again = report(api, headers, command_id, status="succeeded", exitCode=0)
    other = report(api, headers, command_id, status="failed", exitCode=1)
    backwards = report(api, headers, command_id, status="running")

    assert running.status_code == 200 and running.get_json()["status"] == "running"
    assert done.status_code == 200
    assert done.get_json()["status"] == "succeeded" and done.get_json()["exitCode"] == 0
    assert again.status_code == 200 and again.get_json()["changed"] is False
    for refused in (other, backwards):
        assert refused.status_code == 409
        assert problem(refused)["code"] == "STATUS_CONFLICT"
    assert status_of(runtime_engine, command_id) == "succeeded"


def test_a_token_that_is_no_machine_is_refused(api: Api, runtime_engine: Engine) -> None:
    command(runtime_engine)

    person = take(api, api.headers(sub="alice", scopes=["agent"]))
    no_scope = take(api, api.headers(sub="machine:m-1"))

    assert person.status_code == 403 and problem(person)["code"] == "NOT_A_MACHINE"
    assert no_scope.status_code == 403 and problem(no_scope)["code"] == "INSUFFICIENT_SCOPE"


@pytest.mark.parametrize("wait", ["-1", "31", "nan", "soon"])
def test_a_wait_out_of_bounds_is_400(api: Api, wait: str) -> None:
    refused = take(api, agent(api), wait=wait)

    assert refused.status_code == 400
    assert problem(refused)["problems"] == [{"path": "/wait", "message": "seconds from 0 to 30"}]


def test_a_bad_status_body_is_422_and_changes_nothing(api: Api, runtime_engine: Engine) -> None:
    command_id = command(runtime_engine)
    headers = agent(api)
    take(api, headers)

    for body in ({"status": "sent"}, {"status": "succeeded", "exitCode": "0"}, {"extra": 1}):
        refused = report(api, headers, command_id, **body)
        assert refused.status_code == 422, body
    assert status_of(runtime_engine, command_id) == "sent"


def test_a_long_poll_over_http_answers_when_the_command_arrives(
    api: Api, runtime_engine: Engine
) -> None:
    answers: list = []
    started = threading.Event()
    headers = agent(api)

    def poll() -> None:
        started.set()
        answers.append(take(api, headers, wait="20"))

    poller = threading.Thread(target=poll)
    poller.start()
    assert started.wait(5)
    command_id = command(runtime_engine)
    poller.join(10)

    assert not poller.is_alive()
    assert answers[0].status_code == 200 and answers[0].get_json()["id"] == command_id


# --- long polls and the threads they hold -----------------------------------------------


def poll_share(api: Api) -> PollShare:
    return api.app.extensions[POLL_SHARE_EXTENSION]


class Poller:
    """A long poll on a thread of its own; its answer and how long it took, once it ends."""

    def __init__(self, api: Api, headers: dict[str, str], wait: str = "20") -> None:
        self.answer: TestResponse | None = None
        self.seconds = math.inf
        self._thread = threading.Thread(target=self._run, args=(api, headers, wait))
        self._thread.start()

    def _run(self, api: Api, headers: dict[str, str], wait: str) -> None:
        started = time.monotonic()
        self.answer = take(api, headers, wait=wait)
        self.seconds = time.monotonic() - started

    def ended(self, timeout: float = 10) -> TestResponse:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the long poll is still open"
        assert self.answer is not None
        return self.answer


@pytest.mark.parametrize(
    ("share", "threads", "limit"), [(0.5, 4, 2), (0.5, 1, 1), (0.29, 100, 29), (1, 8, 8)]
)
def test_the_share_is_a_floor_of_the_threads_and_at_least_one(
    share: float, threads: int, limit: int
) -> None:
    assert PollShare.limit_for(share, threads) == limit


def test_polls_beyond_the_share_answer_429_with_retry_after_at_once(
    api: Api, runtime_engine: Engine
) -> None:
    assert poll_share(api).limit == 2  # API_THREADS 4, AGENT_POLL_SHARE 0.5
    open_polls = [Poller(api, agent(api, machine=m)) for m in ("m-1", "m-2")]
    assert poll_share(api).wait_until_held(2, timeout=10)

    started = time.monotonic()
    refused = take(api, agent(api, machine="m-3"), wait="20")
    refused_after = time.monotonic() - started
    # A poll that does not wait holds a thread no longer than a read: never refused.
    look = take(api, agent(api, machine="m-3"), wait="0")

    assert refused.status_code == 429, refused.status_code
    # Refused at once, not after the poll's wait (half of it is room for a busy machine).
    assert refused_after < 10
    assert problem(refused)["code"] == "AGENT_POLLS_BUSY"
    assert refused.headers["Retry-After"] == "5"
    assert look.status_code == 204
    # A place frees when an open poll ends: then the next poll is taken.
    command_id = command(runtime_engine, machine="m-1")
    assert open_polls[0].ended().get_json()["id"] == command_id
    command(runtime_engine, machine="m-2")
    open_polls[1].ended()
    assert take(api, agent(api, machine="m-3"), wait="0.1").status_code == 204
    assert poll_share(api).held == 0


def test_a_newer_poll_of_the_machine_ends_the_older_with_204_at_once(
    api: Api, runtime_engine: Engine
) -> None:
    older = Poller(api, agent(api))
    assert poll_share(api).wait_until_held(1, timeout=10)

    newer = Poller(api, agent(api))
    ended = older.ended()
    command_id = command(runtime_engine)

    assert ended.status_code == 204 and older.seconds < 5
    # The command goes to the poll that is open, never to the one that was ended.
    assert newer.ended().get_json()["id"] == command_id
    assert status_of(runtime_engine, command_id) == "sent"


def test_an_older_poll_announced_after_the_newer_opened_does_not_end_it(
    api: Api, runtime_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    announced: list[str] = []
    newer_announced = threading.Event()
    # A grace far longer than the older's delay below, so that a loaded machine cannot
    # make the newer stop waiting before the older is over.
    monkeypatch.setattr(agent_routes, "REPLACED_POLL_GRACE_SECONDS", 10.0)

    def late_for_the_older(conn: Connection, poll: OpenPoll) -> None:
        if not announced:
            # The older poll's announcement is slow (a loaded server): it comes after a
            # newer poll of the machine has opened here and ended it, and after the newer
            # announced itself too, unless the newer waits for it (0.5 s at most here).
            assert poll.ended.wait(10)
            newer_announced.wait(0.5)
        announced.append(poll.id)
        announce_poll(conn, poll)
        if len(announced) == 2:
            newer_announced.set()

    monkeypatch.setattr(agent_routes, "announce_poll", late_for_the_older)
    older = Poller(api, agent(api))
    assert poll_share(api).wait_until_held(1, timeout=10)
    newer = Poller(api, agent(api))
    assert older.ended().status_code == 204
    command_id = command(runtime_engine)

    # Announced later by the database's clock, the older would count as the newer and its
    # notification would end the one that is open: the newer announces after it instead.
    assert newer.ended().get_json()["id"] == command_id
    assert len(announced) == 2


def test_a_newer_poll_takes_the_place_of_its_machines_older_one_when_the_share_is_full(
    api: Api, runtime_engine: Engine
) -> None:
    older, other = Poller(api, agent(api)), Poller(api, agent(api, machine="m-2"))
    assert poll_share(api).wait_until_held(2, timeout=10)

    newer = Poller(api, agent(api))

    assert older.ended().status_code == 204
    command_id = command(runtime_engine)
    assert newer.ended().get_json()["id"] == command_id
    command(runtime_engine, machine="m-2")
    assert other.ended().status_code == 200


def test_a_poll_opened_in_another_process_ends_this_ones(database) -> None:
    # Two bells on one database stand for two API processes: each has its own.
    url = make_url(database.runtime_dsn).set(drivername="postgresql")
    here, there = (CommandBell(url.render_as_string(hide_password=False)) for _ in range(2))
    engine = make_engine(database.runtime_dsn)
    try:
        with (
            here.open_poll(ORG, "m-1") as older,
            here.open_poll(ORG, "m-2") as stranger,
            here.open_poll(OTHER_ORG, "m-1") as foreign,
        ):
            with engine.begin() as conn:
                for poll in (older, stranger, foreign):
                    announce_poll(conn, poll)
            assert here.listening.wait(10)
            with there.open_poll(ORG, "m-1") as newer:
                with engine.begin() as conn:
                    announce_poll(conn, newer)

                assert older.ended.wait(10)
                assert not newer.ended.is_set()
            assert not stranger.ended.is_set() and not foreign.ended.is_set()
    finally:
        engine.dispose()


def test_an_ended_poll_takes_no_command_even_a_pending_one(
    database, runtime_engine: Engine
) -> None:
    command_id = command(runtime_engine)
    url = make_url(database.runtime_dsn).set(drivername="postgresql")
    bell = CommandBell(url.render_as_string(hide_password=False), idle_seconds=1)
    ended = threading.Event()
    ended.set()  # a newer poll of the machine ended it before its first look

    taken = next_command(
        runtime_engine, org_id=ORG, machine_id="m-1", wait_seconds=5, bell=bell, stop=ended
    )

    assert taken is None
    assert status_of(runtime_engine, command_id) == "pending"


def test_a_stopping_process_ends_its_open_polls_and_any_opened_after(api: Api) -> None:
    open_poll = Poller(api, agent(api))
    assert poll_share(api).wait_until_held(1, timeout=10)

    # What a gunicorn worker does on SIGTERM (serve.py); this test's database, and so
    # its bell, is its own.
    stop_polls()

    assert open_poll.ended().status_code == 204 and open_poll.seconds < 5
    late = Poller(api, agent(api, machine="m-2"))
    assert late.ended().status_code == 204 and late.seconds < 5


def test_the_openapi_document_lists_the_429_and_its_retry_after() -> None:
    poll = openapi_document()["paths"]["/agent/commands/next"]["post"]

    assert "Retry-After" in poll["responses"]["429"]["headers"]
    assert "AGENT_POLL_SHARE" in poll["description"]

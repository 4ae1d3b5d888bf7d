"""200 agents long-polling `orquestador api` (gunicorn, shipped settings) leave the API answering.

The issue this guards: polls sleeping in request threads once took every thread, and
`/healthz` and reads went unanswered for over 80 s. SPEC section 16 states the bound as
a p99 of 100 ms: benchmarks/agent_polls.py measures it; here every probe must be
answered, with room for a busy machine, and the poll share must have been reached.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.machines.bell import POLL_OPENED_CHANNEL
from tests.acceptance.polling_agents import (
    AGENTS,
    FLOW,
    ORG,
    POLL_WAIT_SECONDS,
    SECRET,
    PollingAgents,
    call,
    gunicorn_api,
    latency,
    summary,
)
from tests.db_support import TestDatabase

PROBES = 30
# A probe that waits this long waited for a thread the polls held.
UNANSWERED = 10.0


def test_200_polling_agents_leave_healthz_and_reads_answering(
    database: TestDatabase, tmp_path: Path
) -> None:
    settings = Settings.from_env({}, jwt_secret=SECRET)
    person = mint_token(
        settings, sub="alice", org=ORG, scopes=["flows:admin", "requests:read", "requests:write"]
    )
    agents = [
        mint_token(settings, sub=f"machine:m-{n}", org=ORG, scopes=["agent"]) for n in range(AGENTS)
    ]
    with gunicorn_api(database.runtime_dsn, tmp_path / "api.log") as api:
        flow = call(api.url("/flows"), person, FLOW)
        request = call(api.url("/requests"), person, {"flowId": flow["id"], "data": {}})
        read_path = f"/api/v1/requests/{request['id']}"

        with PollingAgents(api.port, agents) as pollers:
            # Every agent has had a first answer (a poll taken, or a 429) before probing;
            # before the fix the polls held every thread and this never happened.
            assert pollers.everyone_answered.wait(60), dict(pollers.answers)
            healthz = [latency(api.port, "/healthz", None, UNANSWERED) for _ in range(PROBES)]
            reads = [latency(api.port, read_path, person, UNANSWERED) for _ in range(PROBES)]
            answers = dict(pollers.answers)

    report = "\n".join(
        [
            f"{AGENTS} agents polling with wait={POLL_WAIT_SECONDS}; their answers: {answers}",
            summary("/healthz", healthz),
            summary(f"GET {read_path}", reads),
        ]
    )
    # Before the fix a probe waited over 80 s for a thread; the latency itself is measured
    # by benchmarks/agent_polls.py, where a busy machine cannot fail a suite.
    assert max(healthz + reads) < UNANSWERED, report
    # The share was reached and held: polls were taken, the rest told to come back.
    assert answers.get("429", 0) > 0 and not any(s.startswith("5") for s in answers), report


def test_a_stopping_api_answers_its_open_polls_204_at_once(
    database: TestDatabase, tmp_path: Path
) -> None:
    settings = Settings.from_env({}, jwt_secret=SECRET)
    token = mint_token(settings, sub="machine:m-1", org=ORG, scopes=["agent"])
    with gunicorn_api(database.runtime_dsn, tmp_path / "api.log", API_WORKERS="1") as api:
        poll = urllib.request.Request(
            api.url("/agent/commands/next?wait=30"),
            data=b"",
            method="POST",
            headers={"Authorization": f"Bearer {token}"},
        )
        answers: list[int] = []

        def take() -> None:
            with urllib.request.urlopen(poll, timeout=40) as response:
                answers.append(response.status)

        conninfo = database.owner_url.set(drivername="postgresql")
        with psycopg.connect(
            conninfo.render_as_string(hide_password=False), autocommit=True
        ) as listener:
            listener.execute(f"LISTEN {POLL_OPENED_CHANNEL}")
            poller = threading.Thread(target=take)
            poller.start()
            # An open poll announces itself to the other processes' bells: then it waits.
            opened = list(listener.notifies(timeout=20, stop_after=1))
        assert opened, "the poll never opened"
        started = time.monotonic()
        api.process.send_signal(signal.SIGTERM)
        poller.join(20)
        assert api.process.wait(20) == 0
        stopped_after = time.monotonic() - started

    assert answers == [204]
    assert stopped_after < 10, f"stopping took {stopped_after:.1f}s"


def test_the_share_follows_the_threads_gunicorn_runs_even_when_its_command_line_sets_them(
    database: TestDatabase, tmp_path: Path
) -> None:
    settings = Settings.from_env({}, jwt_secret=SECRET)
    tokens = [mint_token(settings, sub=f"machine:m-{n}", org=ORG, scopes=["agent"]) for n in (1, 2)]
    # API_THREADS says 4 (two places); gunicorn runs 2 threads: one place.
    command = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "--threads", "2"]
    with gunicorn_api(database.runtime_dsn, tmp_path / "api.log", command, API_WORKERS="1") as api:
        answers: list[int] = []

        def poll(token: str, wait: int) -> int:
            request = urllib.request.Request(
                api.url(f"/agent/commands/next?wait={wait}"),
                data=b"",
                method="POST",
                headers={"Authorization": f"Bearer {token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=40) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        conninfo = database.owner_url.set(drivername="postgresql")
        with psycopg.connect(
            conninfo.render_as_string(hide_password=False), autocommit=True
        ) as listener:
            listener.execute(f"LISTEN {POLL_OPENED_CHANNEL}")
            holder = threading.Thread(target=lambda: answers.append(poll(tokens[0], 3)))
            holder.start()
            assert list(listener.notifies(timeout=20, stop_after=1)), "the poll never opened"
        second = poll(tokens[1], 3)
        holder.join(10)

    assert second == 429
    assert answers == [204]

"""The machine agent API: an agent long-polls its own machine's commands and reports status.

An agent's token has the `agent` scope and `sub` = "machine:<machineId>"; its `org` is
the machine's organization. Every look-up carries both in its WHERE: another machine's
or another organization's command answers the same 404 as a missing one.

A long poll sleeps in a request thread, so polls may hold at most AGENT_POLL_SHARE of a
process's request threads (PollShare); beyond it a poll answers 429 with Retry-After at
once, and the rest of the threads stay free for every other route. A machine has one
open poll: a newer one ends the older with 204 (the bell keeps that, across processes).
"""

from __future__ import annotations

import math
import threading
import uuid
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState

from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import read_json_object
from orquestador.api.claims import SCOPE_AGENT
from orquestador.api.context import EXTENSION_KEY, engine
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.views import API_PREFIX, timestamp
from orquestador.config import libpq_url
from orquestador.errors import Problem
from orquestador.machines import (
    next_command,
    report_status,
)
from orquestador.machines.bell import announce_poll, bell_for
from orquestador.machines.commands import REPORTABLE, AgentCommand
from orquestador.machines.liveness import record_seen
from orquestador.machines.long_poll import MAX_WAIT_SECONDS

blueprint = Blueprint("agent", __name__, url_prefix=f"{API_PREFIX}/agent")

MACHINE_SUBJECT_PREFIX = "machine:"
POLL_SHARE_EXTENSION = "orquestador.agent_poll_share"
# What a refused poll is told: a place frees when any open poll ends (a command, its
# wait, a newer poll of its machine), so a few seconds, spread by the agent's jitter.
POLL_RETRY_AFTER_SECONDS = 5
# How long a poll that ended its machine's older poll waits for that one's place: the
# older answers at once, unless a look of it is in flight.
REPLACED_POLL_GRACE_SECONDS = 1.0


class PollShare:
    """The agent long polls this process holds, bounded by a share of its request threads."""

    def __init__(self, share: float, threads: int) -> None:
        self._share = share
        self._changed = threading.Condition()
        self._held = 0
        self.limit = self.limit_for(share, threads)

    @staticmethod
    def limit_for(share: float, threads: int) -> int:
        """floor(share * threads), at least 1 (the epsilon keeps 0.29 * 100 at 29)."""
        return max(1, math.floor(share * threads + 1e-9))

    def size_for(self, threads: int) -> None:
        """Take the share of the threads the server really runs (serve.py tells)."""
        with self._changed:
            self.limit = self.limit_for(self._share, threads)
            self._changed.notify_all()

    @property
    def held(self) -> int:
        with self._changed:
            return self._held

    def take(self, timeout: float = 0.0) -> bool:
        """A place for one poll, waiting at most TIMEOUT for one to free; False if none."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._held < self.limit, timeout):
                return False
            self._held += 1
            self._changed.notify_all()
            return True

    def give_back(self) -> None:
        with self._changed:
            self._held -= 1
            self._changed.notify_all()

    def wait_until_held(self, count: int, timeout: float) -> bool:
        """Whether COUNT polls are open within TIMEOUT (tests synchronise on it)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held >= count, timeout)


@blueprint.record_once
def _add_poll_share(state: BlueprintSetupState) -> None:
    # The share is per app, and gunicorn builds one app per worker process.
    settings = state.app.extensions[EXTENSION_KEY].settings
    state.app.extensions[POLL_SHARE_EXTENSION] = PollShare(
        settings.agent_poll_share, settings.api_threads
    )


def size_poll_share(app: Flask, threads: int) -> None:
    """Bound the app's polls by the request threads its server runs (none: no agent API)."""
    share = app.extensions.get(POLL_SHARE_EXTENSION)
    if isinstance(share, PollShare):
        share.size_for(threads)


STATUS_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["status"],
    "additionalProperties": False,
    "properties": {
        "status": {"enum": list(REPORTABLE)},
        "exitCode": {"type": ["integer", "null"], "minimum": -(2**31), "maximum": 2**31 - 1},
        # A chunk of the command's output, taken once by its offset; what is kept stays
        # within COMMAND_OUTPUT_MAX_BYTES (head and tail).
        "output": {"type": ["string", "null"]},
        # Bytes (UTF-8) of output the agent sent before this chunk; 0 when absent.
        "outputOffset": {"type": "integer", "minimum": 0, "maximum": 2**53},
    },
}


def _machine_of(caller: Caller) -> str:
    machine = caller.sub.removeprefix(MACHINE_SUBJECT_PREFIX)
    if not caller.sub.startswith(MACHINE_SUBJECT_PREFIX) or not machine:
        raise ApiProblem(
            403,
            "NOT_A_MACHINE",
            "An agent token's subject must be machine:<machineId> "
            "(orquestador token --machine M --org O).",
        )
    return machine


def _wait_seconds() -> float:
    raw = request.args.get("wait", "0")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (0 <= seconds <= MAX_WAIT_SECONDS):  # NaN fails both comparisons
        raise ApiProblem(
            400,
            "QUERY_INVALID",
            "A query parameter is invalid.",
            problems=[Problem("/wait", f"seconds from 0 to {MAX_WAIT_SECONDS:g}")],
        )
    return seconds


@blueprint.post("/commands/next")
@requires_scope(SCOPE_AGENT)
def take_next() -> Response | tuple[str, int]:
    caller = current_caller()
    machine = _machine_of(caller)
    wait = _wait_seconds()
    database = engine()
    with database.begin() as conn:
        # The agent is alive: every poll says so (written at most every few seconds).
        record_seen(conn, org_id=caller.org, machine_id=machine)
    if wait == 0:
        # One look and no sleep: it holds a thread no longer than any read, so it takes
        # no place among the long polls and ends none.
        command = next_command(
            database,
            org_id=caller.org,
            machine_id=machine,
            wait_seconds=0,
            credential_id=caller.token_id,
        )
        return _command_answer(command)
    # The bell listens on a connection of its own (psycopg's URL, without the driver name).
    direct = current_app.extensions[EXTENSION_KEY].settings.listen_database_url
    conninfo = libpq_url(direct or database.url)
    bell = bell_for(conninfo)
    share: PollShare = current_app.extensions[POLL_SHARE_EXTENSION]
    with bell.open_poll(caller.org, machine) as poll:
        # Ending this machine's older poll frees its place a moment later: wait for it,
        # and so for its announcement too, if it was still to make one (see the bell).
        poll.wait_for_older(REPLACED_POLL_GRACE_SECONDS)
        if not share.take(REPLACED_POLL_GRACE_SECONDS if poll.replaced_older else 0.0):
            raise ApiProblem(
                429,
                "AGENT_POLLS_BUSY",
                "This API process holds as many agent long polls as it allows; "
                "poll again after Retry-After seconds.",
                headers={"Retry-After": str(POLL_RETRY_AFTER_SECONDS)},
            )
        try:
            with database.begin() as conn:
                announce_poll(conn, poll)
            command = next_command(
                database,
                org_id=caller.org,
                machine_id=machine,
                wait_seconds=wait,
                credential_id=caller.token_id,
                bell=bell,
                stop=poll.ended,
            )
        finally:
            share.give_back()
    return _command_answer(command)


def _command_answer(command: AgentCommand | None) -> Response | tuple[str, int]:
    if command is None:
        return "", 204
    return jsonify(command.as_json())


@blueprint.post("/commands/<command_id>/status")
@requires_scope(SCOPE_AGENT)
def report(command_id: str) -> Response:
    caller = current_caller()
    machine = _machine_of(caller)
    try:
        parsed = uuid.UUID(command_id)
    except ValueError:
        raise not_found() from None
    body = read_json_object(STATUS_BODY)
    settings = current_app.extensions[EXTENSION_KEY].settings
    with engine().begin() as conn:
        record_seen(conn, org_id=caller.org, machine_id=machine)
        reported = report_status(
            conn,
            org_id=caller.org,
            machine_id=machine,
            command_id=parsed,
            status=body["status"],
            exit_code=body.get("exitCode"),
            output=body.get("output"),
            output_offset=body.get("outputOffset", 0),
            output_max_bytes=settings.command_output_max_bytes,
        )
    return jsonify(
        {
            "id": str(reported.id),
            "status": reported.status,
            "exitCode": reported.exit_code,
            "updatedAt": timestamp(reported.updated_at),
            "finishedAt": timestamp(reported.finished_at),
            "changed": reported.changed,
            # Where the agent's next chunk starts: what of its output the server has.
            "outputOffset": reported.output_received,
            "outputTruncated": reported.output_truncated,
            # A cancel asked to stop the command: the agent stops it and reports cancelled.
            "cancelRequested": reported.cancel_requested,
        }
    )

"""Each boundary translates a refusal once, by one table: the API's status, the CLI's exit."""

from __future__ import annotations

import argparse

import pytest
from flask import Flask

from orquestador.api.problems import REFUSAL_STATUS, refusal_problem
from orquestador.automation.plans import TriggerMismatch
from orquestador.automation.schedules import FlowNotFound, QuotaExceeded, ScheduleRefused
from orquestador.cli.exits import EXIT_INTERRUPTED, exit_status
from orquestador.cli.output import EXIT_REFUSED, EXIT_USAGE, CommandFailed, UsageProblem
from orquestador.client import ApiError, ApiUnreachable
from orquestador.errors import (
    ConfigError,
    DecisionInvalid,
    NotCancellable,
    NotReconcilable,
    OrquestadorError,
    Refusal,
    StaleItem,
)
from orquestador.machines.commands import CommandNotFound, StatusConflict
from orquestador.machines.credentials import MachineNotEnrolled
from orquestador.queue import acceptance
from orquestador.rollouts.control import RolloutRefused


@pytest.mark.parametrize(
    ("refused", "status"),
    [
        (NotReconcilable("not parked"), 409),
        (StaleItem("changed"), 409),
        (NotCancellable("ended"), 409),
        (StatusConflict("SUCCEEDED", "RUNNING"), 409),
        (RolloutRefused("ROLLOUT_ENDED", "ended"), 409),
        (DecisionInvalid("DECISION_UNKNOWN", "no such decision"), 422),
        (acceptance.TransitionRefused(acceptance.TRANSITION_UNKNOWN, "no"), 422),
        (acceptance.TransitionRefused(acceptance.REVISION_CONFLICT, "stale"), 409),
        (acceptance.TransitionRefused(acceptance.REQUEST_BUSY, "busy"), 409),
        (ScheduleRefused("SCHEDULE_INVALID", "no", []), 422),
        (QuotaExceeded("schedules", 3, 3), 422),
        (TriggerMismatch("deploy"), 422),
        (FlowNotFound(), 404),
        (CommandNotFound(), 404),
        (MachineNotEnrolled(), 404),
        (RolloutRefused(Refusal.NOT_FOUND, "no rollout"), 404),
    ],
)
def test_every_refusal_has_one_status_and_keeps_its_code(refused, status):
    with Flask(__name__).test_request_context():
        problem = refusal_problem(refused)
    assert problem.status == status
    assert problem.code == ("NOT_FOUND" if status == 404 else refused.code)


def test_the_status_table_names_only_refusals():
    assert all(issubclass(kind, Refusal) for kind in REFUSAL_STATUS)


def _args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**given)


@pytest.mark.parametrize(
    ("error", "args", "status"),
    [
        (ConfigError(["DATABASE_URL: not set"]), _args(), EXIT_USAGE),
        (CommandFailed("no", 3), _args(), 3),
        (UsageProblem("ORQUESTADOR_TOKEN is not set"), _args(), EXIT_USAGE),
        (ApiError(409, {"code": "REQUEST_BUSY"}, ""), _args(json=False), EXIT_REFUSED),
        (ApiError(409, None, "busy"), _args(json=False, refused_exit=EXIT_USAGE), EXIT_USAGE),
        (ApiUnreachable("no answer", "refused"), _args(), EXIT_USAGE),
        (OrquestadorError("broken"), _args(), 1),
        (KeyboardInterrupt(), _args(), EXIT_INTERRUPTED),
    ],
)
def test_every_error_the_command_line_knows_has_one_exit_status(error, args, status, capsys):
    assert exit_status(error, args) == status
    if status != EXIT_INTERRUPTED:
        assert capsys.readouterr().err.startswith("orquestador: ")


def test_an_error_no_row_names_keeps_its_traceback():
    assert exit_status(ValueError("a bug"), _args()) is None

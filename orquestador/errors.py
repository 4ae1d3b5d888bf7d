"""Exception hierarchy of the product; each docstring is the default message.

    OrquestadorError                 code, message
    ├── ConfigError                  every bad setting at once (the CLI exits 2)
    ├── DatabaseUnavailable          the API answers 503, a worker waits it out
    ├── LeaseLost                    a holder's write fenced off: it stops, never retries
    ├── RequestChanged, ContractMismatch, IntegrationUnavailable
    ├── CancelRequested              the holder applies a cancel asked while a call ran
    ├── DomainError                  domain/errors.py: a rule of the pure code broken
    │   └── DataValidationError ...  with its problems at their paths
    ├── MigrationFailed, EngineUnavailable, CredentialRefused   (their own modules)
    └── Refusal                      the caller's to change: code, message, problems
        ├── NotReconcilable
        │   └── StaleItem
        ├── NotCancellable
        ├── DecisionInvalid
        ├── TransitionRefused        queue/acceptance.py, one code per reason
        ├── RolloutRefused           rollouts/control.py
        ├── ScheduleRefused, QuotaExceeded, FlowNotFound   automation/schedules.py
        ├── TriggerMismatch                                automation/plans.py
        ├── CommandNotFound, StatusConflict                machines/commands.py
        └── MachineNotEnrolled                             machines/credentials.py

A refusal is translated once at each boundary: the API's one table
(`api/problems.py` `REFUSAL_STATUS`) gives its HTTP status, the command line's
(`cli/exits.py`) its exit status. A refusal whose code is NOT_FOUND is the API's one 404.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem found in a document, located by a JSON Pointer into it."""

    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class OrquestadorError(Exception):
    """Something went wrong in orquestador."""

    code = "INTERNAL"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class ConfigError(OrquestadorError):
    """The configuration is invalid."""

    code = "CONFIG_INVALID"

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class DatabaseUnavailable(OrquestadorError):
    """The database cannot be reached."""

    code = "DATABASE_UNAVAILABLE"


class LeaseLost(OrquestadorError):
    """This worker no longer holds the execution's lease; its write was refused."""

    code = "LEASE_LOST"


class RequestChanged(OrquestadorError):
    """The request changed since the transition was accepted."""

    code = "REQUEST_CHANGED"


class ContractMismatch(OrquestadorError):
    """A recovered checkpoint does not match the action about to run."""

    code = "CONTRACT_MISMATCH"


class CancelRequested(OrquestadorError):
    """A person asked to cancel the execution while a step's call ran; its holder applies it."""

    code = "CANCEL_REQUESTED"


class IntegrationUnavailable(OrquestadorError):
    """No adapter is configured for this capability and version."""

    code = "INTEGRATION_UNAVAILABLE"


class Refusal(OrquestadorError):
    """The product refuses what was asked."""

    code = "REFUSED"
    NOT_FOUND = "NOT_FOUND"  # the code of every refusal that is "no such thing of yours"

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        problems: Iterable[Problem] = (),
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        # Each problem's own words at its path, when the refusal has some.
        self.problems: list[Problem] = list(problems)

    @property
    def detail(self) -> str:
        """What a person is told (an answer's detail); the message unless a class says more."""
        return self.message


class NotReconcilable(Refusal):
    """The execution is not waiting for this decision on this step."""

    code = "NOT_RECONCILABLE"


class StaleItem(NotReconcilable):
    """The execution changed after the bulk was accepted: decide about it on its own."""

    code = "STALE_ITEM"


class NotCancellable(Refusal):
    """Only an execution that has not started (or is waiting) can be cancelled."""

    code = "NOT_CANCELLABLE"


class DecisionInvalid(Refusal):
    """The decision's content is invalid (an output that breaks the schema, an unknown state)."""

    code = "DECISION_INVALID"

    def __init__(
        self,
        code: str,
        message: str,
        paths: list[str] | None = None,
        *,
        problems: Iterable[Problem] = (),
    ) -> None:
        super().__init__(message, code=code, problems=problems)
        # Each problem's own words at its path, when it has some; else `message` at `paths`.
        self.paths = list(paths or []) or [problem.path for problem in self.problems]

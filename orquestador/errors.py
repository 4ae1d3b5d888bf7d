"""Exception hierarchy of the product; each docstring is the default message."""

from __future__ import annotations


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


class IntegrationUnavailable(OrquestadorError):
    """No adapter is configured for this capability and version."""

    code = "INTEGRATION_UNAVAILABLE"

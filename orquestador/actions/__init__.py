"""Trusted adapters: contracts, outcome errors and the versioned registry."""

from orquestador.actions.contracts import ActionContext, Adapter, Effect, Identity
from orquestador.actions.errors import (
    NotReady,
    PermanentError,
    TransientError,
    UncertainError,
)
from orquestador.actions.loading import load_registry
from orquestador.actions.lookup import Found, LookupResult, NotFound, Unknown
from orquestador.actions.registry import AdapterRegistry

__all__ = [
    "ActionContext",
    "Adapter",
    "AdapterRegistry",
    "Effect",
    "Found",
    "Identity",
    "LookupResult",
    "NotFound",
    "NotReady",
    "PermanentError",
    "TransientError",
    "UncertainError",
    "Unknown",
    "load_registry",
]

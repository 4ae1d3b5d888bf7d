"""What every job of a worker shares and never changes: parsed flows and compiled schemas."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from typing import Any

from jsonschema.protocols import Validator

from orquestador.actions import Adapter
from orquestador.domain.flow_definition import FlowDefinition


class FlowCache:
    """Parsed flow definitions by id; safe because a published flow row never changes."""

    def __init__(self, size: int = 256) -> None:
        self._flows: OrderedDict[uuid.UUID, FlowDefinition] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, flow_id: uuid.UUID, definition: dict[str, Any]) -> FlowDefinition:
        with self._lock:
            flow = self._flows.get(flow_id)
            if flow is not None:
                self._flows.move_to_end(flow_id)
                return flow
        flow = FlowDefinition.from_json(definition)
        with self._lock:
            self._flows[flow_id] = flow
            while len(self._flows) > self._size:
                self._flows.popitem(last=False)
        return flow


class SchemaCache:
    """Compiled input/output validators per adapter."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, int, str], Validator] = {}
        self._lock = threading.Lock()

    def validator(self, adapter: Adapter, which: str) -> Validator:
        key = (adapter.capability, adapter.version, which)
        with self._lock:
            found = self._validators.get(key)
        if found is None:
            # The one way validators are built: no reference reaches the network or a
            # file, patterns run in RE2, formats are asserted.
            from orquestador.domain.schemas import validator_for

            schema = adapter.input_schema if which == "input" else adapter.output_schema
            found = validator_for(schema)
            with self._lock:
                self._validators[key] = found
        return found

    def problems(self, adapter: Adapter, which: str, value: Any) -> list[str]:
        """Where `value` breaks the schema, as JSON Pointers only: values may be secret."""
        errors = self.validator(adapter, which).iter_errors(value)
        return sorted({"/" + "/".join(str(p) for p in error.absolute_path) for error in errors})

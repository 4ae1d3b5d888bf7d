"""What `orquestador flows lint` finds in a flow definition, without a server.

Everything publishing would refuse or warn about that needs no adapter to judge
(the schema, unknown states, decision tables, including FIRST rules an earlier rule
shadows), then the states nothing reaches and the transitions that can never run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orquestador.domain.flow_definition import validate_definition
from orquestador.domain.reachability import unreachable
from orquestador.errors import Problem


def lint_definition(definition: Any) -> list[Problem]:
    errors, warnings = validate_definition(definition)
    found = [*errors, *warnings]
    if isinstance(definition, Mapping) and not errors:
        found += unreachable(definition)
    return found

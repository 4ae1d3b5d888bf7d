"""What the two fuzz modules share: how many examples, and the API's document per mode.

The suite draws 10 examples per operation and mode: every documented operation is still
fuzzed in every run, and the run stays short. A deeper search sets
ORQUESTADOR_FUZZ_EXAMPLES (say 200) and runs the two fuzz modules alone.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from flask import Flask
from schemathesis import GenerationMode

MAX_EXAMPLES = int(os.environ.get("ORQUESTADOR_FUZZ_EXAMPLES", "10"))


def schemas_by_mode(app: Flask) -> dict[GenerationMode, Any]:
    """The API's document read once per mode. Positive cases leave out NUL characters so
    they get past the body checks and reach the database; negative cases keep them to
    probe those checks."""
    return {
        mode: schemathesis.openapi.from_wsgi(
            "/api/v1/openapi.json",
            app,
            config=schemathesis.Config.from_dict(
                {"generation": {"allow-x00": mode is GenerationMode.NEGATIVE}}
            ),
        )
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    }

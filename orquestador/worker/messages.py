"""The safe, bounded message kept per attempt and written to logs when an adapter fails.

An adapter's own errors (TransientError, PermanentError, UncertainError) carry words
its author chose for operators; anything else it raised is reported with its class.
Either way every configured secret value becomes `[redacted]` (SPEC 16, see
`orquestador.redaction`) and every input string it is given `[input]` (the engine gives
those read from data or outputs; a flow's constants may be named) before the text
is kept or logged, and the text is cut to ATTEMPT_MESSAGE_MAX characters: inputs may be
secret, and a message is not a place for a provider's whole answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orquestador.actions.errors import ActionError
from orquestador.db.schema import ATTEMPT_MESSAGE_MAX
from orquestador.redaction import REDACTED, replace_values, secret_values

# Shorter strings are too common to blank out without destroying the message.
_MIN_BLANKED = 4
_BLANK = "[input]"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def attempt_message(exc: BaseException, inputs: Any) -> str:
    """What may be stored and logged about `exc`, a failure of a call that got `inputs`."""
    text = str(exc) if isinstance(exc, ActionError) else f"{type(exc).__name__}: {exc}"
    replacements = {value: _BLANK for value in _strings(inputs) if len(value) >= _MIN_BLANKED}
    # A secret that is also an input is still a secret. Redacted before the cut, so no
    # part of a value is left at the end.
    replacements.update(dict.fromkeys(secret_values(), REDACTED))
    text = replace_values(text, replacements)
    if len(text) > ATTEMPT_MESSAGE_MAX:
        text = text[: ATTEMPT_MESSAGE_MAX - 1] + "…"
    return text

"""What an adapter's lookup answers: the provider has the keyed write, has not, or cannot say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Found:
    """The provider has the write keyed by the external key; `output` is what the call returns."""

    output: dict[str, Any]


@dataclass(frozen=True)
class NotFound:
    """The provider has no write under the external key: it did not happen."""


@dataclass(frozen=True)
class Unknown:
    """The provider cannot tell (yet); the write stays in doubt."""


LookupResult = Found | NotFound | Unknown

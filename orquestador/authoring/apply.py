"""`orquestador flows apply DIR`: a folder of flow files made the published flows.

Every `*.json` file under DIR (but `*.cases.json`, the cases of `flows test`) is a flow
definition; one whose canonical content (RFC 8785: key order, spacing and `1.0` versus
`1` do not count) differs from the latest published version of its key is published as
the next version, and one that matches is left alone, so a second run changes nothing.
The folder is read whole and checked before anything is published.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orquestador.domain.canonical import canonical_json
from orquestador.domain.json_text import parse_json

CASES_SUFFIX = ".cases.json"


class FolderInvalid(ValueError):
    """Files of the folder that are no flow definition; one line each."""


@dataclass(frozen=True)
class FlowFile:
    path: Path
    key: str
    definition: dict[str, Any]


@dataclass(frozen=True)
class Change:
    """What applying does with one file: `create` a version, or leave it `unchanged`."""

    file: FlowFile
    action: str
    version: int  # the version created, or the latest one that matches
    flow_id: str | None = None  # known once published or when unchanged


def flow_files(folder: Path) -> list[FlowFile]:
    """The folder's flow files, by path; FolderInvalid names each one that is not."""
    if not folder.is_dir():
        raise FolderInvalid(f"{folder}: not a folder")
    found: list[FlowFile] = []
    problems: list[str] = []
    first_of: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.json")):
        if path.name.endswith(CASES_SUFFIX) or not path.is_file():
            continue
        try:
            definition = parse_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: cannot be read ({exc.__class__.__name__})")
            continue
        except ValueError as exc:
            problems.append(f"{path}: not JSON: {exc}")
            continue
        key = definition.get("key") if isinstance(definition, dict) else None
        if not isinstance(key, str) or not key:
            problems.append(f'{path}: not a flow definition: no "key"')
        elif key in first_of:
            problems.append(f"{path}: the key {key!r} is {first_of[key]}'s too")
        else:
            first_of[key] = path
            found.append(FlowFile(path, key, definition))
    if problems:
        raise FolderInvalid("\n".join(problems))
    return found


def plan(
    files: Sequence[FlowFile],
    latest: Callable[[str], dict[str, Any] | None],
) -> list[Change]:
    """What applying would do; `latest(key)` is the newest published version, with its
    `definition`, or None."""
    changes = []
    for file in files:
        published = latest(file.key)
        if published is None:
            changes.append(Change(file, "create", 1))
        elif canonical_json(published["definition"]) == canonical_json(file.definition):
            changes.append(Change(file, "unchanged", published["version"], published["id"]))
        else:
            changes.append(Change(file, "create", published["version"] + 1))
    return changes

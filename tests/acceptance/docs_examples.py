"""The fenced blocks of README.md and docs/*.md: what each is, and how a shown answer is compared.

A block says what it is in its info string (the words after the opening fence):

    sh run            every command runs, in document order, in one bash per document
                      (`set -euo pipefail`), in a folder where `orquestador dev` runs,
                      with API and TOKEN set as the dev banner prints them
    http              the answer to the last curl of the shell block before it: the status,
                      every header shown, the JSON body
    json output       the standard output of the shell block before it, as JSON
    text output       the standard output of the shell block before it, line by line
    text trace        the trace whose id the shell block before it printed, as the
                      document's trace collector (below) received it: one span a line,
                      children indented under their parent in the order they started
    json cases        a cases file of `orquestador flows test`: it is of the cases format
    json flow         a flow definition: it is published and must answer 201 with no warnings
    json context      the evaluation context of the decision tables after it
    json decision     a decision table, evaluated against the latest context
    json result       what the decision table before it gives
    json fragment     a piece of a definition: valid JSON once wrapped in braces
    python adapter    an ADAPTER_MODULES module: it loads and registers at least one adapter;
                      with file=NAME.py, the document's dev server runs with it (below)
    sql query         runs as the owner on a migrated database, each :name bound to a fresh id
    text, mermaid     prose and diagrams, never run

`file=NAME` among the words also saves the block, run or not, as NAME (a path below
it, such as `flows/NAME.json`, makes its folders) in the folder the shell blocks run in.

Each document's flows and shell blocks run against an `orquestador dev` of its own,
on a fresh database, started in a fresh folder once every `file=NAME` block of every
document is saved there (a document may use another's file: API.md publishes
FLOWS.md's disk-review.json). A document declares an adapter module with a
`python adapter file=NAME.py` block: its server then starts as a reader starts it in
that folder, `ADAPTER_MODULES=NAME PYTHONPATH=. orquestador dev` (several such
blocks: their names joined with commas), so its flows may name the module's
capabilities. The document shows that command in a block marked not run, since the
test starts the server itself.

A document declares HTTP routes with a line `<!-- integrations file: docs/examples/NAME.toml -->`
(the file's path from the repository's root). Its server then starts with that file,
copied into the folder as NAME.toml, as `INTEGRATIONS_FILE=NAME.toml orquestador dev`,
against the provider double of tests/integration/route_provider.py started on
127.0.0.1 first: every `${NAME}` the file reads is set, for the server and for the
shell blocks alike, a NAME ending in `_URL` to the double's address
(`http://127.0.0.1:PORT`), any other to `docs-secret`. The double's own record of what
it performed is `GET $BILLING_URL/_double/writes` (any `_URL` of the file).

A document whose examples need a machine's agent declares it with a line
`<!-- machine agent: MACHINE commands file: NAME.toml -->` (NAME.toml one of the saved
`file=` blocks). The test then starts the reference agent beside the server, as a reader
does in a second terminal: an agent token minted in the folder with
`orquestador token --machine MACHINE --org acme` (the dev token's organization), and
`ORQUESTADOR_API_URL=<the dev API> ORQUESTADOR_TOKEN=<that token>
AGENT_COMMANDS_FILE=NAME.toml orquestador agent`; it stops the agent (SIGTERM) before
the server and expects it to exit 0.

A document whose examples show a trace declares a collector with a line
`<!-- trace collector -->`. The test then starts an OTLP/HTTP receiver on 127.0.0.1
before the server, and the server runs with `OTEL_EXPORTER_OTLP_ENDPOINT` at it, as a
reader runs it with a collector of their own; the spans are compared once the server
has stopped (and exported what it still held).

Any other block needs `<!-- not run: why -->` on the line above it (blank lines
between are allowed), so nothing is skipped without a reason in the document itself.
A shell block runs only when it says `run`: a plain `sh` block (an install, a
database administrator's command) is never run by accident, and fails the check
until it says one or the other.

In an answer shown in a document, a string with an elided id (`0b6c…`,
`/api/v1/flows/0b6c…`) stands for any id, the same one wherever that token repeats
in the document; a timestamp stands for any timestamp; an object shows some of the
keys of the actual one (fields may be added), a list every item.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

RUN_ROLES = {
    ("sh", "run"),
    ("http", None),
    ("json", "output"),
    ("text", "output"),
    ("text", "trace"),
    ("json", "cases"),
    ("json", "flow"),
    ("json", "context"),
    ("json", "decision"),
    ("json", "result"),
    ("json", "fragment"),
    ("python", "adapter"),
    ("sql", "query"),
}
NEVER_RUN = {"text", "mermaid"}

_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<why>\S.*?)\s*-->\s*$")
_ELIDED_ID = re.compile(r"[0-9A-Za-z]*…")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, what its info string and the comment above it say."""

    document: Path
    line: int  # of the opening fence, from 1
    language: str
    role: str | None
    attributes: dict[str, str]
    text: str
    not_run: str | None  # the reason given above it, if any

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> tuple[str, str | None]:
        return (self.language, self.role)

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.kind in RUN_ROLES


def read_blocks(document: Path, text: str | None = None) -> list[Block]:
    lines = (document.read_text("utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        words = opening["info"].split()
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[index])
            index += 1
        index += 1
        plain = [w for w in words[1:] if "=" not in w]
        blocks.append(
            Block(
                document=document,
                line=start + 1,
                language=words[0] if words else "",
                role=plain[0] if plain else None,
                attributes=dict(w.split("=", 1) for w in words[1:] if "=" in w),
                text="\n".join(body) + "\n",
                not_run=_reason_above(lines, start),
            )
        )
    return blocks


def _reason_above(lines: list[str], fence_index: int) -> str | None:
    index = fence_index - 1
    while index >= 0 and not lines[index].strip():
        index -= 1
    found = _NOT_RUN.match(lines[index]) if index >= 0 else None
    return found["why"] if found else None


def unaccounted(block: Block) -> str | None:
    """Why the block is neither run nor marked, or None when it is accounted for."""
    if block.not_run is not None or block.kind in RUN_ROLES:
        return None
    if block.language in NEVER_RUN and block.role is None:
        return None
    info = " ".join([block.language, *([block.role] if block.role else [])]) or "(none)"
    return (
        f"{block.where}: info string {info!r} is none of the roles listed in "
        "tests/acceptance/docs_examples.py (a shell block runs as `sh run`); give it one, "
        "or write <!-- not run: why --> on the line above it"
    )


_TRACE_COLLECTOR = re.compile(r"^\s*<!--\s*trace collector\s*-->\s*$")


def declares_trace_collector(document: Path, text: str | None = None) -> bool:
    lines = (document.read_text("utf-8") if text is None else text).splitlines()
    return any(_TRACE_COLLECTOR.match(line) for line in lines)


_INTEGRATIONS_FILE = re.compile(
    r"^\s*<!--\s*integrations file:\s*(?P<path>docs/examples/[A-Za-z0-9_.-]+\.toml)\s*-->\s*$"
)
_FILE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def integrations_file(document: Path, text: str | None = None) -> Path | None:
    """The INTEGRATIONS_FILE a document's dev server runs with, if it declares one."""
    lines = (document.read_text("utf-8") if text is None else text).splitlines()
    for line in lines:
        found = _INTEGRATIONS_FILE.match(line)
        if found:
            return ROOT / found["path"]
    return None


def integrations_environment(file_text: str, provider_url: str) -> dict[str, str]:
    """Every `${NAME}` of an integrations file: its `_URL`s at the double, the rest a secret."""
    return {
        name: provider_url if name.endswith("_URL") else "docs-secret"
        for name in sorted(set(_FILE_VARIABLE.findall(file_text)))
    }


_MACHINE_AGENT = re.compile(
    r"^\s*<!--\s*machine agent:\s*(?P<machine>[A-Za-z0-9_.-]+)\s+"
    r"commands file:\s*(?P<file>[A-Za-z0-9_.-]+\.toml)\s*-->\s*$"
)


def machine_agent(document: Path, text: str | None = None) -> tuple[str, str] | None:
    """(machine, commands file) of the agent a document's examples need, if it declares one."""
    lines = (document.read_text("utf-8") if text is None else text).splitlines()
    for line in lines:
        found = _MACHINE_AGENT.match(line)
        if found:
            return found["machine"], found["file"]
    return None


_MODULE_FILE = re.compile(r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*)\.py$")


def adapter_modules(blocks: list[Block]) -> list[str]:
    """The modules a document's dev server loads: its run `python adapter file=NAME.py` blocks."""
    return [
        found["module"]
        for block in blocks
        if block.runs and block.kind == ("python", "adapter") and "file" in block.attributes
        if (found := _MODULE_FILE.match(block.attributes["file"]))
    ]


def adapter_file_problem(block: Block) -> str | None:
    """Why a `python adapter file=...` block cannot be imported by its file name, or None."""
    if block.kind != ("python", "adapter") or "file" not in block.attributes:
        return None
    if _MODULE_FILE.match(block.attributes["file"]):
        return None
    return (
        f"{block.where}: file={block.attributes['file']} is no module a server can import; "
        "name an adapter module's file NAME.py, NAME a Python identifier"
    )


def parse_json(block: Block) -> Any:
    text = "{" + block.text + "}" if block.role == "fragment" else block.text
    return json.loads(text)


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: str

    @classmethod
    def from_curl(cls, headers: str, body: str) -> Response:
        """A response kept by the curl recorder (`-D` output and standard output)."""
        if body.startswith("HTTP/"):  # the command used -i: its own headers come first
            body = re.split(r"\r?\n\r?\n", body, maxsplit=1)[1] if "\n" in body else ""
        return cls._parse(headers.replace("\r\n", "\n").strip("\n"), body)

    @classmethod
    def from_sample(cls, text: str) -> Response:
        head, _, body = text.strip("\n").partition("\n\n")
        return cls._parse(head, body)

    @classmethod
    def _parse(cls, head: str, body: str) -> Response:
        status_line, *header_lines = head.split("\n")
        parts = status_line.split()
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {status_line!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return cls(int(parts[1]), headers, body.strip())


@dataclass
class Matcher:
    """Compares what a document shows with what happened; elided ids bind per document."""

    ids: dict[str, str] = field(default_factory=dict)

    def response(self, sample: Response, actual: Response) -> str | None:
        if sample.status != actual.status:
            return f"status {actual.status}, the document shows {sample.status}: {actual.body}"
        for name, value in sample.headers.items():
            if name not in actual.headers:
                return f"no {name} header in the answer"
            problem = self.value(value, actual.headers[name], f"header {name}")
            if problem:
                return problem
        if not sample.body:
            return None
        try:
            body = json.loads(actual.body)
        except ValueError:
            return f"the answer's body is not JSON: {actual.body[:200]!r}"
        return self.value(json.loads(sample.body), body, "body")

    def value(self, sample: Any, actual: Any, where: str) -> str | None:
        if isinstance(sample, dict):
            if not isinstance(actual, dict):
                return f"{where}: expected an object, got {actual!r}"
            for key, item in sample.items():
                if key not in actual:
                    return f"{where}: no {key!r} in {actual!r}"
                problem = self.value(item, actual[key], f"{where}/{key}")
                if problem:
                    return problem
            return None
        if isinstance(sample, list):
            if not isinstance(actual, list) or len(actual) != len(sample):
                return f"{where}: expected {len(sample)} items, got {actual!r}"
            for position, (item, got) in enumerate(zip(sample, actual, strict=True)):
                problem = self.value(item, got, f"{where}/{position}")
                if problem:
                    return problem
            return None
        if isinstance(sample, str) and isinstance(actual, str):
            return (
                None if self._string(sample, actual) else f"{where}: {actual!r} is not {sample!r}"
            )
        if type(sample) is not type(actual) and not _both_numbers(sample, actual):
            return f"{where}: {actual!r} is not {sample!r}"
        return None if sample == actual else f"{where}: {actual!r} is not {sample!r}"

    def _string(self, sample: str, actual: str) -> bool:
        if _TIMESTAMP.match(sample):
            return bool(_TIMESTAMP.match(actual))
        tokens = _ELIDED_ID.findall(sample)
        if not tokens:
            return sample == actual
        pattern = "".join(
            re.escape(literal) + ('([^\\s/"]+)' if position < len(tokens) else "")
            for position, literal in enumerate(_ELIDED_ID.split(sample))
        )
        found = re.fullmatch(pattern, actual)
        if found is None:
            return False
        for token, value in zip(tokens, found.groups(), strict=True):
            if self.ids.setdefault(token, value) != value:
                return False
        return True


def _both_numbers(a: Any, b: Any) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))

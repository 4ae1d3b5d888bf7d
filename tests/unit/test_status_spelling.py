"""Statuses are spelled once, in domain/statuses.py: elsewhere code names the enum member.

The scan reads every module under orquestador/ but the enum module and the migrations
(history) and reports file:line wherever a status is spelled as a string:
- an execution, checkpoint, step or bulk status (RUNNING, RECONCILIATION_REQUIRED, ...)
  anywhere but in an enum's own body: no message uses these words alone;
- a status in quotes in SQL text (`status = 'RUNNING'`, `IN ('pending', 'sent')`);
- a command, approval, rollout child, e-mail outbox or bulk item status where code reads
  or writes a status: compared (`==`, `!=`, `in`), given as a `status` (key, keyword or
  assignment), or listed whole in a tuple, list or set (an OpenAPI `enum`, a named
  set). These words ("pending", "failed", "REFUSED") are also prose, metric labels and
  error codes, which the scan leaves alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orquestador.db.sql_literals import quoted
from orquestador.domain import statuses

PACKAGE = Path(__file__).resolve().parents[2] / "orquestador"
ENUM_MODULE = PACKAGE / "domain" / "statuses.py"


def _words(*vocabularies: type[statuses.StrEnum]) -> frozenset[str]:
    return frozenset(member.value for vocabulary in vocabularies for member in vocabulary)


# Status words that are nothing else in this code base.
ONLY_STATUSES = _words(
    statuses.ExecutionStatus, statuses.CheckpointStatus, statuses.StepStatus, statuses.BulkStatus
)
# Status words that are other things too: found by where they stand.
SHARED_VOCABULARIES = tuple(
    _words(vocabulary)
    for vocabulary in (
        statuses.CommandStatus,
        statuses.ApprovalStatus,
        statuses.RolloutChildStatus,
        statuses.OutboxStatus,
        statuses.BulkItemOutcome,
    )
)
SHARED = frozenset().union(*SHARED_VOCABULARIES)
# SQL as this code base writes it: upper-case keywords, or a status column compared.
SQL = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|WHERE|SET|CASE|FILTER)\b|status\s*(=|<>|IN\b)")
QUOTED = re.compile(r"'([A-Za-z_]+)'")


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _names_a_status(node: ast.AST) -> bool:
    """`status`, `row.status`, `view["status"]`: where a status is held."""
    if isinstance(node, ast.Name):
        return "status" in node.id
    if isinstance(node, ast.Attribute):
        return "status" in node.attr
    if isinstance(node, ast.Subscript):
        return "status" in (_string(node.slice) or "")
    return False


class _Scan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        # Docstrings and the values of an enum's own members are not spellings.
        self._exempt: set[int] = set()

    def _report(self, node: ast.AST, why: str) -> None:
        self.found.append((getattr(node, "lineno", 0), why))

    def _shared(self, node: ast.AST, how: str) -> None:
        word = _string(node)
        if word in SHARED and word not in ONLY_STATUSES:  # those are reported wherever they are
            self._report(node, f"status {word!r} {how} as a string")

    def _skip_docstring(self, node: ast.Module | ast.ClassDef | ast.FunctionDef) -> None:
        if node.body and isinstance(node.body[0], ast.Expr):
            self._exempt.add(id(node.body[0].value))

    def visit_Module(self, node: ast.Module) -> None:
        self._skip_docstring(node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._skip_docstring(node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._skip_docstring(node)
        bases = {getattr(base, "id", getattr(base, "attr", "")) for base in node.bases}
        if any(name.endswith("Enum") for name in bases):
            for statement in node.body:
                if isinstance(statement, ast.Assign):
                    self._exempt.add(id(statement.value))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or id(node) in self._exempt:
            return
        if node.value in ONLY_STATUSES:
            self._report(node, f"status {node.value!r} spelled as a string")
        if SQL.search(node.value):
            for word in QUOTED.findall(node.value):
                if word in ONLY_STATUSES or word in SHARED:
                    self._report(node, f"status '{word}' spelled in SQL text")

    def visit_Compare(self, node: ast.Compare) -> None:
        for operand in (node.left, *node.comparators):
            members = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else []
            for candidate in (operand, *members):
                self._shared(candidate, "compared")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            if "status" in (_string(key) or ""):
                self._shared(value, "given")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg and "status" in node.arg:
            self._shared(node.value, "given")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(_names_a_status(target) for target in node.targets):
            self._shared(node.value, "given")
        self.generic_visit(node)

    def _listed(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        words = {_string(element) for element in node.elts}
        if len(node.elts) >= 2 and any(words <= vocabulary for vocabulary in SHARED_VOCABULARIES):
            self._report(node, f"statuses {sorted(map(str, words))} listed as strings")
        self.generic_visit(node)

    visit_Tuple = visit_List = visit_Set = _listed


def status_strings(source: str) -> list[tuple[int, str]]:
    """Each (line, why) where `source` spells a status instead of naming its member."""
    scan = _Scan()
    scan.visit(ast.parse(source))
    return sorted(set(scan.found))


def _modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path != ENUM_MODULE and "migrations" not in path.parts
    )


def test_no_module_spells_a_status() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {why}"
        for path in _modules()
        for line, why in status_strings(path.read_text(encoding="utf-8"))
    ]
    assert not spelled, "name the enum member instead:\n" + "\n".join(spelled)


@pytest.mark.parametrize(
    "source",
    [
        "if row.status == 'RUNNING': pass",
        "DONE = ('SUCCEEDED', 'FAILED')",
        "WORDS = {'RECONCILIATION_REQUIRED': 'parked'}",
        "Q = text(\"UPDATE execution SET status = 'PENDING' WHERE id = :id\")",
        "Q = \"SELECT 1 FROM machine_command WHERE status IN ('pending', 'sent')\"",
        "Q = f\"SELECT {x} FROM approval WHERE status = 'open'\"",
        "SET = \"status = 'sent', sent_at = clock_timestamp()\"",
        "if command.status == 'expired': pass",
        "if status in ('cancelled', 'expired'): pass",
        "if item.outcome == 'REFUSED': pass",
        "row = {'status': 'pending'}",
        "write(status='sent')",
        "SCHEMA = {'enum': ['pending', 'sent', 'running']}",
        "status = 'skipped'",
        "view['status'] = 'STOPPED'",
    ],
)
def test_a_spelled_status_is_found(source: str) -> None:
    assert status_strings(source), source


@pytest.mark.parametrize(
    "source",
    [
        "'''RUNNING is the status of a held execution.'''",
        "def f():\n    '''Park it RECONCILIATION_REQUIRED.'''",
        "log.info('the command is still pending')",
        "raise ValueError('cancelled: the request was withdrawn')",
        "OUT = {'succeeded': counts.succeeded, 'failed': counts.failed}",
        "LABELS = ('succeeded', 'failed', 'retry', 'not_ready')",
        "_timed(adapter, 'failed', began)",
        "class Refusal(Error):\n    code = 'REFUSED'",
        "if what == 'cancel': pass",
        "class LookUp(StrEnum):\n    UNKNOWN = 'UNKNOWN'",
        "Q = f\"UPDATE execution SET status = '{ExecutionStatus.RUNNING}'\"",
        "if row.status == ExecutionStatus.RUNNING: pass",
        "SHOWN = ('open', 'closed', 'all')",
    ],
)
def test_a_named_status_or_prose_is_not(source: str) -> None:
    assert not status_strings(source), source


def test_sql_lists_a_set_of_statuses_in_its_enum_order_and_a_tuple_as_given() -> None:
    assert quoted(statuses.UNHELD) == "'PENDING', 'RETRY_WAIT', 'WAITING'"
    assert quoted(statuses.UNDER_WAY_COMMAND) == "'pending', 'sent', 'running'"
    waiting_first = (statuses.ExecutionStatus.WAITING, statuses.ExecutionStatus.RUNNING)
    assert quoted(waiting_first) == "'WAITING', 'RUNNING'"
    assert statuses.in_order(frozenset()) == []

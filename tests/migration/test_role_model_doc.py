"""docs/OPERATIONS.md's role model says what the code grants, table by table and column by column.

The migration tests check that a migrated database holds exactly the declared grants;
this checks that the document states those same grants.
"""

from __future__ import annotations

from pathlib import Path

from orquestador.db.grants import PLATFORM_INSERT_COLUMNS
from orquestador.db.schema import RUNTIME_GRANTS, RUNTIME_UPDATE_COLUMNS

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
MARKER = "<!-- role model: a test compares this table with the grants the code declares -->"
ORDER = ("SELECT", "INSERT", "UPDATE", "DELETE")


def _documented() -> dict[str, tuple[str, str]]:
    """The role model table: table -> (runtime cell, platform cell)."""
    lines = OPERATIONS.read_text(encoding="utf-8").split(MARKER, 1)[1].strip().splitlines()
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[2:]:  # header and rule
        if not line.startswith("|"):
            break
        table, runtime, platform = (cell.strip() for cell in line.strip("|").split("|"))
        rows[table.strip("`")] = (runtime, platform)
    return rows


def _columns(privilege: str, columns: tuple[str, ...]) -> str:
    return f"{privilege} ({', '.join(f'`{c}`' for c in columns)})"


def _runtime_cell(table: str) -> str:
    cells = []
    for privilege in ORDER:
        if privilege == "UPDATE" and table in RUNTIME_UPDATE_COLUMNS:
            cells.append(_columns("UPDATE", RUNTIME_UPDATE_COLUMNS[table]))
        elif privilege in RUNTIME_GRANTS[table]:
            cells.append(privilege)
    return ", ".join(cells)


def test_the_role_model_table_states_every_grant_the_code_declares() -> None:
    expected = {
        table: (
            _runtime_cell(table),
            _columns("INSERT", PLATFORM_INSERT_COLUMNS[table])
            if table in PLATFORM_INSERT_COLUMNS
            else "none",
        )
        for table in RUNTIME_GRANTS
    }
    assert _documented() == expected

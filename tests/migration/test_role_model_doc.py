"""docs/OPERATIONS.md's role model says what the code grants, table by table and column by column,
and lists every function a migrated database holds, with who may run it.

The migration tests check that a migrated database holds exactly the declared grants;
this checks that the document states those same grants.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, text

from orquestador.db.grants import PLATFORM_INSERT_COLUMNS
from orquestador.db.schema import RUNTIME_GRANTS, RUNTIME_UPDATE_COLUMNS
from tests.db_support import RUNTIME_ROLE

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


FUNCTIONS_MARKER = (
    "<!-- functions: a test compares this table with the functions of a migrated database -->"
)


def _documented_functions() -> dict[str, tuple[str, str]]:
    """The functions table: signature (no spaces) -> (rights cell, EXECUTE cell)."""
    text_after = OPERATIONS.read_text(encoding="utf-8").split(FUNCTIONS_MARKER, 1)[1]
    rows: dict[str, tuple[str, str]] = {}
    for line in text_after.strip().splitlines()[2:]:
        if not line.startswith("|"):
            break
        function, rights, executors = (cell.strip() for cell in line.strip("|").split("|"))
        rows[function.strip("`").replace(" ", "")] = (rights, executors)
    return rows


def test_the_functions_table_lists_every_function_of_a_migrated_database(
    owner_engine: Engine,
) -> None:
    with owner_engine.connect() as conn:
        found = {
            row.signature.replace(" ", ""): row
            for row in conn.execute(
                text(
                    "SELECT p.oid::regprocedure::text AS signature, p.prosecdef AS definer,"
                    " has_function_privilege(:runtime, p.oid, 'EXECUTE') AS runtime"
                    " FROM pg_proc p"
                    " WHERE p.pronamespace = CAST(current_schema() AS regnamespace)"
                ),
                {"runtime": RUNTIME_ROLE},
            )
        }
    documented = _documented_functions()
    assert set(documented) == set(found)
    for signature, (rights, executors) in documented.items():
        assert rights.startswith("the owner (`SECURITY DEFINER`)") is found[signature].definer
        assert (executors == "runtime") is found[signature].runtime, signature

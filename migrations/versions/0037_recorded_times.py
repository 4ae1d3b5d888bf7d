"""A safe step's recorded times never pass the database's clock at the write.

Revision ID: 0037
Revises: 0036

orquestador_write_batch (same signature): a start or an end a worker measured itself for
a step that wrote no RUNNING checkpoint is kept at most at the database's clock when it
is written, so no measure, however it was taken, dates an attempt after the writes that
follow it in the same transaction (the next step's RUNNING checkpoint, the finish).
"""

import importlib.util
from pathlib import Path
from types import ModuleType

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def _migration(name: str) -> ModuleType:
    # A migration file is not an importable module name.
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _body(lean: ModuleType, cancel: ModuleType, rows: ModuleType) -> str:
    """0036's body with every measured time bounded by clock_timestamp() (LEAST ignores
    the NULL of a time not measured, as coalesce did)."""
    body: str = lean._body(cancel, rows)
    body = lean._once(
        body,
        "coalesce(h.finished_at, clock_timestamp())",
        "least(h.finished_at, clock_timestamp())",
        count=2,
    )
    body = lean._once(
        body,
        "h.output, NULL, h.started_at, least(h.finished_at, clock_timestamp()),\n"
        "                   h.started_at, h.observed",
        "h.output, NULL, least(h.started_at, clock_timestamp()),\n"
        "                   least(h.finished_at, clock_timestamp()),\n"
        "                   least(h.started_at, clock_timestamp()), h.observed",
    )
    return lean._once(
        body,
        "coalesce(h.started_at, clock_timestamp())",
        "least(h.started_at, clock_timestamp())",
        count=2,
    )


def upgrade() -> None:
    rows = _migration("0011_write_batch_rows.py")
    lean = _migration("0036_lean_steps.py")
    rows._replace(_body(lean, _migration("0034_cancel_requested.py"), rows))


def downgrade() -> None:
    rows = _migration("0011_write_batch_rows.py")
    lean = _migration("0036_lean_steps.py")
    rows._replace(lean._body(_migration("0034_cancel_requested.py"), rows))

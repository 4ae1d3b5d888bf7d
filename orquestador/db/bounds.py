"""The bounds the owner sets on what the runtime role may ask of the SECURITY DEFINER functions.

The maintenance leader runs as the runtime role and owns nothing: it removes history and
makes months through functions that run with the owner's rights (migrations 0009 and
0024). Whatever their caller asks, they keep at least the retention the owner allowed,
make at most the months ahead it allowed and touch at most a batch a call: the owner
writes these bounds into `function_bound` at migrate time (every `orquestador migrate` at
head, and `orquestador migrate grant`), from the retention settings of the environment it
runs in. The runtime role may read them, never write them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text

if TYPE_CHECKING:
    from orquestador.config import Settings

# The months the maintenance leader makes ahead of the current one, and the most any
# caller of orquestador_history_partitions gets.
MONTHS_AHEAD = 3
# The most rows of each table one call of a retention function deletes: twice the
# leader's batch (worker/maintenance.py), far from a call that takes every lock at once.
RETENTION_BATCH_MAX = 1000


@dataclass(frozen=True)
class FunctionBounds:
    """One value a bound, named as the row of `function_bound` that holds it.

    Each `*_days` is the least period the functions keep (a caller asking less gets
    this); `history_months_ahead` and `retention_batch` the most they do a call.
    """

    history_retention_days: int = 90
    history_retention_failed_days: int = 365
    simulation_retention_days: int = 7
    history_months_ahead: int = MONTHS_AHEAD
    retention_batch: int = RETENTION_BATCH_MAX

    @classmethod
    def from_settings(cls, settings: Settings) -> FunctionBounds:
        """The retention settings as floors; months and batch as the code allows."""
        return cls(
            history_retention_days=settings.history_retention_days,
            history_retention_failed_days=settings.history_retention_failed_days,
            simulation_retention_days=settings.simulation_retention_days,
        )


# The setting each floor comes from, for the lines that say a setting is below it.
FLOOR_SETTINGS = {
    "history_retention_days": "HISTORY_RETENTION_DAYS",
    "history_retention_failed_days": "HISTORY_RETENTION_FAILED_DAYS",
    "simulation_retention_days": "SIMULATION_RETENTION_DAYS",
}

_WRITE = text(
    """
    INSERT INTO function_bound (name, value) VALUES (:name, :value)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
    """
)
_READ = text("SELECT name, value FROM function_bound")


def apply_function_bounds(connection: Connection, bounds: FunctionBounds) -> None:
    """Write every bound (as the owner: the runtime role may not)."""
    connection.execute(_WRITE, [{"name": k, "value": v} for k, v in asdict(bounds).items()])


def read_function_bounds(connection: Connection) -> FunctionBounds | None:
    """The bounds in force; None before the migration that made them (no table)."""
    if connection.execute(text("SELECT to_regclass('function_bound')")).scalar() is None:
        return None
    stored = {row.name: row.value for row in connection.execute(_READ)}
    known = {f.name for f in fields(FunctionBounds)}
    return FunctionBounds(**{k: int(v) for k, v in stored.items() if k in known})


def floors_above(settings: Settings, bounds: FunctionBounds) -> list[tuple[str, int, int]]:
    """(setting, its value, the owner's floor) for each retention setting below its floor:
    the functions keep the floor's days, not the setting's."""
    return [
        (env, getattr(settings, name), getattr(bounds, name))
        for name, env in FLOOR_SETTINGS.items()
        if getattr(settings, name) < getattr(bounds, name)
    ]

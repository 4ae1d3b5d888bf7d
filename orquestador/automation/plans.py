"""The plans store: a plan per platform plan id, and the flow bound to each of its moments.

Every statement names the organization, so another organization's plan or flow is
indistinguishable from a missing one. The schema, not this code, refuses a flow whose
trigger is not the moment (a composite foreign key to flow (id, trigger)).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, and_, select, text
from sqlalchemy.exc import IntegrityError

from orquestador.db.schema import MOMENTS, flow, hosting_plan, plan_flow_binding
from orquestador.errors import Problem, Refusal

# The platform's plan ids arrive in URLs and event bodies; bounded like the other ids.
MAX_PLAN_ID_CHARACTERS = 200
MAX_PLAN_NAME_CHARACTERS = 200
# SQLSTATE of a foreign key violation.
_FOREIGN_KEY_VIOLATION = "23503"


@dataclass(frozen=True)
class Plan:
    """A plan as the API shows it: the platform's id, a name, a flow id (or None) per moment."""

    key: str
    name: str
    bindings: dict[str, uuid.UUID | None]


class TriggerMismatch(Refusal):
    """The flow's trigger is not the moment it was to be bound to."""

    code = "BINDING_TRIGGER_MISMATCH"

    def __init__(self, moment: str) -> None:
        super().__init__(
            f"Only a flow whose trigger is {moment!r} can be bound to the {moment} moment.",
            problems=[Problem("/flowId", f"the flow's trigger is not {moment!r}")],
        )


def plan_id_problem(key: str) -> str | None:
    """Why a platform plan id is refused, or None."""
    if not key or len(key) > MAX_PLAN_ID_CHARACTERS:
        return f"a plan id has 1 to {MAX_PLAN_ID_CHARACTERS} characters"
    if not key.isprintable():
        return "a plan id has only printable characters"
    return None


def put_plan(connection: Connection, *, org: str, key: str, name: str) -> bool:
    """Create the plan or rename it; True when it was created."""
    created = connection.execute(
        text(
            "INSERT INTO hosting_plan (org_id, key, name) VALUES (:org, :key, :name)"
            " ON CONFLICT (org_id, key) DO UPDATE SET name = EXCLUDED.name"
            # xmax is 0 only on a freshly inserted row version.
            " RETURNING xmax = 0 AS created"
        ),
        {"org": org, "key": key, "name": name},
    ).scalar_one()
    return bool(created)


def find_plan(connection: Connection, *, org: str, key: str) -> Plan | None:
    rows = connection.execute(
        select(hosting_plan.c.key, hosting_plan.c.name, plan_flow_binding.c.moment, flow.c.id)
        .select_from(
            hosting_plan.outerjoin(
                plan_flow_binding, plan_flow_binding.c.plan_id == hosting_plan.c.id
            ).outerjoin(
                flow,
                and_(flow.c.id == plan_flow_binding.c.flow_id, flow.c.org_id == org),
            )
        )
        .where(hosting_plan.c.org_id == org, hosting_plan.c.key == key)
    ).all()
    if not rows:
        return None
    bindings: dict[str, uuid.UUID | None] = dict.fromkeys(MOMENTS)
    for row in rows:
        if row.moment is not None and row.id is not None:
            bindings[row.moment] = row.id
    return Plan(key=rows[0].key, name=rows[0].name, bindings=bindings)


def bind_flow(
    connection: Connection, *, org: str, key: str, moment: str, flow_id: uuid.UUID
) -> bool:
    """Bind the flow to the plan's moment (replacing any); False when plan or flow is not found.

    Raises TriggerMismatch when the database refuses the flow's trigger; the caller's
    transaction is then unusable and rolls back, leaving the binding as it was.
    """
    try:
        bound = connection.execute(
            text(
                "INSERT INTO plan_flow_binding (plan_id, moment, flow_id)"
                " SELECT p.id, :moment, f.id FROM hosting_plan p, flow f"
                " WHERE p.org_id = :org AND p.key = :key AND f.id = :flow AND f.org_id = :org"
                " ON CONFLICT (plan_id, moment) DO UPDATE SET flow_id = EXCLUDED.flow_id"
                " RETURNING plan_id"
            ),
            {"org": org, "key": key, "moment": moment, "flow": flow_id},
        ).first()
    except IntegrityError as error:
        if getattr(error.orig, "sqlstate", None) == _FOREIGN_KEY_VIOLATION:
            raise TriggerMismatch(moment) from None
        raise
    return bound is not None


def unbind_flow(connection: Connection, *, org: str, key: str, moment: str) -> bool:
    """Remove the plan's binding for the moment, if any; False when the plan is not found."""
    plan = connection.execute(
        select(hosting_plan.c.id).where(hosting_plan.c.org_id == org, hosting_plan.c.key == key)
    ).scalar_one_or_none()
    if plan is None:
        return False
    connection.execute(
        plan_flow_binding.delete().where(
            plan_flow_binding.c.plan_id == plan, plan_flow_binding.c.moment == moment
        )
    )
    return True

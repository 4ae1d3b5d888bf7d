"""What an approval is about, for the person who decides: the flow and transition that ask,
the machine, and who asked. Read by organization, from the approval's execution."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, select

from orquestador.db.request_machine import REQUEST_MACHINE
from orquestador.db.schema import execution, flow, request


@dataclass(frozen=True)
class ApprovalSubject:
    flow_key: str
    flow_version: int
    transition_id: str
    machine_id: str | None
    requested_by: str | None

    def lines(self) -> list[str]:
        """The subject in words, a line a fact (an e-mail's, a notice's)."""
        said = [f"Flow: {self.flow_key} v{self.flow_version}, transition {self.transition_id}"]
        if self.machine_id:
            said.append(f"Machine: {self.machine_id}")
        if self.requested_by:
            said.append(f"Asked by: {self.requested_by}")
        return said


def approval_subject(
    conn: Connection, *, org_id: str, execution_id: uuid.UUID
) -> ApprovalSubject | None:
    """The subject of the approval an execution's step asks for, or None (not found)."""
    row = conn.execute(
        select(
            flow.c.key,
            flow.c.version,
            execution.c.transition_id,
            REQUEST_MACHINE.label("machine_id"),
            execution.c.actor_snapshot.op("->>")("sub").label("requested_by"),
        )
        .select_from(
            execution.join(flow, flow.c.id == execution.c.flow_id).join(
                request, request.c.id == execution.c.request_id
            )
        )
        .where(execution.c.id == execution_id, execution.c.org_id == org_id)
    ).one_or_none()
    if row is None:
        return None
    return ApprovalSubject(
        row.key, row.version, row.transition_id, row.machine_id, row.requested_by
    )

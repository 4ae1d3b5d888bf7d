"""The machine a request is about, read one way by every reader.

A request names its machine in its own `machine_id` column (a run, a platform event,
a schedule's fire give it) or only in its data's `machineId` (a request a person
created with the data). The e-mail footer, the pages, the search and every filter read
this one expression, so a request is about the same machine wherever it is shown.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.sql.elements import ColumnElement

from orquestador.db.schema import request

REQUEST_MACHINE: ColumnElement[Any] = func.coalesce(
    request.c.machine_id, request.c.data.op("->>")("machineId")
)

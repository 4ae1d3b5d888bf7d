"""Platform events: POST /events starts the flow bound to (plan, moment) exactly once."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("events", __name__)

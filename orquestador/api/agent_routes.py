"""The machine agent API: an agent long-polls its own machine's commands and reports status."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("agent", __name__)

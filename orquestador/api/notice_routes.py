"""Panel notices and an organization's notification preferences."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("notices", __name__)

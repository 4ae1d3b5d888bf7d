"""Plans and their flow bindings per moment."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("plans", __name__)

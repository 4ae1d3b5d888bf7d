"""Dry runs: a simulated request and execution that cannot touch the world."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("dry_runs", __name__)

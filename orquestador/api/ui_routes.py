"""The execution pages for people: server-rendered HTML, signed in with a cookie."""

from __future__ import annotations

from flask import Blueprint

blueprint = Blueprint("ui", __name__)

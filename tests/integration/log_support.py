"""The product's JSON log lines, captured for a test."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from orquestador.logs import ContextFilter, JsonLineFormatter


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Every `orquestador` line as the product writes it with LOG_FORMAT=json."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("orquestador")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)

"""Log lines: what every process writes, in one format, swappable in one place."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping
from contextvars import ContextVar, Token
from datetime import datetime
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from orquestador import tracing

# Everything a LogRecord carries on its own; any other attribute came in through `extra`.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
# CSI sequences (colours, cursor moves) that libraries such as werkzeug add to their lines.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# An exception message may be long or span lines (SQLAlchemy appends the statement and its
# parameters after the first line): keep the first line, cut to this length.
_EXCEPTION_MESSAGE_LIMIT = 500
_BARE_VALUE = re.compile(r"[^\s\"'=\\]+")


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`: the record's `extra`, then its exception.

    The exception is named by class and first message line on the same line, so a line
    stays greppable by execution_id; the traceback follows only for ERROR and above
    (unexpected failures), not for the expected ones logged as warnings. The message is
    printed as raised: code whose exceptions may quote inputs (an adapter's) logs a safe
    message of its own in `extra` instead of passing exc_info.
    """

    def __init__(self, *, colour: bool = False, tracebacks_from: int = logging.ERROR) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.colour = colour
        self.tracebacks_from = tracebacks_from

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        parts = [self.formatMessage(record)]
        parts += [
            f"{key}={logfmt_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_")
        ]
        ids = getattr(record, _TRACE_IDS, None)
        if ids is not None:
            parts += [f"trace_id={ids[0]}", f"span_id={ids[1]}"]
        exc_type, exc, _tb = record.exc_info or (None, None, None)
        if exc_type is not None:
            parts.append(f"exception={exc_type.__name__}")
            message = exception_message(exc)
            if message:
                parts.append(f"exception_message={logfmt_value(message)}")
        line = " ".join(parts)
        if exc_type is not None and record.levelno >= self.tracebacks_from:
            line += "\n" + self.formatException(record.exc_info)  # type: ignore[arg-type]
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line if self.colour else _ANSI_ESCAPE.sub("", line)


class JsonLineFormatter(JsonFormatter):  # type: ignore[misc]
    """One JSON object per line: time, level, logger, message, the record's `extra`.

    The same facts as TextFormatter: `exception` and `exception_message` (first line);
    the traceback (`exc_info`) only from `tracebacks_from` up. Values that are not JSON
    (UUIDs, datetimes) are written as strings.
    """

    def __init__(self, *, tracebacks_from: int = logging.ERROR) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
            json_default=_json_value,
            json_ensure_ascii=False,
        )
        self.tracebacks_from = tracebacks_from

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        if "message" in log_data and isinstance(log_data["message"], str):
            log_data["message"] = _ANSI_ESCAPE.sub("", log_data["message"])
        exc_type, exc, _tb = record.exc_info or (None, None, None)
        if exc_type is not None:
            log_data["exception"] = exc_type.__name__
            message = exception_message(exc)
            if message:
                log_data["exception_message"] = message
        if record.levelno < self.tracebacks_from:
            log_data.pop("exc_info", None)
        ids = getattr(record, _TRACE_IDS, None)
        if ids is not None:
            log_data["trace_id"], log_data["span_id"] = ids


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def make_formatter(fmt: str, *, colour: bool = False, level: str = "INFO") -> logging.Formatter:
    """The formatter for LOG_FORMAT (`text` or `json`); gunicorn's loggers use it too."""
    level_number = logging.getLevelName(level.upper())
    tracebacks_from = logging.DEBUG if level_number == logging.DEBUG else logging.ERROR
    if fmt == "json":
        return JsonLineFormatter(tracebacks_from=tracebacks_from)
    return TextFormatter(colour=colour, tracebacks_from=tracebacks_from)


# Fields every line written in the current context carries (an API request's route and
# ids): set by the code that knows them, read by ContextFilter on the handler.
_CONTEXT: ContextVar[Mapping[str, Any] | None] = ContextVar("orquestador_log_context", default=None)


def bind_context(**fields: Any) -> Token[Mapping[str, Any] | None]:
    """Add FIELDS to every line logged in this context until `reset_context(token)`."""
    return _CONTEXT.set({**(_CONTEXT.get() or {}), **fields})


def reset_context(token: Token[Mapping[str, Any] | None]) -> None:
    _CONTEXT.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound context into each record; a field given in `extra` wins.

    With tracing on, the record also keeps the current span's (trace id, span id),
    read here in the thread that logged: a JSON line names its trace.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_CONTEXT.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        ids = tracing.current_ids()
        if ids is not None:
            setattr(record, _TRACE_IDS, ids)
        return True


# The record attribute ContextFilter keeps the span's ids in; private (a leading
# underscore), so the text format does not list it among the `extra` pairs.
_TRACE_IDS = "_orquestador_trace_ids"


def logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if _BARE_VALUE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def exception_message(exc: BaseException | None) -> str:
    """The first line of an exception's message (a database error's own, not the SQL)."""
    if exc is None:
        return ""
    origin = getattr(exc, "orig", None) or exc
    lines = str(origin).strip().splitlines()
    return lines[0][:_EXCEPTION_MESSAGE_LIMIT] if lines else ""


def configure(level: str, stream: TextIO | None = None, *, fmt: str = "text") -> None:
    """Send every logger's lines to STREAM (stderr) once, as FMT (LOG_FORMAT: text or json).

    Colours only for text on a terminal.
    """
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter(fmt, colour=_is_terminal(stream), level=level))
    handler.addFilter(ContextFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # Alembic announces each of its plugins at INFO; nobody needs that on every start.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

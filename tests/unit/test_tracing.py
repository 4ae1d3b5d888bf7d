"""Tracing off costs nothing and needs nothing; on, log lines name the span they are in."""

from __future__ import annotations

import ast
import io
import json
import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orquestador import tracing
from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.logs import ContextFilter, JsonLineFormatter, TextFormatter
from tests.trace_support import (
    hex_span_id,
    hex_trace_id,
    recorded_spans,  # noqa: F401  (a fixture)
)

ROOT = Path(__file__).resolve().parents[2]

# Imports every module that opens a span, builds the app and serves one request, then
# prints whether tracing is on and whether any OpenTelemetry module was ever imported.
_PRODUCT_RUN = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from orquestador import tracing
from orquestador.api.app import create_app
from orquestador.config import Settings
import orquestador.integrations.http_adapter, orquestador.notices.mailer
import orquestador.worker.daemon
settings = Settings.from_env(
    {ENVIRON},
    database_url="postgresql://orquestador@127.0.0.1:1/orquestador",
    request_api_enabled=True,
    jwt_secret="s" * 48,
)
app = create_app(settings)
status = app.test_client().get("/api/v1/openapi.json").status_code
with tracing.span("action.attempt") as span:
    span.set_attribute("orquestador.outcome", "succeeded")
imported = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
print("RESULT", status, tracing.enabled(), imported)
"""

# Makes `import opentelemetry...` fail, as on an install without the `otel` extra.
_WITHOUT_OPENTELEMETRY = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _Missing())
"""


def _run_product(environ: dict[str, str], prelude: str = "") -> tuple[str, str]:
    script = prelude + _PRODUCT_RUN.replace("{ENVIRON}", repr(environ))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    return line, result.stdout


def test_with_no_endpoint_no_opentelemetry_module_is_ever_imported() -> None:
    line, _output = _run_product({})
    assert line == "RESULT 200 False []"


def test_without_the_otel_extra_the_product_runs_and_says_why_nothing_is_traced() -> None:
    line, output = _run_product(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, prelude=_WITHOUT_OPENTELEMETRY
    )
    assert line == "RESULT 200 False []"
    assert "pip install 'orquestador[otel]'" in output


def test_only_the_tracing_module_imports_opentelemetry() -> None:
    importers = []
    for path in sorted((ROOT / "orquestador").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "opentelemetry" for name in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert set(importers) == {"orquestador/tracing.py"}


def test_off_every_call_answers_at_once_with_nothing() -> None:
    assert not tracing.enabled()
    assert tracing.span("execution.claim", parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01") is (
        tracing.NO_SPAN
    )

    def call(argument: int) -> int:
        return argument

    assert tracing.carried(call) is call
    assert tracing.current_traceparent() is None
    assert tracing.current_ids() is None
    headers = {"Idempotency-Key": "k"}
    tracing.inject_headers(headers)
    assert headers == {"Idempotency-Key": "k"}


def test_an_endpoint_that_is_not_an_http_url_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
    assert "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL" in str(refused.value)


def test_a_stored_traceparent_makes_the_span_a_child_in_that_trace(
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    with tracing.span("transition.accept"):
        stored = tracing.current_traceparent()
    assert stored is not None

    def in_the_call_thread(_argument: None) -> str | None:
        return tracing.current_traceparent()

    with tracing.span("execution.claim", parent=stored, kind="consumer"):
        carried = tracing.carried(in_the_call_thread)
    accept, claim = recorded_spans.get_finished_spans()
    assert claim.context.trace_id == accept.context.trace_id
    assert claim.parent.span_id == accept.context.span_id
    # Run later, on another thread: the function still sees the span it was carried from.
    seen: list[str | None] = []
    thread = threading.Thread(target=lambda: seen.append(carried(None)))
    thread.start()
    thread.join()
    (traceparent,) = seen
    assert traceparent is not None
    assert traceparent.split("-")[:3] == ["00", hex_trace_id(claim), hex_span_id(claim)]


def test_log_lines_name_the_current_trace_and_span(
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    json_stream, text_stream = io.StringIO(), io.StringIO()
    logger = logging.getLogger("orquestador.test.tracing")
    handlers = []
    for stream, formatter in ((json_stream, JsonLineFormatter()), (text_stream, TextFormatter())):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(ContextFilter())
        logger.addHandler(handler)
        handlers.append(handler)
    logger.setLevel(logging.INFO)
    try:
        with tracing.span("action.attempt"):
            logger.info("inside")
        logger.info("outside")
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
    (span,) = recorded_spans.get_finished_spans()
    inside, outside = (json.loads(line) for line in json_stream.getvalue().splitlines())
    assert (inside["trace_id"], inside["span_id"]) == (hex_trace_id(span), hex_span_id(span))
    assert "trace_id" not in outside and "span_id" not in outside
    text_inside, text_outside = text_stream.getvalue().splitlines()
    assert text_inside.endswith(f"inside trace_id={hex_trace_id(span)} span_id={hex_span_id(span)}")
    assert "trace_id" not in text_outside


def test_a_stored_traceparent_gives_its_trace_id_and_anything_else_none() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tracing.trace_id_of(f"00-{trace}-00f067aa0ba902b7-01") == trace
    assert tracing.trace_id_of(f"00-{trace.upper()}-00f067aa0ba902b7-01") == trace
    for stored in (None, "", "00-abc-00f067aa0ba902b7-01", f"00-{'0' * 32}-00f067aa0ba902b7-01"):
        assert tracing.trace_id_of(stored) is None
    assert tracing.trace_id_of(f"00-{'g' * 32}-00f067aa0ba902b7-01") is None

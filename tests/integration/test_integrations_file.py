"""INTEGRATIONS_FILE: every kind of mistake is one line naming the file line, route and key.

`orquestador check` prints them all and exits 2; a good file loads into the registry
the worker and the API run with.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orquestador.actions.loading import load_registry
from orquestador.errors import ConfigError
from orquestador.integrations.routes import load_routes, route_file_problems
from tests.integration.worker_support import settings

ROOT = Path(__file__).resolve().parents[2]
ENVIRON = {"BILLING_URL": "https://billing.example.com", "BILLING_TOKEN": "tok"}

GOOD = """\
[[route]]
capability = "billing.invoice"
version = 1
effect = "NON_IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/customers/{customer}/invoices"
headers = { Authorization = "Bearer ${BILLING_TOKEN}" }
timeout_seconds = 10
max_attempts = 3
input_schema = { type = "object", required = ["amount", "customer"] }
output_schema = { type = "object", required = ["id"] }
response = { id = "/id" }
lookup = { url = "${BILLING_URL}/v1/invoices?idempotency_key={externalKey}", found = "/data/0" }
example = { id = "inv_example" }

[[route]]
capability = "document.verify"
version = 1
method = "POST"
url = "${BILLING_URL}/v1/verify"
"""

# Each mistake, the line it is on (1-based) and what the message must name.
MISTAKES = """\
[[route]]
capability = "billing.invoice"
version = 1
effect = "SOMETIMES_WRITE"
method = "POST"
url = "${MISSING_URL}/v1/invoices"
headers = { Authorization = "Bearer ${MISSING_TOKEN}" }
timeout_seconds = 90
max_attempts = 3
colour = "blue"
input_schema = { type = "objekt" }
output_schema = { type = "object", properties = { id = { pattern = "(?<=x)" } } }
response = { id = "id" }
body = { total = "/amount" }

[[route]]
capability = "document.verify"
version = 1
method = "POST"
url = "${BILLING_URL}/v1/verify"
output_schema = { type = "object" }

[[route]]
capability = "reports.read"
version = 1
effect = "READ_ONLY"
method = "GET"
url = "https://{host}/v1/report"
timeout_seconds = 5
max_attempts = 1
lookup = { url = "https://reports.example.com/{externalKey}", found = "data" }
"""

EXPECTED = [
    (4, "route billing.invoice@1: effect: must be one of"),
    (6, "route billing.invoice@1: url: ${MISSING_URL} is not set"),
    (7, "route billing.invoice@1: headers: ${MISSING_TOKEN} is not set"),
    (8, "route billing.invoice@1: timeout_seconds: 90 is not below WORKER_LEASE_SECONDS=60"),
    (10, "route billing.invoice@1: colour: unknown key"),
    (11, "route billing.invoice@1: input_schema: /type: invalid JSON Schema"),
    (12, "route billing.invoice@1: output_schema: /properties/id/pattern"),
    (13, "route billing.invoice@1: response: id: 'id' is not a JSON Pointer"),
    (14, "route billing.invoice@1: body: total: a source is"),
    (21, "route document.verify@1: output_schema: document.verify@1 has a fixed contract"),
    (28, "route reports.read@1: url: the scheme, host and port are fixed"),
    (31, "route reports.read@1: lookup: a READ_ONLY route has no write to look up"),
    (31, "route reports.read@1: lookup.found: 'data' is not a JSON Pointer"),
]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "integrations.toml"
    path.write_text(text)
    return path


def test_a_good_file_loads_every_route(tmp_path):
    routes = load_routes(_file(tmp_path, GOOD), ENVIRON, lease_seconds=60)
    assert [r.key for r in routes] == ["billing.invoice@1", "document.verify@1"]
    billing, verify = routes
    assert billing.url == "https://billing.example.com/v1/customers/{customer}/invoices"
    assert billing.headers == {"Authorization": "Bearer tok"}
    assert "tok" not in repr(billing)
    assert billing.lookup.found == "/data/0"
    assert (verify.effect, verify.max_attempts, verify.timeout_seconds) == ("READ_ONLY", 3, 10)


def test_each_mistake_is_one_line_with_its_place(tmp_path):
    path = _file(tmp_path, MISTAKES)
    routes, problems = route_file_problems(path, {"BILLING_URL": "https://x.example"}, 60)
    assert routes == []
    for line, text in EXPECTED:
        assert any(p.startswith(f"{path}:{line}: {text}") for p in problems), (line, text, problems)
    assert all("\n" not in p for p in problems)


DRY_RUNS = """\
[[route]]
capability = "reports.read"
version = 1
effect = "READ_ONLY"
method = "GET"
url = "${BILLING_URL}/v1/report"
timeout_seconds = 5
max_attempts = 1
dry_run = "always"

[[route]]
capability = "billing.refund"
version = 1
effect = "IDEMPOTENT_WRITE"
method = "POST"
url = "${BILLING_URL}/v1/refunds"
timeout_seconds = 5
max_attempts = 1
dry_run = "call"

[[route]]
capability = "reports.read"
version = 2
effect = "READ_ONLY"
method = "GET"
url = "${BILLING_URL}/v1/report"
timeout_seconds = 5
max_attempts = 1
example = { total = 0 }
dry_run = "call"
"""


def test_dry_run_is_simulate_or_call_and_call_only_on_a_read_without_example(tmp_path):
    path = _file(tmp_path, DRY_RUNS)
    routes, problems = route_file_problems(path, ENVIRON, 60)
    assert routes == []
    assert problems == [
        f'{path}:9: route reports.read@1: dry_run: must be "simulate" (the default) or "call"',
        f'{path}:19: route billing.refund@1: dry_run: "call" is for READ_ONLY routes: a dry run '
        "never sends a write",
        f'{path}:30: route reports.read@2: dry_run: "call" sends the request, so the example '
        "is never answered",
    ]
    opted_in = DRY_RUNS.split("[[route]]")[1].replace('"always"', '"call"')
    (route,) = load_routes(_file(tmp_path, "[[route]]" + opted_in), ENVIRON, 60)
    assert route.dry_run == "call"
    billing, verify = load_routes(_file(tmp_path, GOOD), ENVIRON, lease_seconds=60)
    assert (billing.dry_run, verify.dry_run) == ("simulate", "simulate")


def test_the_shipped_example_calls_no_provider_in_a_dry_run_unless_a_read_opts_in():
    environ = {
        "BILLING_URL": "https://billing.example.com",
        "BILLING_TOKEN": "tok",
        "KYC_URL": "https://kyc.example.com",
        "KYC_API_KEY": "key",
    }
    routes = load_routes(ROOT / "docs/examples/integrations.toml", environ, 60)
    for route in routes:
        # Each route answers a dry run with its example, or is a read that opts in.
        assert route.example is not None or (route.dry_run == "call" and not route.effect.writes), (
            route.key
        )
    verify = next(r for r in routes if r.key == "document.verify@1")
    assert (verify.method, verify.effect, verify.dry_run) == ("POST", "READ_ONLY", "simulate")
    assert verify.example is not None


def test_toml_syntax_errors_name_their_line(tmp_path):
    path = _file(tmp_path, GOOD + "\n[[route]\ncapability = 1\n")
    _, problems = route_file_problems(path, ENVIRON, 60)
    (problem,) = problems
    assert problem.startswith(f"{path}: not valid TOML") and "line 22" in problem


def test_the_registry_serves_configured_routes_and_refuses_timeouts_past_the_lease(
    tmp_path, monkeypatch
):
    path = _file(tmp_path, GOOD)
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    registry = load_registry(settings(integrations_file=str(path)))
    assert registry.knows("billing.invoice", 1) and registry.knows("document.verify", 1)
    assert registry.get("billing.invoice", 1).lookup is not None
    short_lease = settings(
        integrations_file=str(path), worker_lease_seconds=8, worker_renew_seconds=2
    )
    with pytest.raises(ConfigError) as refused:
        load_registry(short_lease)
    assert "timeout_seconds: 10 is not below WORKER_LEASE_SECONDS=8" in str(refused.value.problems)


def test_orquestador_check_prints_each_problem_and_exits_2(tmp_path):
    path = _file(tmp_path, MISTAKES)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "MIGRATION_DATABASE_URL", "MISSING_URL", "MISSING_TOKEN")
    }
    env |= {
        "INTEGRATIONS_FILE": str(path),
        "BILLING_URL": "https://x.example",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "orquestador.cli", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    for line, text in EXPECTED:
        assert any(f"{path}:{line}: {text}" in out for out in lines), (line, text, lines)
    assert "Bearer" not in done.stderr and "x.example" not in done.stderr

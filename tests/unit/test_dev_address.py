"""The dev server's address in ORQUESTADOR_HOME: written, read, stale once its process ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orquestador.dev_address import (
    forget_dev_api,
    is_loopback_url,
    loopback_url,
    record_dev_api,
    record_path,
    recorded_dev_api,
    trusted_dev_api,
)


def _gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    return int(ended.stdout)


def test_the_record_of_a_live_process_names_its_url(tmp_path: Path) -> None:
    path = record_dev_api(tmp_path, "http://127.0.0.1:18123/api/v1")

    assert json.loads(path.read_text()) == {
        "url": "http://127.0.0.1:18123/api/v1",
        "pid": os.getpid(),
    }
    assert recorded_dev_api(tmp_path) == "http://127.0.0.1:18123/api/v1"
    assert [p.name for p in tmp_path.iterdir()] == ["dev-api.json"], "no partial file left"


def test_a_record_whose_process_is_gone_is_stale_and_removed(tmp_path: Path) -> None:
    record_path(tmp_path).write_text(
        json.dumps({"url": "http://127.0.0.1:1/api/v1", "pid": _gone_pid()})
    )

    assert recorded_dev_api(tmp_path) is None
    assert not record_path(tmp_path).exists()


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"url": "x"}', '{"url": 1, "pid": 1}', '{"url": "x", "pid": true}']
)
def test_a_broken_record_is_no_record(tmp_path: Path, text: str) -> None:
    record_path(tmp_path).write_text(text)

    assert recorded_dev_api(tmp_path) is None


def test_no_record_is_none(tmp_path: Path) -> None:
    assert recorded_dev_api(tmp_path / "missing") is None


def test_a_stopping_dev_forgets_only_its_own_record(tmp_path: Path) -> None:
    record_dev_api(tmp_path, "http://127.0.0.1:18123/api/v1")
    forget_dev_api(tmp_path)
    assert not record_path(tmp_path).exists()

    # A newer dev process (here: the parent of this one, alive) replaced the record.
    newer = {"url": "http://127.0.0.1:18124/api/v1", "pid": os.getppid()}
    record_path(tmp_path).write_text(json.dumps(newer))
    forget_dev_api(tmp_path)
    assert recorded_dev_api(tmp_path) == newer["url"]


@pytest.mark.parametrize(
    "host, url",
    [
        ("127.0.0.1", "http://127.0.0.1:8080/api/v1"),
        ("0.0.0.0", "http://127.0.0.1:8080/api/v1"),
        ("::", "http://[::1]:8080/api/v1"),
        ("::1", "http://[::1]:8080/api/v1"),
        ("localhost", "http://localhost:8080/api/v1"),
    ],
)
def test_the_url_is_the_one_a_client_on_this_host_uses(host: str, url: str) -> None:
    assert loopback_url(host, 8080) == url


def test_the_agent_sends_its_token_only_to_orquestador_api_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orquestador.cli import main

    commands = tmp_path / "agent-commands.toml"
    commands.write_text('[reboot]\nargv = ["/bin/true"]\ntimeout_seconds = 5\n')
    (tmp_path / "dev-jwt-secret").write_text("secret\n")
    monkeypatch.delenv("ORQUESTADOR_API_URL", raising=False)
    monkeypatch.setenv("ORQUESTADOR_HOME", str(tmp_path))
    monkeypatch.setenv("ORQUESTADOR_TOKEN", "an-agent-token")
    monkeypatch.setenv("AGENT_COMMANDS_FILE", str(commands))
    # Even a dev folder's own record, on this host, never gets ORQUESTADOR_TOKEN.
    record_dev_api(tmp_path, "http://127.0.0.1:18123/api/v1")
    assert main(["agent", "--wait", "1"]) == 2
    said = capsys.readouterr().err
    assert "ORQUESTADOR_API_URL is not set" in said and "only there" in said

    monkeypatch.setenv("ORQUESTADOR_API_URL", "http://127.0.0.1:18123/api/v1")
    # An out-of-range --wait stops the command after its checks, before any request.
    assert main(["agent", "--wait", "31"]) == 2
    assert capsys.readouterr().err.strip() == "orquestador: --wait must be from 0 to 30 seconds"


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8080/api/v1", True),
        ("http://127.9.9.9/api/v1", True),
        ("http://[::1]:8080/api/v1", True),
        ("http://localhost:8080/api/v1", True),
        ("https://collector.example/api/v1", False),
        ("http://10.0.0.5:8080/api/v1", False),
        ("http://127.0.0.1.evil.example/api/v1", False),
        ("http://user:pw@127.0.0.1/api/v1", False),
        ("file:///etc/passwd", False),
        ("http://[::1/api/v1", False),
    ],
)
def test_only_a_url_on_this_host_is_loopback(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_a_record_counts_only_beside_the_dev_key_and_only_on_this_host(tmp_path: Path) -> None:
    key = tmp_path / "dev-jwt-secret"
    # pid 1 always exists: a record anyone leaves in a folder is never stale by its pid.
    record_path(tmp_path).write_text(json.dumps({"url": "http://127.0.0.1:1/api/v1", "pid": 1}))
    assert trusted_dev_api(tmp_path, key) is None  # no development key in the folder
    key.write_text("secret\n")
    assert trusted_dev_api(tmp_path, key) == "http://127.0.0.1:1/api/v1"
    record_path(tmp_path).write_text(json.dumps({"url": "https://evil.example/api/v1", "pid": 1}))
    assert trusted_dev_api(tmp_path, key) is None

"""`orquestador executions` usage errors that are caught before anything is asked of the API."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest

from orquestador.cli import main


@pytest.fixture
def listening_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A socket that listens and never answers: any request would be queued on it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        monkeypatch.setenv(
            "ORQUESTADOR_API_URL", f"http://127.0.0.1:{listener.getsockname()[1]}/api/v1"
        )
        monkeypatch.setenv("ORQUESTADOR_TOKEN", "not-checked-here")
        # A request that is sent waits a moment for the answer that never comes.
        monkeypatch.setattr("orquestador.client.transport.DEFAULT_TIMEOUT", (1.0, 0.2))
        yield listener


def _connections_made(listener: socket.socket) -> int:
    listener.setblocking(False)
    made = 0
    while True:
        try:
            accepted, _ = listener.accept()
        except BlockingIOError:
            return made
        accepted.close()
        made += 1


def test_confirm_without_output_is_a_usage_error_before_any_request(
    listening_api: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["executions", "reconcile", str(uuid.uuid4()), "--decision", "confirm"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--reason", "acme shows the charge"])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: orquestador executions reconcile")
    assert "--output is required with --decision confirm" in err
    assert "the step's output as the provider reports it (JSON, or @FILE)" in err
    assert "Traceback" not in err
    assert _connections_made(listening_api) == 0


@pytest.mark.parametrize("decision", ["retry", "fail"])
def test_retry_and_fail_need_no_output(listening_api: socket.socket, decision: str) -> None:
    # They reach the request: the silent API is asked, and its silence exits 2.
    argv = ["executions", "reconcile", str(uuid.uuid4()), "--decision", decision]

    assert main([*argv, "--reason", "checked"]) == 2
    assert _connections_made(listening_api) == 1


@pytest.mark.parametrize("decision", ["confirm", "fail"])
def test_a_correction_goes_only_with_retry(
    listening_api: socket.socket, capsys: pytest.CaptureFixture[str], decision: str
) -> None:
    argv = ["executions", "reconcile", str(uuid.uuid4()), "--decision", decision]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--reason", "checked", "--output", "{}", "--correct", "/amount=950"])

    assert exited.value.code == 2
    assert "--correct goes only with --decision retry" in capsys.readouterr().err
    assert _connections_made(listening_api) == 0


@pytest.mark.parametrize(
    ("correct", "said"),
    [
        ("amount", "--correct takes PATH=VALUE (say /amount=950 or /plan=large), not 'amount'"),
        ("=950", "--correct takes PATH=VALUE"),
        ("/amount=@no-such-file.json", "--correct /amount: cannot read no-such-file.json"),
    ],
)
def test_a_malformed_correction_is_a_usage_error_before_any_request(
    listening_api: socket.socket, capsys: pytest.CaptureFixture[str], correct: str, said: str
) -> None:
    argv = ["executions", "reconcile", str(uuid.uuid4()), "--decision", "retry"]

    assert main([*argv, "--reason", "checked", "--correct", correct]) == 2
    assert said in capsys.readouterr().err
    assert _connections_made(listening_api) == 0

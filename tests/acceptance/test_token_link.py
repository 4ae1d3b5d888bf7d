"""`orquestador token --link` as a person runs it: a real process asks a real API for a link."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests

from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "token-link-test-secret-" + "0123456789abcdef" * 3


@pytest.fixture
def api_url(database: TestDatabase) -> Iterator[str]:
    with served_api(database, SECRET) as (url, _):
        yield url


def _token(*args: str, api_url: str) -> subprocess.CompletedProcess:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env = {**base, "JWT_SECRET": SECRET, "ORQUESTADOR_API_URL": api_url}
    return subprocess.run(
        [*ORQUESTADOR, "token", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_printed_link_signs_in_once(api_url: str) -> None:
    done = _token(
        "--link", "--sub", "carol", "--org", "acme", "--scope", "requests:read", api_url=api_url
    )
    assert done.returncode == 0, done.stderr
    (url,) = done.stdout.split()
    assert "/ui/auth/link?t=" in url
    first = requests.get(url, timeout=10, allow_redirects=False)
    assert first.status_code == 200 and "orquestador_link_session" in first.cookies
    assert requests.get(url, timeout=10, allow_redirects=False).status_code == 410


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["--next", "https://elsewhere.example/"], 1, "refused (422 BODY_INVALID)"),
        (["--machine", "m-1"], 2, "--link signs a person in"),
    ],
)
def test_a_link_refused_or_misasked_exits_non_zero(
    api_url: str, args: list[str], status: int, said: str
) -> None:
    who = [] if "--machine" in args else ["--sub", "carol"]
    done = _token("--link", *who, "--org", "acme", *args, api_url=api_url)
    assert done.returncode == status
    assert said in done.stderr and "Traceback" not in done.stderr

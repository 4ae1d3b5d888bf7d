"""Debian's nginx with the shipped configuration (docs/deploy/nginx.conf.template) on
127.0.0.1, in front of an upstream of the test's choosing; and `orquestador api` itself.

The template is an include of nginx's http block: it is filled in as `envsubst` would and
included by a minimal main configuration of the test's own (pid, logs and temporary
files in a folder of its own), so what answers is the shipped server block, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from string import Template

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "docs" / "deploy" / "nginx.conf.template"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

_MAIN = """daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
worker_processes 1;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    include {folder}/orquestador.conf;
}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def status_of(url: str, timeout: float = 5) -> int | None:
    """The HTTP status of a GET (None: no answer within TIMEOUT)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def running_nginx(upstream: str) -> Iterator[int]:
    """nginx with the shipped configuration, in front of UPSTREAM (host:port); its port."""
    if not Path(NGINX).is_file():
        pytest.skip("nginx is not installed (Debian's package `nginx`)")
    folder = Path(tempfile.mkdtemp(prefix="orquestador-nginx-"))
    # Its workers run as an unprivileged account when the test runs as root.
    folder.chmod(0o777)
    port = free_port()
    shipped = Template(TEMPLATE.read_text()).safe_substitute(
        ORQUESTADOR_API=upstream, ORQUESTADOR_LISTEN=f"127.0.0.1:{port}"
    )
    (folder / "orquestador.conf").write_text(shipped)
    (folder / "nginx.conf").write_text(_MAIN.format(folder=folder))
    process = subprocess.Popen(
        [
            NGINX,
            "-p",
            str(folder),
            "-c",
            str(folder / "nginx.conf"),
            "-e",
            str(folder / "error.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:

        def listening() -> bool:
            assert process.poll() is None, (folder / "error.log").read_text()
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 30, "nginx to listen")
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def running_api(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`orquestador api` (gunicorn) with ENV added to a clean environment."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "orquestador.cli", "api"],
            cwd=ROOT,
            env={**base, "PYTHONPATH": str(ROOT), **env},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait(10)

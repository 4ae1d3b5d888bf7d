"""Where the running `orquestador dev` answers, kept in ORQUESTADOR_HOME for the command line.

`dev` writes `dev-api.json` ({"url", "pid"}) once its port is bound and removes it when it
stops. A command run in the same folder without ORQUESTADOR_API_URL reads it, so a dev
server on another port than API_PORT's is still found. A record whose process is gone
(the dev process was killed) is stale: it is removed on read and never used.

A record is only a file in a folder, and anyone can leave one (in a cloned repository,
say) naming any URL. So it is used only in a folder that holds the development key and
only when its URL is on this host (loopback), and the command line sends it the
development token, never ORQUESTADOR_TOKEN.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from orquestador.db.embedded import pid_exists

RECORD_NAME = "dev-api.json"
API_PATH = "/api/v1"


def record_path(home: Path) -> Path:
    return home / RECORD_NAME


def loopback_url(host: str, port: int) -> str:
    """The API's base URL as a client on this host reaches it."""
    # A server bound to every address answers on loopback.
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{API_PATH}"


def record_dev_api(home: Path, url: str) -> Path:
    """Record URL as this process's; replaced whole, so a reader never sees half of it."""
    path = record_path(home)
    partial = path.with_name(f".{RECORD_NAME}.{os.getpid()}")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    partial.replace(path)
    return path


def forget_dev_api(home: Path) -> None:
    """Remove the record if this process wrote it (a newer dev may have replaced it)."""
    path = record_path(home)
    if _read(path).get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recorded_dev_api(home: Path) -> str | None:
    """The URL of the dev server running for HOME, or None (no record, or a stale one)."""
    path = record_path(home)
    record = _read(path)
    url, pid = record.get("url"), record.get("pid")
    if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    if not pid_exists(pid):
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return url


def is_loopback_url(url: str) -> bool:
    """Whether URL is plain HTTP(S) to this host: localhost or a loopback address."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.username or parts.password:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def trusted_dev_api(home: Path, dev_key: Path) -> str | None:
    """The recorded dev server's URL, only in a folder holding the development key and
    only when the URL is on this host; else None."""
    if not dev_key.is_file():
        return None
    url = recorded_dev_api(home)
    return url if url is not None and is_loopback_url(url) else None


def _read(path: Path) -> dict[str, object]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}

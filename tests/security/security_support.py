"""Shared pieces of the security tests: a listener that must hear nothing, unchecked flows."""

from __future__ import annotations

import socket
import threading
import uuid
from types import TracebackType
from typing import Any

from sqlalchemy import Engine

from orquestador.api.flow_store import publish_flow
from tests.integration.api_support import ORG, decommission


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection made to it.

    Each connection is closed at once, so a client that did connect fails fast
    instead of waiting for an answer. Connections still queued when the listener
    stops count too, so no sleep is needed before asserting.
    """

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self._socket.settimeout(0.05)
        self.port = self._socket.getsockname()[1]
        self.connections: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_until_stopped, daemon=True)

    def url(self, path: str = "schema.json") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def _accept_once(self) -> bool:
        try:
            connection, peer = self._socket.accept()
        except (TimeoutError, BlockingIOError):
            return False
        self.connections.append(peer)
        connection.close()
        return True

    def _accept_until_stopped(self) -> None:
        while not self._stop.is_set():
            self._accept_once()

    def heard(self) -> list[tuple[str, int]]:
        """Every connection made so far, those still waiting in the backlog included."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.setblocking(False)
        while self._accept_once():
            pass
        return list(self.connections)

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


def store_unchecked(engine: Engine, **changes: Any) -> str:
    """A flow stored the way a flow published before a check existed is: as it was sent."""
    definition = decommission(**changes)
    with engine.begin() as connection:
        row = publish_flow(
            connection,
            org=ORG,
            key=f"unchecked-{uuid.uuid4().hex[:8]}",
            trigger="manual",
            definition=definition,
            data_schema=definition["dataSchema"],
            created_by="alice",
        )
    return str(row.id)

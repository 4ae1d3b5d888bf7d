"""A TCP forwarder that can turn into a black hole: the database host vanishing without a
word (no reset, no FIN), so that every statement on an open connection waits forever."""

from __future__ import annotations

import socket
import threading


class Blackhole:
    """Forwards 127.0.0.1:`port` to `target` until `vanish()`; from then on it keeps every
    socket open, passes nothing, and answers no new connection."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        # (host, port) over TCP, or the path of a server's Unix-domain socket.
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._vanished = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._listener]
        # Connections whose client sent something after the host vanished: each is a
        # thread of the client now waiting for an answer that never comes.
        self._swallowed: set[int] = set()
        self._forwarded = 0
        self._sent = 0  # what clients sent that reached the server
        threading.Thread(target=self._accept, daemon=True).start()

    def vanish(self) -> None:
        self._vanished.set()

    def sent(self) -> int:
        """How many times a client's bytes reached the server (a statement, roughly)."""
        with self._lock:
            return self._sent

    def swallowed(self) -> int:
        """How many connections have sent something into the hole."""
        with self._lock:
            return len(self._swallowed)

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self._vanished.is_set():
                continue  # accepted by the kernel, never answered: a connect that hangs
            if isinstance(self._target, str):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self._target)
            else:
                upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets.append(upstream)
                self._forwarded += 1
                connection = self._forwarded
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump,
                    args=(source, sink, connection if source is client else None),
                    daemon=True,
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, connection: int | None) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self._vanished.is_set():
                if connection is not None:  # the client asked something
                    with self._lock:
                        self._swallowed.add(connection)
                continue
            try:
                sink.sendall(data)
            except OSError:
                return
            if connection is not None:
                with self._lock:
                    self._sent += 1

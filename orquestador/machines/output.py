"""A machine command's output: chunks an agent appends by offset, kept as a head and a tail
within COMMAND_OUTPUT_MAX_BYTES, configured secrets redacted, and read after an offset.

The agent numbers its output in bytes (UTF-8) of the text it sends: a chunk carries the
offset it starts at. The server keeps how far it has taken the agent's output
(`output_received`), so a chunk sent again after a lost answer adds nothing, and a chunk
that starts further on says the agent skipped what lies between (it keeps only the end
of an output too long to send whole): those bytes count as dropped.

What is kept is counted in its own bytes (`output_size`), after redaction: the head is
the first half of the bound, from offset 0, contiguous; the tail is the latest bytes, up
to the other half. Between them, if anything, the dropped bytes, which a reader is told
about with a marker. A reader's offsets are in these kept bytes: `after=N` gives what
was kept beyond N, and `nextOffset` where to ask from next time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from orquestador.redaction import redact

# The most of a command's output a page shows: its last lines.
PAGE_LINES = 200


def dropped_marker(dropped: int) -> str:
    """What stands between the head and the tail of an output too long to keep whole."""
    return f"\n[… {dropped} bytes of output dropped …]\n"


@dataclass(frozen=True)
class StoredOutput:
    """A command's output as kept: head, tail, how far the agent's and the kept bytes go."""

    head: str = ""
    tail: str = ""
    # Bytes of the agent's output taken (its offsets), and bytes kept or dropped (ours).
    received: int = 0
    size: int = 0

    @property
    def head_bytes(self) -> int:
        return len(self.head.encode())

    @property
    def tail_start(self) -> int:
        return self.size - len(self.tail.encode())

    @property
    def dropped(self) -> int:
        return self.tail_start - self.head_bytes

    @property
    def text(self) -> str:
        """The whole of what was kept, the dropped part marked."""
        if self.dropped > 0:
            return self.head + dropped_marker(self.dropped) + self.tail
        return self.head + self.tail


def append_chunk(
    stored: StoredOutput,
    *,
    offset: int,
    chunk: str,
    max_bytes: int,
    redacted: Callable[[str], str] = redact,
) -> StoredOutput:
    """The output with the agent's chunk at `offset` taken once, within `max_bytes`.

    Bytes the agent sent before (offset below what was taken) are not taken again; a
    chunk starting past it means the bytes in between were skipped: they are dropped,
    and the tail starts again after them.
    """
    data = chunk.encode()
    if offset < 0:
        raise ValueError("an output offset is not negative")
    if offset + len(data) <= stored.received:
        return stored  # all of it was taken before
    skipped = max(0, offset - stored.received)
    new = data[max(0, stored.received - offset) :].decode("utf-8", "replace")
    kept = redacted(new).encode()
    received = offset + len(data)
    head, tail, size = stored.head.encode(), stored.tail.encode(), stored.size
    if skipped:
        # What lay between is gone: so is the tail it would have continued.
        size, tail = size + skipped, b""
    half = max_bytes // 2
    if size == len(head) and len(head) < half:
        # Nothing dropped yet and the head has room: it grows, contiguous from 0.
        room = _char_cut(kept, half - len(head))
        head, kept, size = head + kept[:room], kept[room:], size + room
    tail, size = tail + kept, size + len(kept)
    if len(tail) > max_bytes - half:
        tail = _from_char(tail, len(tail) - (max_bytes - half))
    return replace(stored, head=head.decode(), tail=tail.decode(), received=received, size=size)


def read_after(stored: StoredOutput, after: int) -> tuple[str, bool]:
    """What was kept past `after` (in kept bytes), and whether some of it was dropped.

    An offset inside the dropped part gives the marker and the tail; one past the end,
    nothing. An offset that falls inside a character starts at the next one.
    """
    after = max(0, after)
    head, tail = stored.head.encode(), stored.tail.encode()
    dropped = stored.dropped
    if after < len(head):
        rest = _from_char(head, after).decode()
        if dropped > 0:
            return rest + dropped_marker(dropped) + stored.tail, True
        return rest + stored.tail, False
    if after < stored.tail_start:
        return dropped_marker(stored.tail_start - max(after, len(head))).lstrip("\n") + (
            stored.tail
        ), True
    return _from_char(tail, after - stored.tail_start).decode(), False


# What a view reads of an output, at most, from each end: enough for PAGE_LINES lines of
# ordinary length, never the whole of a large output for every command of a list.
VIEW_CHARACTERS = 32768


def output_end(head_end: str, tail_end: str, dropped: int) -> str:
    """The last PAGE_LINES lines of an output read as its head's and tail's last
    VIEW_CHARACTERS characters, the dropped part marked where it lies."""
    if dropped > 0:
        return last_lines(head_end + dropped_marker(dropped) + tail_end)
    return last_lines(head_end + tail_end)


def last_lines(text: str, count: int = PAGE_LINES) -> str:
    """The last `count` lines of an output, as a page shows it."""
    lines = text.splitlines()
    return "\n".join(lines[-count:])


def _char_cut(data: bytes, limit: int) -> int:
    """The largest cut at most `limit` that falls between two UTF-8 characters."""
    if limit >= len(data):
        return len(data)
    cut = max(0, limit)
    while cut > 0 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def _from_char(data: bytes, start: int) -> bytes:
    """`data` from `start`, moved on to the first byte that starts a UTF-8 character."""
    start = max(0, start)
    while start < len(data) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]

"""A command's output kept from an agent's chunks: once each, head and tail, read by offset."""

from __future__ import annotations

from orquestador.machines.output import (
    StoredOutput,
    append_chunk,
    dropped_marker,
    last_lines,
    read_after,
)


def plain(text: str) -> str:
    return text


def add(stored: StoredOutput, offset: int, chunk: str, max_bytes: int = 1000) -> StoredOutput:
    return append_chunk(stored, offset=offset, chunk=chunk, max_bytes=max_bytes, redacted=plain)


def test_chunks_append_in_order_and_a_chunk_sent_again_is_kept_once() -> None:
    stored = add(StoredOutput(), 0, "one\n")
    stored = add(stored, 4, "two\n")
    again = add(stored, 4, "two\n")  # the answer was lost: the agent sends it again
    overlapping = add(stored, 0, "one\ntwo\nthree\n")  # a whole output at offset 0

    assert stored.text == again.text == "one\ntwo\n"
    assert again == stored
    assert overlapping.text == "one\ntwo\nthree\n"
    assert (overlapping.received, overlapping.size, overlapping.dropped) == (14, 14, 0)


def test_past_the_bound_the_head_and_the_latest_bytes_are_kept_the_rest_counted() -> None:
    stored = StoredOutput()
    for number in range(100):
        stored = add(stored, stored.received, f"line {number:03d}\n", max_bytes=100)

    assert stored.head.startswith("line 000\n") and len(stored.head.encode()) == 50
    assert stored.tail.endswith("line 099\n") and len(stored.tail.encode()) <= 50
    assert stored.received == stored.size == 900
    assert stored.dropped == 900 - 50 - len(stored.tail.encode())
    assert dropped_marker(stored.dropped) in stored.text


def test_a_chunk_past_what_was_taken_drops_the_bytes_between() -> None:
    stored = add(StoredOutput(), 0, "start\n")
    stored = add(stored, 1000, "end\n")  # the agent skipped the middle of a long output

    assert stored.head == "start\n" and stored.tail == "end\n"
    assert stored.dropped == 994
    assert stored.text == "start\n" + dropped_marker(994) + "end\n"


def test_secrets_are_redacted_before_anything_is_kept() -> None:
    stored = append_chunk(
        StoredOutput(),
        offset=0,
        chunk="token=s3cr3t-value\n",
        max_bytes=1000,
        redacted=lambda text: text.replace("s3cr3t-value", "[redacted]"),
    )

    assert stored.text == "token=[redacted]\n"
    assert stored.received == len(b"token=s3cr3t-value\n")


def test_a_multibyte_character_is_never_cut_in_two() -> None:
    stored = StoredOutput()
    for _ in range(40):
        stored = add(stored, stored.received, "ñandú €\n", max_bytes=60)

    stored.head.encode().decode()  # whole characters: both decode as they are
    stored.tail.encode().decode()
    assert "\ufffd" not in stored.text


def test_a_reader_gets_what_was_kept_after_its_offset() -> None:
    stored = StoredOutput()
    for number in range(100):
        stored = add(stored, stored.received, f"line {number:03d}\n", max_bytes=100)

    everything, truncated = read_after(stored, 0)
    assert truncated and everything == stored.text
    later, truncated = read_after(stored, stored.tail_start + 9)
    assert (later, truncated) == (stored.tail[9:], False)
    inside, truncated = read_after(stored, 60)  # within the dropped part
    assert truncated and inside.endswith(stored.tail) and "dropped" in inside
    assert read_after(stored, stored.size) == ("", False)


def test_a_page_shows_the_last_lines() -> None:
    text = "".join(f"{n}\n" for n in range(500))

    shown = last_lines(text, 200)

    assert shown.splitlines() == [str(n) for n in range(300, 500)]

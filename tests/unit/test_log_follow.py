"""Following an engine log from an offset (bless.system.log_follow): rotation, truncation, chunks, partial lines."""

from __future__ import annotations

import os
from pathlib import Path

from bless.system.log_follow import FileFollower, LogChunk, TextFollower


def _drain(follower: FileFollower | TextFollower, max_bytes: int = 1 << 20) -> tuple[bytes, list[str]]:
    data, lost = b"", []
    while True:
        chunk: LogChunk = follower.read(max_bytes)
        data += chunk.data
        if chunk.lost:
            lost.append(chunk.lost)
        if not chunk.more:
            return data, lost


def test_a_file_is_read_from_where_the_last_read_stopped_complete_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    follower = FileFollower(log)
    assert _drain(follower) == (b"", []), "no file yet: an empty log"
    log.write_bytes(b"one\ntw")
    assert _drain(follower) == (b"one\n", [])
    with log.open("ab") as out:
        out.write(b"o\nthree\n")
    assert _drain(follower) == (b"two\nthree\n", [])
    assert _drain(follower) == (b"", [])


def test_a_line_written_just_before_a_rotation_is_read_from_the_old_file(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"first\n")
    follower = FileFollower(log)
    assert _drain(follower) == (b"first\n", [])
    with log.open("ab") as out:
        out.write(b"bless-seal: in the old file\n")
    os.rename(log, tmp_path / "engine.log.1")  # rotated before the next poll
    log.write_bytes(b"new file\n")
    assert _drain(follower) == (b"bless-seal: in the old file\nnew file\n", [])


def test_a_truncation_after_an_unread_line_is_said_and_the_file_read_again(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 100 + b"\n")
    follower = FileFollower(log)
    _drain(follower)
    with log.open("ab") as out:
        out.write(b"bless-seal: lost\n")
    with log.open("r+b") as out:
        out.truncate(0)
    log.write_bytes(b"short\n")
    data, lost = _drain(follower)
    assert data == b"short\n" and len(lost) == 1 and "truncated" in lost[0]
    log.write_bytes(b"y" * 200 + b"\n")  # rewritten in place and grown past the offset: caught by its bytes
    data, lost = _drain(follower)
    assert data == b"y" * 200 + b"\n" and len(lost) == 1 and "rewritten" in lost[0]


def test_reads_are_bounded_chunks_and_a_huge_line_is_handed_out_cut(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"a" * 10 + b"\n" + b"b" * 5000 + b"\n" + b"c\n")
    follower = FileFollower(log)
    sizes: list[int] = []
    while True:
        chunk = follower.read(1024)
        assert len(chunk.data) <= 1024
        sizes.append(len(chunk.data))
        if not chunk.more:
            break
    assert sum(sizes) == log.stat().st_size and len(sizes) > 5


def test_a_text_follower_says_a_rewrite_too() -> None:
    text = [b"one\n"]
    follower = TextFollower(lambda: text[0])
    assert _drain(follower) == (b"one\n", [])
    text[0] = b"ONE\ntwo\n"
    data, lost = _drain(follower)
    assert data == b"ONE\ntwo\n" and len(lost) == 1


def test_docker_lines_after_skips_what_was_handed_out_at_the_same_time_stamp() -> None:
    from bless.runtime.docker import lines_after

    first = [b"2026-11-28T05:10:00.1Z one", b"2026-11-28T05:10:00.100000000Z two", b"2026-11-28T05:10:01Z three"]
    out, since, seen = lines_after(first, 0, 0)
    assert out == [b"one", b"two", b"three"] and seen == 1
    # The daemon's since is inclusive (and a float, a microsecond early): what was handed out comes again.
    again = [b"2026-11-28T05:10:00.1Z one", b"2026-11-28T05:10:01Z three", b"2026-11-28T05:10:01Z four"]
    out, since, seen = lines_after(again, since, seen)
    assert out == [b"four"] and seen == 2

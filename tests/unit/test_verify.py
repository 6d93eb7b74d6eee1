"""Tests for bless.core.verify on real files: a tamper matrix, races, read-only notices, path safety."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import pwd
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bless.core.relpath import check_relative_path
from bless.core.untrusted_text import shown
from bless.core.verify import (
    FileEntry,
    Notice,
    Problem,
    TreeCheck,
    TreeError,
    TreeListing,
    hash_tree,
    verify_tree,
)
from bless.core.verify import check as verify_check
from bless.core.verify import walk as verify_walk

BIG = 8 << 20  # 8 MiB: several read chunks, so start/middle/end flips hit different chunks
SMALL_FILES = {
    "small/a.txt": b"alpha alpha alpha\n",
    "small/b.txt": b"bravo\n",
    "nested/deep/c.bin": bytes(range(256)) * 16,
    "nested/deep/d.json": b'{"k": 1}\n',
}
ALL_FILES = ["big.bin", *SMALL_FILES]
ALL_DIRS = ["empty", "nested", "nested/deep", "small"]


@pytest.fixture(scope="session")
def big_bytes() -> bytes:
    return os.urandom(BIG)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to (not inside) the cache root, holding a 'secret' file."""
    d = tmp_path / "outside"
    d.mkdir()
    # Same size as small/a.txt so a symlink swap cannot be caught by size alone.
    (d / "secret").write_bytes(b"S" * len(SMALL_FILES["small/a.txt"]))
    return d


@pytest.fixture
def root(tmp_path: Path, big_bytes: bytes, outside: Path) -> Iterator[Path]:
    r = tmp_path / "cache"
    r.mkdir()
    (r / "big.bin").write_bytes(big_bytes)
    for rel, data in SMALL_FILES.items():
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_bytes(data)
    (r / "empty").mkdir()
    yield r
    # Read-only dirs would make tmp_path cleanup fail for a non-root user.
    for dirpath, _dirs, _files in os.walk(r):
        os.chmod(dirpath, 0o755)


@pytest.fixture
def listing(root: Path) -> TreeListing:
    return hash_tree(root)


def check(root: Path, listing: TreeListing, **kwargs: object) -> TreeCheck:
    return verify_tree(root, listing.files, listing.dirs, **kwargs)  # type: ignore[arg-type]


def found(result: TreeCheck) -> set[tuple[str, str]]:
    return {(p.kind, p.path) for p in result.problems}


def make_read_only(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# ---------------------------------------------------------------------------------------------
# Clean trees and hash_tree


def test_hash_tree_records_every_file_and_dir(root: Path, listing: TreeListing, big_bytes: bytes) -> None:
    assert [e.path for e in listing.files] == sorted(ALL_FILES)
    assert list(listing.dirs) == sorted(ALL_DIRS)  # the empty dir is recorded
    expected = {"big.bin": big_bytes, **SMALL_FILES}
    for entry in listing.files:
        data = expected[entry.path]
        assert entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert listing.total_size == sum(len(d) for d in expected.values())


def test_clean_tree_passes(root: Path, listing: TreeListing) -> None:
    result = check(root, listing)
    assert result.ok
    assert result.problems == ()
    assert result.files_checked == len(ALL_FILES)
    assert result.bytes_hashed == listing.total_size
    assert result.elapsed_s >= 0


def test_round_trip_with_any_worker_count(root: Path, listing: TreeListing) -> None:
    for workers in (1, 2, 7):
        assert hash_tree(root, workers=workers) == listing
        assert check(root, listing, workers=workers).ok


def test_read_only_tree_has_no_notices(root: Path, listing: TreeListing) -> None:
    make_read_only(root)
    result = check(root, listing)
    assert result.ok
    assert result.notices == ()


def test_chmod_only_change_passes_with_writable_notice(root: Path, listing: TreeListing) -> None:
    make_read_only(root)
    os.chmod(root / "big.bin", 0o644)
    os.chmod(root / "nested", 0o755)
    result = check(root, listing)
    assert result.ok
    assert [(n.kind, n.path) for n in result.notices] == [("writable", "big.bin"), ("writable", "nested")]
    assert "write bit" in result.notices[0].detail


def test_an_entry_other_users_can_write_is_a_problem(root: Path, listing: TreeListing) -> None:
    """Group/other write on a file or a directory below the root: another user could change the cache
    while it is served, after every byte verified."""
    make_read_only(root)
    os.chmod(root / "big.bin", 0o464)
    os.chmod(root / "nested", 0o557)
    result = check(root, listing)
    assert not result.ok
    assert sorted((p.kind, p.path) for p in result.problems) == [
        ("writable_by_others", "big.bin"),
        ("writable_by_others", "nested"),
    ]
    assert "chmod go-w" in result.problems[0].detail
    assert result.notices == ()


@pytest.mark.parametrize(("path", "bits"), [("big.bin", 0o4000), ("big.bin", 0o2000), ("nested", 0o1000)])
def test_a_setuid_setgid_or_sticky_bit_is_a_problem(root: Path, listing: TreeListing, path: str, bits: int) -> None:
    """Publish sets every mode exactly: a special bit was added since (before: a write-bit notice at most)."""
    make_read_only(root)
    os.chmod(root / path, stat.S_IMODE(os.lstat(root / path).st_mode) | bits)
    result = check(root, listing)
    assert not result.ok
    assert [(p.kind, p.path) for p in result.problems] == [("special_mode", path)]
    assert "setuid, setgid or sticky" in result.problems[0].detail


def test_writable_notices_can_be_turned_off(root: Path, listing: TreeListing) -> None:
    result = check(root, listing, expect_read_only=False)
    assert result.ok and result.notices == ()
    # By default a freshly written (writable) tree yields notices for the root, dirs and files.
    paths = {n.path for n in check(root, listing).notices}
    assert paths == {".", *ALL_DIRS, *ALL_FILES}


def test_to_dict_is_json_ready(root: Path, listing: TreeListing) -> None:
    (root / "big.bin").unlink()
    d = check(root, listing).to_dict()
    again = json.loads(json.dumps(d))
    assert again["ok"] is False
    assert again["problems"] == [{"kind": "missing", "path": "big.bin", "detail": "listed but not found"}]
    assert {"notices", "files_checked", "bytes_hashed", "elapsed_s"} <= again.keys()


# ---------------------------------------------------------------------------------------------
# The tamper matrix: each change is detected and named, and nothing else is reported.


def _symlink_file_outside(root: Path, outside: Path) -> None:
    (root / "small/a.txt").unlink()
    (root / "small/a.txt").symlink_to(outside / "secret")


def _symlink_dir(root: Path, outside: Path) -> None:
    # An identical copy elsewhere: following the link would make everything "match".
    copy = outside / "deep-copy"
    shutil.copytree(root / "nested/deep", copy)
    shutil.rmtree(root / "nested/deep")
    (root / "nested/deep").symlink_to(copy, target_is_directory=True)


def _add_dir_symlink(root: Path, outside: Path) -> None:
    (root / "small/escape").symlink_to(outside, target_is_directory=True)


def _fifo_for_file(root: Path, outside: Path) -> None:
    (root / "small/b.txt").unlink()
    os.mkfifo(root / "small/b.txt")


def _add_fifo(root: Path, outside: Path) -> None:
    os.mkfifo(root / "nested/pipe")


def _same_size_replacement(root: Path, outside: Path) -> None:
    data = SMALL_FILES["small/a.txt"]
    (root / "small/a.txt").write_bytes(b"X" * len(data))


def _file_becomes_dir(root: Path, outside: Path) -> None:
    (root / "small/b.txt").unlink()
    (root / "small/b.txt").mkdir()


def _dir_becomes_file(root: Path, outside: Path) -> None:
    (root / "empty").rmdir()
    (root / "empty").write_bytes(b"")


def _truncate(root: Path, outside: Path) -> None:
    os.truncate(root / "big.bin", BIG - 1)


def _extend(root: Path, outside: Path) -> None:
    with (root / "big.bin").open("ab") as f:
        f.write(b"\0")


def _add_dir_with_file(root: Path, outside: Path) -> None:
    (root / "newdir/sub").mkdir(parents=True)
    (root / "newdir/sub/x.bin").write_bytes(b"x")


def _hidden_file(root: Path, outside: Path) -> None:
    (root / "nested/.hidden").write_bytes(b"h")


Tamper = Callable[[Path, Path], object]
TAMPERS: dict[str, tuple[Tamper, set[tuple[str, str]]]] = {
    "flip_start": (lambda r, o: flip_byte(r / "big.bin", 0), {("sha256", "big.bin")}),
    "flip_middle": (lambda r, o: flip_byte(r / "big.bin", BIG // 2), {("sha256", "big.bin")}),
    "flip_end": (lambda r, o: flip_byte(r / "big.bin", BIG - 1), {("sha256", "big.bin")}),
    "flip_small": (lambda r, o: flip_byte(r / "nested/deep/c.bin", 100), {("sha256", "nested/deep/c.bin")}),
    "truncate": (_truncate, {("size", "big.bin")}),
    "extend": (_extend, {("size", "big.bin")}),
    "truncate_to_zero": (lambda r, o: os.truncate(r / "small/b.txt", 0), {("size", "small/b.txt")}),
    "delete": (lambda r, o: (r / "small/a.txt").unlink(), {("missing", "small/a.txt")}),
    "delete_big": (lambda r, o: (r / "big.bin").unlink(), {("missing", "big.bin")}),
    "add_file": (lambda r, o: (r / "new.txt").write_bytes(b"new"), {("extra", "new.txt")}),
    "add_empty_file": (lambda r, o: (r / "small/z").write_bytes(b""), {("extra", "small/z")}),
    "add_hidden_file": (_hidden_file, {("extra", "nested/.hidden")}),
    "add_empty_dir": (lambda r, o: (r / "nested/newempty").mkdir(), {("extra_dir", "nested/newempty")}),
    "add_dir_with_file": (
        _add_dir_with_file,
        {("extra_dir", "newdir"), ("extra_dir", "newdir/sub"), ("extra", "newdir/sub/x.bin")},
    ),
    "remove_empty_dir": (lambda r, o: (r / "empty").rmdir(), {("missing_dir", "empty")}),
    "symlink_to_file_outside": (_symlink_file_outside, {("symlink", "small/a.txt")}),
    "dir_replaced_by_symlink": (
        _symlink_dir,
        {("symlink", "nested/deep"), ("missing", "nested/deep/c.bin"), ("missing", "nested/deep/d.json")},
    ),
    "dir_symlink_added": (_add_dir_symlink, {("symlink", "small/escape")}),
    "fifo_replaces_file": (_fifo_for_file, {("not_regular", "small/b.txt")}),
    "fifo_added": (_add_fifo, {("not_regular", "nested/pipe")}),
    "same_size_content": (_same_size_replacement, {("sha256", "small/a.txt")}),
    "file_becomes_dir": (_file_becomes_dir, {("not_regular", "small/b.txt")}),
    "dir_becomes_file": (_dir_becomes_file, {("missing_dir", "empty")}),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tamper_is_detected_and_named(name: str, root: Path, listing: TreeListing, outside: Path) -> None:
    tamper, expected = TAMPERS[name]
    tamper(root, outside)
    result = check(root, listing)
    assert not result.ok
    assert found(result) == expected
    for problem in result.problems:
        assert problem.detail  # every problem explains itself


def test_size_mismatch_is_reported_with_both_sizes_and_not_hashed(root: Path, listing: TreeListing) -> None:
    _truncate(root, root)
    result = check(root, listing)
    (problem,) = result.problems
    assert problem.detail == f"expected {BIG} bytes, found {BIG - 1}"
    # Sizes are compared before hashing: the 8 MiB file was never read.
    assert result.bytes_hashed == listing.total_size - BIG


def test_sha256_problem_names_both_digests(root: Path, listing: TreeListing) -> None:
    _same_size_replacement(root, root)
    (problem,) = check(root, listing).problems
    want = next(e.sha256 for e in listing.files if e.path == "small/a.txt")
    got = hashlib.sha256(b"X" * len(SMALL_FILES["small/a.txt"])).hexdigest()
    assert want in problem.detail and got in problem.detail


def test_symlink_detail_names_the_target(root: Path, listing: TreeListing, outside: Path) -> None:
    _symlink_file_outside(root, outside)
    (problem,) = check(root, listing).problems
    assert str(outside / "secret") in problem.detail


def test_dir_symlink_is_not_followed(root: Path, listing: TreeListing, outside: Path) -> None:
    _add_dir_symlink(root, outside)
    result = check(root, listing)
    # The secret behind the link is neither hashed nor reported as an extra file.
    assert all("secret" not in p.path for p in result.problems)
    assert result.bytes_hashed == listing.total_size


def test_many_problems_at_once_are_all_reported_and_sorted(root: Path, listing: TreeListing, outside: Path) -> None:
    expected: set[tuple[str, str]] = set()
    for name in (
        "flip_middle",
        "delete",
        "add_file",
        "add_empty_dir",
        "remove_empty_dir",
        "fifo_replaces_file",
        "flip_small",
        "dir_symlink_added",
    ):
        tamper, want = TAMPERS[name]
        tamper(root, outside)
        expected |= want
    result = check(root, listing)
    assert found(result) == expected
    assert len(result.problems) == len(expected)
    keys = [(p.path, p.kind) for p in result.problems]
    assert keys == sorted(keys)


def test_missing_root_is_a_single_problem(tmp_path: Path, listing: TreeListing) -> None:
    result = check(tmp_path / "nope", listing)
    assert [(p.kind, p.path) for p in result.problems] == [("root_missing", ".")]
    assert result.files_checked == 0 and not result.ok


def test_root_that_is_a_file_is_root_missing(tmp_path: Path, listing: TreeListing) -> None:
    (tmp_path / "f").write_bytes(b"")
    assert found(check(tmp_path / "f", listing)) == {("root_missing", ".")}


def test_root_symlink_is_refused(tmp_path: Path, root: Path, listing: TreeListing) -> None:
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    assert found(check(link, listing)) == {("symlink", ".")}
    with pytest.raises(TreeError):
        hash_tree(link)


def test_empty_listing_against_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    result = verify_tree(tmp_path / "e", [], [])
    assert result.ok and result.files_checked == 0


def test_files_only_listing_implies_parent_dirs(root: Path, listing: TreeListing) -> None:
    # Without a dirs listing, parents of listed files are expected; only the empty dir is extra.
    result = verify_tree(root, listing.files)
    assert found(result) == {("extra_dir", "empty")}


# ---------------------------------------------------------------------------------------------
# The listing itself


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a//b", "./a", "a/", "a\\b", "a/../b", "", "a\x00b"])
def test_bad_paths_in_listing_are_reported_and_never_opened(
    bad: str, root: Path, listing: TreeListing, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Make '../x' exist and match, so only the path check can catch it.
    (root.parent / "x").write_bytes(b"x")
    sneaky = FileEntry(bad, 1, hashlib.sha256(b"x").hexdigest())
    opened: list[str] = []
    real_open = os.open

    def spy(path: object, flags: int, *args: object, **kwargs: object) -> int:
        opened.append(os.fsdecode(path))  # type: ignore[arg-type]
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)  # the module bless.core.verify's walk uses
    result = verify_tree(root, [*listing.files, sneaky], listing.dirs)
    monkeypatch.undo()
    assert found(result) == {("bad_path", bad)}
    assert "rejected" in result.problems[0].detail
    # Only the root and real cache entries were opened, never the bad path or a component of it.
    allowed = {str(root)} | {seg for rel in (*ALL_FILES, *ALL_DIRS) for seg in rel.split("/")}
    assert opened and set(opened) <= allowed, opened
    assert result.files_checked == len(ALL_FILES)


def test_all_four_named_bad_paths_at_once(root: Path, listing: TreeListing) -> None:
    sha = "0" * 64
    bad = ["../x", "/etc/passwd", "a//b", "./a"]
    result = verify_tree(root, [*listing.files, *(FileEntry(b, 1, sha) for b in bad)], [*listing.dirs, "../d"])
    assert found(result) == {("bad_path", b) for b in [*bad, "../d"]}


def test_duplicate_listing_entries_are_bad_path(root: Path, listing: TreeListing) -> None:
    dup = listing.files[0]
    result = verify_tree(root, [*listing.files, dup], [*listing.dirs, "empty"])
    assert found(result) == {("bad_path", dup.path), ("bad_path", "empty")}


def test_path_listed_as_file_and_dir_is_bad_path(root: Path, listing: TreeListing) -> None:
    result = verify_tree(root, listing.files, [*listing.dirs, "big.bin"])
    assert ("bad_path", "big.bin") in found(result)


@pytest.mark.parametrize(
    ("size", "sha"),
    [(-1, "0" * 64), (True, "0" * 64), (1, "0" * 63), (1, "A" * 64), (1, "g" * 64), (1.0, "0" * 64)],
)
def test_file_entry_rejects_malformed_size_or_digest(size: object, sha: str) -> None:
    with pytest.raises(ValueError):
        FileEntry("a", size, sha)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# hash_tree refuses what a staged cache must not contain


@pytest.mark.parametrize(
    ("make", "kind", "path"),
    [
        (lambda r, o: (r / "ln").symlink_to(r / "big.bin"), "symlink", "ln"),
        (lambda r, o: (r / "small/out").symlink_to(o / "secret"), "symlink", "small/out"),
        (lambda r, o: (r / "dl").symlink_to(o, target_is_directory=True), "symlink", "dl"),
        (lambda r, o: (r / "dangling").symlink_to(r / "nothing-here"), "symlink", "dangling"),
        (lambda r, o: os.mkfifo(r / "nested/fifo"), "not_regular", "nested/fifo"),
        (lambda r, o: (r / "back\\slash").write_bytes(b""), "bad_path", "back\\slash"),
    ],
)
def test_hash_tree_refuses(make: Tamper, kind: str, path: str, root: Path, outside: Path) -> None:
    make(root, outside)
    with pytest.raises(TreeError) as info:
        hash_tree(root)
    assert isinstance(info.value, ValueError)
    assert [(p.kind, p.path) for p in info.value.problems] == [(kind, path)]
    assert shown(path) in str(info.value)  # names are shown escaped in messages (a backslash doubled)


def test_hash_tree_reports_all_offenders(root: Path, outside: Path) -> None:
    (root / "l1").symlink_to(outside / "secret")
    (root / "nested/l2").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "p")
    with pytest.raises(TreeError) as info:
        hash_tree(root)
    assert {(p.kind, p.path) for p in info.value.problems} == {
        ("symlink", "l1"),
        ("symlink", "nested/l2"),
        ("not_regular", "p"),
    }


def test_hash_tree_missing_root(tmp_path: Path) -> None:
    with pytest.raises(TreeError) as info:
        hash_tree(tmp_path / "nope")
    assert info.value.problems[0].kind == "root_missing"


def test_extra_file_with_unrecordable_name_is_still_extra(root: Path, listing: TreeListing) -> None:
    (root / "a\\b").write_bytes(b"")
    (root / "bad\nname").write_bytes(b"")
    assert found(check(root, listing)) == {("extra", "a\\b"), ("extra", "bad\nname")}


# ---------------------------------------------------------------------------------------------
# Swaps between the scan and the open (time-of-check / time-of-use)


def _after_scan(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    real_scan = verify_walk.scan_tree

    def scan_then_swap(root_fd: int) -> verify_walk.Scan:
        result = real_scan(root_fd)
        action()
        return result

    monkeypatch.setattr(verify_check, "scan_tree", scan_then_swap)  # the name verify_tree calls


def test_file_swapped_for_symlink_after_scan(
    root: Path, listing: TreeListing, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _after_scan(monkeypatch, lambda: _symlink_file_outside(root, outside))
    result = check(root, listing)
    assert found(result) == {("symlink", "small/a.txt")}
    assert "during verification" in result.problems[0].detail


def test_parent_dir_swapped_for_symlink_after_scan(
    root: Path, listing: TreeListing, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # O_NOFOLLOW on the last component alone would read straight through the swapped parent.
    _after_scan(monkeypatch, lambda: _symlink_dir(root, outside))
    result = check(root, listing)
    assert found(result) == {("symlink", "nested/deep/c.bin"), ("symlink", "nested/deep/d.json")}
    assert result.bytes_hashed == listing.total_size - len(SMALL_FILES["nested/deep/c.bin"]) - len(
        SMALL_FILES["nested/deep/d.json"]
    )


def test_file_swapped_for_fifo_after_scan_does_not_hang(
    root: Path, listing: TreeListing, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _after_scan(monkeypatch, lambda: _fifo_for_file(root, outside))
    assert found(check(root, listing)) == {("not_regular", "small/b.txt")}


def test_file_deleted_after_scan(root: Path, listing: TreeListing, monkeypatch: pytest.MonkeyPatch) -> None:
    _after_scan(monkeypatch, lambda: (root / "big.bin").unlink())
    assert found(check(root, listing)) == {("missing", "big.bin")}


def test_file_resized_after_scan(root: Path, listing: TreeListing, monkeypatch: pytest.MonkeyPatch) -> None:
    _after_scan(monkeypatch, lambda: _extend(root, root))
    assert found(check(root, listing)) == {("size", "big.bin")}


# ---------------------------------------------------------------------------------------------
# Parallelism and progress


def test_progress_sums_to_bytes_hashed(root: Path, listing: TreeListing) -> None:
    lock = threading.Lock()
    seen = [0]
    threads: set[str] = set()

    def progress(n: int) -> None:
        with lock:
            seen[0] += n
            threads.add(threading.current_thread().name)

    result = check(root, listing, workers=4, progress=progress)
    assert result.ok
    assert seen[0] == result.bytes_hashed == listing.total_size
    # Called from the hashing threads, not the caller's: the callee must be thread-safe.
    assert threads and all(t.startswith("bless-hash") for t in threads)


def test_progress_exception_propagates(root: Path, listing: TreeListing) -> None:
    def boom(n: int) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        check(root, listing, workers=2, progress=boom)


def test_invalid_worker_count(root: Path, listing: TreeListing) -> None:
    with pytest.raises(ValueError):
        check(root, listing, workers=0)


# Root reads everything whatever the modes say, so as root (the test command's user) the check of
# an unreadable part runs in a forked child that drops to ``nobody`` (its group, no supplementary
# groups) first. Forked, not exec'd: the interpreter may live where nobody cannot reach (a pyenv
# under /root), and the child already holds bless. The tree is then a copy in a fresh dir nobody
# can reach, because pytest's tmp dirs are 0700 root. As any other user the check runs in-process.


@pytest.fixture
def reachable_root(root: Path) -> Iterator[Path]:
    """``root``, or as root a copy of it in a fresh 0755 dir that an unprivileged child can reach."""
    if os.geteuid() != 0:
        yield root
        return
    base = Path(tempfile.mkdtemp(prefix="bless-verify-"))
    try:
        base.chmod(0o755)
        copy = base / "cache"
        shutil.copytree(root, copy)  # keeps the modes: files 0644, dirs 0755
        yield copy
    finally:
        shutil.rmtree(base)  # root removes it whatever modes the test left


def unprivileged_found(root: Path, listing: TreeListing) -> set[tuple[str, str]]:
    """The problems ``verify_tree`` finds when run by a user that the modes apply to."""
    if os.geteuid() != 0:
        return found(check(root, listing))
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            reply = {"euid": os.geteuid(), "problems": [p.to_dict() for p in check(root, listing).problems]}
            code = 0
        except BaseException as exc:
            reply = {"error": repr(exc)}
        finally:
            with os.fdopen(write_end, "w") as out:
                json.dump(reply, out)
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        reply = json.load(pipe)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, reply
    assert reply["euid"] == nobody.pw_uid  # the modes bind it: it really dropped root
    return {(problem["kind"], problem["path"]) for problem in reply["problems"]}


def test_unreadable_file_is_reported(reachable_root: Path, listing: TreeListing) -> None:
    os.chmod(reachable_root / "small/a.txt", 0)
    try:
        assert unprivileged_found(reachable_root, listing) == {("unreadable", "small/a.txt")}
    finally:
        os.chmod(reachable_root / "small/a.txt", 0o644)


def test_unlistable_dir_is_reported(reachable_root: Path, listing: TreeListing) -> None:
    os.chmod(reachable_root / "nested/deep", 0)
    try:
        problems = unprivileged_found(reachable_root, listing)
        assert ("unreadable", "nested/deep") in problems
        assert {("missing", "nested/deep/c.bin"), ("missing", "nested/deep/d.json")} <= problems
    finally:
        os.chmod(reachable_root / "nested/deep", 0o755)


# ---------------------------------------------------------------------------------------------
# check_relative_path


@pytest.mark.parametrize("good", ["a", "a/b", "a.b/c..d", ".hidden", "..a", "a..", "é/ü", "rank_0_0/x.bin"])
def test_accepts_normal_relative_paths(good: str) -> None:
    assert check_relative_path(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "/",
        "/etc/passwd",
        "..",
        "../x",
        "a/..",
        "a/../../b",
        ".",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "a\\b",
        "..\\x",
        "a\x00b",
        "a\nb",
        "a\x7fb",
        "\udcff",
        "x" * 256,
        "/".join(["x" * 200] * 21),
    ],
)
def test_rejects_unsafe_paths(bad: str) -> None:
    with pytest.raises(ValueError):
        check_relative_path(bad)


def test_rejects_non_strings() -> None:
    with pytest.raises(ValueError):
        check_relative_path(b"a")  # type: ignore[arg-type]


def _assert_contained(path: str) -> None:
    assert not path.startswith("/")
    assert posixpath.normpath(path) == path
    joined = posixpath.normpath(posixpath.join("/cache/root", path))
    assert joined.startswith("/cache/root/")
    assert ".." not in path.split("/")


# Path-like strings over a tiny alphabet reach the interesting cases far more often than text().
path_like = st.text(alphabet=["a", "b", ".", "/", "\\", "\x00", "\n", " ", "é", "\udcff"], max_size=12)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.text(), path_like))
def test_random_strings_never_crash_and_never_escape(path: str) -> None:
    try:
        result = check_relative_path(path)
    except ValueError as exc:
        assert str(exc)  # every rejection says why
        return
    assert result == path
    _assert_contained(path)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(alphabet="ab.", min_size=1, max_size=4), min_size=1, max_size=5))
def test_joined_segments_accepted_iff_no_dot_segments(segments: list[str]) -> None:
    path = "/".join(segments)
    safe = all(s not in (".", "..") for s in segments)
    if safe:
        assert check_relative_path(path) == path
        _assert_contained(path)
    else:
        with pytest.raises(ValueError):
            check_relative_path(path)


def test_public_records_are_frozen() -> None:
    p = Problem("missing", "a", "gone")
    n = Notice("writable", "a", "w")
    with pytest.raises(AttributeError):
        p.path = "b"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        n.path = "b"  # type: ignore[misc]


def test_mode_constants_sanity(root: Path) -> None:
    # The fixture tree is plain files and dirs, as hash_tree requires.
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            assert stat.S_ISREG(os.lstat(os.path.join(dirpath, name)).st_mode)


def test_a_file_rewritten_in_place_while_it_is_hashed_is_a_problem(tmp_path: Path) -> None:
    """One byte rewritten behind the reader, mtime put back: the digest may still match the old bytes, but
    the file's ctime moved, so the result cannot be trusted."""
    root = tmp_path / "t"
    root.mkdir()
    big = root / "big.bin"
    big.write_bytes(b"\x07" * (8 * 1024 * 1024))
    listing = hash_tree(root)
    before = os.stat(big)
    rewritten: list[bool] = []

    def progress(_n: int) -> None:
        if not rewritten:  # after the first chunk: rewrite bytes already read, then hide the mtime change
            with open(big, "r+b") as handle:
                handle.write(b"\x07")
            os.utime(big, ns=(before.st_atime_ns, before.st_mtime_ns))
            rewritten.append(True)

    result = verify_tree(root, listing.files, listing.dirs, progress=progress, workers=1)
    assert rewritten
    assert [(p.kind, p.path) for p in result.problems] == [("changed_during_verify", "big.bin")]
    assert check(root, listing).ok  # nothing changes it now: verifying again passes

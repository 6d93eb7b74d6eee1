"""Sealed serving: every compile the blessing does not hold is seen while serving, at once, and handled by policy.

Two sources feed it:

* **bless's Triton cache manager** (:mod:`bless.engines.bless_seal`, shipped into every blessed start by
  :func:`~bless.flows.engine_start.engine_spec`): a lookup the blessed tree cannot answer writes one line,
  ``bless-seal: {...}``, to the engine's log before Triton compiles. :func:`parse_seal_lines` reads them.
* **the watcher** (:class:`SealWatcher`): about every second it lists every place the running engine can
  write (the overlay's upper layer or the verified copy's new files, its private HOME and temp dir, a
  container's own filesystem, its ``/dev/shm``) and has the adapter judge what is new (``classify_upper``,
  ``classify_outside``): a new compiled artifact is an unproven compile. Its first look is the start's:
  what a start writes as a matter of course (Inductor's scratch dir, Python's bytecode, shared-memory
  segments) is noise there, and a compile when it appears later, while serving. It covers what the hook cannot
  see (Inductor's bundler writing Triton files itself, FlashInfer, DeepGEMM, CUDA's PTX JIT, HOME, temp).

:class:`Seal` applies the policy (``[serving] unproven_compile``, ``serve-full --unproven-compile``) to each
distinct compile (a kernel's cache key, a written path; a repeat is only counted): it is reported to the event
sink at once, listed in the readiness record (``serve-full ready NAME --json``: the first events and the count)
and appended, one line, to ``unproven-compiles.jsonl`` in the serve dir (bounded:
:mod:`bless.core.unproven_evidence`); ``refuse`` makes the readiness probe fail (46) while the engine keeps
answering, ``record`` only records, ``stop`` ends serving gracefully (serve-full then exits 48,
:class:`~bless.errors.UnprovenCompileError`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core import unproven_evidence as evidence
from bless.core.json_form import JsonForm, as_json
from bless.core.profile import UnprovenCompilePolicy
from bless.engines.base import EngineAdapter
from bless.errors import BlessError, UnprovenCompileError
from bless.evidence_types import OutsideEntry
from bless.flows.engine_start import EngineSession
from bless.flows.events import Event, EventSink
from bless.flows.serve.ready import RECORD_EVENTS_MAX, clear_ready, record_unproven
from bless.runtime.base import Runtime, Started
from bless.store import Store
from bless.store.layout import StorePaths
from bless.system.log_follow import LogFollower

__all__ = [
    "LINE_PREFIX",
    "POLL_S",
    "Seal",
    "SealWatcher",
    "UnprovenCompile",
    "parse_seal_lines",
    "unproven_compile_error",
    "watching",
]

#: What bless's cache manager writes before each event (bless/engines/bless_seal.py; a unit test holds them equal).
LINE_PREFIX = "bless-seal: "
#: Failed polls in a row after which the watcher itself is an event: a seal that cannot look is no seal.
BLIND_POLLS = 5
#: How often the watcher looks (seconds): an unproven compile is reported within about this long.
POLL_S = 1.0
_MAX_IN_MESSAGE = 5


@dataclass(frozen=True)
class UnprovenCompile(JsonForm):
    """One compile the blessing does not hold, seen while serving.

    ``source``: ``triton-cache-manager`` (a lookup the blessed tree missed: ``kernel``, ``key``, ``file``)
    or ``watcher`` (a new compiled file: ``path`` as the adapter shows it, ``reason`` its judgement).
    """

    json_keys = ("event", "source", "time", "kernel", "key", "file", "path", "reason")

    source: str
    time: float
    kernel: str | None = field(default=None, metadata=as_json(omit_if_none=True))
    key: str | None = field(default=None, metadata=as_json(omit_if_none=True))
    file: str | None = field(default=None, metadata=as_json(omit_if_none=True))
    path: str | None = field(default=None, metadata=as_json(omit_if_none=True))
    reason: str | None = field(default=None, metadata=as_json(omit_if_none=True))

    def describe(self) -> str:
        """One line for people: the kernel (and its cache key) or the path, and who saw it."""
        if self.kernel is not None:
            key = f", key {self.key}" if self.key else ""
            return f"kernel {self.kernel} ({self.file or '?'}{key}; seen by the {self.source})"
        return f"{self.path or '?'} ({self.reason or 'new compiled file'}; seen by the {self.source})"

    def json_extra(self) -> dict[str, Any]:
        """What the record is, for a reader of mixed event lines."""
        return {"event": "unproven_compile"}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _seconds(value: object) -> float | None:
    """A finite time stamp, or None (a 400-digit integer or NaN is no time)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


#: A seal line: the prefix at the start of the line, or after the process tag vLLM puts on a subprocess's
#: output (``(EngineCore_DP0 pid=42) ``). Anchored, so a prompt or an error message that quotes the prefix
#: (a logged request, say) is no event.
_SEAL_LINE = re.compile(r"^(?:\([^()\n]{1,80}\)\s*)?" + re.escape(LINE_PREFIX))


def parse_seal_lines(text: str, *, now: Callable[[], float] = time.time) -> list[UnprovenCompile]:
    """Every ``bless-seal:`` line of an engine log, in order (the prefix may follow a process tag).

    A line that carries the prefix but no readable event still counts (fail closed): something
    reported a miss, and serve-full cannot say which kernel.
    """
    found: list[UnprovenCompile] = []
    for line in text.splitlines():
        match = _SEAL_LINE.match(line)
        if match is None:
            continue
        payload = line[match.end() :].strip()
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or data.get("event") != "unproven_compile":
            found.append(
                UnprovenCompile(
                    source="triton-cache-manager", time=now(), reason=f"unreadable seal line: {payload[:200]!r}"
                )
            )
            continue
        stamp = data.get("time")
        found.append(
            UnprovenCompile(
                source=_text(data.get("source")) or "triton-cache-manager",
                time=_seconds(stamp) or now(),
                kernel=_text(data.get("kernel")) or "?",
                key=_text(data.get("key")),
                file=_text(data.get("file")),
            )
        )
    return found


@dataclass
class SealWatcher:
    """Finds the unproven compiles of one running engine, each once (:meth:`poll`)."""

    runtime: Runtime
    session: EngineSession
    adapter: EngineAdapter
    now: Callable[[], float] = time.time
    _log: LogFollower | None = None
    _seen_upper: set[str] = field(default_factory=set)
    _seen_outside: set[str] = field(default_factory=set)
    #: Whether the first look outside the tree was made: what it found is the start's (judged as a start's
    #: writes); what is new after it was written while serving.
    _outside_baseline: bool = False

    @property
    def started(self) -> Started:
        assert self.session.started is not None
        return self.session.started

    def poll(self) -> list[UnprovenCompile]:
        """What is new since the last poll: seal lines in the log, new compiled files where the engine writes."""
        return [event for batch in self.batches() for event in batch]

    def batches(self) -> Iterator[list[UnprovenCompile]]:
        """:meth:`poll`, one batch at a time: a chunk of the log's seal lines each, then the new files.

        :func:`watching` hands each batch to the seal as it comes, so a poll over a log that gained a gigabyte
        of seal lines holds one chunk's events at a time, never all of them.
        """
        yield from self._from_log()
        rest = self._from_upper() + self._from_outside()
        if rest:
            yield rest

    def _from_log(self) -> Iterator[list[UnprovenCompile]]:
        """The seal lines the log gained since the last poll, a batch per chunk read from where the last read stopped.

        Constant memory whatever the log's size (:mod:`bless.system.log_follow`); complete lines only (a line
        being written is read next time). A log truncated or rewritten before everything was read may have lost
        a seal line: that is itself an event (fail closed), and the log is read again from its start.
        """
        if self._log is None:
            self._log = self.runtime.follow_log(self.started)
        while True:
            chunk = self._log.read()
            found: list[UnprovenCompile] = []
            if chunk.lost is not None:
                found.append(
                    UnprovenCompile(
                        source="watcher",
                        time=self.now(),
                        reason=f"{chunk.lost}: a seal line written before it may have been lost",
                    )
                )
            found += parse_seal_lines(chunk.data.decode("utf-8", "replace"), now=self.now)
            if found:
                yield found
            if not chunk.more:
                return

    def close(self) -> None:
        """Let go of the log (an open file of the local runtime)."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def _from_upper(self) -> list[UnprovenCompile]:
        entries = [e for e in self.runtime.upper_entries(self.started) if e.path not in self._seen_upper]
        if not entries:
            return []
        self._seen_upper.update(e.path for e in entries)
        verdict = self.adapter.classify_upper(entries)
        # What a trial would fail on, serving reports: new compiled artifacts, and writes the adapter's rules do
        # not expect (a rewritten compiled file, a deletion), which are no proven load either.
        return [
            UnprovenCompile(source="watcher", time=self.now(), path=path, reason=reason)
            for paths, reason in (
                (verdict.new_artifacts, "a new compiled artifact in the cache's writable layer"),
                (verdict.unexpected, "a write the blessing's rules do not expect in the cache's writable layer"),
            )
            for path in paths
        ]

    def _from_outside(self) -> list[UnprovenCompile]:
        # Every writable place outside the tree: the private HOME and temp dir, the container's filesystem,
        # and the engine's /dev/shm. After the first look, what a start may write (Inductor's scratch, bytecode,
        # shared-memory segments) is a compile nobody proved: the adapter judges it with ``serving``.
        listed = self.session.outside_so_far() + self.runtime.shm_entries(self.started)
        fresh: list[OutsideEntry] = [e for e in listed if e.shown not in self._seen_outside]
        serving = self._outside_baseline
        found: list[UnprovenCompile] = []
        for entry in fresh:
            self._seen_outside.add(entry.shown)
            verdict = self.adapter.classify_outside([entry], serving=serving)
            if verdict.compiled:
                reason = verdict.compiled[0].split(": ", 1)[-1]
                found.append(UnprovenCompile(source="watcher", time=self.now(), path=entry.shown, reason=reason))
        self._outside_baseline = True
        return found


@dataclass
class Seal:
    """The policy of one serve applied to each unproven compile (the module docstring says how).

    Each distinct compile (:func:`~bless.core.unproven_evidence.event_identity`: a kernel's cache key, a path) is
    reported, listed and appended once; a repeat is only counted (``repeats``). The evidence file is appended to,
    never rewritten, and bounded (:mod:`bless.core.unproven_evidence`): past its bound one marker line says the
    list is incomplete and later compiles are only counted (``dropped``). The readiness record lists the first
    :data:`~bless.flows.serve.ready.RECORD_EVENTS_MAX` events and the count, and is rewritten only when the
    count changes.
    """

    store: Store
    name: str
    serve_dir: Path
    policy: UnprovenCompilePolicy
    events: EventSink
    #: Set under ``stop``: the serve's own stop event, so the foreground loop ends gracefully.
    stop: threading.Event
    #: The blessing served: every event of the evidence file names it (the next ``bless run`` reads them by it).
    config_hash: str = ""
    #: The distinct compiles recorded, in the order seen.
    seen: list[UnprovenCompile] = field(default_factory=list)
    #: Events of a compile already recorded (the same kernel missed again).
    repeats: int = 0
    #: Compiles not listed before, met once the evidence file was full (counted each time, never listed).
    dropped: int = 0
    _identities: set[str] = field(default_factory=set)
    _size: int | None = None
    _full: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stop_requested(self) -> bool:
        return self.policy == "stop" and bool(self.seen or self.dropped)

    @property
    def evidence_file(self) -> Path:
        return StorePaths.unproven_compiles(self.serve_dir)

    def __call__(self, found: Sequence[UnprovenCompile]) -> None:
        """Record, report and act on newly found events (thread-safe)."""
        if not found:
            return
        with self._lock:
            new, lines, filled = self._admit(found)
            if lines:
                self._append(lines)
            listed = [self._listed(event) for event in self.seen[:RECORD_EVENTS_MAX]]
            count, full = len(self.seen), self._full
        for event in new:
            self.events(
                Event(
                    "warning",
                    f"UNPROVEN COMPILE ({self.policy}): {event.describe()}; {_consequence(self.policy)}",
                    {"unproven_compile": event.to_dict(), "policy": self.policy},
                )
            )
        if filled:
            self.events(
                Event(
                    "warning",
                    f"UNPROVEN COMPILE ({self.policy}): {self.evidence_file} is full ({count} distinct compiles "
                    "listed); later ones are counted, not listed, and the next bless run reads the list as incomplete",
                )
            )
        if new or filled:
            self._update_readiness(listed, count, full)
        if self.policy == "stop":
            self.stop.set()

    def _listed(self, event: UnprovenCompile) -> dict[str, Any]:
        return {**event.to_dict(), "config_hash": self.config_hash}

    def _admit(self, found: Sequence[UnprovenCompile]) -> tuple[list[UnprovenCompile], list[bytes], bool]:
        """The events not seen before, their lines (those that fit), and whether the file just became full."""
        if self._size is None:
            try:
                self._size = self.evidence_file.stat().st_size
            except OSError:
                self._size = 0
        new: list[UnprovenCompile] = []
        lines: list[bytes] = []
        filled = False
        size = self._size
        for event in found:
            identity = evidence.event_identity(event.to_dict())
            if identity in self._identities:
                self.repeats += 1
                continue
            if self._full:
                self.dropped += 1
                continue
            line = evidence.evidence_line(self._listed(event))
            if not evidence.fits(size, line):
                self._full = filled = True
                self.dropped += 1
                lines.append(
                    evidence.full_line(config_hash=self.config_hash, time=time.time(), recorded=len(self.seen))
                )
                continue
            self._identities.add(identity)
            self.seen.append(event)
            new.append(event)
            lines.append(line)
            size += len(line)
        return new, lines, filled

    def _append(self, lines: Sequence[bytes]) -> None:
        """Append the lines in one write, made durable; a failed write is cut back, never left half a line."""
        data = b"".join(lines)
        before = self._size or 0
        try:
            fd = os.open(
                self.evidence_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            self.events(Event("warning", f"could not write {self.evidence_file}: {exc}"))
            return
        try:
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(f"wrote {written} of {len(data)} bytes")
                os.fsync(fd)
                self._size = before + len(data)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, before)
                self.events(Event("warning", f"could not write {self.evidence_file}: {exc}"))
        finally:
            os.close(fd)

    def _update_readiness(self, listed: Sequence[Mapping[str, Any]], count: int, full: bool) -> None:
        try:
            record_unproven(self.store, self.name, listed, count=count, full=full)
        except (OSError, ValueError, BlessError) as exc:
            if self.policy == "refuse":
                # Fail closed: a record that cannot say "refused" must not say "ready".
                clear_ready(self.store, self.name)
                self.events(Event("warning", f"could not update the readiness record ({exc}): removed it"))
            else:
                self.events(Event("warning", f"could not list the unproven compile in the readiness record: {exc}"))


def _consequence(policy: UnprovenCompilePolicy) -> str:
    return {
        "refuse": "readiness now fails (serve-full ready exits 46); the engine keeps answering",
        "record": "recorded only (unproven_compile = record)",
        "stop": "stopping the engine gracefully (unproven_compile = stop)",
    }[policy]


def unproven_compile_error(seal: Seal) -> UnprovenCompileError:
    """Why a ``stop`` serve ended (48), naming what was compiled and where the evidence is."""
    shown = "; ".join(event.describe() for event in seal.seen[:_MAX_IN_MESSAGE])
    more = f" (and {len(seal.seen) - _MAX_IN_MESSAGE} more)" if len(seal.seen) > _MAX_IN_MESSAGE else ""
    return UnprovenCompileError(
        f"the engine compiled what the blessing does not hold while serving, and was stopped "
        f"(unproven_compile = stop): {shown}{more}",
        hint=f"the events are in {seal.evidence_file}; bless the shapes the traffic reaches (rebless with "
        "coverage), then serve again",
        details={
            "unproven_compile": [event.to_dict() for event in seal.seen[:RECORD_EVENTS_MAX]],
            "count": len(seal.seen),
            "serve_dir": str(seal.serve_dir),
            "evidence_file": str(seal.evidence_file),
        },
        remedy="rebless_unproven_stopped",
    )


@contextmanager
def watching(
    watcher: SealWatcher, seal: Seal, *, poll_s: float = POLL_S, heartbeat: Callable[[], object] | None = None
) -> Iterator[None]:
    """Poll ``watcher`` in a thread for the ``with`` body, handing what it finds to ``seal``; a last poll at the end.

    ``heartbeat``: called after every poll, by the polling thread itself (a detached serve's watcher renews its
    heartbeat, :func:`~bless.flows.serve.ready.renew_heartbeat`): a frozen or hung poll stops renewing it, and
    readiness then fails. A heartbeat that cannot be renewed is said once; it never ends the thread.

    A poll that fails (the runtime lost the engine, a file vanished mid-walk) is reported once and retried:
    the body (following the log) notices an engine that is gone. Failing :data:`BLIND_POLLS` times in a row,
    the watcher cannot judge what the engine compiles: that is itself an event (fail closed: under
    ``refuse`` readiness fails), and no error ever ends the thread silently.
    """
    done = threading.Event()
    failures: list[str] = []
    in_a_row = [0]

    def poll_once() -> None:
        try:
            if isinstance(watcher, SealWatcher):
                for batch in watcher.batches():
                    seal(batch)
            else:
                seal(watcher.poll())
            in_a_row[0] = 0
        except Exception as exc:
            if not failures:
                seal.events(Event("warning", f"sealed serving: the watcher could not look ({exc}); retrying"))
            failures.append(str(exc))
            in_a_row[0] += 1
            if in_a_row[0] == BLIND_POLLS:
                reason = f"the watcher failed {BLIND_POLLS} polls in a row and cannot judge the engine: {exc}"
                seal([UnprovenCompile(source="watcher", time=time.time(), reason=reason)])

    heartbeat_failed: list[str] = []

    def beat() -> None:
        if heartbeat is None:
            return
        try:
            heartbeat()
        except Exception as exc:
            if not heartbeat_failed:
                seal.events(Event("warning", f"sealed serving: could not renew the watcher's heartbeat ({exc})"))
            heartbeat_failed.append(str(exc))

    def loop() -> None:
        while not done.is_set():
            poll_once()
            beat()
            if done.wait(poll_s):
                break

    thread = threading.Thread(target=loop, name="bless-seal-watcher", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        poll_once()
        if isinstance(watcher, SealWatcher):
            watcher.close()

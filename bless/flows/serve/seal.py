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
event: every event is reported to the event sink at once, listed in the readiness record (``serve-full
ready NAME --json``) and appended to ``unproven-compiles.jsonl`` in the serve dir; ``refuse`` makes the
readiness probe fail (46) while the engine keeps answering, ``record`` only records, ``stop`` ends serving
gracefully (serve-full then exits 48, :class:`~bless.errors.UnprovenCompileError`).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core.json_form import JsonForm, as_json
from bless.core.profile import UnprovenCompilePolicy
from bless.engines.base import EngineAdapter
from bless.errors import BlessError, UnprovenCompileError
from bless.evidence_types import OutsideEntry
from bless.flows.engine_start import EngineSession
from bless.flows.events import Event, EventSink
from bless.flows.serve.ready import clear_ready, record_unproven
from bless.runtime.base import Runtime, Started
from bless.store import Store
from bless.store.layout import StorePaths
from bless.system.durable import atomic_write_bytes

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
    _log_offset: int = 0
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
        return self._from_log() + self._from_upper() + self._from_outside()

    def _from_log(self) -> list[UnprovenCompile]:
        text = self.runtime.logs(self.started)
        if len(text) < self._log_offset:
            self._log_offset = 0  # a shorter log (rotated): read it again rather than miss a line
        end = text.rfind("\n") + 1  # complete lines only: a line being written is read next time
        if end <= self._log_offset:
            return []
        chunk = text[self._log_offset : end]
        self._log_offset = end
        return parse_seal_lines(chunk, now=self.now)

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
    """The policy of one serve applied to each unproven compile (the module docstring says how)."""

    store: Store
    name: str
    serve_dir: Path
    policy: UnprovenCompilePolicy
    events: EventSink
    #: Set under ``stop``: the serve's own stop event, so the foreground loop ends gracefully.
    stop: threading.Event
    #: The blessing served: every event of the evidence file names it (the next ``bless run`` reads them by it).
    config_hash: str = ""
    seen: list[UnprovenCompile] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stop_requested(self) -> bool:
        return self.policy == "stop" and bool(self.seen)

    @property
    def evidence_file(self) -> Path:
        return StorePaths.unproven_compiles(self.serve_dir)

    def __call__(self, found: Sequence[UnprovenCompile]) -> None:
        """Record, report and act on newly found events (thread-safe)."""
        if not found:
            return
        with self._lock:
            self.seen.extend(found)
            listed = [{**event.to_dict(), "config_hash": self.config_hash} for event in self.seen]
        for event in found:
            self.events(
                Event(
                    "warning",
                    f"UNPROVEN COMPILE ({self.policy}): {event.describe()}; {_consequence(self.policy)}",
                    {"unproven_compile": event.to_dict(), "policy": self.policy},
                )
            )
        self._write_evidence(listed)
        self._update_readiness(listed)
        if self.policy == "stop":
            self.stop.set()

    def _write_evidence(self, listed: Sequence[Mapping[str, Any]]) -> None:
        data = "".join(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n" for event in listed)
        try:
            atomic_write_bytes(self.evidence_file, data.encode())
        except OSError as exc:
            self.events(Event("warning", f"could not write {self.evidence_file}: {exc}"))

    def _update_readiness(self, listed: Sequence[Mapping[str, Any]]) -> None:
        try:
            record_unproven(self.store, self.name, listed)
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
            "unproven_compile": [event.to_dict() for event in seal.seen],
            "serve_dir": str(seal.serve_dir),
            "evidence_file": str(seal.evidence_file),
        },
        remedy="rebless_unproven_stopped",
    )


@contextmanager
def watching(watcher: SealWatcher, seal: Seal, *, poll_s: float = POLL_S) -> Iterator[None]:
    """Poll ``watcher`` in a thread for the ``with`` body, handing what it finds to ``seal``; a last poll at the end.

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

    def loop() -> None:
        while not done.is_set():
            poll_once()
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

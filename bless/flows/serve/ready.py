"""The readiness record: proof, for a probe, that a canary-checked engine serves a profile.

Kubernetes sends traffic to a pod once its readiness probe succeeds. For serve-full that must mean
"the blessing was verified, the engine is up, and it reproduced the golden outputs", never only
"the port answers". So serve-full writes ``<root>/ready/<name>.json`` once the canary passed (or was
skipped with ``--no-canary``, said in the record) and removes it when serving ends; ``serve-full
ready NAME`` (the exec probe) succeeds only while that record exists, the process that keeps serving
is alive, and the engine still answers. A record left behind by a serve-full that was killed is
detected by its process identity (pid and start time), never trusted; a detached Docker serve's
container is looked up by its id through the runtime. Unknown is not alive: a holder this probe cannot
judge (malformed, on another host, without a start time, Docker unreachable) is a refusal, never ready.

Sealed serving (:mod:`.seal`) lists every unproven compile in the record as it is seen; under the
policy ``refuse`` one is enough for the probe to fail (the engine keeps answering what it was sent).
A detached serve is watched by a process of its own (:mod:`.detached`): its record names that watcher
(``watcher``), and the probe fails while the watcher has not started yet or is gone (the engine would
serve unsealed). Alive is not enough: a frozen watcher (SIGSTOP, a hung poll) sees nothing. The watcher
names itself in ``ready/<name>.heartbeat`` too and renews that file's time after every poll; the probe
fails once it is older than :data:`HEARTBEAT_STALE_S`, or when it names another process than the record
(those checks: :mod:`.ready_seal`).

Every record says who seals it: ``watcher`` is a required key. A record that says no watcher is expected
(``null``: serve-full watches in the foreground) while its holder is a detached engine (a container, or the
process a handed-over serving lease names) is refused: no edit of the record turns the seal off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.container_labels import PHASE, PHASE_SERVE, PROFILE, other_store_root
from bless.core.untrusted_text import shown
from bless.errors import BlessError, EngineHttpError, NotServingError
from bless.flows.serve.ready_seal import HEARTBEAT_STALE_S, refuse_detached_without_watcher, refuse_unsealed
from bless.replay.devices import GpuRank
from bless.replay.engine_client import EngineClient
from bless.runtime.base import Runtime
from bless.store import Store
from bless.system.clock import utc_now
from bless.system.durable import atomic_write_bytes
from bless.system.json_files import UnreadableJsonError, load_json_object
from bless.system.procid import process_alive

__all__ = [
    "HEARTBEAT_STALE_S",
    "RECORD_EVENTS_MAX",
    "ReadyRecord",
    "check_ready",
    "clear_ready",
    "mark_ready",
    "record_unproven",
    "record_watcher",
    "renew_heartbeat",
]

#: What a detached Docker holder's container id may be (Docker's are 64 hex digits; fakes use names).
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

#: What a record's host may be: an IPv4/IPv6 address or a DNS name (no space, newline or URL syntax).
_HOST = re.compile(r"[A-Za-z0-9.:-]{1,253}")


def _short(text: str) -> str:
    return text if len(text) < 200 else text[:200] + "..."


#: Seconds a probe waits for the engine's answer: a probe runs every few seconds and must not pile up.
PROBE_TIMEOUT_S = 3.0
#: The unproven compiles the record lists (the first ones; ``count`` says how many there are, and the serve dir's
#: ``unproven-compiles.jsonl`` lists them all): the record stays small however many the engine meets.
RECORD_EVENTS_MAX = 20


@dataclass(frozen=True)
class ReadyRecord:
    """One serve's readiness: what is served, where the engine answers, and who keeps it serving."""

    name: str
    config_hash: str
    host: str
    port: int
    canary: str  # "passed" or "skipped"
    holder: Mapping[str, Any]  # process identity of serve-full (foreground) or of a detached local engine
    since: str
    #: What serve-full does about a compile the blessing does not hold: refuse, record or stop.
    unproven_policy: str = "refuse"
    #: The first unproven compiles seen while serving (:meth:`bless.flows.serve.seal.UnprovenCompile.to_dict`).
    unproven: tuple[Mapping[str, Any], ...] = ()
    #: How many distinct unproven compiles were seen (at least ``len(unproven)``).
    unproven_count: int = 0
    #: Whether the serve's evidence file is full (more were met than it lists).
    unproven_full: bool = False
    #: The seal watcher of a detached serve (:func:`~bless.system.procid.process_identity`); ``{}`` while it has not
    #: started yet; None where serve-full itself watches (foreground) or nothing is sealed (``--debug``).
    watcher: Mapping[str, Any] | None = None
    #: The GPUs the engine runs on, rank 0 first (empty on a CPU profile, and in a record written before ranks were).
    ranks: tuple[GpuRank, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): a file format (read back by from_dict), the policy and the events nested as one key.
        return {
            "name": self.name,
            "config_hash": self.config_hash,
            "host": self.host,
            "port": self.port,
            "canary": self.canary,
            "holder": dict(self.holder),
            "since": self.since,
            "unproven_compile": {
                "policy": self.unproven_policy,
                "count": self.seen_count,
                "events": [dict(event) for event in self.unproven],
                "evidence_full": self.unproven_full,
            },
            "watcher": dict(self.watcher) if self.watcher is not None else None,
            "ranks": [rank.to_dict() for rank in self.ranks],
        }

    @property
    def seen_count(self) -> int:
        """How many distinct unproven compiles the serve met."""
        return max(self.unproven_count, len(self.unproven))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadyRecord:
        """Read a record back; a malformed one is a ValueError (the caller refuses it)."""
        try:
            record = cls(
                name=str(data["name"]),
                config_hash=str(data["config_hash"]),
                host=str(data["host"]),
                port=int(data["port"]),
                canary=str(data["canary"]),
                holder=dict(data["holder"]),
                since=str(data["since"]),
                **_unproven_from(data.get("unproven_compile")),
                watcher=_watcher_from(data["watcher"]),
                ranks=tuple(GpuRank.from_dict(rank) for rank in data.get("ranks") or ()),
            )
        except KeyError as exc:
            raise ValueError(f"malformed readiness record: no {_short(str(exc))} field") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"malformed readiness record: {_short(str(exc))}") from None
        if record.canary not in ("passed", "skipped") or not 0 < record.port < 65536:
            raise ValueError("malformed readiness record: canary or port out of range")
        if record.unproven_policy not in ("refuse", "record", "stop"):
            raise ValueError(f"malformed readiness record: unproven_compile policy {record.unproven_policy!r}")
        if not _HOST.fullmatch(record.host):
            host = shown(record.host[:100])
            raise ValueError(f"malformed readiness record: host {host} is not a host name or address")
        return record


def _unproven_from(section: Any) -> dict[str, Any]:
    """The ``unproven_compile`` section read back (a record without one: policy refuse, none seen)."""
    if section is None:
        return {}
    if not isinstance(section, Mapping) or not isinstance(section.get("events"), list):
        raise ValueError("unproven_compile is not an object with an events list")
    events = tuple(dict(event) for event in section["events"])
    count = section.get("count", len(events))
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("unproven_compile count is not a count")
    return {
        "unproven_policy": str(section.get("policy")),
        "unproven": events,
        "unproven_count": count,
        "unproven_full": section.get("evidence_full") is True,
    }


def _watcher_from(section: Any) -> dict[str, Any] | None:
    """The ``watcher`` read back: None (no watcher expected) or an object (``{}``: not started yet)."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError("watcher is not an object")
    return dict(section)


def mark_ready(
    store: Store,
    *,
    name: str,
    config_hash: str,
    host: str,
    port: int,
    canary: str,
    holder: Mapping[str, Any],
    unproven_policy: str = "refuse",
    watcher: Mapping[str, Any] | None = None,
    ranks: Sequence[GpuRank] = (),
) -> ReadyRecord:
    """Write the record (atomically) once the canary passed.

    ``watcher``: ``{}`` for a detached serve whose seal watcher is about to start (the probe fails until the
    watcher records itself, :func:`record_watcher`); None where serve-full watches itself or nothing is sealed.

    ``holder``: what keeps serving, as :func:`~bless.store.process_identity` records a process (serve-full
    in the foreground, a detached local engine), or ``{"container", "name"}`` for a detached Docker
    container, which the probe looks up by id (:func:`check_ready`'s ``docker``). ``ranks``: the GPUs the engine
    runs on, rank 0 first (the plan's device binding).
    """
    record = ReadyRecord(
        name=name,
        config_hash=config_hash,
        host=host,
        port=port,
        canary=canary,
        holder=holder,
        since=utc_now(),
        unproven_policy=unproven_policy,
        watcher=watcher,
        ranks=tuple(ranks),
    )
    path = store.paths.ready_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        store.paths.ready_heartbeat(name).unlink()  # an earlier serve's watcher never vouches for this one
    _write(path, record)
    return record


def _write(path: Path, record: ReadyRecord) -> None:
    atomic_write_bytes(path, (json.dumps(record.to_dict(), indent=2) + "\n").encode())


def record_unproven(
    store: Store, name: str, events: Sequence[Mapping[str, Any]], *, count: int | None = None, full: bool = False
) -> ReadyRecord | None:
    """Rewrite the record (atomically) listing the first ``events``, and ``count`` in all; None without a record.

    At most :data:`RECORD_EVENTS_MAX` events are listed (``count`` defaults to how many were given); ``full``:
    the serve's evidence file is full.

    Never makes a record: one that is gone was cleared because serving ends. Raises OSError (and
    ValueError for a record that is not one) for the caller to report.
    """
    path = store.paths.ready_file(name)
    data = load_json_object(path)
    if data is None:
        return None
    listed = tuple(dict(event) for event in events[:RECORD_EVENTS_MAX])
    record = dataclasses.replace(
        ReadyRecord.from_dict(data),
        unproven=listed,
        unproven_count=len(events) if count is None else count,
        unproven_full=full,
    )
    _write(path, record)
    return record


def record_watcher(store: Store, name: str, identity: Mapping[str, Any]) -> ReadyRecord | None:
    """Rewrite the record (atomically) naming the detached serve's seal watcher; None when there is no record.

    Called by the watcher itself before it looks for the first time, so it is the record's only writer from
    then on. Its heartbeat (``ready/<name>.heartbeat``, naming it) is written first: :func:`renew_heartbeat`
    keeps it fresh. Raises OSError (and ValueError for a record that is not one) for the caller to report.
    """
    path = store.paths.ready_file(name)
    data = load_json_object(path)
    if data is None:
        return None
    record = dataclasses.replace(ReadyRecord.from_dict(data), watcher=dict(identity))
    atomic_write_bytes(store.paths.ready_heartbeat(name), (json.dumps(dict(identity), sort_keys=True) + "\n").encode())
    _write(path, record)
    return record


def renew_heartbeat(store: Store, name: str) -> bool:
    """Renew the seal watcher's heartbeat (its file's time: no write, no fsync); False when it is gone.

    Raises OSError (other than its absence) for the caller to report.
    """
    try:
        os.utime(store.paths.ready_heartbeat(name))
    except FileNotFoundError:
        return False
    return True


def clear_ready(store: Store, name: str) -> None:
    """Remove the record (no traffic from here on); nothing to remove is fine.

    Best effort: a record that cannot be removed is stale as soon as its holder ends (the probe checks it).
    """
    with contextlib.suppress(OSError):
        store.paths.ready_file(name).unlink()
    with contextlib.suppress(OSError):
        store.paths.ready_heartbeat(name).unlink()


def check_ready(
    store: Store,
    name: str,
    *,
    accept_skipped_canary: bool = False,
    client_for: Callable[[str, int], EngineClient] | None = None,
    docker: Callable[[], Runtime] | None = None,
) -> ReadyRecord:
    """The record of ``name`` if a canary-checked engine serves it now; else NotServingError (46).

    Ready means: the record exists and is well formed, its canary passed (a skipped one only with
    ``accept_skipped_canary``), the process that keeps serving is alive (a process identity on this
    host with its start time, or a Docker container found running by its id through ``docker``; without
    ``docker`` a container holder cannot be judged and is refused), the engine answers its model listing
    within :data:`PROBE_TIMEOUT_S`, and a detached serve's seal watcher runs.
    """
    path = store.paths.ready_file(name)
    stale_hint = "remove it; the serve writes a new one after its next canary"

    def refusal(reason: str, message: str, hint: str, remedy: str | None = None) -> NotServingError:
        return NotServingError(f"{name}: {message}", hint=hint, details={"name": name, "reason": reason}, remedy=remedy)

    try:
        data = load_json_object(path)
    except UnreadableJsonError as exc:
        raise refusal(
            "unreadable", f"the readiness record {path} is unreadable ({exc})", stale_hint, "stale_ready_record"
        ) from None
    if data is None:
        _refuse_other_root(name, store, docker)
        raise refusal(
            "no_record",
            f"no readiness record ({path}): serve-full is not serving this profile yet, or has stopped",
            "wait for serve-full to finish its start (verify, ready, canary); its log says where it is",
        )
    try:
        record = ReadyRecord.from_dict(data)
    except ValueError as exc:
        raise refusal("unreadable", f"{exc} ({path})", stale_hint, "stale_ready_record") from None
    if record.canary != "passed" and not accept_skipped_canary:
        raise refusal(
            "canary_skipped",
            "serving, but the canary was skipped (--no-canary): not a proven engine",
            "serve with the canary, or accept a skipped canary explicitly (accept_skipped_canary)",
            "accept_skipped_canary",
        )
    if record.seen_count and record.unproven_policy == "refuse":
        first = record.unproven[0] if record.unproven else {}
        what = first.get("kernel") or first.get("path") or first.get("file") or "?"
        raise NotServingError(
            f"{name}: the engine compiled {record.seen_count} kernel(s) or file(s) the blessing does not hold "
            f"while serving (first: {what}, seen by {first.get('source')}); it keeps answering what it was sent, "
            "but takes no new traffic (unproven_compile = refuse)",
            hint="bless what it met: the serve dir's unproven-compiles.jsonl lists the events; re-bless (rebless) "
            "with coverage of those shapes, then restart the serve (or serve with unproven_compile = record)",
            remedy="rebless_unproven_refused",
            details={
                "name": name,
                "reason": "unproven_compile",
                "unproven_compile": record.to_dict()["unproven_compile"],
            },
        )
    _refuse_unless_holder_alive(name, record.holder, docker)
    client = (client_for or _client)(record.host, record.port)
    try:
        client.models()
    except EngineHttpError as exc:
        raise refusal(
            "engine_silent",
            f"the engine does not answer at {record.host}:{record.port}: {exc.message}",
            "read serve-full's log: the engine may be stopping or stuck",
        ) from None
    if record.watcher is not None:
        refuse_unsealed(store, name, record.watcher)
    elif record.canary == "passed":  # a blessed, canary-checked serve (a --debug start is neither, nor sealed)
        refuse_detached_without_watcher(store, name, record.holder)
    return record


def _refuse_other_root(name: str, store: Store, docker: Callable[[], Runtime] | None) -> None:
    """NotServingError (46) naming the store root whose running container serves ``name``, when not this one.

    Without a record here, a serve of this profile from another root (its record, lease and serve dir live
    there) is what ``serve-full stop`` names in the same situation; the probe names it too. Best effort: no
    Docker, no such container, or Docker unreachable leaves the plain "no readiness record" refusal.
    """
    if docker is None:
        return
    try:
        found = docker().list_ours({PROFILE: name, PHASE: PHASE_SERVE})
    except BlessError:
        return
    for info in found:
        owner_root = other_store_root(info.labels, store.root)
        if owner_root is not None and info.status == "running":
            raise NotServingError(
                f"{name}: no readiness record under {store.root}: container {shown(info.name)} serves this profile "
                f"for another store root, {shown(owner_root)}",
                hint=f"probe it from its own root (root {owner_root})",
                details={"name": name, "reason": "other_root", "store_root": owner_root, "profile_name": name},
                remedy="ready_from_own_root",
            )


def _holder_refusal(name: str, reason: str, message: str, hint: str) -> NotServingError:
    return NotServingError(f"{name}: {message}", hint=hint, details={"name": name, "reason": reason})


def _refuse_unless_holder_alive(name: str, holder: Mapping[str, Any], docker: Callable[[], Runtime] | None) -> None:
    """NotServingError (46) unless what keeps serving is known to run now: unknown is not alive."""
    if "container" in holder:
        _refuse_unless_container_runs(name, holder, docker)
        return
    stale = "the record is not one serve-full writes: remove it; serve-full writes a new one after its next canary"
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        what = "names no holder" if not holder else f"names pid {shown(repr(pid)[:40])}, not a process id"
        raise _holder_refusal(name, "holder_malformed", f"the readiness record {what}: cannot tell who serves", stale)
    host = holder.get("host")
    if not isinstance(host, str):
        raise _holder_refusal(
            name, "holder_malformed", f"the readiness record's holder (pid {pid}) names no host", stale
        )
    start = holder.get("proc_start")
    if not isinstance(start, int) or isinstance(start, bool):
        raise _holder_refusal(
            name,
            "holder_malformed",
            f"the readiness record's holder (pid {pid}) has no process start time, so a recycled pid could not "
            "be told from it",
            stale,
        )
    alive = process_alive(holder)
    if alive is None:
        raise _holder_refusal(
            name,
            "holder_elsewhere",
            f"the process that serves it (pid {pid}) runs on host {shown(host[:100])}, where this probe cannot see it",
            "run serve-full ready on the host (or in the container) that serves",
        )
    if not alive:
        raise _holder_refusal(
            name,
            "holder_gone",
            f"the process that served it (pid {pid}) is gone; the record is stale",
            "start serve-full again",
        )


def _refuse_unless_container_runs(name: str, holder: Mapping[str, Any], docker: Callable[[], Runtime] | None) -> None:
    """NotServingError (46) unless the detached serve's container is found running by its id."""
    container = holder.get("container")
    if not isinstance(container, str) or not _CONTAINER_ID.fullmatch(container):
        raise _holder_refusal(
            name,
            "holder_malformed",
            f"the readiness record names container {shown(repr(container)[:80])}, not a container id",
            "the record is not one serve-full writes: remove it; serve-full writes a new one after its next canary",
        )
    if docker is None:
        raise _holder_refusal(
            name,
            "holder_unknown",
            f"the serve is a Docker container ({container[:12]}) and no Docker runtime was given to look it up",
            "this is a bug in the caller: serve-full ready looks containers up through Docker",
        )
    try:
        found = docker().list_ours({PROFILE: name, PHASE: PHASE_SERVE})
    except BlessError as exc:
        raise _holder_refusal(
            name,
            "holder_unknown",
            f"cannot tell whether its container {container[:12]} runs: {exc.message}",
            "run serve-full ready where the Docker Engine that serves is reachable",
        ) from None
    status = next((info.status for info in found if info.id == container), None)
    if status != "running":
        what = "is gone" if status is None else f"is {shown(status[:40])}, not running"
        raise _holder_refusal(
            name,
            "holder_gone",
            f"the container that served it ({container[:12]}) {what}; whatever answers on the port is not it",
            "start serve-full --detach again (serve-full stop NAME first removes what is left)",
        )


def _client(host: str, port: int) -> EngineClient:
    return EngineClient(host, port, timeout_s=PROBE_TIMEOUT_S)

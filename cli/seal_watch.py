"""The seal watcher of a detached serve, as a process: ``python -m bless.cli.seal_watch DOC``.

``serve-full --detach`` starts it (:func:`bless.flows.serve.detached.start_watcher`) in its own session,
stdin closed, stdout and stderr in ``seal-watcher.log`` in the serve dir; nobody types this. It rebuilds
the runtime, the adapter and the store from the watch document ``DOC`` and runs
:func:`bless.flows.serve.detached.run_watcher` until the engine is gone (exit 0) or SIGTERM/SIGINT/SIGHUP
(``serve-full stop``; exit 0); under ``unproven_compile = stop`` it ends the serve and exits 48. A
refusal exits with its own code, its reason in the log.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from bless.cli import boundary
from bless.cli.boundary import Report
from bless.engines import get_adapter
from bless.errors import UsageError
from bless.flows.events import Event
from bless.flows.serve import detached
from bless.runtime import get_runtime
from bless.runtime.base import Runtime
from bless.runtime.local import LocalRuntime
from bless.store import Store


def _log(event: Event) -> None:
    """One line per event, with the time: raw text (messages carry engine log text, never markup)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write(f"{stamp} {event.kind}: {event.message}\n")
    sys.stderr.flush()


def _runtime(doc: detached.WatchDoc) -> Runtime:
    if doc.runtime_kind == "local":
        return LocalRuntime(use_mount_namespace=doc.local_mount_namespace)
    return get_runtime("docker")


def _render(console: Console, data: Mapping[str, Any]) -> None:
    console.print(f"seal watcher ended ({data['ended_by']}); {len(data['unproven_compile'])} unproven compile(s)")
    stop = data.get("stop")
    if stop is not None:
        console.print(f"the serve was ended: stopped {', '.join(stop['stopped']) or 'nothing'}")
        for note in stop["notes"]:
            console.print(f"note: {note}")


def _watch(doc_path: Path, done: threading.Event) -> Report:
    doc = detached.load_watch_doc(doc_path)
    runtime = _runtime(doc)
    outcome = detached.run_watcher(
        doc,
        runtime=runtime,
        adapter=get_adapter(doc.engine).for_factors(doc.factors),
        store=Store(doc.store_root, doc.manifests_dir),
        done=done,
        docker=(lambda: runtime) if doc.runtime_kind == "docker" else partial(get_runtime, "docker"),
        events=_log,
    )
    return Report(outcome.to_dict(), _render, failure=outcome.failure)


def main(argv: list[str] | None = None) -> None:
    """Entry point (``python -m bless.cli.seal_watch DOC``); exits with the watcher's code."""
    args = sys.argv[1:] if argv is None else argv
    done = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handle)

    def body() -> Report:
        if len(args) != 1:
            raise UsageError("usage: python -m bless.cli.seal_watch SEAL_WATCH_JSON (serve-full --detach starts it)")
        return _watch(Path(args[0]), done)

    sys.exit(boundary.execute(body, json_output=False, verbose=True, termination_log=False))


if __name__ == "__main__":
    main()

"""The engine containers of one run: their names and labels, the sessions that start them, the engine
time they spend and the logs they leave; and the removal of a crashed run's leftover containers.

Both halves rest on the same labels: every container a run starts carries its run id, phase and the
identity of the bless process that made it, which is how a later run tells a crashed run's leftovers
from the containers of a run that is still going.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path

from bless import container_labels as labels
from bless.core.coverage import CoveragePlan
from bless.core.factors import ResolvedConfig
from bless.engines.base import EngineAdapter
from bless.flows.engine_start import EngineSession, engine_spec
from bless.replay.devices import GpuSlot
from bless.replay.trials import CoherenceReport
from bless.runtime.base import ContainerInfo, Mount, Runtime
from bless.system.durable import atomic_write_bytes
from bless.system.os_refusals import os_errors
from bless.system.procid import process_alive, process_identity


class RunContainers:
    """Makes the engine sessions of one run (bootstrap and trials) and adds up their engine time."""

    def __init__(
        self,
        resolved: ResolvedConfig,
        *,
        adapter: EngineAdapter,
        runtime: Runtime,
        run_id: str,
        image: str | None,
        store_root: Path,
    ):
        """``adapter`` is already specialized for the run's factors; ``image`` is the resolved image id;
        ``store_root`` the store the run blesses into: its tag is in every name, its identity in every label."""
        self.resolved = resolved
        self.store_root = store_root
        self.store_tag = labels.store_tag(store_root)
        self.profile = resolved.profile
        self.adapter = adapter
        self.runtime = runtime
        self.run_id = run_id
        self.image = image
        #: The coverage requests every start of this run sends after its protocol (None: coverage off).
        self.coverage: CoveragePlan | None = None
        #: Start-to-ready, request and stop seconds of every engine, summed (parallel trials overlap).
        self.engine_seconds = 0.0
        self._engine_seconds_lock = threading.Lock()  # parallel trials finish on their own threads
        identity = process_identity()
        self._owner_process = json.dumps(
            {key: identity[key] for key in ("host", "pid", "proc_start")}, sort_keys=True, separators=(",", ":")
        )

    def session(
        self, phase: str, name: str, mount: Mount, candidate: int, log_path: Path, slot: GpuSlot, private_dir: Path
    ) -> EngineSession:
        """One engine start of ``phase`` (bootstrap or trial) on ``slot``'s GPUs, labeled as this run's.

        ``private_dir`` receives the start's fresh HOME and temp dir (what the engine leaves there is judged).
        """
        settings = self.profile.trials
        spec = engine_spec(
            self.resolved,
            self.adapter,
            self.runtime,
            name=name,
            labels={
                **labels.labels_for(
                    run_id=self.run_id,
                    phase=phase,
                    config_hash=self.resolved.config_hash,
                    profile=self.profile.name,
                    store_root=self.store_root,
                ),
                labels.OWNER_PROCESS: self._owner_process,
            },
            cache_mount=mount,
            image=self.image,
            extra_env={
                # A trial must load the blessed cache: the engine's force-load switch turns a failed
                # load into a failed start instead of a silent recompile (never for the bootstrap).
                **(self.adapter.replay_env() if phase != labels.PHASE_BOOTSTRAP else {}),
                "BLESS_RUN_ID": self.run_id,
                "BLESS_PHASE": phase,
                "BLESS_CANDIDATE": str(candidate),
            },
            log_path=log_path,
            gpu_ids=slot.device_ids or None,
            private_dir=private_dir,
            # Trials run as serving will (bless's Triton cache manager), so what serves is what was proven;
            # the bootstrap writes its kernels through the engine's own manager.
            seal=phase != labels.PHASE_BOOTSTRAP,
        )
        return EngineSession(
            self.runtime,
            spec,
            ready_timeout_s=settings.ready_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            stop_timeout_s=settings.stop_timeout_s,
            completion_fields=self.adapter.completion_fields,
        )

    def name(self, phase: str, candidate: int, trial: int | None = None) -> str:
        """The container name of a bootstrap (``trial`` None) or of one trial of a candidate.

        ``bless-<phase>-<hash12>-c<candidate>[-t<trial>]-<store tag>``: engines are shared, and another store
        root may bless the same config at the same time; the store's tag keeps the two runs' names apart.
        """
        # Deterministic: the per-hash lock makes it unique among this store's runs, and a foreign
        # container squatting it is detected (and refused) rather than raced.
        suffix = f"-t{trial}" if trial is not None else ""
        return f"bless-{phase}-{self.resolved.config_hash[:12]}-c{candidate}{suffix}-{self.store_tag}"

    def count_engine_time(self, session: EngineSession, report: CoherenceReport | None) -> None:
        """Add a finished session's start-to-ready, request and stop time to :attr:`engine_seconds`."""
        seconds = (session.start_to_ready_s or 0.0) + (report.request_seconds if report else 0.0)
        if session.stop_result is not None:
            seconds += session.stop_result.seconds
        with self._engine_seconds_lock:
            self.engine_seconds += seconds

    def clean_leftovers(self, config_hash: str) -> tuple[list[str], list[str]]:
        """Remove this store's bless-run containers of this hash whose run is gone; returns (removed, spared).

        Only containers this store root made are looked at (its tag, :data:`labels.STORE`): another root's
        run of the same config on the same engine is never ours, whatever state it is in. The per-hash lock
        is per store root, and two processes may still share one root through two paths (one tag): those
        whose creating process still runs (or cannot be checked from here) are spared; a start under one of
        their names is then a clear conflict rather than a stolen container.
        """
        removed: list[str] = []
        spared: list[str] = []
        # Only bless-run phases: a serving container of the same config must survive a rebless.
        for phase in (labels.PHASE_BOOTSTRAP, labels.PHASE_TRIAL, labels.PHASE_HELPER):
            selector = {labels.CONFIG_HASH: config_hash, labels.PHASE: phase, labels.STORE: self.store_tag}
            runs: dict[str, list[ContainerInfo]] = {}
            for info in self.runtime.list_ours(selector):
                runs.setdefault(info.labels.get(labels.RUN_ID, ""), []).append(info)
            for run_id, infos in sorted(runs.items()):
                if not run_id or any(_owner_running(info.labels) for info in infos):
                    spared.extend(info.name for info in infos)
                else:
                    removed.extend(self.runtime.cleanup_ours({**selector, labels.RUN_ID: run_id}))
        return removed, spared


def keep_private(private_dir: Path, evidence: Path) -> None:
    """Move a start's private HOME and temp dir into the evidence (a failed trial keeps what it compiled)."""
    with os_errors(f"keeping the engine's private dirs in {evidence}"):
        if evidence.exists():
            shutil.rmtree(evidence)
        shutil.move(str(private_dir), str(evidence))


def write_log(path: Path, log: str) -> None:
    """Keep an engine's log as evidence (atomically: a half-written log would mislead).

    Raises:
        NoSpaceError, StoreUnavailableError: the staging dir cannot take it (a full disk, permissions).
    """
    with os_errors(f"keeping the engine log {path}"):
        atomic_write_bytes(path, log.encode("utf-8", "replace"))


def _owner_running(container_labels: Mapping[str, str]) -> bool:
    """Whether the bless process that created a container may still run (True when it cannot be told)."""
    raw = container_labels.get(labels.OWNER_PROCESS)
    if raw is None:
        return False  # made before owners were labeled: a leftover, as always
    try:
        owner = json.loads(raw)
    except ValueError:
        return True
    return not isinstance(owner, dict) or process_alive(owner) is not False

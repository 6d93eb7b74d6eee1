"""The `bless run` flow tests' harness: the real Orchestrator, Store and ReferenceAdapter over the fake runtime."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core.factors import GpuInfo, ResolvedConfig, resolve
from bless.core.profile import Profile, load_profile
from bless.engines.reference import ReferenceAdapter
from bless.flows.events import Event
from bless.flows.run import Orchestrator, RunOptions, RunResult
from bless.store import Store
from tests.support.fakes import FakeRuntime

REPO = Path(__file__).resolve().parents[2]


def make_profile(**env: str) -> Profile:
    profile = load_profile(REPO / "profiles" / "reference-cpu.toml")
    return dataclasses.replace(profile, env={**profile.env, **env}) if env else profile


def make_resolved(profile: Profile, runtime: FakeRuntime) -> ResolvedConfig:
    return resolve(
        profile,
        ReferenceAdapter(),
        image_resolver=runtime.resolve_image,
        hardware_probe=lambda spec: {"accelerator": "cpu", "isa": "x86-64-v2"},
    )


@dataclass
class Harness:
    store: Store
    runtime: FakeRuntime
    resolved: ResolvedConfig
    events: list[Event]
    gpus: list[GpuInfo] = field(default_factory=list)  # what the GPU probe lists (none: a CPU host)

    @property
    def config_hash(self) -> str:
        return self.resolved.config_hash

    def run(self, trials: int = 3, adapter: ReferenceAdapter | None = None, **options: Any) -> RunResult:
        orchestrator = Orchestrator(
            self.resolved,
            store=self.store,
            runtime=self.runtime,
            adapter=adapter or ReferenceAdapter(),
            events=self.events.append,
            gpu_probe=lambda: list(self.gpus),
        )
        return orchestrator.run(RunOptions(trials=trials, **options))

    def rejected_dirs(self) -> list[Path]:
        return self._evidence_dirs("rejected")

    def interrupted_dirs(self) -> list[Path]:
        """The evidence of candidates a signal stopped: filed apart from the rejections."""
        return self._evidence_dirs("interrupted")

    def _evidence_dirs(self, kind: str) -> list[Path]:
        parent = self.store.root / kind / self.config_hash
        return sorted(p for p in parent.iterdir() if not p.name.startswith(".")) if parent.is_dir() else []

    def staging_left(self) -> list[Path]:
        staging = self.store.root / "staging"
        return sorted(staging.iterdir()) if staging.is_dir() else []

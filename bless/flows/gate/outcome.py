"""``bless gate`` in one call: the profiles to gate, the gate, its JUnit report written, its refusal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.errors import GateFailedError, InputInvalidError, UsageError
from bless.flows.gate.check import GateReport, default_profiles, gate_failure, run_gate
from bless.flows.gate.formats import github_annotations, junit_xml
from bless.store import Store
from bless.system.durable import atomic_write_bytes
from bless.system.user_files import check_output_target

__all__ = ["GateOutcome", "gate_profiles"]


@dataclass(frozen=True)
class GateOutcome:
    """A gate's report, where its JUnit report went, and whether the profiles were the default set."""

    report: GateReport
    junit: Path | None
    defaulted: bool

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless gate --json``)."""
        # By hand (not JsonForm): the report's JSON, with a ``junit`` key only when one was written.
        data = self.report.to_dict()
        if self.junit is not None:
            data["junit"] = str(self.junit)
        return data

    @property
    def annotations(self) -> list[str]:
        """The GitHub Actions annotations of the failing rows (one line each)."""
        return github_annotations(self.report)

    @property
    def failure(self) -> GateFailedError | None:
        """GATE_FAILED (24) when a profile is not blessed, reported after every row."""
        return None if self.report.ok else gate_failure(self.report, defaulted=self.defaulted)


def gate_profiles(
    profiles: Sequence[Path],
    store: Store,
    *,
    verify: bool = False,
    junit: Path | None = None,
    allow_unverified: bool = False,
) -> GateOutcome:
    """Gate ``profiles`` (none: ``profiles/*.toml`` of the current directory) against ``store``'s manifests
    dir, and write the JUnit report to ``junit`` when given (its target is checked before the gate runs:
    a FIFO or a device there is refused at once). With ``verify`` a profile whose cache files ``store`` does
    not hold fails, unless ``allow_unverified``.

    Raises:
        UsageError: no profiles given and none in ``profiles/``.
        InputInvalidError: ``junit`` cannot be written.
    """
    paths = list(profiles) if profiles else default_profiles(Path())
    if not paths:
        raise UsageError(
            "no profiles to gate: none given and no profiles/*.toml in the current directory",
            hint="name the profile files to gate, and the manifests dir to gate them against",
            remedy="gate_profile_files",
        )
    if junit is not None:
        check_output_target(
            junit,
            what="JUnit report",
            hint="the JUnit report's path names a regular file, or one to be created",
            remedy="junit_regular_file",
        )
    report = run_gate(paths, store=store, verify=verify, allow_unverified=allow_unverified)
    if junit is not None:
        try:
            junit.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(junit, junit_xml(report))
        except OSError as exc:
            raise InputInvalidError(f"cannot write the JUnit report {junit}: {exc.strerror or exc}") from None
    return GateOutcome(report, junit, defaulted=not profiles)

"""``bless gate``: every profile must hash to a valid, unique blessed manifest (:mod:`.check`), reported in
the formats CI tools read (:mod:`.formats`); :mod:`.outcome` is the command's one entry point."""

from bless.flows.gate.check import GateReport, GateRow, default_profiles, gate_failure, gate_profile, run_gate
from bless.flows.gate.formats import github_annotations, junit_xml
from bless.flows.gate.outcome import GateOutcome, gate_profiles

__all__ = [
    "GateOutcome",
    "GateReport",
    "GateRow",
    "default_profiles",
    "gate_failure",
    "gate_profile",
    "gate_profiles",
    "github_annotations",
    "junit_xml",
    "run_gate",
]

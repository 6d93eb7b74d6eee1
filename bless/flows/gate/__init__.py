"""``bless gate``: every profile must hash to a valid, unique blessed manifest (:mod:`.check`), reported in
the formats CI tools read (:mod:`.formats`)."""

from bless.flows.gate.check import GateReport, GateRow, default_profiles, gate_failure, gate_profile, run_gate
from bless.flows.gate.formats import github_annotations, junit_xml

__all__ = [
    "GateReport",
    "GateRow",
    "default_profiles",
    "gate_failure",
    "gate_profile",
    "github_annotations",
    "junit_xml",
    "run_gate",
]

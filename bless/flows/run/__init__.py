"""``bless run``: bootstrap a compile cache, prove it with K trials, publish or reject it.

Phase 1 (bootstrap) starts the engine on an empty staging cache mounted read-write,
waits for readiness, runs the replay protocol (its outputs become the golden outputs),
stops gracefully, normalizes ownership, checks the adapter's expected artifacts and
hashes the tree. Phase 2 runs K trials, each a fresh engine that sees the staged tree
as a read-only lower layer (overlay) and must reuse it: coherent outputs equal to the
golden ones, a load marker, no compile marker, no new artifacts in the upper layer, and
the tree byte-identical afterwards. Accept publishes through the store (manifest last);
reject keeps the evidence. ``--candidates N`` bootstraps afresh after a rejection.

Trials run ``--parallel N`` at a time, one per GPU slot (see bless/replay/devices.py): each has its
own GPU set, overlay upper layer, port and log. A failed trial stops new ones from starting
(those running finish and count); Ctrl-C stops every running engine. The outputs are also
compared across devices: a cache that answers differently on another GPU than where it was
compiled is rejected.

One module per concern: :mod:`.orchestrator` (the run and its candidates: refusals, publish,
reject; :func:`bless_profile`, the command's one call: profile, K, runtime, resolution, run),
:mod:`.bootstrap` (phase 1), :mod:`.schedule` (phase 2's trials on GPU slots, stopped together),
:mod:`.trial` (one trial and its verdict), :mod:`.containers` (the run's engine containers: names,
labels, sessions, leftovers of a crashed run), :mod:`.rebless_rule` (the rebless rule on
failure-rate bounds), :mod:`.served` (what earlier sealed serves met that the blessing did not
hold), :mod:`.results` (options in, K worked out, results and their refusal out)
and :mod:`.summary` (a rejection's ``summary.md``).

No other flow imports this package; what flows share lives in :mod:`bless.flows` beside it.
"""

from __future__ import annotations

from bless.flows.run.orchestrator import Orchestrator, bless_profile
from bless.flows.run.results import CandidateResult, RunOptions, RunResult, TrialResult

__all__ = [
    "CandidateResult",
    "Orchestrator",
    "RunOptions",
    "RunResult",
    "TrialResult",
    "bless_profile",
]

"""The exact log lines the reference engine prints; bless's ``reference`` adapter parses them.

Every marker goes to stdout, one line, flushed at once, and starts with ``MARKER_PREFIX``. The
prefixes below are a contract: change them only together with the adapter. This module is
standard-library only, so bless itself may import the constants without importing torch.
"""

from __future__ import annotations

import sys

MARKER_PREFIX = "bless-reference: "

USING_CACHE_DIR = MARKER_PREFIX + "Using cache directory: "
LOADED = MARKER_PREFIX + "Directly load compiled artifact from path "
COMPILING = MARKER_PREFIX + "Compiling model (reason: "
SAVED = MARKER_PREFIX + "saved compiled artifact to "
UNABLE_TO_SAVE = MARKER_PREFIX + "unable to save compiled artifact to "
COUNTERS = MARKER_PREFIX + "compile counters "
COMPILE_TIME = MARKER_PREFIX + "torch.compile took "
READY = MARKER_PREFIX + "ready on port "
FATAL = MARKER_PREFIX + "FATAL "
SHUTTING_DOWN = MARKER_PREFIX + "shutting down"
EAGER = MARKER_PREFIX + "compile disabled (eager mode); cache not used"
# Shape-bucket kernels (--shape-buckets): compiled lazily, per prompt length, on first use in a process.
LAZY_COMPILING = MARKER_PREFIX + "compiling shape-bucket kernel for bucket "
LAZY_UNSAVED = MARKER_PREFIX + "unable to save shape-bucket kernel for bucket "
LAZY_LOADED = MARKER_PREFIX + "loaded shape-bucket kernel for bucket "
# Informational (the adapter may read the key as an engine-native key): key, torch version, device.
ARTIFACT_KEY = MARKER_PREFIX + "artifact key "
INDUCTOR_DIR = MARKER_PREFIX + "inductor scratch dir "
KERNELS_RESTORED = MARKER_PREFIX + "kernel libraries copied from the artifact into the inductor dir: "
KERNELS_NOT_RESTORED = MARKER_PREFIX + "kernel libraries not copied from the artifact: "
# Not parsed by the adapter; says loudly that a test knob (unsafe for serving) is active.
KNOB_ACTIVE = MARKER_PREFIX + "WARNING unsafe test knob active: "


def emit(line: str) -> None:
    """Print one marker line to stdout and flush, so a log follower sees it immediately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def using_cache_dir(path: str) -> str:
    """``Using cache directory: <dir>``, printed first when compiling."""
    return f"{USING_CACHE_DIR}{path}"


def loaded(path: str) -> str:
    """``Directly load compiled artifact from path <file>``: only when the load really hit."""
    return f"{LOADED}{path}"


def compiling(reason: str) -> str:
    """``Compiling model (reason: <why>)``: no artifact, forced recompile, or a load that missed."""
    return f"{COMPILING}{reason})"


def saved(path: str) -> str:
    """``saved compiled artifact to <file>``."""
    return f"{SAVED}{path}"


def unable_to_save(path: str, error: str) -> str:
    """``unable to save compiled artifact to <file>: <error>``; the engine keeps serving."""
    return f"{UNABLE_TO_SAVE}{path}: {error}"


def counters(compact_json: str) -> str:
    """``compile counters <json>`` with the inductor and aot_autograd counters of this boot."""
    return f"{COUNTERS}{compact_json}"


def compile_time(seconds: float) -> str:
    """``torch.compile took <X.XX> s in total`` (artifact load + compile + warm-up forwards)."""
    return f"{COMPILE_TIME}{seconds:.2f} s in total"


def ready(port: int) -> str:
    """``ready on port <N>``, printed right before the HTTP server starts serving."""
    return f"{READY}{port}"


def fatal(message: str) -> str:
    """``FATAL <message>``; the process exits non-zero right after."""
    return f"{FATAL}{message}"

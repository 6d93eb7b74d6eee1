"""What a serve is called on a host: its container name, and the command line that stops it."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from bless.store import builtin_root

__all__ = ["serve_container_name", "stop_command"]

_SERVE_PREFIX = "bless-serve-"


def stop_command(name: str, root: Path | None = None) -> str:
    """The shell command line that stops the detached serve of profile ``name`` and cleans up after it.

    ``root`` is the store root the serve used. It is named (``--root``) unless it is the built-in
    default ``~/.cache/bless``: the lease and serve dir live under it, and a stop run against another
    root (a shell without the same ``--root`` or ``$BLESS_ROOT``) would stop the engine but leave them
    behind, the lease pinning the blessed version forever. Words are quoted for a shell.
    """
    words = ["serve-full", "stop", name]
    if root is not None and root != builtin_root():
        words += ["--root", str(root)]
    return shlex.join(words)


def serve_container_name(profile_name: str, *, per_root: Path | None = None) -> str:
    """The serving container's name: ``bless-serve-NAME``, one per profile name on a host.

    Container names (like ports) are host-wide, so two store roots serving one profile name collide.
    With ``per_root`` (``serve-full --name-per-root``) the name ends in a tag of that store root,
    ``bless-serve-NAME-<8 hex digits>``, so serves of one profile from different roots can run side
    by side (each on its own port).
    """
    name = f"{_SERVE_PREFIX}{profile_name}"
    if per_root is None:
        return name
    # The real path: two spellings of one root (a symlink, a relative --root) are one store.
    tag = hashlib.sha256(str(Path(per_root).resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{name}-{tag}"

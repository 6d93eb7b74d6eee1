"""What a serve is called on a host: its container name, and the command line that stops it."""

from __future__ import annotations

import shlex
from pathlib import Path

from bless.container_labels import store_tag
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
    """The serving container's name: ``bless-serve-NAME-<tag>``, the tag naming the store root ``per_root``.

    Container names (like ports) are engine-wide, and engines are shared: every serve's name ends in its store
    root's tag (:func:`bless.container_labels.store_tag`, 8 hex digits), so serves of one profile from
    different roots run side by side (each on its own port). ``per_root`` None gives the untagged
    ``bless-serve-NAME`` that serves started before names were tagged carry (``stop`` still finds those).
    """
    name = f"{_SERVE_PREFIX}{profile_name}"
    if per_root is None:
        return name
    return f"{name}-{store_tag(per_root)}"

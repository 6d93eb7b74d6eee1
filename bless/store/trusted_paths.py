"""Whether the store paths above a blessing can be trusted: nobody but their owner may replace them."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from bless.errors import VerifyFailedError
from bless.system.entries import unsafe_to_trust

_WRITABLE_HINT = (
    "remove group/other write permission (chmod go-w PATH) from those store paths; bless creates them 0755/0644 "
    "whatever the umask"
)
_SPECIAL_HINT = (
    "clear the bit (chmod u-s,g-s,-t PATH): bless makes these paths with exact modes and never sets one, so it was "
    "added since"
)
_UNREADABLE_HINT = (
    "run as a user who may read the store (its owner), or let this user search its dirs (chmod a+rX PATH), "
    "without making them writable"
)
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_LINK_HINT = (
    "bless never makes these paths links: find out what replaced them, remove the link and pull or re-bless "
    "the blessing"
)


def special_bits(path: Path) -> str | None:
    """Why ``path`` (never followed) carries a setuid, setgid or sticky bit, or None (missing: not judged here)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None  # unsafe_to_trust reports what cannot be read
    if stat.S_ISLNK(mode) or not mode & _SPECIAL_BITS:
        return None
    return f"{path} is mode {stat.filemode(mode)} (a setuid, setgid or sticky bit)"


def refuse_untrusted_paths(
    checked: Sequence[Path], *, config_hash: str, root: Path, exact: Sequence[Path] = ()
) -> None:
    """Raise unless every path in ``checked`` is neither group/other-writable nor (below ``root``) a symlink,
    and no path in ``exact`` carries a setuid, setgid or sticky bit.

    Whoever can write one of them can swap a manifest and its tree together, and every byte would still
    verify. The store root itself may be a link (it is followed); nothing below it may. ``exact``: the
    paths bless itself makes with an exact mode (the manifest file, ``blessed/``, ``blessed/<hash>/``),
    which never carry a special bit: one there was added since, and is refused. The store root and the
    manifests dir may be an operator's (a setgid shared directory, a git checkout): a setgid or sticky
    bit there lets nobody replace an entry (the write bits decide that), so it is accepted.

    Raises:
        VerifyFailedError: naming each unsafe path, its mode, and what fixes it (``store_permissions``).
    """
    problems = [problem for path in checked if (problem := unsafe_to_trust(path, follow=path == root))]
    special = [problem for path in exact if (problem := special_bits(path))]
    if not problems and not special:
        return
    links = [problem for problem in problems if problem.endswith(" is a symlink")]
    unreadable = [problem for problem in problems if ": cannot stat (" in problem]
    writable = len(links) + len(unreadable) < len(problems)
    reasons = [
        *(["writable by other users"] if writable else []),
        *(["replaced by a symlink"] if links else []),
        *(["unreadable by this user"] if unreadable else []),
        *(["given a setuid, setgid or sticky bit"] if special else []),
    ]
    hints = [
        *([_WRITABLE_HINT] if writable else []),
        *([_LINK_HINT] if links else []),
        *([_UNREADABLE_HINT] if unreadable else []),
        *([_SPECIAL_HINT] if special else []),
    ]
    problems += special
    raise VerifyFailedError(
        f"store paths are {' and '.join(reasons)}, so a blessing there cannot be trusted: {'; '.join(problems)}",
        hint="; ".join(hints) + "; then verify again",
        details={"reason": "store_permissions", "problems": problems, "config_hash": config_hash},
    )

"""Whether the store paths above a blessing can be trusted: nobody but their owner may replace them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bless.errors import VerifyFailedError
from bless.system.entries import unsafe_to_trust

_WRITABLE_HINT = (
    "remove group/other write permission (chmod go-w PATH) from those store paths; bless creates them 0755/0644 "
    "whatever the umask"
)
_LINK_HINT = (
    "bless never makes these paths links: find out what replaced them, remove the link and pull or re-bless "
    "the blessing"
)


def refuse_untrusted_paths(checked: Sequence[Path], *, config_hash: str, root: Path) -> None:
    """Raise unless every path in ``checked`` is neither group/other-writable nor (below ``root``) a symlink.

    Whoever can write one of them can swap a manifest and its tree together, and every byte would still
    verify. The store root itself may be a link (it is followed); nothing below it may.

    Raises:
        VerifyFailedError: naming each unsafe path, its mode, and what fixes it (``store_permissions``).
    """
    problems = [problem for path in checked if (problem := unsafe_to_trust(path, follow=path == root))]
    if not problems:
        return
    links = [problem for problem in problems if problem.endswith(" is a symlink")]
    writable = len(links) < len(problems)
    reasons = [*(["writable by other users"] if writable else []), *(["replaced by a symlink"] if links else [])]
    hints = [*([_WRITABLE_HINT] if writable else []), *([_LINK_HINT] if links else [])]
    raise VerifyFailedError(
        f"store paths are {' and '.join(reasons)}, so a blessing there cannot be trusted: {'; '.join(problems)}",
        hint="; ".join(hints) + "; then verify again",
        details={"reason": "store_permissions", "problems": problems, "config_hash": config_hash},
    )

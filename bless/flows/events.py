"""Progress events and run ids, shared by every flow.

The library never prints: flows report progress as :class:`Event` values to an
:data:`EventSink` the CLI provides, and the CLI renders them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Event:
    """Progress for humans: the CLI renders these; the library never prints."""

    kind: str  # phase | trial-start | trial-end | candidate-end | note | warning
    message: str
    data: dict[str, Any] = field(default_factory=dict)


EventSink = Callable[[Event], None]


def ignore_events(_: Event) -> None:
    """The sink used when the caller wants no progress."""
    return None


def new_run_id() -> str:
    """A sortable, unique id for one run: UTC time plus random hex."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)

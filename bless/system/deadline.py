"""The deadline of one network exchange, standard library only (the engine client and the registry client share it)."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

__all__ = ["Guard"]


class Guard:
    """The deadline of one exchange: when it passes, the sockets the exchange used are shut down.

    Shutting a socket down wakes a thread blocked reading it (closing it would not), so a registry
    that trickles cannot hold a request past its deadline, whatever the per-read timeout.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Guard:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            expired = self.expired
            if not expired:
                self._sockets.append(sock)
        if expired:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with suppress(OSError):  # already closed: nothing to wake
        sock.shutdown(socket.SHUT_RDWR)

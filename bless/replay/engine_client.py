"""The engine's HTTP API as bless uses it: ``/v1/models`` (readiness, the served model), ``/v1/completions``
and ``/v1/chat/completions`` (coverage requests).

One small client over the standard library for every phase (bootstrap, trials, the canary, the readiness
probe): every request has a timeout, every reply a size cap and a checked shape, and an adapter may require
the generated token ids in every completion (the protocol compares them, not only text).
"""

from __future__ import annotations

import errno
import http.client
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.errors import EngineHttpError, NotReadyError
from bless.system.deadline import Guard

__all__ = ["MAX_OTHER_ERRORS", "MAX_REPLY_BYTES", "Completion", "EngineClient", "wait_ready"]

MAX_REPLY_BYTES = 8 << 20
MAX_OTHER_ERRORS = 20


@dataclass(frozen=True)
class Completion:
    prompt: str
    text: str
    token_ids: tuple[int, ...]
    latency_s: float


class EngineClient:
    """A tiny client for ``/v1/models`` and ``/v1/completions`` on 127.0.0.1 (stdlib only)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float,
        model: str | None = None,
        fields: Mapping[str, Any] | None = None,
        require_token_ids: bool = False,
    ):
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.model = model
        #: Extra fields of every completion request (the adapter's ``completion_fields``).
        self.fields = dict(fields or {})
        #: A completion whose reply holds no token ids is an error (bless compares token ids, not only text).
        self.require_token_ids = require_token_ids

    def _request(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One exchange, whole within ``timeout_s`` (a reply trickled a byte at a time included), its JSON parsed.

        Every failure is an :class:`EngineHttpError`: a refused or dropped connection (``refused``), an
        error status, a reply over :data:`MAX_REPLY_BYTES`, too slow, not JSON, nested deeper than
        Python parses or holding an integer longer than it converts, a host that is no host.
        """
        data = None if body is None else json.dumps(body).encode()
        guard = Guard(self.timeout_s)  # shuts the socket down when the exchange's time is up
        connection: http.client.HTTPConnection | None = None
        try:
            with guard:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                connection.connect()
                if connection.sock is not None:
                    guard.watch(connection.sock)
                connection.request(
                    "GET" if body is None else "POST", path, body=data, headers={"Content-Type": "application/json"}
                )
                reply = connection.getresponse()
                raw = reply.read(MAX_REPLY_BYTES + 1)
            if guard.expired:
                raise EngineHttpError(f"{path}: no whole reply within {self.timeout_s:g} s")
        except (ConnectionError, TimeoutError, OSError) as exc:
            if guard.expired:
                raise EngineHttpError(f"{path}: no whole reply within {self.timeout_s:g} s") from None
            refused = isinstance(exc, ConnectionRefusedError | ConnectionResetError) or exc.errno in (
                errno.ECONNREFUSED,
                errno.ECONNRESET,
            )
            raise EngineHttpError(f"{path}: {type(exc).__name__}: {exc}", refused=refused) from None
        except (http.client.HTTPException, ValueError) as exc:  # a malformed reply; InvalidURL: not a host
            if guard.expired:
                raise EngineHttpError(f"{path}: no whole reply within {self.timeout_s:g} s") from None
            raise EngineHttpError(f"{path}: {type(exc).__name__}: {_short(exc)}") from None
        finally:
            if connection is not None:
                connection.close()
        if reply.status >= 400:
            detail = raw[:2000].decode("utf-8", "replace")
            raise EngineHttpError(f"{path}: HTTP {reply.status}: {detail}")
        if len(raw) > MAX_REPLY_BYTES:
            raise EngineHttpError(f"{path}: reply larger than {MAX_REPLY_BYTES} bytes")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, UTF-8, an int over 4300 digits
            raise EngineHttpError(f"{path}: reply is not JSON bless reads: {_short(exc)}") from None

    def models(self) -> list[str]:
        """Model ids served; a reply of the wrong shape is an EngineHttpError."""
        reply = self._request("/v1/models")
        try:
            return [str(item["id"]) for item in reply["data"]]
        except (KeyError, TypeError) as exc:
            raise EngineHttpError(f"/v1/models: unexpected reply shape ({exc!r})") from None

    def complete(
        self, prompt: str | Sequence[int], max_tokens: int, sampling: Mapping[str, Any] | None = None
    ) -> Completion:
        """One completion, greedy unless ``sampling`` says otherwise; text and token ids are both required.

        ``prompt`` is text or a list of token ids (the engine then schedules exactly that many tokens);
        ``sampling`` adds request fields (temperature, top_k, logprobs, ...: coverage requests only).
        """
        sent: str | list[int] = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
        body: dict[str, Any] = {
            **self.fields,
            "prompt": sent,
            "max_tokens": max_tokens,
            "temperature": 0,
            **(sampling or {}),
        }
        if self.model:
            body["model"] = self.model
        started = time.monotonic()
        reply = self._request("/v1/completions", body)
        latency = time.monotonic() - started
        try:
            choice = reply["choices"][0]
            text = choice["text"]
            token_ids = choice.get("token_ids")
            if not isinstance(text, str):
                raise TypeError("text is not a string")
            if token_ids is None:
                if self.require_token_ids:
                    raise TypeError("the reply holds no token_ids (the trials and the canary compare token ids)")
                token_ids = []
            if not isinstance(token_ids, list) or not all(type(t) is int for t in token_ids):  # no bools
                raise TypeError("token_ids is not a list of integers")
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineHttpError(f"/v1/completions: unexpected reply shape ({exc})") from None
        shown = prompt if isinstance(prompt, str) else f"[{len(sent)} token ids]"
        return Completion(shown, text, tuple(token_ids), latency)

    def chat(self, message: str, max_tokens: int, fields: Mapping[str, Any] | None = None) -> str:
        """One chat completion of a single user ``message`` (coverage requests): its reply's first choice.

        ``fields`` adds request fields (``tools``, ``tool_choice``, ``response_format``, sampling). The reply
        must hold a message; its content or tool calls come back as text (coverage compares nothing).
        """
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": message}],
            "max_tokens": max_tokens,
            **(fields or {}),
        }
        if self.model:
            body["model"] = self.model
        reply = self._request("/v1/chat/completions", body)
        try:
            answer = reply["choices"][0]["message"]
            if not isinstance(answer, Mapping):
                raise TypeError("message is not an object")
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineHttpError(f"/v1/chat/completions: unexpected reply shape ({exc})") from None
        return json.dumps(answer, sort_keys=True)[:2000]


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."


def wait_ready(
    client: EngineClient,
    *,
    timeout_s: float,
    is_alive: Callable[[], bool],
    poll_s: float = 0.5,
    max_other_errors: int = MAX_OTHER_ERRORS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Poll ``/v1/models`` until it answers; returns the seconds waited.

    A refused connection while booting is the normal state, not an error, and is never
    counted; other failures (5xx, bad replies) are retried at most ``max_other_errors``
    times. The engine exiting, or ``timeout_s`` passing, ends the wait at once.
    """
    started = clock()
    other_errors: list[str] = []
    while True:
        if not is_alive():
            raise NotReadyError("the engine exited before it became ready")
        try:
            client.models()
            return clock() - started
        except EngineHttpError as exc:
            if not exc.refused:
                other_errors.append(exc.message)
                if len(other_errors) > max_other_errors:
                    raise NotReadyError(
                        f"{len(other_errors)} failed readiness checks; last: {other_errors[-1]}"
                    ) from None
        if clock() - started > timeout_s:
            raise NotReadyError(f"not ready after {timeout_s:.0f} s")
        sleep(poll_s)

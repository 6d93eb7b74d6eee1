"""Hostile engine replies and readiness records are refused with the engine/readiness codes (issue 25, item 7).

Deep nesting (RecursionError), an integer longer than Python converts (ValueError), a pid past any
pid (OverflowError), a host with a newline (InvalidURL) each ended ``serve-full ready`` with exit 1; a
reply trickled a byte at a time kept it alive for as long as the engine liked (the 3 s timeout bounded
each read). Each is now an EngineHttpError (a NotServingError, 46, for the probe), in bounded time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bless.errors import EngineHttpError, ExitCode, NotServingError
from bless.flows.serve.ready import check_ready, mark_ready
from bless.replay.engine_client import EngineClient
from bless.store import Store
from bless.system.procid import process_identity
from tests.support.fakes import FakeEngineServer, Reply, json_reply


def test_a_deeply_nested_models_reply_is_an_engine_error() -> None:
    with (
        FakeEngineServer(routes={"/v1/models": Reply(200, b"[" * 200_000)}) as server,
        pytest.raises(EngineHttpError, match="not JSON"),
    ):
        EngineClient("127.0.0.1", server.port, timeout_s=5).models()


def test_an_integer_of_5000_digits_in_a_completion_is_an_engine_error() -> None:
    body = b'{"choices": [{"text": "x", "token_ids": [' + b"9" * 5000 + b"]}]}"
    with (
        FakeEngineServer(routes={"/v1/completions": Reply(200, body)}) as server,
        pytest.raises(EngineHttpError, match="not JSON"),
    ):
        EngineClient("127.0.0.1", server.port, timeout_s=5).complete("p", 1)


def test_a_host_with_a_newline_is_an_engine_error() -> None:
    with pytest.raises(EngineHttpError):
        EngineClient("127.0.0.1\nX-Evil: 1", 8000, timeout_s=1).models()


def test_a_malformed_status_line_is_an_engine_error() -> None:
    with trickler(b"HTTP/1.1 banana\r\n\r\n", delay_s=0) as trickle, pytest.raises(EngineHttpError):
        EngineClient("127.0.0.1", trickle.port, timeout_s=2).models()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


class trickler:
    """A server on 127.0.0.1 that sends ``data`` one byte every ``delay_s`` to each connection (until closed).

    ``sent`` counts the bytes sent so far (every connection): a client bounded by a deadline gives up
    before it has all of ``data``; one bounded only per read takes it all.
    """

    def __init__(self, data: bytes, *, delay_s: float) -> None:
        self.data, self.delay_s = data, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.stop = threading.Event()
        self.sent = 0

    def __enter__(self) -> trickler:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.listener.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in self.data:
                if self.stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                self.sent += 1
                time.sleep(self.delay_s)


SLOW_MODELS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n" + b" " * 2000


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_trickled_reply_is_bounded_by_one_deadline(where: str) -> None:
    data = SLOW_MODELS if where == "body" else b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 2000
    with trickler(data, delay_s=0.05) as trickle:  # 2000 bytes: 100 s, each read well within the timeout
        with pytest.raises(EngineHttpError, match="no whole reply within 2 s"):
            EngineClient("127.0.0.1", trickle.port, timeout_s=2).models()
        assert trickle.sent < len(data), "the client read the whole trickle: no deadline ended it"


def _record(store: Store, port: int, **changes: Any) -> None:
    mark_ready(
        store, name="p", config_hash="ab" * 32, host="127.0.0.1", port=port, canary="passed", holder=process_identity()
    )
    path = store.paths.ready_file("p")
    document = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "pid":
            document["holder"]["pid"] = value
        else:
            document[key] = value
    path.write_text(json.dumps(document))


MODELS = {"/v1/models": json_reply({"object": "list", "data": [{"id": "m"}]})}


@pytest.mark.parametrize(
    "change",
    [{"pid": 2**70}, {"pid": 2**31}, {"host": "127.0.0.1\nHost: x"}, {"host": "127.0.0.1 evil"}, {"port": 10**5000}],
    ids=["pid-2^70", "pid-2^31", "host-newline", "host-space", "port-huge"],
)
def test_a_hostile_ready_record_is_not_serving(store: Store, change: dict[str, Any]) -> None:
    with FakeEngineServer(routes=MODELS) as server:
        _record(store, server.port)
        check_ready(store, "p")  # the honest record is ready
        raw = store.paths.ready_file("p").read_text()
        if "port" in change:  # json.dumps refuses to write a 5001-digit int under the default limit
            raw = raw.replace(f'"port": {server.port}', '"port": 1' + "0" * 5000)
            store.paths.ready_file("p").write_text(raw)
        else:
            _record(store, server.port, **change)
        with pytest.raises(NotServingError):
            check_ready(store, "p")


def test_serve_full_ready_against_a_trickling_engine_exits_46_in_bounded_time(store: Store) -> None:
    from bless.cli.serve import ready_app

    with trickler(SLOW_MODELS, delay_s=0.05) as trickle:
        _record(store, trickle.port)
        result = CliRunner().invoke(ready_app, ["p", "--root", str(store.root), "--json"])
        assert result.exit_code == ExitCode.NOT_SERVING, result.stdout
        assert trickle.sent < len(SLOW_MODELS), "the probe read the whole trickle: no deadline ended it"
        assert json.loads(result.stdout)["error"]["details"]["reason"] == "engine_silent"


def test_deep_nesting_and_long_ints_reach_the_probe_as_46(store: Store) -> None:
    from bless.cli.serve import ready_app

    for body in (b"[" * 200_000, b'{"data": [' + b"1" * 5000 + b"]}"):
        with FakeEngineServer(routes={"/v1/models": Reply(200, body)}) as server:
            _record(store, server.port)
            result = CliRunner().invoke(ready_app, ["p", "--root", str(store.root), "--json"])
            assert result.exit_code == ExitCode.NOT_SERVING, result.stdout

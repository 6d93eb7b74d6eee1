"""Tests for bless.replay.trials (analysis, statistics), bless.replay.engine_client (readiness, the HTTP
client) and bless.replay.reuse."""

from __future__ import annotations

import itertools
import json
import math
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from bless.core.profile import TrialSettings
from bless.core.verify import Problem, TreeCheck
from bless.errors import BlessError, EngineHttpError, NotReadyError
from bless.evidence_types import LogSignals, UpperVerdict
from bless.replay.engine_client import Completion, EngineClient, wait_ready
from bless.replay.reuse import classify_reuse
from bless.replay.trials import (
    CoherenceReport,
    Observation,
    analyze,
    failure_rate_bound,
    golden_from,
    golden_token_map,
    run_protocol,
    trials_for,
)
from tests.support.fakes import FakeEngineServer, Reply, Request

PROMPTS = ("alpha", "beta")


def obs(mode: str, prompt: str, tokens: tuple[int, ...]) -> Observation:
    return Observation(mode, prompt, "".join(chr(t) for t in tokens), tokens, 0.01)


def coherent(tokens: Mapping[str, tuple[int, ...]]) -> list[Observation]:
    out = []
    for mode in ("alone", "repeat", "repeat", "interleaved", "concurrent"):
        out += [obs(mode, p, tokens[p]) for p in PROMPTS]
    return out


GOOD = {"alpha": (97, 98), "beta": (99, 100)}


# --- analyze -----------------------------------------------------------------------------------------


def test_one_distinct_output_per_prompt_passes():
    passed, reasons, unique = analyze(coherent(GOOD), PROMPTS)
    assert passed is True
    assert reasons == []
    assert unique == {"alpha": 1, "beta": 1}


def test_a_differing_repeat_fails_naming_prompt_and_mode():
    observations = coherent(GOOD)
    observations[3] = obs("repeat", "beta", (99, 101))
    passed, reasons, unique = analyze(observations, PROMPTS)
    assert passed is False
    assert unique == {"alpha": 1, "beta": 2}
    assert len(reasons) == 1
    assert reasons[0].startswith("'beta': 2 distinct outputs over 5 requests")
    assert "modes differing from 'alone': repeat" in reasons[0]


def test_concurrent_differing_fails():
    observations = [*coherent(GOOD), obs("concurrent", "alpha", (0,))]
    passed, reasons, unique = analyze(observations, PROMPTS)
    assert not passed
    assert unique["alpha"] == 2
    assert "'alpha'" in reasons[0]
    assert reasons[0].endswith("(modes differing from 'alone': concurrent)")


def test_differing_alone_names_every_other_mode():
    observations = coherent(GOOD)
    observations[0] = obs("alone", "alpha", (1,))
    _, reasons, _ = analyze(observations, PROMPTS)
    assert "concurrent, interleaved, repeat" in reasons[0]


def test_golden_match_passes_and_mismatch_fails():
    assert analyze(coherent(GOOD), PROMPTS, golden=GOOD)[0] is True
    golden = {"alpha": (97, 98), "beta": (99, 999)}
    passed, reasons, unique = analyze(coherent(GOOD), PROMPTS, golden=golden)
    assert not passed
    assert unique == {"alpha": 1, "beta": 1}  # coherent, but not what was blessed
    assert reasons == ["'beta': output differs from the golden output"]


def test_missing_golden_fails():
    passed, reasons, _ = analyze(coherent(GOOD), PROMPTS, golden={"alpha": (97, 98)})
    assert not passed
    assert reasons == ["'beta': no golden output recorded"]


def test_empty_golden_is_not_no_golden():
    # golden={} means "compare against golden, and there is none": every prompt fails.
    passed, reasons, _ = analyze(coherent(GOOD), PROMPTS, golden={})
    assert not passed
    assert len(reasons) == 2


def test_prompt_never_observed_fails():
    observations = [o for o in coherent(GOOD) if o.prompt == "alpha"]
    passed, reasons, unique = analyze(observations, PROMPTS)
    assert not passed
    assert unique["beta"] == 0
    assert reasons == ["'beta': no output observed"]


def test_same_text_different_token_ids_is_incoherent():
    observations = coherent(GOOD)
    observations[2] = Observation("repeat", "alpha", "ab", (97, 98, 0), 0.01)
    assert analyze(observations, PROMPTS)[0] is False


# --- statistics --------------------------------------------------------------------------------------


def test_failure_rate_bound_k3():
    assert failure_rate_bound(3, 0.95) == pytest.approx(1 - 0.05 ** (1 / 3))
    assert failure_rate_bound(3, 0.95) == pytest.approx(0.6316, abs=1e-4)
    assert failure_rate_bound(0, 0.95) == 1.0
    assert failure_rate_bound(1, 0.95) == pytest.approx(0.95)


def test_failure_rate_bound_decreases_with_k():
    bounds = [failure_rate_bound(k, 0.95) for k in range(1, 200)]
    assert all(a > b for a, b in itertools.pairwise(bounds))
    assert bounds[-1] < 0.02
    assert failure_rate_bound(10, 0.99) > failure_rate_bound(10, 0.9)  # more confidence, wider bound


def test_trials_for_known_value():
    assert trials_for(0.1, 0.95) == 29


@pytest.mark.parametrize(("p", "c"), [(0.1, 0.95), (0.01, 0.99), (0.5, 0.5), (0.05, 0.9), (0.9, 0.95), (0.2, 0.999)])
def test_trials_for_is_the_smallest_sufficient_k(p, c):
    k = trials_for(p, c)
    assert k >= 1
    assert failure_rate_bound(k, c) <= p
    if k > 1:
        assert failure_rate_bound(k - 1, c) > p
    # And it agrees with the closed form.
    assert k == max(1, math.ceil(math.log(1 - c) / math.log(1 - p) - 1e-9))


@pytest.mark.parametrize(("p", "c"), [(0, 0.95), (1, 0.95), (0.1, 0), (0.1, 1), (-0.1, 0.5), (0.1, 1.5)])
def test_trials_for_rejects_invalid_arguments(p, c):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        trials_for(p, c)


# --- wait_ready --------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeClient(EngineClient):
    """models() replays a script: an exception instance is raised, anything else is returned."""

    def __init__(self, script: list[object]) -> None:
        # wait_ready only asks models(), which the script answers: the address is never reached.
        super().__init__("127.0.0.1", 9, timeout_s=1)
        self.script = list(script)
        self.calls = 0

    def models(self) -> list[str]:
        self.calls += 1
        step = self.script.pop(0) if self.script else EngineHttpError("refused", refused=True)
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[return-value]


def refused() -> EngineHttpError:
    return EngineHttpError("/v1/models: [Errno 111] Connection refused", refused=True)


def broken(n: int = 0) -> EngineHttpError:
    return EngineHttpError(f"/v1/models: HTTP 503: booting {n}")


def test_refused_connections_are_not_errors_and_the_wait_ends_when_ready():
    clock = FakeClock()
    client = FakeClient([refused() for _ in range(50)] + [["reference-tiny"]])
    waited = wait_ready(
        client,
        timeout_s=600,
        is_alive=lambda: True,
        poll_s=0.5,
        max_other_errors=0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert client.calls == 51
    assert waited == pytest.approx(25.0)
    assert clock.sleeps == [0.5] * 50


def test_other_errors_within_the_bound_are_retried():
    clock = FakeClock()
    client = FakeClient([broken(i) for i in range(3)] + [refused(), ["m"]])
    wait_ready(client, timeout_s=600, is_alive=lambda: True, max_other_errors=3, clock=clock, sleep=clock.sleep)
    assert client.calls == 5


def test_other_errors_beyond_the_bound_fail():
    clock = FakeClock()
    client = FakeClient([broken(i) for i in range(10)] + [["m"]])
    with pytest.raises(NotReadyError, match=r"4 failed readiness checks; last: .*booting 3") as info:
        wait_ready(client, timeout_s=600, is_alive=lambda: True, max_other_errors=3, clock=clock, sleep=clock.sleep)
    assert client.calls == 4
    assert isinstance(info.value, BlessError)


def test_refused_between_errors_does_not_count():
    clock = FakeClock()
    script: list[object] = []
    for i in range(3):
        script += [broken(i), refused(), refused()]
    client = FakeClient([*script, ["m"]])
    wait_ready(client, timeout_s=600, is_alive=lambda: True, max_other_errors=3, clock=clock, sleep=clock.sleep)
    assert client.calls == 10


def test_engine_dead_fails_at_once():
    clock = FakeClock()
    client = FakeClient([["m"]])
    with pytest.raises(NotReadyError, match="exited before it became ready"):
        wait_ready(client, timeout_s=600, is_alive=lambda: False, clock=clock, sleep=clock.sleep)
    assert client.calls == 0
    assert clock.sleeps == []


def test_engine_dying_while_booting_ends_the_wait():
    clock = FakeClock()
    client = FakeClient([])  # refused forever
    alive = iter([True, True, True, False])
    with pytest.raises(NotReadyError, match="exited"):
        wait_ready(client, timeout_s=600, is_alive=lambda: next(alive), clock=clock, sleep=clock.sleep)
    assert client.calls == 3


def test_timeout_fails():
    clock = FakeClock()
    client = FakeClient([])  # refused forever
    with pytest.raises(NotReadyError, match="not ready after 10 s"):
        wait_ready(client, timeout_s=10, is_alive=lambda: True, poll_s=1.0, clock=clock, sleep=clock.sleep)
    assert 10 <= clock.now - 1000.0 <= 12
    assert client.calls == len(clock.sleeps) + 1


# --- EngineClient against a real HTTP server ----------------------------------------------------------


@pytest.fixture(scope="module")
def httpd() -> Iterator[FakeEngineServer]:
    with FakeEngineServer() as httpd:  # answers from its routes table, which each test fills
        yield httpd


@pytest.fixture
def server(httpd: FakeEngineServer) -> FakeEngineServer:
    """The module's server with no routes and no recorded requests."""
    httpd.reset()
    return httpd


def client_for(httpd: FakeEngineServer, **kwargs) -> EngineClient:
    return EngineClient("127.0.0.1", httpd.port, timeout_s=5, **kwargs)


def completion(choice: dict[str, Any]) -> bytes:
    return json.dumps({"choices": [choice]}).encode()


def test_good_reply(server):
    server.routes["/v1/completions"] = Reply(200, completion({"text": " ok", "token_ids": [32, 111, 107]}))
    server.routes["/v1/models"] = Reply(200, json.dumps({"data": [{"id": "reference-tiny"}]}).encode())
    client = client_for(server, model="reference-tiny")
    result = client.complete("hi", 3)
    assert isinstance(result, Completion)
    assert (result.prompt, result.text, result.token_ids) == ("hi", " ok", (32, 111, 107))
    assert result.latency_s >= 0
    assert server.posted() == [{"prompt": "hi", "max_tokens": 3, "temperature": 0, "model": "reference-tiny"}]
    assert client.models() == ["reference-tiny"]


def test_reply_without_token_ids_is_allowed_unless_required(server):
    server.routes["/v1/completions"] = Reply(200, completion({"text": "abc"}))
    result = client_for(server).complete("p", 3)
    assert result.token_ids == ()
    assert result.text == "abc"
    assert "model" not in server.posted()[0]
    # An adapter's sessions require them: text alone would let different token ids pass as coherent.
    with pytest.raises(EngineHttpError, match="no token_ids"):
        client_for(server, require_token_ids=True).complete("p", 3)


def test_the_adapters_completion_fields_are_sent(server):
    server.routes["/v1/completions"] = Reply(200, completion({"text": "a", "token_ids": [97]}))
    client_for(server, fields={"return_token_ids": True}, require_token_ids=True).complete("p", 1)
    assert server.posted() == [{"return_token_ids": True, "prompt": "p", "max_tokens": 1, "temperature": 0}]


def test_vllm_asks_for_token_ids_and_the_reference_engine_needs_not():
    from bless.engines.reference import ReferenceAdapter
    from bless.engines.vllm.adapter import VllmAdapter

    assert dict(VllmAdapter().completion_fields) == {"return_token_ids": True}
    assert dict(ReferenceAdapter().completion_fields) == {}


@pytest.mark.parametrize(
    "choice",
    [
        {"text": "a", "token_ids": ["1"]},
        {"text": "a", "token_ids": [1.5]},
        {"text": "a", "token_ids": [1.0]},
        {"text": "a", "token_ids": [True]},  # JSON true is not a token id (and True == 1 in Python)
        {"text": "a", "token_ids": [1, None]},
        {"text": "a", "token_ids": 7},
        {"text": 5, "token_ids": [1]},
        {"token_ids": [1]},
    ],
)
def test_malformed_choice_is_an_http_error(server, choice):
    server.routes["/v1/completions"] = Reply(200, completion(choice))
    with pytest.raises(EngineHttpError, match="unexpected reply shape") as info:
        client_for(server).complete("p", 3)
    assert info.value.refused is False


@pytest.mark.parametrize("body", [b"{}", b'{"choices": []}', b'{"choices": "x"}', b"[]"])
def test_wrong_reply_shape_is_an_http_error(server, body):
    server.routes["/v1/completions"] = Reply(200, body)
    with pytest.raises(EngineHttpError, match="unexpected reply shape"):
        client_for(server).complete("p", 3)


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"", b"\xff\xfe", b'{"choices": ['])
def test_non_json_reply_is_an_http_error(server, body):
    server.routes["/v1/completions"] = Reply(200, body)
    with pytest.raises(EngineHttpError, match="not JSON") as info:
        client_for(server).complete("p", 3)
    assert not info.value.refused


def test_models_wrong_shape(server):
    server.routes["/v1/models"] = Reply(200, b'{"data": [{"name": "x"}]}')
    with pytest.raises(EngineHttpError, match="/v1/models: unexpected reply shape"):
        client_for(server).models()


def test_http_500_is_an_error_but_not_refused(server):
    server.routes["/v1/models"] = Reply(500, b"engine exploded")
    with pytest.raises(EngineHttpError, match="HTTP 500: engine exploded") as info:
        client_for(server).models()
    assert info.value.refused is False


def test_closed_port_is_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    with pytest.raises(EngineHttpError) as info:
        EngineClient("127.0.0.1", port, timeout_s=2).models()
    assert info.value.refused is True


def test_connection_closed_without_reply_counts_as_refused():
    # Docker's port proxy accepts and then drops connections while nothing listens in the container:
    # that is "still booting" (like a refused connection), not an error that counts toward the bound.
    def drop(request: Request) -> None:
        return None

    with FakeEngineServer(drop) as proxy, pytest.raises(EngineHttpError) as info:
        EngineClient("127.0.0.1", proxy.port, timeout_s=5).models()
    assert info.value.refused is True
    assert [request.path for request in proxy.requests] == ["/v1/models"], "the request arrived, and was dropped"


def test_wait_ready_against_a_real_server(server):
    server.routes["/v1/models"] = Reply(200, b'{"data": [{"id": "m"}]}')
    assert wait_ready(client_for(server), timeout_s=5, is_alive=lambda: True) < 5


def test_run_protocol_against_a_real_server(server):
    server.routes["/v1/completions"] = Reply(200, completion({"text": "x", "token_ids": [1, 2]}))
    plan = TrialSettings(repeats=3, max_tokens=2, prompts=("a", "b"), concurrent=True)
    report = run_protocol(client_for(server), plan, golden={"a": (1, 2), "b": (1, 2)})
    assert isinstance(report, CoherenceReport)
    assert report.passed
    # alone 2 + repeats 2*2 + interleaved 2*2 + concurrent 2*2
    assert report.requests == len(server.posted()) == 14
    assert {o.mode for o in report.observations} == {"alone", "repeat", "interleaved", "concurrent"}
    golden = golden_from(report, plan.max_tokens)
    assert golden == [
        {"prompt": "a", "max_tokens": 2, "text": "x", "token_ids": [1, 2]},
        {"prompt": "b", "max_tokens": 2, "text": "x", "token_ids": [1, 2]},
    ]
    assert golden_token_map(golden) == {"a": (1, 2), "b": (1, 2)}
    assert report.to_dict()["unique_outputs"] == {"a": 1, "b": 1}


# --- classify_reuse ----------------------------------------------------------------------------------

LOADED = LogSignals(
    load_markers=("bless-reference: Directly load compiled artifact from path /c/x",),
    compile_markers=(),
    fatal_markers=(),
)
CLEAN_UPPER = UpperVerdict(expected_rewrites=(), new_artifacts=(), unexpected=())


def tree_ok() -> TreeCheck:
    return TreeCheck(ok=True, problems=(), notices=(), files_checked=2, bytes_hashed=10, elapsed_s=0.01)


def tree_changed() -> TreeCheck:
    problem = Problem("sha256", "reference/k/megacache.bin", "expected sha256 aaaa, found bbbb")
    return TreeCheck(ok=False, problems=(problem,), notices=(), files_checked=2, bytes_hashed=10, elapsed_s=0.01)


def test_clean_reuse_passes():
    report = classify_reuse(LOADED, CLEAN_UPPER, tree_ok())
    assert report.passed
    assert report.reasons == ()
    assert report.load_markers == 1
    assert report.tree_unchanged is True
    assert report.to_dict()["passed"] is True


def test_clean_reuse_without_upper_or_tree_check():
    report = classify_reuse(LOADED, None, None)
    assert report.passed
    assert report.tree_unchanged is None


def test_no_load_marker_fails():
    report = classify_reuse(LogSignals((), (), ()), CLEAN_UPPER, tree_ok())
    assert not report.passed
    assert report.reasons == ("no load marker in the engine log: the blessed artifact was not loaded",)


def test_compile_marker_fails():
    signals = LogSignals(LOADED.load_markers, ("bless-reference: Compiling model (reason: load failed)",), ())
    report = classify_reuse(signals, CLEAN_UPPER, tree_ok())
    assert not report.passed
    assert report.compile_markers == 1
    assert "compile/save marker(s) in the log: bless-reference: Compiling model" in report.reasons[0]


def test_fatal_marker_fails():
    signals = LogSignals(LOADED.load_markers, (), ("bless-reference: FATAL out of memory",))
    report = classify_reuse(signals, CLEAN_UPPER, tree_ok())
    assert not report.passed
    assert "FATAL out of memory" in report.reasons[0]


def test_new_artifact_in_upper_fails():
    upper = UpperVerdict(expected_rewrites=("a",), new_artifacts=("reference/k2/megacache.bin",), unexpected=())
    report = classify_reuse(LOADED, upper, tree_ok())
    assert not report.passed
    assert report.upper_new_artifacts == ("reference/k2/megacache.bin",)
    assert report.upper_expected_rewrites == 1
    assert report.reasons == ("1 new compiled artifact(s) in the upper layer: reference/k2/megacache.bin",)


def test_unexpected_upper_write_fails():
    upper = UpperVerdict(expected_rewrites=(), new_artifacts=(), unexpected=("stray.txt",))
    report = classify_reuse(LOADED, upper, tree_ok())
    assert not report.passed
    assert "unexpected write(s) in the upper layer: stray.txt" in report.reasons[0]


def test_expected_rewrites_alone_pass():
    upper = UpperVerdict(expected_rewrites=("inductor/x.best_config",), new_artifacts=(), unexpected=())
    assert classify_reuse(LOADED, upper, tree_ok()).passed


def test_tree_changed_fails():
    report = classify_reuse(LOADED, CLEAN_UPPER, tree_changed())
    assert not report.passed
    assert report.tree_unchanged is False
    assert (
        "the blessed tree changed during the run (1 problem(s); first: sha256 reference/k/megacache.bin"
        in (report.reasons[0])
    )


def test_every_failure_is_reported_at_once():
    signals = LogSignals((), ("c",), ("f",))
    upper = UpperVerdict((), ("n.bin",), ("u",))
    report = classify_reuse(signals, upper, tree_changed())
    assert len(report.reasons) == 6


# --- outputs without token ids (vLLM's default reply) are compared on text --------------------------


def text_only(mode: str, prompt: str, text: str) -> Observation:
    return Observation(mode, prompt, text, (), 0.01)


def test_differing_text_with_empty_token_ids_is_incoherent() -> None:
    observations = [text_only("alone", "alpha", "one"), text_only("repeat", "alpha", "two")]
    passed, reasons, unique = analyze(observations, ("alpha",))
    assert passed is False
    assert unique == {"alpha": 2}
    assert "repeat" in reasons[0]


def test_golden_text_mismatch_fails_even_when_token_ids_are_empty() -> None:
    observations = [text_only("alone", "alpha", "served"), text_only("repeat", "alpha", "served")]
    passed, reasons, _ = analyze(observations, ("alpha",), golden={"alpha": ()}, golden_text={"alpha": "blessed"})
    assert passed is False
    assert "golden text" in reasons[0]
    assert analyze(observations, ("alpha",), golden={"alpha": ()}, golden_text={"alpha": "served"})[0] is True

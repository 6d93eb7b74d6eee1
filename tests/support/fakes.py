"""The fakes unit tests share: one fake runtime, one fake engine HTTP server. Fakes of OUR interfaces only.

``FakeEngineServer``
    A real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port 0) that stands in for an
    engine's OpenAI-style endpoint. Each request is handed to a responder callable, or, without one,
    looked up in a path -> ``Reply`` table the test fills. A reply carries any status and any bytes
    (hostile or malformed bodies included); a responder may also drop the connection unanswered
    (``None``), block, or signal the test process, since it runs in the server's request thread.
    ``openai_engine`` builds the responder of a coherent engine (``/v1/models``, ``/v1/completions``)
    from a function that picks the token ids. Used where the code under test talks HTTP to an
    engine: ``EngineClient``, the trial protocol, the serve canary.

``FakeRuntime``
    Implements :class:`bless.runtime.base.Runtime` in memory, for the orchestrator and serve-full.
    Every start is a ``FakeContainer`` whose engine does what a ``Behavior`` says (the test's
    ``Scenario`` picks one per phase / candidate / trial): print the reference engine's real
    markers, write the compiled artifact into the read-write tree on bootstrap, leak writes into
    the tree, die at boot, report upper-layer entries, and answer completions through its own
    ``FakeEngineServer`` (or, with ``host_port``, let a server the test runs answer). Around the
    containers: reachability (``ping``), an image table, containers that existed before the test
    (``plant``: ours or foreign, by their labels), foreign volumes in an overlay's place, and a
    record of the calls made (``calls``, plus the labels and paths some of them were given), so a
    test can show that a refusal came before anything was created. ``forbidden`` turns a call the
    code under test must never make into a failure.

The reference engine's markers come from its own module, so a fake log reads like a real one.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from bless import container_labels as labels
from bless.engines.base import ENGINE_HOME, ENGINE_TMP
from bless.engines.reference import ReferenceAdapter
from bless.engines.reference_engine import markers
from bless.errors import ImageMissingError, RuntimeUnavailableError, UnknownEngineVersionError
from bless.evidence_types import OutsideEntry, UpperEntry
from bless.runtime.base import ContainerInfo, ContainerSpec, ContainerStop, NameHolder, Started
from bless.system.log_follow import LogFollower, TextFollower

IMAGE = "bless-reference:0.1.0"  # the image profiles/reference-cpu.toml names
IMAGE_ID = "sha256:" + "cd" * 32
MODEL = "reference-tiny"
ARTIFACT_KEY = "0123456789abcdef"
ARTIFACT = f"reference/{ARTIFACT_KEY}/megacache.bin"
META = f"reference/{ARTIFACT_KEY}/meta.json"


# --- the fake engine HTTP server -----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request as the server received it."""

    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What to answer: any status, any bytes (a test of hostile replies sends what no engine would)."""

    status: int
    body: bytes
    content_type: str = "application/json"


# None: close the connection without answering (what Docker's port proxy does while nothing listens).
Responder = Callable[[Request], Reply | None]


def json_reply(document: object, status: int = 200) -> Reply:
    return Reply(status, json.dumps(document).encode())


def completion_reply(token_ids: Sequence[int]) -> Reply:
    """A completion whose text spells the token ids (one character each), as the fake engines answer."""
    ids = list(token_ids)
    return json_reply({"choices": [{"text": "".join(chr(i) for i in ids), "token_ids": ids}]})


def openai_engine(answer: Callable[[str, int], Sequence[int]], *, model: str = MODEL) -> Responder:
    """A coherent engine: ``/v1/models`` lists ``model``, ``/v1/completions`` answers ``answer(prompt, max_tokens)``."""

    def respond(request: Request) -> Reply:
        if request.method == "GET" and request.path == "/v1/models":
            return json_reply({"object": "list", "data": [{"id": model}]})
        if request.method == "POST" and request.path == "/v1/completions":
            body = request.json()
            return completion_reply(answer(body["prompt"], body["max_tokens"]))
        return json_reply({"error": "not found"}, 404)

    return respond


class FakeEngineServer:
    """An HTTP server on 127.0.0.1 (a free port) answering through ``respond``, else from ``routes``.

    Serving starts on construction; ``close`` (or leaving the ``with`` block) stops it. ``requests``
    holds every request received, in order of arrival.
    """

    def __init__(self, respond: Responder | None = None, *, routes: Mapping[str, Reply] | None = None) -> None:
        self.respond: Responder = respond or self._from_routes
        self.routes: dict[str, Reply] = dict(routes or {})
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._closed = False
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        # A handler blocked in a test's responder must not keep the process (or close()) waiting.
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-engine", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def posted(self) -> list[Any]:
        """The JSON bodies of the POST requests, in order (what a client asked for)."""
        with self._lock:
            return [request.json() for request in self.requests if request.method == "POST"]

    def reset(self) -> None:
        """No routes and no recorded requests: a server shared by several tests starts each one clean."""
        with self._lock:
            self.routes.clear()
            self.requests.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeEngineServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _from_routes(self, request: Request) -> Reply:
        reply = self.routes.get(request.path)
        return reply if reply is not None else json_reply({"error": f"no route for {request.path}"}, 404)

    def _received(self, request: Request) -> Reply | None:
        with self._lock:
            self.requests.append(request)
        return self.respond(request)


def _handler_for(server: FakeEngineServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            reply = server._received(Request(self.command, self.path, body))
            if reply is None:
                self.close_connection = True
                return
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (an interrupted run, a timeout): nobody to answer

    return Handler


# --- the fake runtime ----------------------------------------------------------------------------------


def tokens_for(prompt: str, max_tokens: int, salt: int = 0) -> list[int]:
    """A deterministic completion: what a coherent engine answers (another ``salt``: another answer)."""
    return [(ord(ch) + salt) % 256 for ch in (prompt * max_tokens)][:max_tokens]


def key_line(key: str) -> str:
    """The line the reference engine prints with the artifact key it computed for this start."""
    return f"{markers.ARTIFACT_KEY}{key} (engine 1, torch 2.13.0+cpu, device cpu)"


def _coherent(prompt: str, max_tokens: int, nth: int) -> list[int]:
    return tokens_for(prompt, max_tokens)


@dataclass
class Behavior:
    """What one fake engine start does. Defaults: a coherent engine that loads (trial, serve) or saves (bootstrap)."""

    # (prompt, max_tokens, n-th request for this prompt in this start) -> token ids
    answer: Callable[[str, int, int], list[int]] = _coherent
    write_artifact: bool = True  # bootstrap only: write megacache.bin + meta.json into the rw tree
    log: list[str] | None = None  # None: the markers the reference engine prints for this phase
    upper: list[UpperEntry] = field(default_factory=list)
    touch_tree: bool = False  # write into the (read-only lower) tree: a leak the hash check must catch
    # Files the engine writes outside the tree at its start: ("HOME" | "TMPDIR", relative path) -> content,
    # into the spec's private mounts; and changes in its container's own filesystem (absolute paths).
    outside: dict[tuple[str, str], bytes] = field(default_factory=dict)
    container_changes: list[str] = field(default_factory=list)
    exit_at_boot: bool = False  # the engine dies before listening (prints FATAL)
    interrupt_on_request: int | None = None  # SIGINT the main thread when the n-th completion arrives


# (phase label, candidate, trial index or None) -> what that start does
Scenario = Callable[[str, int, int | None], Behavior]


def coherent_scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
    return Behavior()


@dataclass
class FakeContainer:
    """One container of the fake runtime: started by it, or planted by the test before the run."""

    spec: ContainerSpec
    phase: str
    candidate: int
    trial: int | None
    behavior: Behavior
    log: str = ""
    upper: list[UpperEntry] = field(default_factory=list)
    #: What is in its /dev/shm while it runs (absolute paths under /dev/shm): the test writes it.
    shm: list[str] = field(default_factory=list)
    server: FakeEngineServer | None = None  # its in-process engine; None: never listened, or answered elsewhere
    exit_code: int | None = None  # None while it runs
    stopped: bool = False  # stop() was called
    removed: bool = False
    requests: int = 0
    per_prompt: dict[str, int] = field(default_factory=dict)
    #: The lengths of the prompts sent as token ids (coverage requests), in order.
    token_prompts: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def complete(self, prompt: str | list[int], max_tokens: int) -> list[int]:
        """One completion request to this container's engine (runs in the HTTP server's request thread).

        A prompt of token ids (a coverage request) is recorded by its length and answered as a text prompt.
        """
        if isinstance(prompt, list):
            with self.lock:
                self.token_prompts.append(len(prompt))
            prompt = f"<{len(prompt)} token ids>"
        with self.lock:
            self.requests += 1
            count = self.requests
            nth = self.per_prompt.get(prompt, 0) + 1
            self.per_prompt[prompt] = nth
        main_ident = threading.main_thread().ident
        if self.behavior.interrupt_on_request == count and main_ident is not None:
            # A real SIGINT to the main thread, which is blocked reading this very reply: the code under
            # test sees KeyboardInterrupt in the middle of its protocol, as with Ctrl-C.
            signal.pthread_kill(main_ident, signal.SIGINT)
            time.sleep(0.2)
        return self.behavior.answer(prompt, max_tokens, nth)


class FakeRuntime:
    """A :class:`~bless.runtime.base.Runtime` in memory whose engines are in-process HTTP servers (module docstring)."""

    kind: Literal["docker", "local"] = "docker"
    copies_mounts = False

    def __init__(
        self,
        scenario: Scenario = coherent_scenario,
        *,
        reachable: bool = True,
        images: Mapping[str, str] | None = None,
        host_port: int | None = None,
        forbidden: Mapping[str, str] | None = None,
    ) -> None:
        self.scenario = scenario
        self.reachable = reachable
        self.images: dict[str, str] = dict(images if images is not None else {IMAGE: IMAGE_ID})
        # Set: engines are reached on this port (a server the test runs, or none), not their own server.
        self.host_port = host_port
        # method name -> why the code under test must never call it (a call fails the test)
        self.forbidden: dict[str, str] = dict(forbidden or {})
        self.volume_conflicts: dict[str, str] = {}  # container name -> why its overlay volume is in the way
        self.containers: list[FakeContainer] = []
        # Calls that look something up or change something, in order. The polls (is_running, exit_code,
        # logs, upper_entries, engine_port) are left out: how often a wait loop asks proves nothing.
        self.calls: list[str] = []
        self.listed: list[Mapping[str, str]] = []  # the labels list_ours was asked for
        self.cleanups: list[Mapping[str, str]] = []  # the labels cleanup_ours was asked for
        self.normalized: list[Path] = []

    # -- Runtime protocol ---------------------------------------------------------------------------

    def ping(self) -> None:
        self._call("ping")
        if not self.reachable:
            raise RuntimeUnavailableError("Docker Engine: ping failed: connection refused")

    def resolve_image(self, reference: str) -> str:
        self._call("resolve_image")
        if reference not in self.images:
            raise ImageMissingError(f"image {reference!r} is not present")
        return self.images[reference]

    def engine_port(self, preferred: int) -> int:
        return preferred

    def start(self, spec: ContainerSpec) -> Started:
        self._call("start")
        assert labels.is_ours(dict(spec.labels)), "every container must carry our labels"
        assert self.name_holder(spec.name) == "free", f"name {spec.name} taken"
        phase = spec.labels[labels.PHASE]
        candidate = int(spec.env.get("BLESS_CANDIDATE", "0"))
        # bless-trial-<hash12>-c<candidate>-t<trial>-<store tag>
        trial = int(spec.name.rsplit("-t", 1)[1].split("-")[0]) if phase == labels.PHASE_TRIAL else None
        behavior = self.scenario(phase, candidate, trial)
        container = FakeContainer(spec, phase, candidate, trial, behavior, upper=list(behavior.upper))
        self.containers.append(container)
        private = {ENGINE_HOME: "HOME", ENGINE_TMP: "TMPDIR"}
        for mount in spec.mounts:
            for (where, relative), content in behavior.outside.items():
                if mount.kind == "private" and private.get(mount.target) == where:
                    (mount.source / relative).parent.mkdir(parents=True, exist_ok=True)
                    (mount.source / relative).write_bytes(content)
        lines = self._boot(container)
        if behavior.exit_at_boot:
            container.exit_code = 1
            container.log = "\n".join([*lines, markers.fatal("simulated crash (fake engine)")]) + "\n"
            return Started(id=spec.name, name=spec.name, spec=spec, host_port=None)
        port = self.host_port
        if port is None:
            container.server = FakeEngineServer(openai_engine(container.complete))
            port = container.server.port
            lines.append(markers.ready(port))
        container.log = "\n".join(lines) + "\n" if lines else ""
        return Started(id=spec.name, name=spec.name, spec=spec, host_port=port)

    def is_running(self, started: Started) -> bool:
        return self.container(started.name).running

    def exit_code(self, started: Started) -> int | None:
        return self.container(started.name).exit_code

    def logs(self, started: Started) -> str:
        return self.container(started.name).log

    def follow_log(self, started: Started) -> LogFollower:
        return TextFollower(lambda: self.container(started.name).log.encode())

    def stop(self, started: Started, timeout_s: int) -> ContainerStop:
        self._call("stop")
        container = self.container(started.name)
        if container.running:
            if container.server is not None:
                container.server.close()
                # Only an engine the fake runs prints its markers; a log the test wrote stays as written.
                container.log += markers.SHUTTING_DOWN + "\n"
            container.exit_code = 0
        container.stopped = True
        return ContainerStop(exit_code=container.exit_code, graceful=True, seconds=0.01)

    def remove(self, started: Started) -> None:
        self._call("remove")
        container = self.container(started.name)
        assert container.stopped, "removed before it was stopped"
        container.removed = True

    def upper_entries(self, started: Started) -> list[UpperEntry]:
        return list(self.container(started.name).upper)

    def filesystem_changes(self, started: Started) -> list[OutsideEntry]:
        changes = self.container(started.name).behavior.container_changes
        return [OutsideEntry(where="container", path=path) for path in changes]

    def shm_entries(self, started: Started) -> list[OutsideEntry]:
        container = self.container(started.name)
        if container.stopped or container.exit_code is not None:
            return []
        return [OutsideEntry(where="container", path=path) for path in list(container.shm)]

    def name_holder(self, name: str) -> NameHolder:
        self._call("name_holder")
        holder = self._find(name)
        if holder is None:
            return "free"
        return "ours" if labels.is_ours(dict(holder.spec.labels)) else "foreign"

    def list_ours(self, labels_: Mapping[str, str]) -> list[ContainerInfo]:
        self._call("list_ours")
        self.listed.append(dict(labels_))
        return [
            ContainerInfo(
                id=c.name, name=c.name, status="running" if c.running else "exited", labels=dict(c.spec.labels)
            )
            for c in self._ours(labels_)
        ]

    def overlay_conflict(self, name: str) -> str | None:
        self._call("overlay_conflict")
        return self.volume_conflicts.get(name)

    def cleanup_ours(self, labels_: Mapping[str, str]) -> list[str]:
        self._call("cleanup_ours")
        self.cleanups.append(dict(labels_))
        removed = []
        for container in self._ours(labels_):
            if container.server is not None:
                container.server.close()
            if container.running:
                container.exit_code = 0
            container.stopped = container.removed = True
            removed.append(container.name)
        return removed

    def normalize_ownership(self, path: Path, *, image: str | None) -> None:
        self._call("normalize_ownership")
        self.normalized.append(path)

    # -- for tests ----------------------------------------------------------------------------------

    def plant(self, name: str, container_labels: Mapping[str, str]) -> FakeContainer:
        """A running container that exists before the code under test runs: ours or foreign, by its labels."""
        spec = ContainerSpec(name=name, command=("engine",), env={}, labels=dict(container_labels))
        phase = container_labels.get(labels.PHASE, "")
        container = FakeContainer(spec, phase, candidate=0, trial=None, behavior=Behavior())
        self.containers.append(container)
        return container

    def container(self, name: str) -> FakeContainer:
        """The container holding ``name`` now (the last one started under it when none does)."""
        found = self._find(name)
        if found is None:
            found = next(c for c in reversed(self.containers) if c.name == name)
        return found

    def names(self) -> list[str]:
        return [c.name for c in self.containers]

    def all_stopped_and_removed(self) -> bool:
        return all(c.stopped and c.removed for c in self.containers)

    def close(self) -> None:
        """Stop every in-process engine still serving, whatever the test did (no leaked server threads)."""
        for container in self.containers:
            if container.server is not None:
                container.server.close()

    # -- the fake engine's boot ---------------------------------------------------------------------

    def _boot(self, container: FakeContainer) -> list[str]:
        """What the engine does and prints before it listens: the reference engine's markers, its artifact."""
        spec, behavior = container.spec, container.behavior
        cache_mounts = [mount for mount in spec.mounts if mount.kind != "private"]
        if not cache_mounts:  # nothing mounted (a debug serve): no cache to talk about
            return list(behavior.log or [])
        (mount,) = cache_mounts
        cache = mount.source
        bootstrap = container.phase == labels.PHASE_BOOTSTRAP
        if behavior.log is not None:
            lines = list(behavior.log)
        elif bootstrap:
            lines = [
                markers.using_cache_dir(mount.target),
                key_line(ARTIFACT_KEY),
                markers.compiling(f"no compiled artifact at {mount.target}/{ARTIFACT}"),
                markers.compile_time(1.5),
            ]
        else:
            lines = [
                markers.using_cache_dir(mount.target),
                key_line(ARTIFACT_KEY),
                markers.loaded(f"{mount.target}/{ARTIFACT}"),
                markers.compile_time(0.25),
            ]
        if behavior.exit_at_boot:
            return lines
        if bootstrap and behavior.write_artifact:
            assert mount.kind == "rw"
            (cache / ARTIFACT).parent.mkdir(parents=True, exist_ok=True)
            # Inductor is not deterministic across compiles: every bootstrap writes other bytes.
            run_id = spec.labels[labels.RUN_ID]
            (cache / ARTIFACT).write_bytes(
                f"compiled artifact of candidate {container.candidate} of run {run_id}".encode()
            )
            (cache / META).write_text(json.dumps({"key": ARTIFACT_KEY, "candidate": container.candidate}))
            lines.append(markers.saved(f"{mount.target}/{ARTIFACT}"))
        if behavior.touch_tree:
            (cache / ARTIFACT).write_bytes(b"rewritten through a leaky mount")
        return lines

    # -- bookkeeping --------------------------------------------------------------------------------

    def _call(self, method: str) -> None:
        if method in self.forbidden:
            raise AssertionError(f"{method} must not be called: {self.forbidden[method]}")
        self.calls.append(method)

    def _find(self, name: str) -> FakeContainer | None:
        return next((c for c in self.containers if c.name == name and not c.removed), None)

    def _ours(self, labels_: Mapping[str, str]) -> list[FakeContainer]:
        return [
            c
            for c in self.containers
            if not c.removed
            and labels.is_ours(dict(c.spec.labels))
            and all(c.spec.labels.get(k) == v for k, v in labels_.items())
        ]


# --- an adapter ---------------------------------------------------------------------------------------


class UnknownVersionAdapter(ReferenceAdapter):
    """The reference adapter with an engine version it has no rules for, and a replay-only env switch."""

    def for_factors(self, factors: Mapping[str, Any]) -> UnknownVersionAdapter:
        return self

    def require_known_version(self, *, allow_unknown: bool) -> None:
        if not allow_unknown:
            raise UnknownEngineVersionError("engine 9.9 has no entry", hint="--allow-unknown-engine-version")

    def replay_env(self) -> dict[str, str]:
        return {"FAKE_FORCE_LOAD": "1"}

"""bless push / pull against a registry that lies: endless bodies, false lengths, trickles.

The lies (``tests/support/lying_registry.py``) are told by the in-memory registry under the registry client
(``tests/support/registry_simulator.py``), and, for the tests marked ``ALSO_REAL``, ``REAL_ONLY`` or named
``-real``, by a lying loopback server in front of a real registry: trickles and stalls need its
real sockets, ``bless`` processes its address. Whatever a registry sends, push and pull end with a
documented refusal (never exit 1), read at most a bounded amount, and leave the host's store as it was.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bless.cli.error_hints import command_line_hint
from bless.cli.main import app
from bless.core.manifest import Manifest, tree_sha256
from bless.core.verify import FileEntry
from bless.errors import (
    ArtifactInvalidError,
    ArtifactNotFoundError,
    BlessError,
    DigestMismatchError,
    DowngradeError,
    ExitCode,
    LockHeldError,
    ManifestInvalidError,
    RegistryUnavailableError,
    TransferIncompleteError,
)
from bless.flows.pull import pull_blessing
from bless.flows.push import push_blessing
from bless.oci.artifact import ARTIFACT_TYPE, FILE_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE, digest_of
from bless.oci.client import RegistryClient, parse_reference
from bless.oci.limits import TransferLimits
from bless.store import Store
from tests.support.lying_registry import (
    Lie,
    LyingRegistry,
    declared,
    delayed,
    endless,
    reply,
    slow_headers,
    token_challenge,
    trickle,
)
from tests.support.registry_simulator import ALSO_REAL, REAL_ONLY, AnyRegistry, RegistrySimulator, on_registries
from tests.unit.store_helpers import child_env
from tests.unit.test_fleet_registry import NEW_ID, OLD_ID, assert_untouched, bless_version

REPO = Path(__file__).resolve().parents[2]
#: The most a bounded client may have read of an endless reply: its largest cap (a 4 MiB manifest)
#: plus what loopback socket buffers hold.
READ_BOUND = 16 << 20
MANIFEST = r"/v2/c/t/manifests/[^/]+"
BLOB = r"/v2/c/t/blobs/sha256:[0-9a-f]{64}"


@pytest.fixture
def origin(tmp_path: Path) -> Store:
    return Store(tmp_path / "origin")


@pytest.fixture
def host(tmp_path: Path) -> Store:
    return Store(tmp_path / "host")


@pytest.fixture
def blessed(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store) -> tuple[Manifest, Manifest]:
    """The host has the old version; the registry has the new one under c/t:new."""
    transport = registry.transport
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=transport)
    pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=transport)
    new = bless_version(origin, tmp_path, "b", NEW_ID)
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=transport)
    return old, new


# --------------------------------------------------------------------------------------------
# 1. Unbounded reads


@pytest.mark.parametrize(
    ("lie", "expected", "registry"),
    on_registries(
        {
            "manifest": (Lie("GET", MANIFEST, endless()), ArtifactInvalidError),
            "manifest-length": (Lie("GET", MANIFEST, declared(1 << 40)), ArtifactInvalidError),
            "error-404": (Lie("GET", MANIFEST, endless(404)), ArtifactNotFoundError),
            "error-500": (Lie("GET", MANIFEST, endless(500)), RegistryUnavailableError),
            "blob-error-500": (Lie("GET", BLOB, endless(500)), RegistryUnavailableError),
            "token": (Lie("GET", MANIFEST, token_challenge, times=1), RegistryUnavailableError),
            "redirect": (
                Lie("GET", MANIFEST, endless(302, {"Location": "/v2/c/t/manifests/new"})),
                RegistryUnavailableError,
            ),
            "blob-redirect": (Lie("GET", BLOB, endless(307, {"Location": "/elsewhere"})), RegistryUnavailableError),
        },
        also_real=["manifest", "token", "redirect"],
    ),
    indirect=["registry"],
)
def test_endless_replies_are_refused_after_a_bounded_read(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest], lie: Lie, expected: type[BlessError]
) -> None:
    old, _new = blessed
    token = Lie("GET", "/token", endless())
    with registry.lying(lie, token) as lying:
        with pytest.raises(expected) as info:
            pull_blessing(host, parse_reference(lying.ref("c/t:new")), workers=1, transport=lying.transport)
        assert lying.largest_reply < READ_BOUND, f"read {lying.largest_reply} bytes of an endless reply"
    assert info.value.exit_code == expected.exit_code
    assert_untouched(host, old)


def test_a_redirect_is_followed(registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]) -> None:
    """Registries send clients elsewhere (blob storage, a mirror): a redirect with a small body is followed."""
    moved = reply(b"<a>moved</a>", 307, {"Location": "/v2/c/t/manifests/new"})
    with registry.lying(Lie("GET", "/v2/c/t/manifests/moved", moved)) as lying:  # only the redirect knows it
        pulled = pull_blessing(host, parse_reference(lying.ref("c/t:moved")), transport=lying.transport)
    assert pulled.installed


@pytest.mark.parametrize(
    ("lies", "registry"),
    on_registries(
        {
            "token-list": ((Lie("GET", MANIFEST, token_challenge, times=1), Lie("GET", "/token", reply(b"[]"))),),
            "token-string": (
                (Lie("GET", MANIFEST, token_challenge, times=1), Lie("GET", "/token", reply(b'"a token"'))),
            ),
            "challenge-without-realm": ((Lie("GET", MANIFEST, reply(b"", 401, {"WWW-Authenticate": "Bearer"})),),),
        },
        also_real=["token-list"],
    ),
    indirect=["registry"],
)
def test_malformed_authentication_replies_are_refused_not_a_crash(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest], lies: tuple[Lie, ...]
) -> None:
    """oras reads the challenge and the token reply as well-formed; they came out as AttributeError (exit 1)."""
    old, _new = blessed
    with registry.lying(*lies) as lying, pytest.raises(RegistryUnavailableError, match="malformed"):
        pull_blessing(host, parse_reference(lying.ref("c/t:new")), transport=lying.transport)
    assert_untouched(host, old)


def test_an_endless_challenge_body_is_not_read(
    registry: AnyRegistry, host: Store, origin: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    """The /v2/ reply's status and header are all a client needs: pull and push go on."""
    _old, new = blessed
    with registry.lying(Lie("GET", "/v2/", endless())) as lying:
        assert pull_blessing(host, parse_reference(lying.ref("c/t:new")), transport=lying.transport).installed
        push_blessing(origin, new, parse_reference(lying.ref("c/t:again")), transport=lying.transport)
        assert lying.largest_reply < READ_BOUND


@pytest.mark.parametrize(
    ("lie", "registry"),
    on_registries(
        {
            "upload-start": (Lie("POST", r"/v2/c/t/blobs/uploads/", endless(500)),),
            "upload": (Lie("PUT", r"/v2/c/t/blobs/uploads/.*", endless(500)),),
            "manifest-put": (Lie("PUT", MANIFEST, endless(400)),),
        },
        also_real=["upload"],
    ),
    indirect=["registry"],
)
def test_push_refuses_endless_error_replies(tmp_path: Path, registry: AnyRegistry, origin: Store, lie: Lie) -> None:
    manifest = bless_version(origin, tmp_path, "c", NEW_ID)
    with registry.lying(lie) as lying:
        with pytest.raises(RegistryUnavailableError):
            push_blessing(origin, manifest, parse_reference(lying.ref("c/t:v1")), transport=lying.transport)
        assert lying.largest_reply < READ_BOUND


#: Runs the rest of argv under a 2 GiB address-space limit: a client that reads an endless body whole
#: fails there (MemoryError, exit 1), not the machine. An exec'd wrapper, not preexec_fn: this test
#: process has threads (the lying server's), and forking then running Python code is unsafe with threads.
LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@REAL_ONLY
def test_cli_pull_of_an_endless_manifest_is_exit_73_not_a_memory_error(
    tmp_path: Path, registry: AnyRegistry, blessed: tuple[Manifest, Manifest]
) -> None:
    with registry.lying(Lie("GET", MANIFEST, endless())) as lying:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                LIMITED,
                "-m",
                "bless.cli.main",
                "--root",
                str(tmp_path / "cli-host"),
                "pull",
                lying.ref("c/t:new"),
            ],
            cwd=REPO,
            env=child_env(BLESS_ROOT="", COLUMNS="250"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == ExitCode.ARTIFACT_INVALID, proc.stderr[-2000:]
    assert "larger than" in proc.stderr


# --------------------------------------------------------------------------------------------
# 2. Deadlines


#: Tight limits for the tests: a 1.5 s grace, and a rate no trickle reaches (a manifest's budget is
#: its 4 MiB cap at this rate: half a second more).
TIGHT = TransferLimits(min_rate=8 << 20, grace_s=1.5)


@pytest.mark.parametrize(
    "lie",
    [
        Lie("GET", BLOB, trickle(0.25, prefix=16)),
        Lie("GET", MANIFEST, trickle(0.25, prefix=16)),
        Lie("GET", MANIFEST, slow_headers(0.25)),
    ],
    ids=["blob-body", "manifest-body", "manifest-headers"],
)
@REAL_ONLY
def test_a_trickling_registry_is_refused_by_the_deadline(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest], lie: Lie
) -> None:
    """One byte every 0.25 s never trips the 60 s read timeout: the deadline ends it (74), staging cleaned."""
    old, _new = blessed
    with registry.lying(lie) as lying:
        with pytest.raises(TransferIncompleteError, match="did not finish within"):
            pull_blessing(host, parse_reference(lying.ref("c/t:new")), workers=1, limits=TIGHT)
        assert isinstance(lying, LyingRegistry)
        assert lying.owed > 0 and lying.sent < lying.owed, "the pull waited for the whole trickle"
    assert_untouched(host, old)


def test_the_pull_has_one_deadline_for_all_its_blobs(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    """Every blob alone is within its budget (0.6 s of 1.5 s); together they overrun the pull's."""
    old, new = blessed
    assert len(new.cache.files) >= 4
    limits = TransferLimits(min_rate=1 << 30, grace_s=1.5)
    with (
        registry.lying(Lie("GET", BLOB, delayed(0.6))) as lying,
        pytest.raises(TransferIncompleteError, match="did not finish within"),
    ):
        pull_blessing(host, parse_reference(lying.ref("c/t:new")), workers=1, limits=limits, transport=lying.transport)
    assert_untouched(host, old)


@REAL_ONLY
def test_cli_pull_takes_the_limits_and_refuses_a_trickle_with_74(
    tmp_path: Path, registry: AnyRegistry, blessed: tuple[Manifest, Manifest]
) -> None:
    with registry.lying(Lie("GET", BLOB, trickle(0.25, prefix=16))) as lying:
        args = ("pull", lying.ref("c/t:new"), "--min-rate", "1M", "--transfer-grace", "1.5")
        proc = subprocess.run(
            [sys.executable, "-m", "bless.cli.main", "--root", str(tmp_path / "cli-host"), *args],
            cwd=REPO,
            env=child_env(BLESS_ROOT="", COLUMNS="250"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == ExitCode.TRANSFER_INCOMPLETE, proc.stderr[-2000:]
    assert "--min-rate" in proc.stderr
    staging = tmp_path / "cli-host" / "staging"
    assert not staging.exists() or list(staging.iterdir()) == []
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "bless.cli.main",
            "--root",
            str(tmp_path / "cli-host"),
            "pull",
            "127.0.0.1:1/c/t:v1",
            "--min-rate",
            "fast",
        ],
        cwd=REPO,
        env=child_env(BLESS_ROOT=""),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == ExitCode.USAGE, bad.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# 3. Path sets no tree can hold


def test_pull_refuses_a_file_listed_below_another_file(
    tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store
) -> None:
    """A blessing listing ``x`` and ``x/y`` crashed the pull (FileExistsError, exit 1): it is invalid (22)."""
    base = bless_version(origin, tmp_path, "a", OLD_ID)
    document = json.loads(base.to_json_bytes())
    blobs = {"x": b"file x", "x/y": b"file x/y"}
    entries = [FileEntry(path, len(data), hashlib.sha256(data).hexdigest()) for path, data in blobs.items()]
    document["cache"].update(
        files=[{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries],
        dirs=[],
        total_size=sum(e.size for e in entries),
        tree_sha256=tree_sha256(entries, []),
    )
    config = (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    oci = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": MANIFEST_MEDIA_TYPE, "digest": digest_of(config), "size": len(config)},
        "layers": [
            {
                "mediaType": FILE_MEDIA_TYPE,
                "digest": f"sha256:{e.sha256}",
                "size": e.size,
                "annotations": {"org.opencontainers.image.title": e.path},
            }
            for e in entries
        ],
        "annotations": {"org.bless.config-hash": base.config_hash, "org.bless.dir-id": base.cache.dir_id},
    }
    client = RegistryClient(parse_reference(registry.ref("c/t:crafted")), transport=registry.transport)
    for data in (config, *blobs.values()):
        client.upload_blob(digest_of(data), len(data), data)
    client.put_manifest(json.dumps(oci).encode(), "crafted", OCI_MANIFEST_MEDIA_TYPE)
    with pytest.raises(ManifestInvalidError, match="listed as a file") as info:
        pull_blessing(host, parse_reference(registry.ref("c/t:crafted")), transport=registry.transport)
    assert info.value.exit_code == ExitCode.MANIFEST_INVALID
    assert_untouched(host, None)


# --------------------------------------------------------------------------------------------
# 7. Two pulls of one blessing at once


@REAL_ONLY
def test_two_concurrent_pulls_of_one_blessing_both_succeed_and_download_once(
    tmp_path: Path, registry: AnyRegistry, blessed: tuple[Manifest, Manifest]
) -> None:
    """Real processes; blobs arrive after 1.5 s each, so the first pull holds the lock while the second resolves."""
    _old, new = blessed
    root = tmp_path / "shared-host"
    with registry.lying(Lie("GET", BLOB, delayed(1.5))) as lying:
        command = [sys.executable, "-m", "bless.cli.main", "--root", str(root), "pull", lying.ref("c/t:new"), "--json"]
        children = [
            subprocess.Popen(
                command,
                cwd=REPO,
                env=child_env(BLESS_ROOT="", COLUMNS="250"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [child.communicate(timeout=120) for child in children]
    for child, (_stdout, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr[-2000:]
    documents = [json.loads(stdout) for stdout, _ in outputs]
    assert sorted(d["installed"] for d in documents) == [False, True]
    loser = next(d for d in documents if not d["installed"])
    assert loser["bytes_downloaded"] == 0, "the second pull waited instead of downloading everything"
    live = Store(root).find(new.config_hash)
    assert live is not None and live.cache.dir_id == NEW_ID


def test_a_pull_told_not_to_wait_names_pull_in_its_hint(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    _old, new = blessed
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:  # another writer of this config (its own thread: the lock is re-entrant per thread)
        with host.lock(new.config_hash):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(LockHeldError) as info:
            pull_blessing(host, parse_reference(registry.ref("c/t:new")), wait=False, transport=registry.transport)
        worded = command_line_hint(info.value) or ""
        assert "bless pull" in worded and "bless run --wait" not in worded
        assert info.value.exit_code == ExitCode.LOCK_HELD
    finally:
        release.set()
        holder.join()


# --------------------------------------------------------------------------------------------
# 8. The right code for what happened


@ALSO_REAL
def test_a_blob_truncated_in_registry_storage_is_altered_content_72(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    """The registry serves the shorter file whole, with its true length: no retry brings the bytes back."""
    old, new = blessed
    big = f"sha256:{next(f for f in new.cache.files if f.path == 'big.bin').sha256}"
    registry.tamper(big, registry.stored(big)[:1000])
    with pytest.raises(DigestMismatchError, match="serves it as 1000") as info:
        pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    assert "retry" not in (info.value.hint or "")
    assert_untouched(host, old)


@REAL_ONLY
def test_a_registry_stalling_mid_blob_is_a_broken_transfer_74_not_cannot_connect(
    registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    """It answered and sent 16 bytes, then nothing: the silence (the grace) ends it, as a transfer broken mid-way."""
    old, _new = blessed
    patient = TransferLimits(min_rate=1, grace_s=1.5)  # a deadline far away: the read timeout ends it
    with registry.lying(Lie("GET", BLOB, trickle(30, prefix=16))) as lying:
        with pytest.raises(TransferIncompleteError, match="stalled") as info:
            pull_blessing(host, parse_reference(lying.ref("c/t:new")), workers=1, limits=patient)
        assert isinstance(lying, LyingRegistry)
        assert lying.owed > 0 and lying.sent == 0, "the pull waited past the silence for the next byte"
    assert "cannot connect" not in info.value.message
    assert_untouched(host, old)


# --------------------------------------------------------------------------------------------
# 10. Smaller: downgrades, oras' chatter


@REAL_ONLY
def test_pulling_an_older_blessing_over_a_newer_one_needs_allow_downgrade(
    tmp_path: Path, registry: AnyRegistry, host: Store, blessed: tuple[Manifest, Manifest]
) -> None:
    """Without --trust nothing else notices a tag moved back: the pull says so and refuses (16)."""
    old, new = blessed
    pull_blessing(host, parse_reference(registry.ref("c/t:new")))
    with pytest.raises(DowngradeError, match="older than the live one") as info:
        pull_blessing(host, parse_reference(registry.ref("c/t:old")))
    assert info.value.exit_code == ExitCode.DOWNGRADE
    assert_untouched(host, new)
    runner = CliRunner(env={"COLUMNS": "250", "BLESS_ROOT": None, "BLESS_TRUST": None})
    refused = runner.invoke(app, ["--root", str(host.root), "pull", registry.ref("c/t:old")])
    assert refused.exit_code == ExitCode.DOWNGRADE, refused.stderr
    assert "--allow-downgrade" in refused.stderr
    allowed = runner.invoke(app, ["--root", str(host.root), "pull", registry.ref("c/t:old"), "--allow-downgrade"])
    assert allowed.exit_code == 0, allowed.stderr
    assert_untouched(host, old)


@REAL_ONLY
def test_no_docker_config_is_quiet(tmp_path: Path, registry: AnyRegistry, blessed: tuple[Manifest, Manifest]) -> None:
    """A host without credentials is normal for a loopback or public registry: nothing about it on stderr."""
    empty = tmp_path / "no-docker-config"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "bless.cli.main", "--root", str(tmp_path / "quiet"), "pull", registry.ref("c/t:new")],
        cwd=REPO,
        env=child_env(BLESS_ROOT="", COLUMNS="250", DOCKER_CONFIG=str(empty), HOME=str(empty)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "does not exist" not in proc.stderr


# --------------------------------------------------------------------------------------------
# Whatever a registry answers: a documented refusal, bounded in time, never exit 1


ROUTES = {"challenge": "/v2/", "manifest": MANIFEST, "blob": BLOB, "token": "/token"}
#: An honest pull here asks under ten requests; a lie redirecting to itself is followed 30 times (requests'
#: limit), a retried one a few times: more than this is a loop no limit ends.
MOST_REQUESTS_OF_A_LIED_TO_PULL = 64
fuzz_headers = st.dictionaries(
    st.sampled_from(["Content-Length", "WWW-Authenticate", "Location", "Content-Encoding", "Docker-Content-Digest"]),
    st.sampled_from(
        ["0", "5", "-1", "99999999999", "Bearer", 'Bearer realm="/token"', "Basic", "gzip", "deflate", "x", "/v2/",
         "http://[::1", "sha256:" + "0" * 64, ""]
    ),
    max_size=3,
)  # fmt: skip
fuzz_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"[]", b'"x"', b"{}", b'{"token": []}', b'{"errors": 5}', b'{"errors": [{"message": 7}]}']),
)


# In memory an example costs milliseconds (behind the lying server, half a second): ten times as many.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(route="token", status=200, headers={}, body=b"[]")
@example(route="blob", status=302, headers={}, body=b'{"errors":0}')
@given(
    route=st.sampled_from(sorted(ROUTES)),
    status=st.sampled_from([200, 202, 204, 302, 307, 400, 401, 403, 404, 416, 500, 503]),
    headers=fuzz_headers,
    body=fuzz_bodies,
)
def test_any_reply_ends_in_a_documented_refusal(
    registry: AnyRegistry,
    host: Store,
    blessed: tuple[Manifest, Manifest],
    route: str,
    status: int,
    headers: dict[str, str],
    body: bytes,
) -> None:
    old, _new = blessed
    lies = [Lie("GET", ROUTES[route], reply(body, status, headers))]
    if route == "token":  # only asked for after a challenge
        lies.insert(0, Lie("GET", MANIFEST, token_challenge, times=1))
    limits = TransferLimits(min_rate=1 << 20, grace_s=1.0)
    with registry.lying(*lies) as lying:
        try:
            pull_blessing(
                host, parse_reference(lying.ref("c/t:new")), workers=1, limits=limits, transport=lying.transport
            )
        except BlessError as exc:
            assert exc.exit_code != ExitCode.INTERNAL, exc.diagnostics()
        # Bounded work, not seconds: a pull asks a handful of requests, a redirect loop stops at requests' 30.
        assert isinstance(lying, RegistrySimulator) and lying.requests <= MOST_REQUESTS_OF_A_LIED_TO_PULL
    live = host.find(old.config_hash)
    assert live is not None
    staging = host.root / "staging"
    assert not staging.exists() or list(staging.iterdir()) == []

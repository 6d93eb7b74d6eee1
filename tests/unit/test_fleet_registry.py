"""bless push / pull against a registry, with small real blessings.

The registry is the in-memory one under the registry client (``tests/support/registry_simulator.py``); the
tests marked ``ALSO_REAL`` run against a real Docker Distribution on 127.0.0.1 as well (one per
attack class, end to end), those marked ``REAL_ONLY`` only there (``bless`` run by typer's runner or
as a process, which cannot be handed a transport).

The attack matrix: every attack is a distinct refusal, nothing is installed, and the blessing the
host already had is untouched. A registry that lies (endless or trickled bodies, false lengths,
stalls, truncated blobs, malformed auth, crafted path sets, concurrent pulls, downgrades) is in
``test_hostile_registry.py``; full and read-only disks in ``test_full_disk.py``. Crash: a pull
SIGKILLed at each step leaves the store valid (old or new) and the next pull cleans up and installs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bless.cli.main import app
from bless.core.manifest import Manifest
from bless.core.verify import verify_tree
from bless.errors import (
    ArtifactInvalidError,
    BelowThresholdError,
    BlessError,
    DigestMismatchError,
    ExitCode,
    MetadataExpiredError,
    RegistryUnavailableError,
    RollbackError,
    SignatureUntrustedError,
    TransferIncompleteError,
    UnsignedError,
)
from bless.flows.pull import PULL_STEPS, pull_blessing
from bless.flows.push import push_blessing
from bless.oci.artifact import ARTIFACT_TYPE, blessing_artifact, trust_tag
from bless.oci.client import parse_reference
from bless.store import PUBLISH_STEPS, Store
from bless.trust import RoleKeys, init_repository, sign_blessing
from tests.support.registry_simulator import ALSO_REAL, REAL_ONLY, AnyRegistry, RegistrySimulator, on_registries
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import child_env, make_factors, make_manifest, write_tree

PULL_CHILD = Path(__file__).resolve().parent / "pull_child.py"
OLD_ID = "20250101T000000Z-aaaaaaaaaaaa"
NEW_ID = "20250102T000000Z-bbbbbbbbbbbb"


def bless_version(store: Store, work: Path, variant: str, dir_id: str) -> Manifest:
    """Publish a small real blessing (same config hash for every variant: a rebless)."""
    tree = write_tree(work / f"tree-{variant}-{dir_id}", variant)
    (tree / "big.bin").write_bytes(os.urandom(1 << 20) if variant == "big" else variant.encode() * 4096)
    # A fixed creation time: the same blessing made on two hosts has the same manifest bytes.
    manifest = make_manifest(tree, dir_id=dir_id, created=f"{dir_id[:4]}-{dir_id[4:6]}-{dir_id[6:8]}T00:00:00Z")
    store.publish(tree, manifest)
    return manifest


def provision(tmp_path: Path, keys: Path) -> Path:
    trust = tmp_path / "host-trust"
    trust.mkdir(exist_ok=True)
    shutil.copy(keys / "metadata" / "root.json", trust / "root.json")
    return trust


def assert_untouched(host: Store, old: Manifest | None) -> None:
    """The host still serves exactly what it had, and no pull debris is left."""
    if old is None:
        assert host.records() == []
    else:
        live = host.find(old.config_hash)
        assert live is not None and live.cache.dir_id == old.cache.dir_id
        assert verify_tree(host.blessed_dir(live), live.cache.files, live.cache.dirs).ok
    staging = host.root / "staging"
    assert not staging.exists() or [p.name for p in staging.iterdir()] == []


@pytest.fixture
def origin(tmp_path: Path) -> Store:
    return Store(tmp_path / "origin")


@pytest.fixture
def host(tmp_path: Path) -> Store:
    return Store(tmp_path / "host")


# --------------------------------------------------------------------------------------------
# push / pull


@ALSO_REAL
def test_push_pull_roundtrip_reproducible_and_noop(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    transport = registry.transport
    manifest = bless_version(origin, tmp_path, "a", OLD_ID)
    pushed = push_blessing(origin, manifest, parse_reference(registry.ref("caches/tiny:v1")), transport=transport)
    # Reproducible: the digest is a function of the blessing alone (another host computes the same).
    assert pushed.digest == blessing_artifact(manifest).digest
    other_host = Store(tmp_path / "other-origin")
    copy = bless_version(other_host, tmp_path / "elsewhere", "a", OLD_ID)
    other_ref = parse_reference(registry.ref("caches/tiny:v1b"))
    assert push_blessing(other_host, copy, other_ref, transport=transport).digest == pushed.digest
    again = push_blessing(origin, manifest, parse_reference(registry.ref("caches/tiny:v1")), transport=transport)
    assert again.blobs_uploaded == 0 and again.bytes_uploaded == 0

    assert _get_manifest(registry, "caches/tiny", "v1")["artifactType"] == ARTIFACT_TYPE

    pulled = pull_blessing(host, parse_reference(registry.ref("caches/tiny:v1")), transport=transport)
    assert pulled.installed and pulled.digest == pushed.digest
    live = host.find(manifest.config_hash)
    assert live is not None and live.to_json_bytes() == manifest.to_json_bytes()
    assert verify_tree(host.blessed_dir(live), live.cache.files, live.cache.dirs, expect_read_only=True).ok
    assert_untouched(host, manifest)
    # Already present: a no-op, by tag or by digest.
    noop = pull_blessing(host, parse_reference(pulled.pinned), transport=transport)
    assert not noop.installed and noop.bytes_downloaded == 0


def test_rebless_moves_only_changed_files(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    transport = registry.transport
    first = bless_version(origin, tmp_path, "a", OLD_ID)
    ref = parse_reference(registry.ref("caches/tiny:prod"))
    full = push_blessing(origin, first, ref, transport=transport)
    pull_blessing(host, ref, transport=transport)
    tree = write_tree(tmp_path / "tree-rebless", "a")
    (tree / "big.bin").write_bytes(b"a" * 4096)
    (tree / "nested" / "index.json").write_text('{"variant": "changed"}\n')
    second = make_manifest(tree, dir_id=NEW_ID)
    origin.publish(tree, second)
    delta = push_blessing(origin, second, ref, transport=transport)
    assert delta.blobs_uploaded == 2  # the new manifest and the one changed file
    assert delta.bytes_uploaded < full.bytes_uploaded
    # A local copy that no longer hashes right is downloaded after all, never trusted.
    live_first = host.find(first.config_hash)
    assert live_first is not None
    kernel = host.blessed_dir(live_first) / "nested" / "deep" / "kernel.so"
    kernel.chmod(0o644)
    kernel.write_bytes(b"x" * kernel.stat().st_size)
    pulled = pull_blessing(host, ref, transport=transport)
    changed = next(f for f in second.cache.files if f.path == "nested/index.json")
    kept_but_damaged = next(f for f in second.cache.files if f.path == "nested/deep/kernel.so")
    assert pulled.installed and pulled.blobs_downloaded == 2  # the changed file and the damaged one
    assert pulled.bytes_downloaded == changed.size + kept_but_damaged.size
    live = host.find(second.config_hash)
    assert live is not None and live.cache.dir_id == NEW_ID
    assert verify_tree(host.blessed_dir(live), live.cache.files, live.cache.dirs).ok


@REAL_ONLY
def test_pull_cli_prints_the_resolved_digest(tmp_path: Path, registry: AnyRegistry, origin: Store):
    manifest = bless_version(origin, tmp_path, "a", OLD_ID)
    runner = CliRunner(env={"COLUMNS": "250", "BLESS_ROOT": None, "BLESS_TRUST": None})
    pushed = runner.invoke(
        app, ["--root", str(origin.root), "push", manifest.config_hash[:12], registry.ref("c/t:v1"), "--json"]
    )
    assert pushed.exit_code == 0, pushed.stderr
    digest = json.loads(pushed.stdout)["digest"]
    result = runner.invoke(app, ["--root", str(tmp_path / "h"), "pull", registry.ref("c/t:v1"), "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["digest"] == digest and document["installed"] is True
    assert document["trust"]["signed"] is False
    human = runner.invoke(app, ["--root", str(tmp_path / "h"), "pull", registry.ref("c/t:v1")])
    assert digest in human.stderr and "already present" in human.stderr
    missing = runner.invoke(app, ["--root", str(tmp_path / "h"), "pull", registry.ref("c/t:nope"), "--json"])
    assert missing.exit_code == ExitCode.ARTIFACT_NOT_FOUND
    bad = runner.invoke(app, ["--root", str(tmp_path / "h"), "pull", "no-registry-here", "--json"])
    assert bad.exit_code == ExitCode.USAGE


# --------------------------------------------------------------------------------------------
# Signed pulls and the attack matrix


def signed_push(registry: AnyRegistry, origin: Store, manifest: Manifest, keys: Path, ref: str, **sign: object) -> str:
    sign_blessing(keys, manifest, manifest.to_json_bytes(), **sign, sources=TEST_KEYS)  # type: ignore[arg-type]
    reference = parse_reference(ref)
    return push_blessing(
        origin, manifest, reference, metadata_dir=keys / "metadata", transport=registry.transport
    ).digest


@ALSO_REAL
def test_signed_pull_and_rollback_by_moving_the_tag(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    transport = registry.transport
    keys = tmp_path / "keys"
    init_repository(keys, sources=TEST_KEYS)
    trust = provision(tmp_path, keys)
    ref = registry.ref("caches/tiny:prod")
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    old_digest = signed_push(registry, origin, old, keys, ref)
    assert pull_blessing(host, parse_reference(ref), trust_dir=trust, transport=transport).trust is not None
    new = bless_version(origin, tmp_path, "b", NEW_ID)
    signed_push(registry, origin, new, keys, ref)
    pulled = pull_blessing(host, parse_reference(ref), trust_dir=trust, transport=transport)
    assert pulled.installed and pulled.trust is not None and pulled.trust.versions["targets"] == 3

    # The attacker moves the tag back to the older, validly signed artifact.
    old_bytes = registry.manifest_bytes("caches/tiny", old_digest)
    registry.put_manifest("caches/tiny", "prod", old_bytes)
    with pytest.raises(RollbackError):
        pull_blessing(host, parse_reference(ref), trust_dir=trust, transport=transport)
    assert_untouched(host, new)
    # ...and also points the old artifact's signatures at the newest metadata: delisted, unsigned.
    newest = push_blessing(origin, new, parse_reference(ref), metadata_dir=keys / "metadata", transport=transport)
    newest_trust = _get_manifest(registry, "caches/tiny", trust_tag(newest.digest))
    newest_trust["subject"] = {**newest_trust["subject"], "digest": old_digest, "size": len(old_bytes)}
    registry.put_manifest("caches/tiny", trust_tag(old_digest), json.dumps(newest_trust).encode())
    with pytest.raises(UnsignedError):
        pinned = parse_reference(f"{registry.ref('caches/tiny')}@{old_digest}")
        pull_blessing(host, pinned, trust_dir=trust, transport=transport)
    assert_untouched(host, new)


@pytest.mark.parametrize(
    ("attack", "registry"),
    on_registries(
        {attack: (attack,) for attack in ("expired", "untrusted-key", "below-threshold", "unsigned")},
        also_real=["untrusted-key"],
    ),
    indirect=["registry"],
)
def test_signature_attacks_are_refused_before_download(
    attack: str, tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store
):
    keys = tmp_path / "keys"
    init_repository(keys, roles={"targets": RoleKeys(3, 2)}, sources=TEST_KEYS)
    trust = provision(tmp_path, keys)
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    signed_push(registry, origin, old, keys, registry.ref("c/t:old"))
    pull_blessing(host, parse_reference(registry.ref("c/t:old")), trust_dir=trust, transport=registry.transport)
    new = bless_version(origin, tmp_path, "b", NEW_ID)
    ref = registry.ref("c/t:new")
    expected: type[BlessError]
    if attack == "expired":
        now = datetime.now(UTC) - timedelta(days=2)
        signed_push(registry, origin, new, keys, ref, now=now, expires=timedelta(days=1))
        expected = MetadataExpiredError
    elif attack == "untrusted-key":
        impostor = tmp_path / "impostor"
        init_repository(impostor, roles={"targets": RoleKeys(3, 2)}, sources=TEST_KEYS)
        signed_push(registry, origin, new, impostor, ref)
        expected = SignatureUntrustedError
    elif attack == "below-threshold":
        for path in sorted((keys / "keys").glob("targets-*.pem"))[1:]:
            path.unlink()
        signed_push(registry, origin, new, keys, ref)
        expected = BelowThresholdError
    else:
        push_blessing(origin, new, parse_reference(ref), transport=registry.transport)
        expected = UnsignedError
    with pytest.raises(expected) as info:
        pull_blessing(host, parse_reference(ref), trust_dir=trust, transport=registry.transport)
    assert info.value.exit_code == expected.exit_code
    assert_untouched(host, old)


def _get_manifest(registry: AnyRegistry, repository: str, reference: str) -> dict[str, Any]:
    document = json.loads(registry.manifest_bytes(repository, reference))
    assert isinstance(document, dict)
    return document


@ALSO_REAL
def test_registry_content_attacks(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    transport = registry.transport
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=transport)
    pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=transport)
    new = bless_version(origin, tmp_path, "b", NEW_ID)
    pushed = push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=transport)

    # A manifest swapped for another blessing's: the config blob of another config, layers unchanged.
    other_store = Store(tmp_path / "other")
    other_tree = write_tree(tmp_path / "other-tree", "b")
    (other_tree / "big.bin").write_bytes(b"b" * 4096)
    other = make_manifest(other_tree, make_factors(seed=7), dir_id=NEW_ID)
    other_store.publish(other_tree, other)
    push_blessing(other_store, other, parse_reference(registry.ref("c/t:other")), transport=transport)
    swapped = _get_manifest(registry, "c/t", "new")
    swapped["config"] = _get_manifest(registry, "c/t", "other")["config"]
    registry.put_manifest("c/t", "swapped", json.dumps(swapped).encode())
    with pytest.raises(ArtifactInvalidError):
        pull_blessing(host, parse_reference(registry.ref("c/t:swapped")), transport=transport)
    assert_untouched(host, old)

    # Crafted paths: a layer that would land outside the cache.
    for evil in ("../escape", "/etc/evil", "nested/../../x"):
        crafted = _get_manifest(registry, "c/t", "new")
        crafted["layers"][0]["annotations"]["org.opencontainers.image.title"] = evil
        registry.put_manifest("c/t", "crafted", json.dumps(crafted).encode())
        with pytest.raises(ArtifactInvalidError):
            pull_blessing(host, parse_reference(registry.ref("c/t:crafted")), transport=transport)
        assert_untouched(host, old)

    # The OCI manifest altered in the registry's storage: by digest or by tag, its bytes must hash right.
    original = registry.stored(pushed.digest)
    registry.tamper(pushed.digest, original + b" ")
    for reference in (pushed.pinned, registry.ref("c/t:new")):
        with pytest.raises(DigestMismatchError):
            pull_blessing(host, parse_reference(reference), transport=transport)
        assert_untouched(host, old)
    registry.tamper(pushed.digest, original)

    # A blob altered in the registry's storage (same length, other bytes): refused while streaming.
    big = next(f for f in new.cache.files if f.path == "big.bin")
    data = bytearray(registry.stored(f"sha256:{big.sha256}"))
    data[len(data) // 2] ^= 0xFF
    registry.tamper(f"sha256:{big.sha256}", bytes(data))
    with pytest.raises(DigestMismatchError):
        pull_blessing(host, parse_reference(pushed.pinned), transport=transport)
    assert_untouched(host, old)


@ALSO_REAL
def test_registry_down_and_killed_mid_pull(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    transport = registry.transport
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=transport)
    pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=transport)
    new = bless_version(origin, tmp_path, "big", NEW_ID)
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=transport)

    # Truncated download: the registry is killed once 256 KiB of the big blob went out (by a loopback relay).
    with registry.killed_after(256 << 10) as relay_host, pytest.raises(TransferIncompleteError):
        # One download at a time: which blob the outage hits first is then not a race.
        pull_blessing(host, parse_reference(f"{relay_host}/c/t:new"), workers=1, transport=transport)
    assert_untouched(host, old)

    # The registry is down: refused at once, nothing touched.
    with pytest.raises(RegistryUnavailableError):
        pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=transport)
    assert_untouched(host, old)


@ALSO_REAL
def test_a_pull_by_digest_of_a_blessing_present_here_needs_no_registry(
    tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store
):
    """``serve-full --from REF@sha256:...`` promises "a no-op when present": with the registry down, a digest
    whose blessing is live here is served from the store; any other reference still needs the registry."""
    transport = registry.transport
    manifest = bless_version(origin, tmp_path, "a", OLD_ID)
    pushed = push_blessing(origin, manifest, parse_reference(registry.ref("c/t:v1")), transport=transport)
    pulled = pull_blessing(host, parse_reference(registry.ref("c/t:v1")), transport=transport)
    other = bless_version(origin, tmp_path, "big", NEW_ID)  # a newer blessing, never pulled here
    registry.kill()

    noop = pull_blessing(host, parse_reference(pulled.pinned), transport=transport)
    assert not noop.installed and noop.bytes_downloaded == 0 and noop.digest == pushed.digest
    assert (noop.config_hash, noop.dir_id) == (manifest.config_hash, manifest.cache.dir_id)
    assert_untouched(host, manifest)
    with pytest.raises(RegistryUnavailableError):  # by tag: which blessing it names now is the registry's to say
        pull_blessing(host, parse_reference(registry.ref("c/t:v1")), transport=transport)
    unknown = registry.ref(f"c/t@{blessing_artifact(other).digest}")
    with pytest.raises(RegistryUnavailableError):  # a digest not live here
        pull_blessing(host, parse_reference(unknown), transport=transport)
    assert_untouched(host, manifest)


# --------------------------------------------------------------------------------------------
# Crash: SIGKILL at each step of a pull


@REAL_ONLY
def test_pull_killed_at_each_step_leaves_old_or_new(tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store):
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")))
    pull_blessing(host, parse_reference(registry.ref("c/t:old")))
    new = bless_version(origin, tmp_path, "big", NEW_ID)
    ref = registry.ref("c/t:new")
    push_blessing(origin, new, parse_reference(ref))
    points = [f"pull:{step}" for step in PULL_STEPS if step != "done"] + ["pull:download-half"]
    points += [*PUBLISH_STEPS, "rename-manifest:before-fsync"]
    for point in points:
        child = subprocess.run(
            [sys.executable, str(PULL_CHILD), str(host.root), ref, point, str(new.cache.total_size)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert child.returncode == -9, (point, child.stdout, child.stderr)
        live = host.find(old.config_hash)
        assert live is not None and live.cache.dir_id in (OLD_ID, NEW_ID), point
        assert verify_tree(host.blessed_dir(live), live.cache.files, live.cache.dirs).ok, point
        if live.cache.dir_id == NEW_ID:
            # The commit happened before the kill: put the old one back for the next point.
            host.publish(_tree_copy(origin, old, tmp_path / f"restore-{point}"), old)
    # The next pull cleans up after the dead ones and installs.
    result = pull_blessing(host, parse_reference(ref))
    assert result.installed
    assert_untouched(host, new)
    assert host.gc(dry_run=True).actions == () or all(
        "staging" not in str(action.path) for action in host.gc(dry_run=True).actions
    )


def _tree_copy(store: Store, manifest: Manifest, target: Path) -> Path:
    shutil.copytree(store.blessed_dir(manifest), target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def test_credentials_from_the_docker_config_are_used_and_never_written(
    tmp_path: Path, origin: Store, host: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a real registry with an htpasswd file."""
    from tests.support.registry import running_registry

    user, password = "fleet-user", "pw-Zq81-never-written"
    secured = running_registry(tmp_path / "secured", credentials=(user, password))
    registry = next(secured)
    try:
        manifest = bless_version(origin, tmp_path, "a", OLD_ID)
        ref = parse_reference(registry.ref("private/tiny:v1"))
        # No credentials: access denied, before anything is uploaded or installed.
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-config"))
        with pytest.raises(RegistryUnavailableError, match="access denied"):
            push_blessing(origin, manifest, ref)
        config = tmp_path / "docker-config"
        config.mkdir()
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        push_blessing(origin, manifest, ref)
        assert pull_blessing(host, ref).installed
        for root in (origin.root, host.root):
            for path in root.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    assert password.encode() not in data and token.encode() not in data, path
    finally:
        registry.stop()


def test_an_image_pull_secret_mounted_as_kubernetes_does_is_the_docker_config(
    tmp_path: Path, origin: Store, host: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The init container's credentials: a kubernetes.io/dockerconfigjson secret's ``.dockerconfigjson``
    mounted as ``config.json`` (a link into the kubelet's ``..data`` dir) under ``$DOCKER_CONFIG``."""
    user, password = "pod-user", "pw-Kx42-pull-secret"
    registry = RegistrySimulator(credentials=(user, password))
    manifest = bless_version(origin, tmp_path, "a", OLD_ID)
    ref = parse_reference(registry.ref("private/pod:v1"))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    dockerconfigjson = json.dumps({"auths": {registry.host: {"username": user, "password": password, "auth": token}}})
    secret = tmp_path / "registry-auth"
    data = secret / "..2026_11_24_00_00_00.000000001"
    data.mkdir(parents=True)
    (data / "config.json").write_text(dockerconfigjson)
    (secret / "..data").symlink_to(data.name)
    (secret / "config.json").symlink_to("..data/config.json")
    monkeypatch.setenv("DOCKER_CONFIG", str(secret))
    push_blessing(origin, manifest, ref, transport=registry)
    assert pull_blessing(host, ref, transport=registry).installed


@ALSO_REAL
def test_parallel_uploads_push_each_missing_blob_once_and_the_same_artifact(
    tmp_path: Path, registry: AnyRegistry, origin: Store, host: Store
) -> None:
    transport = registry.transport
    manifest = bless_version(origin, tmp_path, "a", OLD_ID)
    serial = push_blessing(
        origin, manifest, parse_reference(registry.ref("c/serial:v1")), transport=transport, workers=1
    )
    parallel = push_blessing(
        origin, manifest, parse_reference(registry.ref("c/parallel:v1")), transport=transport, workers=4
    )
    assert parallel.digest == serial.digest
    assert parallel.blobs_uploaded == serial.blobs_uploaded == serial.blobs_total  # a new repository: every blob
    assert parallel.bytes_uploaded == serial.bytes_uploaded
    pulled = pull_blessing(host, parse_reference(registry.ref("c/parallel:v1")), transport=transport)
    assert pulled.installed and pulled.digest == serial.digest


def test_a_failed_parallel_upload_is_raised_and_no_manifest_is_tagged(
    tmp_path: Path, origin: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bless.errors import RegistryUnavailableError
    from bless.oci.client import RegistryClient

    registry = RegistrySimulator()
    manifest = bless_version(origin, tmp_path, "big", OLD_ID)
    real_upload = RegistryClient.upload_blob
    manifests_put: list[str] = []

    def failing_upload(self: RegistryClient, digest: str, size: int, source: Path | bytes) -> None:
        if size == 1 << 20:  # big.bin: the one blob of its size
            raise RegistryUnavailableError("the registry dropped the upload")
        real_upload(self, digest, size, source)

    monkeypatch.setattr(RegistryClient, "upload_blob", failing_upload)
    monkeypatch.setattr(RegistryClient, "put_manifest", lambda self, *a: manifests_put.append("put"))
    with pytest.raises(RegistryUnavailableError, match="dropped the upload"):
        push_blessing(
            origin, manifest, parse_reference(registry.ref("c/t:v1")), transport=registry.transport, workers=4
        )
    assert manifests_put == [], "a blessing whose blobs did not all arrive is never tagged"

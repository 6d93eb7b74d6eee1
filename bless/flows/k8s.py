"""``bless k8s render``: the Kubernetes manifests that serve one blessing (see :mod:`bless.k8s.documents`).

The blessing's manifest comes from the local store when it holds the pushed blessing (a stored manifest whose
reproducible OCI manifest has the digest of ``--from``: the same bytes the registry serves), and otherwise from the
registry by digest (the OCI manifest and its config blob only, not the cache's files). The hardware factor it was
proven on becomes the pods' node affinity, and the profile must be the one it was made from. Nothing is written
anywhere.

The **dry form** (``dry_run``) reads no blessing at all, for a blessing not at hand (a tensor-parallel profile
blessed on GPUs elsewhere, its registry out of reach): the config hash and the hardware are the profile's own,
resolved from its declarations (``[hardware]``, ``[runtime]``, ``[model]``) without probing, as ``bless hash``
does. Nothing is checked against ``--from``: in the pod, serve-full refuses a blessing whose config hash is not
the profile's (20), and the init container's pull checks the signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from bless.core.factors import diff_factors
from bless.core.manifest import Manifest
from bless.core.profile import Profile, parse_profile, read_profile
from bless.core.untrusted_text import shown
from bless.engines import get_adapter
from bless.engines.base import EngineAdapter
from bless.errors import BlessError, InputInvalidError, RegistryUnavailableError
from bless.flows.resolve import resolve_as_blessed, resolve_for_command
from bless.k8s.documents import Blessing, K8sOptions, K8sRendered, check_secret_env, render, require_digest
from bless.oci.artifact import blessing_artifact
from bless.oci.client import Reference, RegistryClient, Transport, parse_reference
from bless.oci.limits import DEFAULT_LIMITS, TransferLimits
from bless.store import Store
from bless.system.user_files import read_input
from bless.trust.metadata import parse_root

__all__ = ["render_blessing"]

#: A trusted root.json is a few KiB; a ConfigMap holds at most 1 MiB.
_ROOT_JSON_MAX = 512 * 1024


def render_blessing(
    profile_path: Path,
    options: K8sOptions,
    *,
    trust_dir: Path | None = None,
    store: Store | None = None,
    plain_http: bool | None = None,
    limits: TransferLimits = DEFAULT_LIMITS,
    transport: Transport | None = None,
    dry_run: bool = False,
) -> K8sRendered:
    """Render ``options.artifact`` served with the profile at ``profile_path``.

    ``trust_dir``: a directory holding the trusted ``root.json``, rendered as the trust ConfigMap
    (without it the Deployment names an existing one, ``options.trust_configmap``). ``store``: where to
    look for the blessing first (a stored manifest whose OCI manifest digest is the one pinned: no
    registry is contacted); None, or not there: the registry. ``transport``: what carries the registry
    client's requests (None: the network).
    """
    raw = read_profile(profile_path)  # read once: the ConfigMap holds the bytes that were validated
    profile = parse_profile(raw, profile_path)
    profile_text = raw.decode("utf-8")  # parse_profile refused anything else
    if trust_dir is not None:
        options = _with_trust_root(options, trust_dir)
    adapter = get_adapter(profile.engine)
    secret_env = sorted(name for name in profile.env if adapter.env_policy.is_secret(name))
    check_secret_env(profile, options, secret_env)  # before any request: a secret is refused offline too
    require_digest(options.artifact)  # before any request: a tag is never even looked up
    reference = parse_reference(options.artifact)
    if dry_run:
        return _dry_render(profile, profile_path, profile_text, adapter, options, secret_env)
    manifest = _stored_blessing(store, reference) if store is not None else None
    if manifest is not None and store is not None:
        read_from = f"the local store {shown(str(store.root))} (no registry contacted)"
    else:
        manifest = _registry_blessing(reference, store, plain_http=plain_http, limits=limits, transport=transport)
        read_from = f"the registry {shown(reference.registry)}"
    if manifest.profile_name == profile.name:  # another name: render's own refusal says so
        check_config_hash(profile, adapter, manifest, artifact=options.artifact)
    rendered = render(
        profile,
        profile_text,
        Blessing.of(manifest),
        options,
        cache_path=adapter.cache_mount_path,
        secret_env=secret_env,
    )
    return dataclasses.replace(rendered, blessing_read_from=read_from)


def _dry_render(
    profile: Profile,
    profile_path: Path,
    profile_text: str,
    adapter: EngineAdapter,
    options: K8sOptions,
    secret_env: list[str],
) -> K8sRendered:
    """The documents from the profile alone: its config hash and hardware as declared (no blessing read)."""
    resolution = resolve_for_command(profile, image_resolver=None, hardware="declared", offline=True, adapter=adapter)
    hardware = resolution.resolved.factors.get("hardware")
    blessing = Blessing(
        profile_name=profile.name,
        config_hash=resolution.config_hash,
        dir_id="",
        hardware=dict(hardware) if isinstance(hardware, Mapping) else {},
    )
    rendered = render(
        profile, profile_text, blessing, options, cache_path=adapter.cache_mount_path, secret_env=secret_env
    )
    note = (
        f"dry form: no blessing was read; config hash {resolution.config_hash[:16]}... and the node affinity are "
        f"{shown(str(profile_path))}'s own declaration; the pod serves --from only if it is that config's blessing"
    )
    return dataclasses.replace(rendered, warnings=(note, *rendered.warnings), blessing_read_from="nowhere (dry form)")


def _registry_blessing(
    reference: Reference,
    store: Store | None,
    *,
    plain_http: bool | None,
    limits: TransferLimits,
    transport: Transport | None,
) -> Manifest:
    """The blessing's manifest from the registry; a registry that cannot be reached says where else it could be."""
    try:
        client = RegistryClient(reference, plain_http=plain_http, limits=limits, transport=transport)
        return client.resolve_blessing(reference)[1]
    except RegistryUnavailableError as exc:
        not_stored = f"; the store {shown(str(store.root))} holds no blessing pushed as it" if store else ""
        raise RegistryUnavailableError(
            f"{exc.message}{not_stored}",
            hint=f"{exc.hint + '; ' if exc.hint else ''}or render where the blessing is stored (the store it was "
            "pushed from, or one it was pulled into): that needs no registry",
            details=exc.details,
            remedy=exc.remedy,
        ) from None


def _stored_blessing(store: Store, reference: Reference) -> Manifest | None:
    """The stored blessing whose OCI artifact is the one ``reference`` pins, or None.

    The artifact is reproducible (:mod:`bless.oci.artifact`): a stored manifest whose OCI manifest hashes to the
    pinned digest is byte for byte what the registry serves under it, so reading it here is reading it there.
    A manifest that does not validate is never a match (it could not have been pushed), and a store that cannot be
    read holds nothing here: the registry is asked, as without a store.
    """
    try:
        records = store.index().records
    except BlessError:
        return None
    for record in records:
        if record.manifest is not None and blessing_artifact(record.manifest).digest == reference.digest:
            return record.manifest
    return None


def _with_trust_root(options: K8sOptions, trust_dir: Path) -> K8sOptions:
    path = trust_dir / "root.json"
    data = read_input(
        path,
        what="trusted root",
        limit=_ROOT_JSON_MAX,
        hint="the trust directory holds the trusted root.json (from trust init)",
        remedy="k8s_trust_dir",
    )
    parse_root(data, f"--trust {shown(str(path))}")  # TUF root metadata, or 66 (not rendered into a ConfigMap)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputInvalidError(f"{path} is not UTF-8 text") from None
    return dataclasses.replace(options, trust_root_json=text)


def check_config_hash(profile: Profile, adapter: EngineAdapter, manifest: Manifest, *, artifact: str) -> None:
    """Refuse ``profile`` unless it resolves to the blessing's config hash.

    What only the pod can see (the engine image's Python environment, the GPUs, a local model's
    content, a revision name's commit) is taken from the blessing; everything the profile says (serve
    arguments, hashed env, model id and revision, engine switches) must hash to the blessing's. A
    profile with another seed, say, would be served under this blessing's name and refused in the pod.
    """
    blessed = manifest.factors
    try:
        resolved = resolve_as_blessed(profile, adapter, blessed)
    except BlessError as exc:
        raise InputInvalidError(
            f"{profile.label} cannot be checked against the blessing at {artifact}: {exc.message}",
            hint="render with the profile that blessing was made from",
        ) from None
    if resolved.config_hash != manifest.config_hash:
        changes = "; ".join(change.describe() for change in diff_factors(blessed, resolved.factors)[:5])
        raise InputInvalidError(
            f"{profile.label} resolves to config hash {resolved.config_hash[:16]}..., not the blessing's "
            f"{manifest.config_hash[:16]}... ({changes})",
            hint="render with the profile that blessing was made from (the pod's serve would refuse this one)",
            remedy="k8s_blessing_profile",
        )

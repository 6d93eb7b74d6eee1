"""Fleet commands: ``bless trust init|rotate``, ``bless sign`` (TUF), ``bless push`` and ``bless pull`` (OCI)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from bless.cli import render
from bless.cli.boundary import Report, command
from bless.cli.common import JsonOption, app_state, lookup_live, lookup_manifest, reading_store
from bless.errors import UsageError
from bless.flows.sign import sign_stored_blessing
from bless.oci.limits import DEFAULT_LIMITS, DEFAULT_MIN_RATE, TransferLimits, parse_rate
from bless.store import Store
from bless.trust import (
    DEFAULT_EXPIRES,
    DEFAULT_ROOT_EXPIRES,
    KeySources,
    RoleKeys,
    init_repository,
    parse_duration,
    rotate_role,
    trust_report,
)
from bless.trust.keys import HSM_PIN_ENV, PASSPHRASE_ENV, SIGNER_SCHEMES, has_encrypted_keys, parse_signer_option

# The registry client (oras, requests) is imported by the commands that talk to a registry, not by
# every bless command: run, verify and serve-full without --from neither need it nor pay its import.
if TYPE_CHECKING:
    from bless.flows.pull import PullResult
    from bless.flows.serve import Fetched

TrustOption = Annotated[
    Path | None,
    typer.Option(
        "--trust",
        envvar="BLESS_TRUST",
        help="Directory holding the trusted TUF root.json: refuse blessings that are not validly signed, "
        "fresh and current (env BLESS_TRUST).",
        file_okay=False,
    ),
]
KeysOption = Annotated[
    Path,
    typer.Option("--keys", help="The signing repository (bless trust init --keys DIR).", file_okay=False),
]
ExpiresOption = Annotated[
    str,
    typer.Option(
        "--expires",
        help=f"How long the signed targets, snapshot and timestamp stay valid (default {DEFAULT_EXPIRES.days}d).",
    ),
]

SignerOption = Annotated[
    list[str] | None,
    typer.Option(
        "--signer",
        metavar="ROLE=URI",
        help="A key of ROLE held outside DIR/keys, as a securesystemslib signer URI "
        f"({', '.join(SIGNER_SCHEMES)}), e.g. targets=hsm:2?label=bless; repeatable. An HSM's PIN comes from "
        f"{HSM_PIN_ENV} (or a prompt).",
        show_default=False,
    ),
]
UnencryptedKeysOption = Annotated[
    bool,
    typer.Option(
        "--unencrypted-keys",
        help=f"Write new file keys unencrypted when no passphrase is given ({PASSPHRASE_ENV} or the prompt); "
        "without it such a key is refused.",
    ),
]


def _pin_handler(message: str) -> str:
    """An HSM's user PIN: BLESS_HSM_PIN, else asked on a terminal (a signer calls this when it needs it)."""
    pin = os.environ.get(HSM_PIN_ENV)
    if pin:
        return pin
    if sys.stdin.isatty():
        return str(typer.prompt(message, hide_input=True, err=True))
    raise UsageError(f"the signer needs a PIN and {HSM_PIN_ENV} is not set", hint=f"set {HSM_PIN_ENV}")


def key_sources(signers: list[str] | None, *, passphrase_needed: bool, confirm: bool, unencrypted: bool) -> KeySources:
    """``--signer``, ``--unencrypted-keys`` and the file keys' passphrase (BLESS_KEY_PASSPHRASE, else a prompt on a
    terminal when ``passphrase_needed``) as the library's :class:`KeySources`."""
    uris = parse_signer_option(signers or [])
    text = os.environ.get(PASSPHRASE_ENV)
    if text is not None and not text:
        raise UsageError(f"{PASSPHRASE_ENV} is set and empty", hint="set it to the passphrase, or unset it")
    if text is None and passphrase_needed and sys.stdin.isatty():
        text = str(
            typer.prompt("Passphrase of the signing keys", hide_input=True, confirmation_prompt=confirm, err=True)
        )
    passphrase = text.encode("utf-8") if text else None
    return KeySources(uris, passphrase, unencrypted, _pin_handler)


#: The root's validity: set where a root version is written (trust init, trust rotate), never by bless sign.
RootExpiresOption = Annotated[
    str,
    typer.Option(
        "--root-expires", help=f"How long the new root version stays valid (default {DEFAULT_ROOT_EXPIRES.days}d)."
    ),
]

PlainHttpOption = Annotated[
    bool | None,
    typer.Option(
        "--plain-http/--https",
        help="Talk HTTP instead of HTTPS (default: HTTP only for loopback registries such as localhost:5000).",
        show_default=False,
    ),
]

#: How slow a registry may be before a pull is refused as a broken transfer (74): bless.oci.client.TransferLimits.
MinRateOption = Annotated[
    str,
    typer.Option(
        "--min-rate",
        envvar="BLESS_MIN_RATE",
        help="Slowest transfer accepted, bytes/s with k, M or G (env BLESS_MIN_RATE): each blob, and the whole "
        "pull, must finish within --transfer-grace plus its size at this rate.",
    ),
]
TransferGraceOption = Annotated[
    float,
    typer.Option(
        "--transfer-grace",
        envvar="BLESS_TRANSFER_GRACE",
        min=1.0,
        help="Seconds every registry exchange gets on top of its size at --min-rate (env BLESS_TRANSFER_GRACE).",
    ),
]


def transfer_limits(min_rate: str, grace_s: float) -> TransferLimits:
    """The ``--min-rate`` / ``--transfer-grace`` options as limits (a bad rate is a usage error)."""
    return TransferLimits(min_rate=parse_rate(min_rate), grace_s=grace_s)


PullWaitOption = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="Queue behind another pull or run of the same config for its lock (default), or refuse at once (exit 11).",
    ),
]

AllowDowngradeOption = Annotated[
    bool,
    typer.Option(
        "--allow-downgrade",
        help="Replace the live blessing of the config even when the pulled one was created before it (else exit 16).",
    ),
]

trust_app = typer.Typer(
    name="trust",
    help="Create and rotate the TUF keys that sign blessings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def render_trust(console: Console, trust: Mapping[str, Any]) -> None:
    """One line: signed (target, versions, expiry) or the unsigned note as a warning."""
    if trust.get("signed"):
        versions = ", ".join(f"{role} v{version}" for role, version in trust["versions"].items())
        console.print(
            Text.assemble(("signed", "bold green"), f" {trust['target']} ({versions}; expires {trust['expires']})")
        )
    else:
        console.print(Text(f"note: {trust['note']}", style="yellow"))


def _render_init(console: Console, data: Mapping[str, Any]) -> None:
    console.print(Text.assemble(("created", "bold green"), f" TUF roles and keys in {data['keys_dir']}"))
    for role, spec in data["roles"].items():
        held = data["signers"].get(role)
        where = f"held by {', '.join(held)}" if held else ("encrypted files" if data["encrypted_keys"] else "files")
        console.print(f"  {role}: {spec['threshold']} of {spec['keys']} key(s), {where}", markup=False)
    if data["key_files"] and not data["encrypted_keys"]:
        console.print(Text("warning: the file keys are NOT encrypted (--unencrypted-keys)", style="yellow"))
    console.print(
        f"Provision serving hosts with {data['root']} (their --trust directory); keep {data['keys_dir']}/keys private."
    )


@command
def trust_init_command(
    ctx: typer.Context,
    keys: KeysOption,
    root_keys: Annotated[int, typer.Option("--root-keys", min=1, help="Number of root keys.")] = 1,
    root_threshold: Annotated[int, typer.Option("--root-threshold", min=1, help="Root signatures required.")] = 1,
    targets_keys: Annotated[int, typer.Option("--targets-keys", min=1, help="Number of targets keys.")] = 1,
    targets_threshold: Annotated[
        int, typer.Option("--targets-threshold", min=1, help="Targets signatures required.")
    ] = 1,
    signer: SignerOption = None,
    unencrypted_keys: UnencryptedKeysOption = False,
    expires: ExpiresOption = f"{DEFAULT_EXPIRES.days}d",
    root_expires: RootExpiresOption = f"{DEFAULT_ROOT_EXPIRES.days}d",
    json_output: JsonOption = False,
) -> Report:
    """Create the TUF roles (root, targets, snapshot, timestamp) and their keys in DIR.

    A role named by --signer ROLE=URI uses that key (an HSM, a KMS: its public key is read from there);
    every other role gets Ed25519 file keys in DIR/keys (mode 0600), encrypted with the passphrase from
    BLESS_KEY_PASSPHRASE or a prompt (unencrypted only with --unencrypted-keys). Signed metadata goes to
    DIR/metadata; DIR/metadata/root.json is what serving hosts are provisioned with. Existing keys or
    metadata are never overwritten.
    """
    uris = parse_signer_option(signer or [])
    file_roles = {"root", "targets", "snapshot", "timestamp"} - set(uris)
    sources = key_sources(signer, passphrase_needed=bool(file_roles), confirm=True, unencrypted=unencrypted_keys)
    result = init_repository(
        keys,
        roles={
            "root": RoleKeys(root_keys, root_threshold),
            "targets": RoleKeys(targets_keys, targets_threshold),
        },
        sources=sources,
        expires=parse_duration(expires),
        root_expires=parse_duration(root_expires),
    )
    data = {
        "keys_dir": str(result.keys_dir),
        "root": str(result.metadata_dir / "root.json"),
        "key_files": [str(path) for path in result.key_files],
        "encrypted_keys": result.encrypted,
        "signers": {role: list(held) for role, held in result.signers.items()},
        "roles": {role: {"keys": spec.keys, "threshold": spec.threshold} for role, spec in result.roles.items()},
    }
    return Report(data, _render_init)


def _render_sign(console: Console, data: Mapping[str, Any]) -> None:
    versions = ", ".join(f"{role} v{version}" for role, version in data["versions"].items())
    what = data["target"] or "rotated keys"
    console.print(Text.assemble(("signed", "bold green"), f" {what} ({versions}); expires {data['expires']}"))
    for removed in data["removed_targets"]:
        console.print(f"  delisted older version {removed} (sign with --keep-previous to keep it)")
    for warning in data["warnings"]:
        console.print(Text(f"warning: {warning}", style="yellow"))
    if "model_signing" in data:
        console.print(f"  Model Signing bundle {data['model_signing']['bundle']}; outside tools check it with:")
        console.print(f"    {data['model_signing']['verify_command']}", markup=False)


@command
def trust_rotate_command(
    ctx: typer.Context,
    keys: KeysOption,
    role: Annotated[str, typer.Option("--role", help="root, targets, snapshot or timestamp.")],
    signer: SignerOption = None,
    new_signer: Annotated[
        list[str] | None,
        typer.Option(
            "--new-signer",
            metavar="URI",
            help="A new key of --role held by a signer (HSM, KMS), instead of fresh file keys; repeatable.",
            show_default=False,
        ),
    ] = None,
    unencrypted_keys: UnencryptedKeysOption = False,
    expires: ExpiresOption = f"{DEFAULT_EXPIRES.days}d",
    root_expires: RootExpiresOption = f"{DEFAULT_ROOT_EXPIRES.days}d",
    json_output: JsonOption = False,
) -> Report:
    """Replace a role's keys in a new root version (signed by the old and new root keys) and re-sign.

    Hosts provisioned with an older root follow the rotation on their next verification; metadata
    signed with the revoked keys is refused from then on. The new root version expires after
    --root-expires (whatever the role rotated: every rotation writes a new root). The new keys are those of
    --new-signer, or fresh file keys encrypted like trust init's. The old keys sign from DIR/keys and --signer.
    """
    new_uris = tuple(new_signer or ())
    for uri in new_uris:
        parse_signer_option([f"{role}={uri}"])  # the same checks as --signer's (scheme, role)
    sources = key_sources(
        signer,
        passphrase_needed=not new_uris or has_encrypted_keys(keys),
        confirm=not new_uris and not has_encrypted_keys(keys),
        unencrypted=unencrypted_keys,
    )
    result = rotate_role(
        keys,
        role,
        sources=sources,
        new_signers=new_uris,
        expires=parse_duration(expires),
        root_expires=parse_duration(root_expires),
    )
    return Report(result.to_dict(), _render_sign)


@command
def sign_command(
    ctx: typer.Context,
    config_hash: Annotated[str, typer.Argument(help="Config hash, or a unique prefix of at least 8 hex digits.")],
    keys: KeysOption,
    signer: SignerOption = None,
    expires: ExpiresOption = f"{DEFAULT_EXPIRES.days}d",
    keep_previous: Annotated[
        bool,
        typer.Option("--keep-previous", help="Keep older signed versions of this config listed (default: delist)."),
    ] = False,
    model_signing: Annotated[
        bool,
        typer.Option(
            "--model-signing",
            help="Also write an OpenSSF Model Signing bundle of the tree (ECDSA P-256) for outside tools.",
        ),
    ] = False,
    json_output: JsonOption = False,
) -> Report:
    """Sign a blessing: its manifest becomes a TUF target (new targets/snapshot/timestamp versions).

    The manifest names every file's size and sha256, so the signature covers the whole tree. A
    re-blessed config's older versions are delisted unless --keep-previous. The keys: the file keys of
    DIR/keys (passphrase from BLESS_KEY_PASSPHRASE or a prompt) and those named by --signer ROLE=URI.
    """
    sources = key_sources(signer, passphrase_needed=has_encrypted_keys(keys), confirm=False, unencrypted=False)
    store = reading_store(ctx)
    outcome = sign_stored_blessing(
        store,
        lookup_live(store, config_hash),
        keys,
        expires=parse_duration(expires),
        sources=sources,
        keep_previous=keep_previous,
        model_signing=model_signing,
    )
    return Report(outcome.to_dict(), _render_sign)


def _render_push(console: Console, data: Mapping[str, Any]) -> None:
    console.print(Text.assemble(("pushed", "bold green"), f" {data['reference']}"))
    console.print(f"  digest {data['digest']}  (pull by digest: {data['pinned']})")
    # Only when some blobs were skipped: "had the rest" after uploading all of them reads as a contradiction.
    had_some = data["blobs_uploaded"] < data["blobs_total"]
    console.print(
        f"  {data['blobs_uploaded']} of {data['blobs_total']} blobs uploaded, "
        f"{render.human_bytes(data['bytes_uploaded'])} of {render.human_bytes(data['bytes_total'])}"
        + (" (the registry had the rest)" if had_some else "")
    )
    if data["signatures"]:
        console.print(f"  signatures (TUF metadata) under tag {data['signatures']}")
    else:
        console.print(Text("note: pushed without signatures (--metadata DIR attaches them)", style="yellow"))


@command
def push_command(
    ctx: typer.Context,
    config_hash: Annotated[str, typer.Argument(help="Config hash, or a unique prefix of at least 8 hex digits.")],
    reference: Annotated[str, typer.Argument(help="REGISTRY/REPOSITORY[:TAG], e.g. localhost:5000/caches/llama:v1.")],
    metadata: Annotated[
        Path | None,
        typer.Option(
            "--metadata",
            help="Attach the TUF metadata that signs this blessing (the signing repository's DIR/metadata).",
            file_okay=False,
        ),
    ] = None,
    plain_http: PlainHttpOption = None,
    json_output: JsonOption = False,
) -> Report:
    """Push a blessing to an OCI registry as a reproducible artifact (application/vnd.bless.cache.v1).

    The blessed tree is verified first. One blob per file (reblesses share unchanged files' blobs), the
    manifest as config; the same blessing pushed from any host has the same digest. Credentials come
    from the docker config (docker login); none is ever written anywhere by bless.
    """
    from bless.flows.push import push_blessing
    from bless.oci.client import parse_reference

    store = reading_store(ctx)
    manifest = lookup_manifest(store, config_hash)
    result = push_blessing(store, manifest, parse_reference(reference), metadata_dir=metadata, plain_http=plain_http)
    return Report(result.to_dict(), _render_push)


def pull_report(result: PullResult) -> dict[str, Any]:
    """The JSON of a pull (also embedded in serve-full --from's)."""
    return {**result.to_dict(), "trust": trust_report(result.trust)}


def render_pull(console: Console, data: Mapping[str, Any]) -> None:
    """A pull: installed or already present, the resolved digest, the trust verdict."""
    if data["installed"]:
        console.print(
            Text.assemble(
                ("pulled", "bold green"),
                f" {data['config_hash'][:16]}... ({data['dir_id']}): {data['blobs_downloaded']} blobs, "
                f"{render.human_bytes(data['bytes_downloaded'])}, verified and installed",
            )
        )
    else:
        console.print(
            Text.assemble(("already present", "bold green"), f" {data['config_hash'][:16]}... ({data['dir_id']})")
        )
    console.print(f"  resolved {data['reference']} -> {data['digest']}")
    render_trust(console, data["trust"])


@command
def pull_command(
    ctx: typer.Context,
    reference: Annotated[
        str, typer.Argument(help="REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST (preferred).")
    ],
    trust: TrustOption = None,
    plain_http: PlainHttpOption = None,
    min_rate: MinRateOption = DEFAULT_MIN_RATE,
    transfer_grace: TransferGraceOption = DEFAULT_LIMITS.grace_s,
    wait: PullWaitOption = True,
    allow_downgrade: AllowDowngradeOption = False,
    json_output: JsonOption = False,
) -> Report:
    """Pull a blessing into the store: every blob checked while it streams, installed atomically.

    With --trust DIR the blessing must be a validly signed, fresh, current TUF target (exit 60-66) before
    any file is downloaded. A blessing already present is a no-op. A tag is resolved to a digest, printed
    (--json: "digest" and "pinned").
    """
    from bless.flows.pull import pull_blessing
    from bless.oci.client import parse_reference

    store = app_state(ctx).store()
    limits = transfer_limits(min_rate, transfer_grace)
    result = pull_blessing(
        store,
        parse_reference(reference),
        trust_dir=trust,
        plain_http=plain_http,
        limits=limits,
        wait=wait,
        allow_downgrade=allow_downgrade,
    )
    return Report(pull_report(result), render_pull)


@dataclass(frozen=True)
class FleetSource:
    """serve-full's ``--from REF`` / ``--trust DIR``: the options; the serve flow pulls through :meth:`fetcher`."""

    reference: str | None = None
    trust: Path | None = None
    plain_http: bool | None = None
    min_rate: str = DEFAULT_MIN_RATE
    transfer_grace: float = DEFAULT_LIMITS.grace_s

    def fetcher(self, console: Console) -> Callable[[Store], Fetched] | None:
        """``--from``'s pull for the serve flow (rendered as it happens); None without ``--from``."""
        reference = self.reference
        if reference is None:
            return None

        def fetch(store: Store) -> Fetched:
            from bless.flows.pull import pull_blessing
            from bless.flows.serve import Fetched
            from bless.oci.client import parse_reference

            result = pull_blessing(
                store,
                parse_reference(reference),
                trust_dir=self.trust,
                plain_http=self.plain_http,
                limits=transfer_limits(self.min_rate, self.transfer_grace),
            )
            report = pull_report(result)
            render_pull(console, report)
            return Fetched(reference=reference, config_hash=result.config_hash, dir_id=result.dir_id, report=report)

        return fetch


#: The ``trust`` sub-commands.
TRUST_COMMANDS = (("init", trust_init_command), ("rotate", trust_rotate_command))
for _name, _command in TRUST_COMMANDS:
    trust_app.command(_name)(_command)

__all__ = [
    "AllowDowngradeOption",
    "FleetSource",
    "MinRateOption",
    "PlainHttpOption",
    "PullWaitOption",
    "TransferGraceOption",
    "TrustOption",
    "pull_command",
    "pull_report",
    "push_command",
    "render_pull",
    "render_trust",
    "sign_command",
    "transfer_limits",
    "trust_app",
    "trust_report",
]

"""Signing commands: ``bless trust init|rotate`` (the TUF roles and keys) and ``bless sign`` (a blessing
becomes a signed TUF target); the ``--trust DIR`` option of the commands that check signatures, and the
one-line view of a trust verdict."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from bless.cli.boundary import Report, command
from bless.cli.common import JsonOption, reading_store
from bless.errors import UsageError
from bless.flows.sign import sign_named_blessing
from bless.flows.trust import init_trust, rotate_trust
from bless.trust import DEFAULT_EXPIRES, DEFAULT_ROOT_EXPIRES, RoleKeys
from bless.trust.keys import HSM_PIN_ENV, PASSPHRASE_ENV, SIGNER_SCHEMES, KeyAccess

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
#: The root's validity: set where a root version is written (trust init, trust rotate), never by bless sign.
RootExpiresOption = Annotated[
    str,
    typer.Option(
        "--root-expires", help=f"How long the new root version stays valid (default {DEFAULT_ROOT_EXPIRES.days}d)."
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


def _passphrase(needed: bool, confirm: bool) -> bytes | None:
    """The file keys' passphrase: BLESS_KEY_PASSPHRASE, else (when ``needed``) asked on a terminal."""
    text = os.environ.get(PASSPHRASE_ENV)
    if text is not None and not text:
        raise UsageError(f"{PASSPHRASE_ENV} is set and empty", hint="set it to the passphrase, or unset it")
    if text is None and needed and sys.stdin.isatty():
        text = str(
            typer.prompt("Passphrase of the signing keys", hide_input=True, confirmation_prompt=confirm, err=True)
        )
    # Bytes that are not UTF-8 come through as they were (surrogateescape): the library refuses them in words.
    return text.encode("utf-8", "surrogateescape") if text else None


def key_access(signers: list[str] | None, *, unencrypted: bool = False) -> KeyAccess:
    """``--signer`` and ``--unencrypted-keys`` as the library's :class:`KeyAccess`: the passphrase from
    BLESS_KEY_PASSPHRASE or a prompt on a terminal, an HSM's PIN from BLESS_HSM_PIN or a prompt."""
    return KeyAccess(tuple(signers or ()), _passphrase, unencrypted, _pin_handler)


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
    created = init_trust(
        keys,
        root=RoleKeys(root_keys, root_threshold),
        targets=RoleKeys(targets_keys, targets_threshold),
        access=key_access(signer, unencrypted=unencrypted_keys),
        expires=expires,
        root_expires=root_expires,
    )
    return Report(created.to_dict(), _render_init)


def render_signing(console: Console, data: Mapping[str, Any]) -> None:
    """A signing (``bless sign``, ``trust rotate``): the target and versions, what was delisted, warnings."""
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
    result = rotate_trust(
        keys,
        role,
        access=key_access(signer, unencrypted=unencrypted_keys),
        new_signers=tuple(new_signer or ()),
        expires=expires,
        root_expires=root_expires,
    )
    return Report(result.to_dict(), render_signing)


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
    outcome = sign_named_blessing(
        reading_store(ctx),
        config_hash,
        keys,
        access=key_access(signer),
        expires=expires,
        keep_previous=keep_previous,
        model_signing=model_signing,
    )
    return Report(outcome.to_dict(), render_signing)


#: The ``trust`` sub-commands.
TRUST_COMMANDS = (("init", trust_init_command), ("rotate", trust_rotate_command))
for _name, _command in TRUST_COMMANDS:
    trust_app.command(_name)(_command)

__all__ = [
    "TrustOption",
    "key_access",
    "render_signing",
    "render_trust",
    "sign_command",
    "trust_app",
]

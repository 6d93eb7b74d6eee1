"""The command line's wording of the library's hints: the one table from a refusal's remedy to the flag to pass.

The library's hints are neutral (``replace the existing blessing (rebless)``): a Python caller is not told to
pass a flag. A refusal whose remedy is an option of a command carries a stable key (``BlessError.remedy``);
the error boundary (cli/boundary.py) shows the wording below instead of the library's hint, with ``--json``
and in the termination log as well. A refusal without a remedy key keeps its hint as it is.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from bless.core.untrusted_text import shown
from bless.errors import BlessError


def _said(text: str) -> Callable[[BlessError], str]:
    """A remedy worded the same whatever the refusal's details."""
    return lambda err: text


def _forget_trusted_root(err: BlessError) -> str:
    """How to move a store to another root chain on purpose, with the store root option."""
    return (
        f"to trust another root on purpose, remove {err.details.get('state_dir', 'the trust directory')} (the host "
        "then forgets the versions it trusted: rollback protection starts again from the new root), or use another "
        "store root (--root)"
    )


def _stop(err: BlessError, *, root: str = "store_root") -> str:
    """The command line that stops the detached serve a refusal names (its own store root named)."""
    from bless.flows.serve.names import stop_command  # the error path only: keep the boundary's import light

    store_root = err.details.get(root)
    return stop_command(str(err.details.get("profile_name", "NAME")), Path(store_root) if store_root else None)


def _config(err: BlessError) -> str:
    """The config hash a refusal names, shortened as commands accept it (HASH when it names none)."""
    config_hash = err.details.get("config_hash")
    return str(config_hash)[:16] if isinstance(config_hash, str) and config_hash else "HASH"


def _last(rejected_dirs: object) -> str:
    """The last candidate's rejected dir a refusal names (``<root>/rejected/...`` when it names none)."""
    if isinstance(rejected_dirs, list) and rejected_dirs:
        return str(rejected_dirs[-1])
    return "<root>/rejected/..."


#: remedy key -> the command-line hint for a refusal carrying it (from its details where it names values).
COMMAND_LINE_HINTS: dict[str, Callable[[BlessError], str]] = {
    "diff_usage": lambda err: "bless diff --profile P HASH, or bless diff HASH_A HASH_B",
    "manifests_dir": lambda err: (
        "point --manifests-dir (or $BLESS_MANIFESTS_DIR) at the directory your blessings were published to; to "
        "publish into a checkout: bless --manifests-dir DIR run --profile P, then commit DIR/*.json"
    ),
    "rebless": lambda err: "use --rebless to bless again (the prior blessing is archived), or bless verify it",
    "allow_weaker": lambda err: (
        f"bless with at least --trials {err.details.get('trials_to_keep_bound', 'K')} to keep the bound, "
        "or add --allow-weaker to publish the weaker one"
    ),
    "allow_downgrade": lambda err: (
        "check the reference (a tag moved back?); to install the older blessing on purpose, pull it with "
        "bless pull --allow-downgrade"
    ),
    "wait_for_lock": lambda err: (
        "wait for that run to finish, or rerun with --wait (bless run --wait) to queue behind it; "
        "the lock is released as soon as that process exits"
    ),
    "pull_wait_for_lock": lambda err: (
        "another bless pull or bless run writes this config now; rerun bless pull without --no-wait to "
        "queue behind it (it then finds the blessing present, or installs its own)"
    ),
    "fewer_parallel": lambda err: (
        f"use --parallel {err.details.get('fit', 1)} or fewer (the default fits the GPUs present)"
    ),
    "sign_first": lambda err: f"sign it first: bless sign {_config(err)} --keys DIR",
    "allow_unknown_engine_version": lambda err: (
        f"{err.details.get('how', 'add its rules')}; or pass --allow-unknown-engine-version to use the nearest "
        f"older entry (vLLM {err.details.get('nearest')}; recorded in the manifest)"
    ),
    "rebless_changed_cache": _said(
        "do not serve or push this cache: re-bless the configuration (bless run --profile ... --rebless) "
        "and find out what changed the read-only blessed files (bless verify lists every problem)"
    ),
    "read_rejection_summary": lambda err: (
        f"read {_last(err.details.get('rejected_dirs'))}/summary.md; a nondeterministic engine cannot be blessed, "
        "and --candidates N tries fresh compiles"
    ),
    "profile_file": _said("pass a profile TOML file with --profile (see profiles/)"),
    "fewer_parallel_for_memory": _said(
        "stop what uses that GPU (nvidia-smi shows the processes), or run with fewer --parallel slots"
    ),
    # registry
    "lower_min_rate": _said(
        "nothing was installed; the registry or the link stalls or trickles: retry when it is healthy, "
        "or give a slow link a lower --min-rate"
    ),
    "longer_transfer_grace": _said(
        "nothing was installed; retry when the registry is healthy (a slow link: a longer --transfer-grace)"
    ),
    "plain_http": _said(
        "check the registry address and that it runs; loopback registries are reached over plain "
        "HTTP, others over HTTPS (--plain-http to force HTTP)"
    ),
    "check_pushed_reference": _said("check the repository, tag or digest (bless push prints what it pushed)"),
    "not_a_pushed_blessing": _said("the reference names something other than a blessing pushed with bless push"),
    "push_again": _said("push the blessing again with bless push"),
    # trust: signing repositories and signers
    "trust_init_repository": _said("create a signing repository with bless trust init --keys DIR"),
    "trust_init_here": _said("create one with bless trust init --keys DIR"),
    "trust_init_keys": _said("create the signing keys with bless trust init --keys DIR"),
    "trust_init_first": _said("bless trust init --keys DIR first"),
    "trust_rotate": _said(
        "keys and metadata are never overwritten; choose a new directory, or rotate keys with bless trust rotate"
    ),
    "writable_keys_dir": _said("choose a --keys directory this user can create and write (not below a file)"),
    "one_signer_per_key": lambda err: (
        f"a role with --signer has one key per URI: give {err.details.get('keys')} --signer "
        f"{err.details.get('role')}=URI"
    ),
    "enough_new_signers": lambda err: f"give at least {err.details.get('threshold')} --new-signer URIs",
    "signer_for_role": lambda err: (
        f"the trusted root lists {err.details.get('listed')} key(s) for {err.details.get('role')}; put one of them "
        f"there, or name the HSM or KMS key that holds one with --signer {err.details.get('role')}=URI"
    ),
    "signer_syntax": _said("write ROLE=URI, e.g. --signer targets=hsm:2?label=bless"),
    "file_key_instead": lambda err: (
        "let bless trust init write an encrypted file key instead (no --signer for that role), "
        f"or keep the key in {', '.join(err.details.get('importable', []))}"
    ),
    "rotate_to_signer": lambda err: (
        "name a key of this repository's root (bless trust rotate --new-signer URI replaces a "
        f"role's keys); {err.details.get('backend_hint')}"
    ),
    "protect_file_key": lambda err: (
        f"set {err.details.get('passphrase_env')} (or answer the prompt) to encrypt it, keep the key in an HSM or "
        f"KMS with --signer {err.details.get('role')}=URI, or ask for an unencrypted key with --unencrypted-keys"
    ),
    "signing_repository_full": _said(
        "a signing repository lists about 37,000 blessings at most: sign re-blessed configs without "
        "--keep-previous (their older versions are delisted), or sign further blessings in another "
        "signing repository (bless trust init) whose root the hosts serving them trust"
    ),
    # trust: signatures and the verifier's trust directory
    "sign_target": _said(
        "sign it with bless sign HASH --keys DIR; a re-blessed config delists its older versions "
        "unless signed with --keep-previous"
    ),
    "sign_with_root_keys": _said(
        "sign with the keys the trusted root lists (bless sign --keys DIR), or provision the right root.json"
    ),
    "resign": _said("re-sign the blessing (bless sign HASH --keys DIR) and distribute the new metadata"),
    "resign_oversized": _said(
        "bless sign never writes metadata this large: it was made by other means; re-sign with bless sign"
    ),
    "sign_and_push": _said(
        "sign it (bless sign HASH --keys DIR) and push it, or point --trust at the signing "
        "repository's metadata directory"
    ),
    "mixed_signings": _said(
        "its files come from different signings: use timestamp.json, snapshot.json and targets.json of one signing "
        "(the signing repository's metadata/ as bless sign left it), or pull the signed blessing again"
    ),
    "crafted_duplicate_key": _said(
        "metadata from bless sign never holds a duplicate key: this file was edited or crafted"
    ),
    "crafted_root": _said(
        "a root from bless trust init or rotate never does this: it was crafted; use the signing "
        "repository's own root.json"
    ),
    "trust_dir": _said("--trust names a directory that holds the trusted root.json (from bless trust init)"),
    "trust_state_dir": _said(
        "bless never makes it a link or writable by others: remove it (the next check under --trust "
        "records it again from the trusted root.json)"
    ),
    "root_chain_gap": _said(
        "verify with --trust pointing at the signing repository's metadata directory (it keeps every "
        "N.root.json), or put the missing N.root.json files beside the root.json"
    ),
    "forget_trusted_root": _forget_trusted_root,
    "another_root_chain": lambda err: (
        "use the root.json this store was first verified with (or a later one of its chain); "
        f"{_forget_trusted_root(err)}"
    ),
    # store and disk
    "read_only_file_system": _said(
        "the file system is mounted read-only: remount it read-write or use another store root (--root); "
        "nothing was committed"
    ),
    "free_space": _said(
        "free space on that file system (bless gc removes what no blessing needs) or raise the quota, then retry; "
        "nothing was committed"
    ),
    "pull_free_space": _said(
        "free space there (bless gc removes what no blessing needs) or pull into another store root "
        "(--root); nothing was downloaded"
    ),
    "pull_free_inodes": _said("free inodes there or pull into another store root (--root); nothing was downloaded"),
    "verify_after_fsync": _said("the blessing is visible but may not survive a power loss; run bless verify"),
    "gc_dry_run": _said("nothing was published; run bless gc --dry-run to see what is left"),
    "copy_hash_from_list": _said("copy the hash from bless list (at least its first 8 characters)"),
    "no_such_blessing": _said(
        "bless list shows the blessings of this store; check --root / --manifests-dir "
        "(or $BLESS_ROOT / $BLESS_MANIFESTS_DIR), or bless the configuration with bless run --profile ..."
    ),
    "restore_invalid_manifests": _said(
        "restore them from the store's archive or version control, or move them out of the "
        "manifests dir; until then every lookup (verify, serve-full) refuses"
    ),
    "readable_store_root": _said(
        "check that the store root (--root) and the manifests dir are directories this user can read"
    ),
    "keep_one_manifest": lambda err: (
        "the store is corrupt: keep the one that is right, move the other(s) out of "
        f"{shown(str(err.details.get('directory')))}, then run bless verify"
    ),
    "repair_dirs_record": lambda err: (
        f'repair {err.details.get("path")} (JSON: {{"version": 1, "dirs": [every --manifests-dir this store '
        "published to]}) or restore it from a backup, then retry"
    ),
    "push_metadata_dir": _said("--metadata names the signing repository's metadata directory (DIR/metadata)"),
    # resolving a profile
    "bless_drifted": _said("bless this configuration (bless run --profile ...), or revert the drifted factor(s)"),
    "bless_first": lambda err: (
        f"no blessing of this engine and model exists yet: run bless run --profile {err.details.get('profile')}"
    ),
    "declare_cpu_isa": _said("declare hardware.cpu_isa in the profile (bless hash prints this machine's)"),
    "declare_hardware": _said(
        "add them to the profile's [hardware] as on the serving host, e.g. "
        'gpu_name = "NVIDIA H100 80GB HBM3", compute_capability = "9.0", gpu_count = 1 '
        "(there: nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader); "
        "bless hash, diff and gate then use the declaration on any machine, and bless run and serve-full "
        "refuse a GPU that differs from it"
    ),
    "declare_runtime": _said(
        "on the serving host, set runtime.python to the engine's interpreter; to hash, diff or gate the profile "
        "elsewhere, declare runtime.python_version and runtime.packages as the serving host has them (bless hash "
        "--json there prints them)"
    ),
    # gating and engines
    "gate_allow_unverified": _said(
        "run the gate with --root at the store that holds the blessed caches, or pass --allow-unverified to gate "
        "on the manifests alone"
    ),
    "gate_profile_files": _said(
        "pass profile files: bless gate profiles/a.toml profiles/b.toml --manifests-dir manifests"
    ),
    "junit_regular_file": _said("--junit names a regular file, or one to be created"),
    "python_that_runs": _said(
        "pass an interpreter that runs here (the local runtime's, e.g. --python .venv/bin/python)"
    ),
    # serving
    "serve_in_foreground": lambda err: (
        f"read {err.details.get('log')}; serve in the foreground (no --detach), where serve-full watches the "
        "engine itself"
    ),
    "check_ready_dir_then_stop": _said("check the store root's ready/ dir; serve-full stop NAME, then serve again"),
    "stop_cleans_up": _said("serve-full stop NAME cleans up what is left; then serve again"),
    "use_or_stop_serve": lambda err: f"use the running engine, or stop it first ({_stop(err)})",
    "stop_serve_then_retry": lambda err: f"remove it ({_stop(err)}), then retry",
    "stop_from_own_root": lambda err: f"stop it from its own root: {_stop(err)}",
    "ready_from_own_root": lambda err: (
        "probe it from its own root: "
        + shlex.join(
            ["serve-full", "ready", str(err.details.get("name", "NAME")), "--root", str(err.details.get("store_root"))]
        )
    ),
    "serve_again_and_verify": lambda err: (
        f"something changed the copy at {err.details.get('copy')} or the blessed tree {err.details.get('original')} "
        "while it was copied; nothing was started: run serve-full again, and bless verify to audit the store"
    ),
    "plain_store_root": _said("move the store root (--root / BLESS_ROOT) to a plain path"),
    "serve_its_profile": _said(
        "serve the profile that blessing was made from, on matching hardware; bless diff shows which factors differ"
    ),
    "serve_again": _said("run serve-full again to serve"),
    "wait_for_start": lambda err: (
        f"wait for it to finish starting; then use it, or stop it with serve-full stop {err.details.get('name')}"
    ),
    "retry_stop": _said("it may be copying or verifying a large cache: retry serve-full stop, or read its log"),
    "stop_on_that_host": _said("run serve-full stop on that host"),
    "retry_stuck_stop": _said(
        "retry serve-full stop; if it persists, the process may be stuck in the kernel (ps -o stat)"
    ),
    "port_in_use": _said(
        "stop what holds the port (serve-full stop NAME if it is a detached serve of ours, bless-serve-NAME-<tag> "
        "in docker ps; ss -ltnp shows other listeners), or serve on another port (serve-full --port N)"
    ),
    "stale_ready_record": _said("remove it; serve-full writes a new one after its next canary"),
    "accept_skipped_canary": _said(
        "serve without --no-canary, or accept it explicitly with serve-full ready --no-canary"
    ),
    "watcher_starting": _said("wait a moment: serve-full --detach starts the watcher right after the canary"),
    "restart_detached_serve": _said(
        "read its log (seal-watcher.log in the serve dir); restart the serve: serve-full stop NAME, then "
        "serve-full --detach"
    ),
    "ready_on_serving_host": _said("run serve-full ready on the host that serves"),
    "rebless_unproven_refused": _said(
        "bless what it met: the serve dir's unproven-compiles.jsonl lists the events; bless run --rebless "
        "with coverage of those shapes, then restart serve-full (or serve with --unproven-compile record)"
    ),
    "rebless_unproven_stopped": lambda err: (
        f"the events are in {err.details.get('evidence_file')}; bless the shapes the traffic reaches (bless run "
        "--rebless with coverage), then serve again"
    ),
    "rebless_cache_not_used": lambda err: (
        f"the engine log is kept in {err.details.get('engine_log')}; a config the config hash "
        "considers equal made the engine compile or key its cache differently: report it, and bless "
        "this machine's configuration (bless run --rebless)"
    ),
    "stop_writer_then_verify": _said(
        "something writes to the read-only blessed dir: find it and stop it, then run bless verify; "
        "do not serve this cache until it verifies"
    ),
    # Kubernetes rendering
    "k8s_name": _said("pass --name with a DNS-1123 label"),
    "k8s_env_secret_inline": lambda err: (
        f'leave it empty in the profile ({err.details.get("secret_env")} = ""), put the value in a Kubernetes '
        f"Secret (kubectl create secret generic NAME --from-literal={err.details.get('secret_env')}=...) and "
        "pass --env-secret NAME"
    ),
    "k8s_env_secret": _said("pass --env-secret NAME, a Kubernetes Secret with one key per secret env name"),
    "k8s_trust_dir": _said("--trust names a directory holding the trusted root.json (bless trust init)"),
    "k8s_blessing_profile": _said(
        "render with the profile that blessing was made from (the pod's serve-full would refuse this one)"
    ),
    "blessing_made_on_gpu": _said("render from a blessing made on a GPU (bless show HASH lists its factors)"),
    "pin_by_digest": _said("use REPO@sha256:... (bless push prints the digest)"),
}


def command_line_hint(err: BlessError) -> str | None:
    """What the command line tells the user to do about ``err``: its remedy's wording, else its own hint."""
    wording = COMMAND_LINE_HINTS.get(err.remedy) if err.remedy is not None else None
    return wording(err) if wording is not None else err.hint


def worded_for_command_line(err: BlessError) -> BlessError:
    """``err`` with its hint in command-line wording (the boundary's last step before showing it)."""
    err.hint = command_line_hint(err)
    return err

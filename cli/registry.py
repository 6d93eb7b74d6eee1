"""Registry commands: ``bless push`` and ``bless pull`` (a blessing as an OCI artifact), their transfer
options, and serve-full ``--from``'s pull (:class:`FleetSource`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from bless.cli import render
from bless.cli.boundary import Report, command
from bless.cli.common import JsonOption, app_state, reading_store
from bless.cli.trust import TrustOption, render_trust
from bless.flows.transfer import DEFAULT_LIMITS, DEFAULT_MIN_RATE, TransferLimits, parse_rate
from bless.store import Store
from bless.trust import trust_report

# The registry client (oras, requests) is imported by the commands that talk to a registry, not by
# every bless command: run, verify and serve-full without --from neither need it nor pay its import.
if TYPE_CHECKING:
    from bless.flows.pull import PullResult
    from bless.flows.serve import Fetched

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
    from bless.flows.push import push_named_blessing

    result = push_named_blessing(
        reading_store(ctx), config_hash, reference, metadata_dir=metadata, plain_http=plain_http
    )
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

    result = pull_blessing(
        app_state(ctx).store(),
        reference,
        trust_dir=trust,
        plain_http=plain_http,
        limits=transfer_limits(min_rate, transfer_grace),
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

            result = pull_blessing(
                store,
                reference,
                trust_dir=self.trust,
                plain_http=self.plain_http,
                limits=transfer_limits(self.min_rate, self.transfer_grace),
            )
            report = pull_report(result)
            render_pull(console, report)
            return Fetched(reference=reference, config_hash=result.config_hash, dir_id=result.dir_id, report=report)

        return fetch


__all__ = [
    "AllowDowngradeOption",
    "FleetSource",
    "MinRateOption",
    "PlainHttpOption",
    "PullWaitOption",
    "TransferGraceOption",
    "pull_command",
    "pull_report",
    "push_command",
    "render_pull",
    "transfer_limits",
]

"""``bless k8s render``: Kubernetes manifests that serve a blessing (YAML on stdout, a summary on stderr)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from bless.cli.boundary import Report, command
from bless.cli.common import JsonOption, ProfileOption, app_state
from bless.cli.registry import MinRateOption, PlainHttpOption, TransferGraceOption, transfer_limits
from bless.core.untrusted_text import shown
from bless.flows.transfer import DEFAULT_LIMITS, DEFAULT_MIN_RATE
from bless.k8s import documents as k8s

k8s_app = typer.Typer(
    name="k8s",
    help="Serve blessings on Kubernetes: render the manifests.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def to_yaml(documents: Any) -> str:
    """The documents as one multi-document YAML stream, keys in the order they were built, without anchors."""
    import yaml  # here, not at the top: every bless command imports this module, only render writes YAML

    class PlainDumper(yaml.SafeDumper):
        """A value used twice is written twice, as kubectl users expect (no anchors and aliases)."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        """A text of several lines (the profile ConfigMap) as a block scalar, readable as the file it is; YAML
        itself falls back to a quoted string where a block cannot hold the text exactly (trailing blanks)."""
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    PlainDumper.add_representer(str, text)

    return yaml.dump_all(documents, Dumper=PlainDumper, sort_keys=False, default_flow_style=False, width=120)


def render_manifests(console: Console, data: Mapping[str, Any]) -> None:
    """The YAML on stdout (for ``kubectl apply -f -``); what it holds and the warnings on stderr."""
    sys.stdout.write(to_yaml(data["documents"]))
    sys.stdout.flush()
    kinds = ", ".join(f"{doc['kind']}/{doc['metadata']['name']}" for doc in data["documents"])
    console.print(Text.assemble(("rendered ", "bold green"), shown(kinds)))
    if data.get("blessing_read_from"):
        console.print(f"the blessing's manifest was read from {data['blessing_read_from']}", markup=False)
    for warning in data["warnings"]:
        console.print(Text.assemble(("warning", "bold yellow"), ": ", shown(warning)))


FromDigestOption = Annotated[
    str,
    typer.Option("--from", help="The blessing in its registry, pinned by digest: REGISTRY/REPO@sha256:..."),
]
EngineImageOption = Annotated[
    str, typer.Option("--image", help="The engine image: your engine image plus bless (pin it by digest).")
]
BlessImageOption = Annotated[
    str, typer.Option("--bless-image", help="The init container's image: bless without torch (by digest).")
]
NameOption = Annotated[str | None, typer.Option("--name", help="The Deployment's name (default: the profile's name).")]
ReplicasOption = Annotated[int, typer.Option("--replicas", min=0, help="Pods to run.")]
NamespaceOption = Annotated[str | None, typer.Option("--namespace", help="metadata.namespace of every document.")]
TrustConfigMapOption = Annotated[
    str, typer.Option("--trust-configmap", help="The ConfigMap that holds the trusted root.json.")
]
TrustRootOption = Annotated[
    Path | None,
    typer.Option(
        "--trust",
        file_okay=False,
        help="Also render the trust ConfigMap, from this directory's root.json (else it must exist).",
    ),
]
PullSecretOption = Annotated[
    str | None,
    typer.Option(
        "--pull-secret",
        help="An image-pull secret (kubernetes.io/dockerconfigjson): pulls the images and the blessing.",
    ),
]
EnvSecretOption = Annotated[
    str | None,
    typer.Option(
        "--env-secret",
        help="A Secret holding the profile's secret env values, one key per name (the profile leaves them empty).",
    ),
]
CpuOption = Annotated[
    str | None,
    typer.Option("--cpu", help="The engine container's CPU (requests = limits; default: 4 per GPU, 2 on CPU)."),
]
MemoryOption = Annotated[
    str | None,
    typer.Option(
        "--memory",
        help="The engine container's memory (requests = limits; default: 16Gi per GPU, 8Gi on CPU, plus /dev/shm).",
    ),
]
ModelClaimOption = Annotated[
    str | None,
    typer.Option(
        "--model-claim",
        help="A PersistentVolumeClaim holding the local model, mounted read-only at model.path (default: hostPath).",
    ),
]
ContainerPortOption = Annotated[int, typer.Option("--port", min=1, max=65535, help="The engine's container port.")]


@command
def render_command(
    ctx: typer.Context,
    profile: ProfileOption,
    from_ref: FromDigestOption,
    image: EngineImageOption,
    bless_image: BlessImageOption,
    name: NameOption = None,
    replicas: ReplicasOption = 1,
    namespace: NamespaceOption = None,
    trust_configmap: TrustConfigMapOption = "bless-trust",
    trust: TrustRootOption = None,
    pull_secret: PullSecretOption = None,
    env_secret: EnvSecretOption = None,
    port: ContainerPortOption = k8s.SERVING_PORT,
    cpu: CpuOption = None,
    memory: MemoryOption = None,
    model_claim: ModelClaimOption = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Read no blessing: the config hash and node affinity from the profile's declarations (a blessing "
            "not at hand); the pod still serves --from only if it is that config's blessing.",
        ),
    ] = False,
    plain_http: PlainHttpOption = None,
    min_rate: MinRateOption = DEFAULT_MIN_RATE,
    transfer_grace: TransferGraceOption = DEFAULT_LIMITS.grace_s,
    json_output: JsonOption = False,
) -> Report:
    """Print a Deployment (and its ConfigMaps) that serves the blessing --from on matching GPUs only.

    An init container pulls it under --trust into an emptyDir store; the engine container runs serve-full
    (verify, a verified copy at the cache path, the engine as its child, the canary); the readiness probe
    is serve-full ready NAME, so no traffic reaches an engine that was not canary-checked. Node affinity
    comes from the blessing's hardware factor. The blessing's manifest is read from the store (--root) when
    it holds the blessing --from pins (the one bless push pushed: no registry is needed), else from the
    registry. YAML goes to stdout: bless k8s render ... | kubectl apply -f -
    """
    from bless.flows.k8s import render_blessing

    options = k8s.K8sOptions(
        artifact=from_ref,
        engine_image=image,
        bless_image=bless_image,
        name=name or "",  # empty: from the profile's name, which the flow reads
        replicas=replicas,
        namespace=namespace,
        trust_configmap=trust_configmap,
        pull_secret=pull_secret,
        env_secret=env_secret,
        port=port,
        cpu=cpu,
        memory=memory,
        model_claim=model_claim,
    )
    rendered = render_blessing(
        profile,
        options,
        trust_dir=trust,
        store=app_state(ctx).store(),
        plain_http=plain_http,
        limits=transfer_limits(min_rate, transfer_grace),
        dry_run=dry_run,
    )
    return Report(rendered.to_dict(), render_manifests)


#: The ``k8s`` sub-commands.
K8S_COMMANDS = (("render", render_command),)
for _name, _command in K8S_COMMANDS:
    k8s_app.command(_name)(_command)

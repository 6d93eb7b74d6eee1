#!/usr/bin/env python3
"""The documents ``bless k8s render`` prints, made runnable with ``podman kube play`` on one machine (no cluster).

Usage (YAML in on stdin, out on stdout)::

    bless k8s render ... | python3 scripts/images/podman_pod.py > bless-pod.yaml
    python3 scripts/images/podman_pod.py --termination-dir /tmp/bless-term --restart-never < rendered.yaml > pod.yaml
    python3 scripts/images/podman_pod.py --down pod.yaml      # podman kube play --down, and the pod's volumes

podman 4.3 (Debian bookworm) is not a kubelet; what it needs changed (docs/guides/kubernetes.md, "Pods on one
machine: podman"), and nothing else:

1. the annotation ``io.podman.annotations.init.container.type: always`` on the Deployment's own metadata *and* its
   pod template's: for a Deployment podman reads the Deployment's, and with its default (``once``) it removes the
   init container when it ends, its logs and exit code with it;
2. ``hostNetwork: true``: a registry on loopback is reachable from the init container, and the engine's port is the
   host's;
3. no ``ports:``: podman turns ``containerPort`` into a port mapping, which host networking refuses;
4. with ``--termination-dir DIR``: each container writes its refusal to ``DIR/<container>`` (podman ignores
   ``terminationMessagePath``, so nothing would show what ``kubectl describe pod`` shows);
5. with ``--restart-never``: ``restartPolicy: Never``: podman restarts a failed init container at once and
   without end (each time contacting the registry); with it the first failure ends the pod.

``--down FILE`` removes what ``podman kube play FILE`` made: the pod (``podman kube play --down``), then the
volumes podman made for the file's ConfigMaps and emptyDirs, which ``--down`` leaves behind (podman 4.3), and
only those: the names the file holds.

The pod integration test (tests/integration/test_k8s_pod.py) runs its pods through :func:`for_podman`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

INIT_ANNOTATION = "io.podman.annotations.init.container.type"
#: Where a container's termination message is mounted when --termination-dir is given.
TERMINATION_MOUNT = "/var/run/termination"


def for_podman(documents: list[Any], *, termination_dir: Path | None = None, restart_never: bool = False) -> list[Any]:
    """``documents`` (as rendered) with the Deployment changed where podman is not a cluster (the module docstring)."""
    deployments = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "Deployment"]
    if len(deployments) != 1:
        raise SystemExit(f"podman_pod: expected one Deployment in the input, found {len(deployments)}")
    (deployment,) = deployments
    template = deployment["spec"]["template"]
    for metadata in (deployment["metadata"], template["metadata"]):
        metadata.setdefault("annotations", {})[INIT_ANNOTATION] = "always"
    spec = template["spec"]
    spec["hostNetwork"] = True
    if restart_never:
        spec["restartPolicy"] = "Never"
    if termination_dir is not None:
        volume = {"name": "termination", "hostPath": {"path": str(termination_dir), "type": "Directory"}}
        spec.setdefault("volumes", []).append(volume)
    for container in spec.get("initContainers", []) + spec["containers"]:
        container.pop("ports", None)
        if termination_dir is None:
            continue
        container.setdefault("volumeMounts", []).append({"name": "termination", "mountPath": TERMINATION_MOUNT})
        for variable in container.get("env", []):
            if variable["name"] == "BLESS_TERMINATION_LOG":  # what the kubelet would show from /dev/termination-log
                variable["value"] = f"{TERMINATION_MOUNT}/{container['name']}"
    return documents


def down(path: Path) -> int:
    """``podman kube play --down`` of ``path``, then the podman volumes named after its ConfigMaps and emptyDirs."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(doc, dict)]
    names = {doc["metadata"]["name"] for doc in documents if doc.get("kind") == "ConfigMap"}
    for doc in documents:
        if doc.get("kind") == "Deployment":
            names |= {v["name"] for v in doc["spec"]["template"]["spec"].get("volumes", []) if "emptyDir" in v}
    played = subprocess.run(["podman", "kube", "play", "--down", str(path)], check=False)
    listed = subprocess.run(["podman", "volume", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    left = sorted(names & set(listed.stdout.split()))
    removed = subprocess.run(["podman", "volume", "rm", *left], check=False).returncode if left else 0
    return played.returncode or removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--termination-dir", type=Path, help="a host directory for each container's refusal")
    parser.add_argument("--restart-never", action="store_true", help="restartPolicy: Never")
    parser.add_argument("--down", type=Path, metavar="FILE", help="remove the pod of FILE and its podman volumes")
    args = parser.parse_args()
    if args.down is not None:
        raise SystemExit(down(args.down))
    documents = [doc for doc in yaml.safe_load_all(sys.stdin) if doc]
    changed = for_podman(documents, termination_dir=args.termination_dir, restart_never=args.restart_never)
    yaml.safe_dump_all(changed, sys.stdout, sort_keys=False, default_flow_style=False, width=120)


if __name__ == "__main__":
    main()

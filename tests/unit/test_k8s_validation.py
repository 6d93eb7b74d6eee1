"""``bless k8s render`` refuses what Kubernetes refuses, a profile that is not the blessing's, a root that is not TUF
(issue 25, item 9).

Namespaces and pull-secret names that are no DNS names, empty images, replicas past int32 were rendered
(and refused later by the API server, or worse, by the pod); only the profile's name was held to the
blessing, so a profile with another seed was rendered under the blessing's digest; any JSON was accepted
as the trusted root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from bless.errors import InputInvalidError, TrustInvalidError
from bless.flows.k8s import render_blessing
from bless.flows.push import push_blessing
from bless.oci.client import parse_reference
from bless.store import Store
from tests.support.registry_simulator import RegistrySimulator
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_k8s_render import KUBERNETES_VERSIONS, options, profile_text, rendered, resolved_factors


@pytest.mark.parametrize(
    "changes",
    [
        {"namespace": "ml\nkind: Secret"},
        {"namespace": "ML"},
        {"namespace": "my ns"},
        {"namespace": "n" * 80},
        {"pull_secret": "Reg Cred"},
        {"pull_secret": "regcred\n"},
        {"trust_configmap": "Trust"},
        {"engine_image": ""},
        {"bless_image": "  "},
        {"engine_image": "registry.example.com/engine:v1\nimage: evil"},
        {"replicas": 2**31},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_what_kubernetes_refuses_is_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    with pytest.raises(InputInvalidError):
        rendered(tmp_path, **changes)


def test_valid_dns_names_are_accepted_and_validate(tmp_path: Path) -> None:
    result = rendered(tmp_path, namespace="ml-team", pull_secret="reg.cred", trust_configmap="a.b", replicas=2**31 - 1)
    for document in result.documents:
        kubernetes_validate.validate(dict(document), KUBERNETES_VERSIONS[-1], strict=True)


def _pushed(tmp_path: Path, text: str) -> tuple[RegistrySimulator, str]:
    registry = RegistrySimulator()
    store = Store(tmp_path / "root")
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(tree, resolved_factors(text, tmp_path))
    store.publish(tree, manifest)
    pushed = push_blessing(store, manifest, parse_reference(registry.ref("blessings/tiny:v1")), transport=registry)
    return registry, pushed.pinned


def test_a_profile_with_another_seed_is_not_the_blessing(tmp_path: Path) -> None:
    registry, pinned = _pushed(tmp_path, profile_text() + "\n[serve]\nseed = 0\n")
    path = tmp_path / "serve.toml"
    path.write_text(profile_text() + "\n[serve]\nseed = 7\n")
    with pytest.raises(InputInvalidError, match=r"not the blessing's .*seed") as info:
        render_blessing(path, options(artifact=pinned), transport=registry)
    assert "made from" in (info.value.hint or "")
    path.write_text(profile_text() + "\n[serve]\nseed = 0\n")
    render_blessing(path, options(artifact=pinned), transport=registry)  # the same profile renders


@pytest.mark.parametrize("root", ['{"signed": {}}', '{"signatures": [], "signed": {"_type": "targets"}}', "[]"])
def test_a_trust_root_that_is_not_tuf_root_metadata_is_refused(tmp_path: Path, root: str) -> None:
    registry, pinned = _pushed(tmp_path, profile_text())
    path = tmp_path / "serve.toml"
    path.write_text(profile_text())
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "root.json").write_text(root)
    with pytest.raises(TrustInvalidError):
        render_blessing(path, options(artifact=pinned), trust_dir=trust, transport=registry)

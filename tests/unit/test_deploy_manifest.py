"""The KubeRay example (deploy/kuberay.yaml, docs/deploy.md) stays true to the code: its
spec validates and its Deployment runs a leader and a standby on one database."""

from __future__ import annotations

from pathlib import Path

import yaml

from sluice.spec import load_spec_text

MANIFEST = Path(__file__).parents[2] / "deploy" / "kuberay.yaml"


def test_the_kuberay_example_holds_a_valid_spec_and_a_leader_with_a_standby() -> None:
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}
    assert set(docs) == {"RayCluster", "ConfigMap", "Deployment", "Service"}
    spec = load_spec_text(docs["ConfigMap"]["data"]["platform.yaml"], "kuberay.yaml").spec
    assert spec.instances.runtime == "ray" and spec.instances.ray.address.startswith("ray://")
    deployment = docs["Deployment"]["spec"]
    assert deployment["replicas"] >= 2
    [container] = deployment["template"]["spec"]["containers"]
    assert [e["name"] for e in container["env"]] == ["SLUICE_DATABASE_URL"]
    assert container["readinessProbe"]["tcpSocket"]["port"] == "gateway"

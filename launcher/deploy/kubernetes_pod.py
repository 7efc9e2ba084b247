"""The StatefulSet of one module in deploy/kubernetes (launcher/deploy/kubernetes.py writes the
files): its pod, container, environment, probes, claims and scratch space, from its spec."""

from __future__ import annotations

from typing import Any

from launcher.options import DEFAULT_REGISTRY
from launcher.release.published import repository
from validator.spec import CONFIG_PATH, CORE_ENV, CORE_SECRETS, STATE_PATH, ModuleSpec

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
# What the validator writes outside its claims, read from the code: submissions' work folders
# and the tokenizer and template children's files (the temp dir, validator/kit/workdirs.py);
# HF_HOME (docker/Dockerfile), huggingface_hub's own files, for a module without an hf-cache
# claim (rl downloads policies into its work folder, through the library); the image user's
# home (matplotlib's font cache for /report, torch.compile's and Triton's kernel caches). The
# journal and the judge texts' cache are on the state claim.
IMAGE_HOME = "/home/validator"
HF_HOME = "/data/hf-cache"
SCRATCH = {"tmp": "/tmp", "home": IMAGE_HOME, "hf-cache": HF_HOME}
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


def scratch(spec: ModuleSpec) -> dict[str, str]:
    """The emptyDirs of a pod, name -> path: the SCRATCH paths that no claim covers."""
    claimed = {"state", *spec.volumes}
    covered = {STATE_PATH, *spec.volumes.values()}
    return {
        (name if name not in claimed else f"{name}-scratch"): path
        for name, path in SCRATCH.items()
        if path not in covered
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
            *({"name": key, "mountPath": path} for key, path in scratch(spec).items()),
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "resources": {
            "requests": {"memory": spec.memory.request},
            "limits": {"memory": spec.memory.limit},
        },
    }
    if spec.gpu:
        body["resources"]["limits"][GPU_RESOURCE] = 1
    if spec.status_port is not None:
        body["ports"] = [{"name": "status", "containerPort": spec.status_port}]
        body["startupProbe"] = probe(STARTUP_PROBE)
        body["livenessProbe"] = probe(LIVENESS_PROBE)
        body["readinessProbe"] = probe(READINESS_PROBE)
    return body


def stateful_set(spec: ModuleSpec) -> dict[str, Any]:
    name = object_name(spec.name)
    pod: dict[str, Any] = {
        # The validator finishes the assignment in progress on SIGTERM (docs/one-host.md).
        "terminationGracePeriodSeconds": spec.stop_grace_seconds,
        # The pause container is PID 1 and reaps the validator's orphaned children, as
        # compose.yaml's `init: true` does.
        "shareProcessNamespace": True,
        # The validator never calls the Kubernetes API: no token in the pod to steal.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": IMAGE_UID,
            "runAsNonRoot": True,
            "fsGroup": IMAGE_UID,
            # A full HF cache is not chowned again at every start.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container(spec)],
        "volumes": [
            {"name": "configs", "configMap": {"name": CONFIGS}},
            *({"name": key, "emptyDir": {}} for key in scratch(spec)),
        ],
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

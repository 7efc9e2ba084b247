"""`deploy/kubernetes/`: a kustomize base written from the module specs (`make compose`).

Per module a StatefulSet `validator-<module>` and its headless Service: each pod is one worker
with one GPU (when the spec asks for one), its own journal (a claim per pod), its own HF cache
(a claim per pod: any storage class can serve it, and no two pods share a lock file over a
network file system), the keys from one Secret, configs/ from one ConfigMap, and the shard
`VALIDATOR_SHARD=K/N` from the pod's ordinal K and the StatefulSet's replicas N. A test checks
that the committed files equal what this writes, and validates them against the Kubernetes
schemas offline.

Hardened: a read-only root file system, with an emptyDir wherever the validator
writes and no claim is mounted (SCRATCH, kubernetes_pod.py); the runtime's default seccomp
profile; no service account token (the validator never calls the Kubernetes API); the spec's
memory request and limit; and, in the example overlay, a NetworkPolicy that admits the status
port only from the monitoring namespace (the status server listens on 0.0.0.0 in the pod).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from launcher.deploy.compose_services import specs_with_files
from launcher.deploy.kubernetes_pod import (
    CONTAINER,
    SHARD_COUNT_ENV,
    headless_service,
    image_name,
    labels,
    object_name,
    settings_name,
    stateful_set,
)
from launcher.release.published import checkout_version
from validator.spec import REPO_ROOT, SPEC_FILE, ModuleSpec

OUTPUT_DIR = Path("deploy/kubernetes")
BASE = Path("base")
# Beside the base, not in it: kustomize refuses a base that holds its overlay (a cycle).
EXAMPLE_OVERLAY = Path("overlays/example")
NAMESPACE = "flock-validator"
MONITORING_NAMESPACE = "monitoring"
HEADER = f"""\
# Written by `make compose` (python run.py kubernetes) from modules/*/{SPEC_FILE}; edit
# the specs, not this file, and change a deployment with an overlay (overlays/example/).
"""

OVERLAY_HEADER = """\
# An operator's overlay, written by `make compose` as an example: copy this folder to
# overlays/<yours>/ (make compose leaves it alone) and set your namespace, registry, workers
# (replicas; the replacements keep each shard count equal to them) and task ids there.
"""


def network_policy(spec: ModuleSpec) -> dict[str, Any]:
    """Ingress to the module's pods: the status port, from the monitoring namespace only (the
    status server listens on 0.0.0.0 in the pod). Egress is left open (the Fed Ledger API, the
    Hub, judge endpoints). The kubelet's probes come from the node, which common network
    plugins (Calico, Cilium) admit whatever the policy; where yours does not, add the nodes'
    CIDR as an ipBlock."""
    namespace_label = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{object_name(spec.name)}-status", "labels": labels(spec)},
        "spec": {
            "podSelector": {"matchLabels": labels(spec)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {namespace_label: MONITORING_NAMESPACE}
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": "status"}],
                }
            ],
        },
    }


NETWORK_POLICIES = "networkpolicies.yaml"


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


def kustomization(
    specs: dict[str, ModuleSpec], digests: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The base's kustomization; with a release's `digests`, its images by digest."""
    tags = {name: {"newTag": checkout_version(REPO_ROOT)} for name in specs}
    if digests is not None:
        tags = {name: {"digest": digests[name]} for name in specs}
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": ["namespace.yaml", *(module_file(name) for name in specs)],
        "images": [{"name": image_name(name), **tags[name]} for name in specs],
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
        "resources": ["../../base", NETWORK_POLICIES],
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


POLICY_HEADER = f"""\
# Written by `make compose` as an example: each module's status port (/metrics, /healthz)
# admitted only from the namespace `{MONITORING_NAMESPACE}` (your Prometheus's); every other
# ingress to the validators is refused. Set your monitoring namespace in your overlay's copy.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the shard script, a patch) as literal blocks, readable in review."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def render(
    specs: dict[str, ModuleSpec], digests: Mapping[str, str] | None = None
) -> dict[Path, str]:
    """The text of every file of deploy/kubernetes, by path inside it (the base's images by a
    release's `digests` when given)."""
    files = {BASE / "namespace.yaml": HEADER + _dump(namespace())}
    for name, spec in specs.items():
        documents = [stateful_set(spec), headless_service(spec), settings(spec)]
        files[BASE / module_file(name)] = HEADER + "---\n".join(_dump(d) for d in documents)
    files[BASE / "kustomization.yaml"] = HEADER + _dump(kustomization(specs, digests))
    files[EXAMPLE_OVERLAY / "kustomization.yaml"] = OVERLAY_HEADER + _dump(example_overlay(specs))
    policies = [network_policy(spec) for spec in specs.values() if spec.status_port is not None]
    files[EXAMPLE_OVERLAY / NETWORK_POLICIES] = POLICY_HEADER + "---\n".join(map(_dump, policies))
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


def write_kubernetes(repo: Path, check: bool) -> int:
    """Writes deploy/kubernetes/ (with `check`: exit 1 naming each stale file, writing none)."""
    specs = specs_with_files(repo)
    output = repo / OUTPUT_DIR
    files = render(specs)
    stale = stale_files(output, files)
    if check:
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

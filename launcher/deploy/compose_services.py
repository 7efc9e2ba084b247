"""The Compose services of the modules, rendered from their specs: `compose.yaml` and
`compose.cpu.yaml` here, the per-GPU file in compose_gpus.py on the same `service()`. The
command that writes them is compose.py (`make compose`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from launcher.engine.containers import (
    LOG_DRIVER,
    LOG_MAX_FILES,
    LOG_MAX_FILES_ENV,
    LOG_MAX_SIZE,
    LOG_MAX_SIZE_ENV,
    state_volume_name,
    volume_name,
)
from launcher.engine.images import DOCKERFILE
from launcher.options import (
    DEFAULT_INSTALLER,
    DEFAULT_LOCK,
    DEFAULT_REGISTRY,
    PRODUCTION_BASE,
    REGISTRY_ENV,
)
from launcher.release.published import repository
from validator.spec import (
    CONFIG_PATH,
    SPEC_FILE,
    STATE_PATH,
    ModuleSpec,
    find_modules,
)

COMPOSE_FILE = "compose.yaml"
CPU_OVERRIDE_FILE = "compose.cpu.yaml"
HEADER = f"""\
# Written by `make compose` from modules/*/{SPEC_FILE}; edit the specs, not this file.
#
# `docker compose up -d validator-<module>` runs a module's validator; set FLOCK_API_KEY,
# TASK_IDS and the module's own secrets (its spec's `secrets:`, e.g. HF_TOKEN for lora) in the
# environment or in a .env file beside this file; a validator without its secrets exits 2 and
# says which. Compose restarts a validator on any failing exit (up to 5 times);
# run.py is the smarter launcher: it restarts only on exit 100 and stops with an explanation on
# 2 and 3.
"""
PINNED = """#
# A release's file: each image is named by the digest its signed release manifest names
# (docs/images.md "Released images"); Compose runs that image or none, and builds nothing.
"""
CPU_HEADER = """\
# Written by `make compose`. For hosts without NVIDIA GPUs (trying things out, CI):
#   docker compose -f compose.yaml -f compose.cpu.yaml up validator-<module>
"""
# The core's settings, read from the host's environment with the validator's defaults.
CORE_ENVIRONMENT = {
    "FLOCK_API_URL": "${FLOCK_API_URL:-https://fed-ledger-prod.flock.io/api/v1}",
    "TIME_SLEEP": "${TIME_SLEEP:-180}",
    "ASSIGNMENT_LOOKUP_INTERVAL": "${ASSIGNMENT_LOOKUP_INTERVAL:-180}",
}
# run.py's build options, read from the same variables (launcher/commands/build_options.py), so that
# an image Compose builds has the source hash run.py computes for them.
BUILD_ARGS = {
    "BASE_IMAGE": f"${{VALIDATOR_BASE_IMAGE:-{PRODUCTION_BASE}}}",
    "ENV_INSTALLER": f"${{VALIDATOR_ENV_INSTALLER:-{DEFAULT_INSTALLER}}}",
    "PIP_OPTIONS": "${VALIDATOR_PIP_OPTIONS:-}",
    "LOCK": f"${{VALIDATOR_LOCK:-{DEFAULT_LOCK}}}",
}
# The name of the image Compose builds from the checkout: a local name, never a registry's (a
# push or a pull by that name cannot mistake it for a release).
COMPOSE_TAG = "compose"
GPU_RESERVATION = {
    "resources": {
        "reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}
    }
}


def _required(name: str, what: str) -> str:
    return f"${{{name}:?set {name}: {what}}}"


def service(spec: ModuleSpec, digests: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The module's service; `digests` (a release's, launcher/release/maintain.py): its image by the
    digest the release signed, and no `build:`, so that Compose runs that image or nothing."""
    environment = {
        "FLOCK_API_KEY": _required("FLOCK_API_KEY", "your Fed Ledger API key"),
        "TASK_IDS": _required("TASK_IDS", "the task ids to validate, e.g. 12,34"),
        **CORE_ENVIRONMENT,
        # No value: Compose passes the host's when it is set and leaves it unset otherwise (an
        # empty HF_ENDPOINT would be taken as the endpoint). A module's secrets too: Compose
        # interpolates every service of the file, so a `:?` here would make `up validator-rl`
        # demand lora's HF_TOKEN; the validator refuses to start without them (exit 2).
        **{name: None for name in [*spec.secrets, *spec.env]},
    }
    body: dict[str, Any] = {
        # The checkout's own image, built by every `up` (`pull_policy: build`; a cached build
        # when nothing changed), so that after an upgrade at the same version `up` runs the new
        # code, never an older build under the same name (docs/compose.md "Which image runs").
        "image": checkout_image(spec.name),
        "pull_policy": "build",
        "build": {
            "context": ".",
            "dockerfile": DOCKERFILE,
            "network": "host",
            "args": {**BUILD_ARGS, "MODULE": spec.name, "ENV_FILE": spec.environment},
        },
        "network_mode": "host",
        "init": True,
        "restart": "on-failure:5",
        "logging": logging_options(),
        # The validator finishes the assignment in progress on a stop (docs/one-host.md).
        "stop_grace_period": f"{spec.stop_grace_seconds}s",
        "environment": environment,
        "volumes": [
            f"./configs:{CONFIG_PATH}:ro",
            *(f"{key}:{path}" for key, path in spec.volumes.items()),
            f"{spec.name}-state:{STATE_PATH}",
        ],
    }
    if digests is not None:
        body["image"] = released_image(spec.name, digests[spec.name])
        body["pull_policy"] = "missing"
        del body["build"]
    if spec.gpu:
        body["deploy"] = GPU_RESERVATION
    if spec.status_port is not None:
        environment["VALIDATOR_HTTP_PORT"] = str(spec.status_port)
        body["healthcheck"] = healthcheck(spec.status_port)
    return {**body, **spec.compose}


def logging_options() -> dict[str, Any]:
    """The log rotated as run.py's containers rotate theirs (launcher/engine/containers.py),
    sizes from the host's environment; a host whose engine uses another log driver sets its own
    `logging:` in an override file. A new dict each time: one shared would be dumped as a YAML
    alias."""
    return {
        "driver": LOG_DRIVER,
        "options": {
            "max-size": f"${{{LOG_MAX_SIZE_ENV}:-{LOG_MAX_SIZE}}}",
            "max-file": f"${{{LOG_MAX_FILES_ENV}:-{LOG_MAX_FILES}}}",
        },
    }


def checkout_image(module: str) -> str:
    """`flock-validator-<module>:compose`: the image Compose builds from this checkout."""
    return f"flock-validator-{module.lower()}:{COMPOSE_TAG}"


def released_image(module: str, digest: str) -> str:
    """`${VALIDATOR_IMAGE_REGISTRY:-ghcr.io/flock-io}/flock-validator-<module>@<digest>`: a
    mirror may serve it, but only the image the release signed."""
    name = repository(DEFAULT_REGISTRY, module).removeprefix(DEFAULT_REGISTRY)
    return f"${{{REGISTRY_ENV}:-{DEFAULT_REGISTRY}}}{name}@{digest}"


def healthcheck(port: int) -> dict[str, Any]:
    """Unhealthy when the loop made no progress for --health-stale-seconds (/healthz: 503).
    The start period covers a first base model's download and load."""
    url = f"http://127.0.0.1:{port}/healthz"
    probe = f"import urllib.request; urllib.request.urlopen('{url}', timeout=5)"
    return {
        "test": ["CMD", "python", "-c", probe],
        "interval": "60s",
        "timeout": "10s",
        "retries": 3,
        "start_period": "900s",
    }


def render(
    specs: dict[str, ModuleSpec], digests: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """The text of compose.yaml and of compose.cpu.yaml for these specs (and a release's
    digests: its images by digest)."""
    volumes: dict[str, dict[str, str]] = {}
    for spec in specs.values():
        for key in spec.volumes:
            volumes[key] = {"name": volume_name(key)}
    for spec in specs.values():
        volumes[f"{spec.name}-state"] = {"name": state_volume_name(spec.name)}
    document = {
        "services": {f"validator-{spec.name}": service(spec, digests) for spec in specs.values()},
        "volumes": volumes,
    }
    compose = HEADER + (PINNED if digests is not None else "") + "\n" + _dump(document)
    gpu_services = [name for name, spec in specs.items() if spec.gpu]
    cpu = CPU_HEADER + "services:" + ("\n" if gpu_services else " {}\n")
    for name in gpu_services:
        cpu += f"  validator-{name}:\n    deploy: !reset {{}}\n"
    return compose, cpu


def _dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100)


def specs_with_files(repo_root: Path) -> dict[str, ModuleSpec]:
    """The modules of `repo_root`, found by the one rule (validator.spec.find_modules)."""
    return find_modules(repo_root)

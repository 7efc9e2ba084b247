"""`compose.yaml` and `compose.cpu.yaml`, written from the module specs (`make compose`).

One service `validator-<name>` per module with a spec file; a test checks that the committed
files equal what this writes, so a spec change cannot leave Compose behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher.containers import state_volume_name, volume_name
from launcher.images import DOCKERFILE, PRODUCTION_BASE
from validator.errors import ConfigError, ExitCode
from validator.spec import (
    CONFIG_PATH,
    SPEC_FILE,
    STATE_PATH,
    ModuleSpec,
    discover_specs,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
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
BUILD_ARGS = {
    "BASE_IMAGE": f"${{VALIDATOR_BASE_IMAGE:-{PRODUCTION_BASE}}}",
    "ENV_INSTALLER": "${VALIDATOR_ENV_INSTALLER:-micromamba}",
    "PIP_OPTIONS": "${VALIDATOR_PIP_OPTIONS:-}",
}
GPU_RESERVATION = {
    "resources": {
        "reservations": {"devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}
    }
}


def _required(name: str, what: str) -> str:
    return f"${{{name}:?set {name}: {what}}}"


def service(spec: ModuleSpec) -> dict[str, Any]:
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
        "build": {
            "context": ".",
            "dockerfile": DOCKERFILE,
            "network": "host",
            "args": {**BUILD_ARGS, "MODULE": spec.name, "ENV_FILE": spec.environment},
        },
        "network_mode": "host",
        "init": True,
        "restart": "on-failure:5",
        # The validator finishes the assignment in progress on a stop (README, "Stopping").
        "stop_grace_period": f"{spec.stop_grace_seconds}s",
        "environment": environment,
        "volumes": [
            f"./configs:{CONFIG_PATH}:ro",
            *(f"{key}:{path}" for key, path in spec.volumes.items()),
            f"{spec.name}-state:{STATE_PATH}",
        ],
    }
    if spec.gpu:
        body["deploy"] = GPU_RESERVATION
    if spec.status_port is not None:
        environment["VALIDATOR_HTTP_PORT"] = str(spec.status_port)
        body["healthcheck"] = healthcheck(spec.status_port)
    return {**body, **spec.compose}


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


def render(specs: dict[str, ModuleSpec]) -> tuple[str, str]:
    """The text of compose.yaml and of compose.cpu.yaml for these specs."""
    volumes: dict[str, dict[str, str]] = {}
    for spec in specs.values():
        for key in spec.volumes:
            volumes[key] = {"name": volume_name(key)}
    for spec in specs.values():
        volumes[f"{spec.name}-state"] = {"name": state_volume_name(spec.name)}
    document = {
        "services": {f"validator-{spec.name}": service(spec) for spec in specs.values()},
        "volumes": volumes,
    }
    compose = HEADER + "\n" + _dump(document)
    gpu_services = [name for name, spec in specs.items() if spec.gpu]
    cpu = CPU_HEADER + "services:" + ("\n" if gpu_services else " {}\n")
    for name in gpu_services:
        cpu += f"  validator-{name}:\n    deploy: !reset {{}}\n"
    return compose, cpu


def _dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100)


def specs_with_files(repo_root: Path) -> dict[str, ModuleSpec]:
    """Modules that declare a spec: a bare folder runs in `python -m validator` but gets no
    service (it has not said what its container needs)."""
    modules_dir = repo_root / "modules"
    return {
        name: spec
        for name, spec in discover_specs(modules_dir).items()
        if (modules_dir / name / SPEC_FILE).is_file()
    }


def main(argv: list[str] | None = None) -> int:
    # compose_gpus builds on service() here: imported when run, not at the top (a cycle).
    from launcher.compose_gpus import GPUS_FILE, HOSTS_FILE, load_hosts, render_gpus

    parser = argparse.ArgumentParser(description="Write compose.yaml from the module specs.")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    parser.add_argument(
        "--hosts",
        type=Path,
        help=f"host file: module -> its GPUs, one worker each [default: REPO/{HOSTS_FILE}]",
    )
    parser.add_argument(
        "--gpus-output",
        type=Path,
        help=f"the per-GPU Compose file to write [default: REPO/{GPUS_FILE}]",
    )
    args = parser.parse_args(argv)
    if args.hosts is not None and args.gpus_output is None:
        # Another host's file must not overwrite the committed example's output.
        parser.error("--hosts needs --gpus-output, e.g. compose.gpus.my-host.yaml")
    specs = specs_with_files(args.repo)
    compose, cpu = render(specs)
    outputs = [(args.repo / COMPOSE_FILE, compose), (args.repo / CPU_OVERRIDE_FILE, cpu)]
    # A repository without a host file (a module author's scratch repo) has no per-GPU file.
    hosts_path = args.hosts or args.repo / HOSTS_FILE
    if args.hosts is not None or hosts_path.is_file():
        try:
            gpus = render_gpus(specs, load_hosts(hosts_path, specs))
        except (ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        outputs.append((args.gpus_output or args.repo / GPUS_FILE, gpus))
    stale = [path for path, text in outputs if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(
                f"{path.name} is not what the module specs say; run `make compose`", file=sys.stderr
            )
        return 1 if stale else 0
    for path, text in outputs:
        path.write_text(text)
    written = " and ".join(path.name for path, _ in outputs)
    print(f"wrote {written}: {', '.join(specs) or 'no modules'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

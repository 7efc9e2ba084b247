"""`compose.gpus.yaml`: one Compose service per GPU, written by `make compose` from a host file.

A host file (`deploy/hosts/example.yaml`) says which GPUs each module's workers get on one host:

    lora: [0, 1]        # validator-lora-gpu0 and validator-lora-gpu1, shards 0/2 and 1/2
    llm_judge: [2, 3]
    rl: []              # a CPU-only module: one worker, no GPU

Worker K of a module's N gets one GPU (`device_ids`), `VALIDATOR_SHARD=K/N` (the validator's
share of the assignments), its own journal volume and its own status port: the workers of a
module are independent validators that split the work, not one validator on many GPUs. Worker
K's journal has the name run.py gives it (`flock-validator-MODULE-state`, `...-state-K`), so
that a host moves between the two with its journals (launcher/fleet/volumes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import RootModel, field_validator

from launcher.deploy.compose_services import _dump, healthcheck, service
from launcher.engine.containers import GPU_ID, state_volume_name, volume_name, worker_state_volume
from launcher.fleet.plan import PORT_STEP
from validator.errors import ConfigError
from validator.spec import STATE_PATH, ModuleSpec, load_yaml_model

HOSTS_FILE = "deploy/hosts/example.yaml"
GPUS_FILE = "compose.gpus.yaml"
MAX_HOSTS_BYTES = 64 * 1024
# Worker K serves its status page on the spec's port + K * PORT_STEP, as run.py's workers do
# (launcher/fleet/plan.py says why the step is not 1). A collision left anyway is an error, not a
# silent second bind.
GPUS_HEADER = f"""\
# Written by `make compose` from modules/*/module.yaml and {HOSTS_FILE}.
#
# One validator per GPU: `docker compose -f {GPUS_FILE} up -d` runs every worker
# the host file lists. Worker K of a module's N gets VALIDATOR_SHARD=K/N (its share of the
# assignments), one GPU, its own journal volume and its own status port (the spec's
# + K * {PORT_STEP}); the HF cache is shared. Each module validates its own tasks: set
# <MODULE>_TASK_IDS (LORA_TASK_IDS, ...) beside FLOCK_API_KEY and the modules' secrets, in the
# environment or in .env. Worker K's journal volume has the name run.py gives it
# (flock-validator-<module>-state, then -state-1, ...); one that an earlier file named after its
# GPU (flock-validator-<module>-gpu<id>-state) is moved by `python run.py <module> --gpus ...`
# at its start (docs/compose.md). For another host, write its own host file and run
#   python run.py compose --hosts my-host.yaml --gpus-output compose.gpus.my-host.yaml
"""


class HostGpus(RootModel[dict[str, list[int | str]]]):
    """module name -> the GPU ids (nvidia-smi indexes or GPU-<uuid>) its workers get."""

    @field_validator("root")
    @classmethod
    def _ids(cls, root: dict[str, list[int | str]]) -> dict[str, list[int | str]]:
        seen: dict[str, str] = {}
        for module, gpus in root.items():
            for gpu in gpus:
                gpu_id = str(gpu)
                if not GPU_ID.fullmatch(gpu_id):
                    raise ValueError(f"{module}: {gpu!r} is not a GPU index or GPU-<uuid>")
                if gpu_id in seen:
                    raise ValueError(f"GPU {gpu_id} is listed twice ({seen[gpu_id]}, {module})")
                seen[gpu_id] = module
        return root


def load_hosts(path: Path, specs: dict[str, ModuleSpec]) -> dict[str, list[str]]:
    """The host file's GPUs by module, checked against the specs; ConfigError in one line."""
    where = str(path)
    hosts = load_yaml_model(
        path,
        where,
        MAX_HOSTS_BYTES,
        HostGpus,
        "must map module names to GPU lists, e.g. `lora: [0, 1]`",
    ).root
    for module, gpus in hosts.items():
        spec = specs.get(module)
        if spec is None:
            known = ", ".join(specs) or "none"
            raise ConfigError(f"{where}: no module {module!r} with a spec (known: {known})")
        if gpus and not spec.gpu:
            raise ConfigError(f"{where}: {module} is CPU-only (gpu: false); give it []")
        if spec.gpu and not gpus:
            raise ConfigError(f"{where}: {module} needs a GPU per worker; list at least one")
    return {module: [str(gpu) for gpu in gpus] for module, gpus in hosts.items()}


def state_key(module: str, shard: int) -> str:
    """The Compose key of worker `shard`'s journal volume: named as the volume is."""
    return worker_state_volume(f"{module}-state", shard)


def worker_name(module: str, gpu: str | None) -> str:
    return f"{module}-gpu{gpu}" if gpu is not None else module


def worker_service(
    spec: ModuleSpec,
    gpu: str | None,
    shard: int,
    workers: int,
    digests: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """compose.yaml's service for the module, narrowed to one GPU and one shard."""
    body = service(spec, digests)
    environment = dict(body["environment"])
    # The file runs every module at once, and each validates its own tasks.
    variable = f"{spec.name.upper()}_TASK_IDS"
    environment["TASK_IDS"] = (
        f"${{{variable}:?set {variable}: the {spec.name} task ids, e.g. 12,34}}"
    )
    environment["VALIDATOR_SHARD"] = f"{shard}/{workers}"
    volumes = [v for v in body["volumes"] if not v.endswith(f":{STATE_PATH}")]
    body["volumes"] = [*volumes, f"{state_key(spec.name, shard)}:{STATE_PATH}"]
    if gpu is not None:
        device = {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}
        body["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    if spec.status_port is not None:
        port = spec.status_port + shard * PORT_STEP
        environment["VALIDATOR_HTTP_PORT"] = str(port)
        body["healthcheck"] = healthcheck(port)
    body["environment"] = environment
    return body


def render_gpus(
    specs: dict[str, ModuleSpec],
    hosts: dict[str, list[str]],
    digests: Mapping[str, str] | None = None,
) -> str:
    """The text of compose.gpus.yaml for these specs and this host's GPUs."""
    services: dict[str, Any] = {}
    volumes: dict[str, dict[str, str]] = {}
    ports: dict[int, str] = {}
    for module, gpus in hosts.items():
        spec = specs[module]
        workers: list[str | None] = list(gpus) or [None]
        for shard, gpu in enumerate(workers):
            name = worker_name(module, gpu)
            body = worker_service(spec, gpu, shard, len(workers), digests)
            port = body["environment"].get("VALIDATOR_HTTP_PORT")
            if port is not None:
                if int(port) in ports:
                    raise ConfigError(
                        f"status port {port} of validator-{name} is also "
                        f"validator-{ports[int(port)]}'s; change a spec's status_port"
                    )
                ports[int(port)] = name
            services[f"validator-{name}"] = body
            for key in spec.volumes:
                volumes[key] = {"name": volume_name(key)}
            state = state_key(module, shard)
            volumes[state] = {"name": worker_state_volume(state_volume_name(module), shard)}
    return GPUS_HEADER + "\n" + _dump({"services": services, "volumes": volumes})

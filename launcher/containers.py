"""What the validator container gets: GPUs, volumes, environment, labels."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from docker.types import DeviceRequest

from launcher.errors import UsageError

LABEL_MODULE = "org.flock-validator.module"
LABEL_LAUNCHER = "org.flock-validator.launcher"
CONFIG_MOUNT = "/app/configs"
STATE_MOUNT = "/data/state"
HF_CACHE_MOUNT = "/data/hf-cache"
CHECK_MOUNT = "/input/check.json"
# Host environment variables the inner CLI reads (README.md, "The validator inside the
# container"); passed on when set.
PASSED_ENV = ("TIME_SLEEP", "ASSIGNMENT_LOOKUP_INTERVAL", "FLOCK_API_URL", "HF_ENDPOINT")
GPU_ID = re.compile(r"^(\d+|GPU-[0-9a-fA-F-]+)$")


def device_requests(gpus: str) -> list[DeviceRequest]:
    """`--gpus all|none|0,1` as Docker device requests."""
    if gpus == "none":
        return []
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    ids = [part.strip() for part in gpus.split(",")]
    if not ids or not all(GPU_ID.match(i) for i in ids):
        raise UsageError(f"--gpus {gpus!r}: use all, none, or device ids such as 0,1")
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


@dataclass
class ContainerSpec:
    image: str
    module: str
    inner_args: list[str]
    secrets: dict[str, str]
    config_dir: Path
    state_volume: str
    hf_cache_volume: str
    gpus: str = "all"
    network: str = "host"
    check_file: Path | None = None
    host_env: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        command = [self.module, *self.inner_args]
        if self.check_file is not None:
            command += ["--check", CHECK_MOUNT]
        return command

    def environment(self) -> dict[str, str]:
        passed = {k: v for k, v in self.host_env.items() if k in PASSED_ENV and v}
        # Secrets only travel as environment variables: never on the command line, never in
        # the image.
        return {**passed, **{k: v for k, v in self.secrets.items() if v}}

    def volumes(self) -> dict[str, dict[str, str]]:
        volumes = {
            str(self.config_dir.resolve()): {"bind": CONFIG_MOUNT, "mode": "ro"},
            self.state_volume: {"bind": STATE_MOUNT, "mode": "rw"},
            self.hf_cache_volume: {"bind": HF_CACHE_MOUNT, "mode": "rw"},
        }
        if self.check_file is not None:
            volumes[str(self.check_file.resolve())] = {"bind": CHECK_MOUNT, "mode": "ro"}
        return volumes

    def run_kwargs(self) -> dict:
        return {
            "image": self.image,
            "command": self.command(),
            "environment": self.environment(),
            "volumes": self.volumes(),
            "device_requests": device_requests(self.gpus),
            "network_mode": self.network,
            "labels": {LABEL_MODULE: self.module, LABEL_LAUNCHER: "run.py"},
            "init": True,  # signals reach python and zombies are reaped
            "detach": True,
        }

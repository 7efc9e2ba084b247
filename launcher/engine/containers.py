"""What the validator container gets: GPUs, volumes, environment, labels, log rotation."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from validator.spec import CHECK_SOURCE_ENV, CONFIG_PATH, CORE_ENV, STATE_PATH, STATE_SOURCE_ENV

if TYPE_CHECKING:
    from docker.types import DeviceRequest

LABEL_MODULE = "org.flock-validator.module"
LABEL_LAUNCHER = "org.flock-validator.launcher"
CHECK_MOUNT = "/input/check.json"
# Host environment variables the inner CLI reads (docs/one-host.md, "The validator inside
# the container"), passed on when set; TASK_IDS goes as an option. A module's spec adds its own.
PASSED_ENV = tuple(name for name in CORE_ENV if name != "TASK_IDS")
# Matched whole (fullmatch) and in ASCII: `$` let a trailing newline through, `\d` other
# scripts' digits.
GPU_ID = re.compile(r"[0-9]+|GPU-[0-9a-fA-F-]+")
# Docker's default log driver keeps one file per container that grows for as long as the
# container lives (months for a validator): rotated here at LOG_MAX_FILES files of LOG_MAX_SIZE
# (50 MB), which the host's environment may change. A daemon whose default driver is another
# (journald, local, a shipper's) was set so by the operator and is left to do its own.
LOG_DRIVER = "json-file"
LOG_MAX_SIZE = "10m"
LOG_MAX_FILES = "5"
LOG_MAX_SIZE_ENV = "VALIDATOR_LOG_MAX_SIZE"
LOG_MAX_FILES_ENV = "VALIDATOR_LOG_MAX_FILES"


def log_options(env: Mapping[str, str]) -> dict[str, str]:
    """The json-file driver's rotation: its size and count from `env`, or the defaults."""
    return {
        "max-size": env.get(LOG_MAX_SIZE_ENV) or LOG_MAX_SIZE,
        "max-file": env.get(LOG_MAX_FILES_ENV) or LOG_MAX_FILES,
    }


def volume_name(key: str) -> str:
    """The Docker volume behind a spec's volume key, shared by every module that declares it."""
    return f"flock-validator-{key}"


def state_volume_name(module: str) -> str:
    """A module's journal volume: each module keeps its own."""
    return f"flock-validator-{module}-state"


def worker_state_volume(base: str, index: int) -> str:
    """Worker K's journal, the one name run.py and Compose give it (a StatefulSet's pod K has
    its claim): `base` (the one-container volume, so that nothing of an existing journal is
    lost when a host goes from one GPU to several) for worker 0, `base-K` after it."""
    return base if index == 0 else f"{base}-{index}"


def device_requests(gpus: str) -> list[DeviceRequest]:
    """`--gpus all|none|0,1` as Docker device requests."""
    if gpus == "none":
        return []
    # Docker's client where a container is made, not where an option is read (run.py --help).
    from docker.types import DeviceRequest  # noqa: PLC0415

    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=gpu_ids(gpus), capabilities=[["gpu"]])]


def gpu_ids(gpus: str) -> list[str]:
    """The ids of `--gpus 0,1` (neither all nor none), each a GPU index or GPU-<uuid>; raises
    UsageError naming the flag for a list with anything else in it."""
    ids = [part.strip() for part in gpus.split(",")]
    if not all(GPU_ID.fullmatch(i) for i in ids):
        raise UsageError(f"--gpus {gpus!r}: use all, none, or device ids such as 0,1")
    return ids


@dataclass
class ContainerSpec:
    image: str
    module: str
    inner_args: list[str]
    secrets: dict[str, str]
    config_dir: Path
    volumes: dict[str, str]  # Docker volume name -> container path
    env_names: tuple[str, ...] = PASSED_ENV  # passed from host_env when set there
    gpus: str = "all"
    network: str = "host"
    check_file: Path | None = None
    host_env: dict[str, str] = field(default_factory=dict)
    name: str | None = None  # the container's name (a fleet's worker); None: Docker picks one
    env: dict[str, str] = field(default_factory=dict)  # set by the launcher (e.g. the worker)

    def command(self) -> list[str]:
        command = [self.module, *self.inner_args]
        if self.check_file is not None:
            command += ["--check", CHECK_MOUNT]
        return command

    def environment(self) -> dict[str, str]:
        passed = {k: v for k, v in self.host_env.items() if k in self.env_names and v}
        # The status page's report names the state by its volume, not by where it is mounted.
        state = [name for name, path in self.volumes.items() if path == STATE_PATH]
        source = {STATE_SOURCE_ENV: f"volume {state[0]}"} if state else {}
        if self.check_file is not None:  # --check's lines name the file the operator gave
            source[CHECK_SOURCE_ENV] = str(self.check_file.resolve())
        # Secrets only travel as environment variables: never on the command line, never in
        # the image.
        return {**passed, **source, **self.env, **{k: v for k, v in self.secrets.items() if v}}

    def mounts(self) -> dict[str, dict[str, str]]:
        volumes = {
            str(self.config_dir.resolve()): {"bind": CONFIG_PATH, "mode": "ro"},
            **{name: {"bind": path, "mode": "rw"} for name, path in self.volumes.items()},
        }
        if self.check_file is not None:
            volumes[str(self.check_file.resolve())] = {"bind": CHECK_MOUNT, "mode": "ro"}
        return volumes

    def run_kwargs(self, daemon_log_driver: str = LOG_DRIVER) -> dict:
        """The container's settings; `daemon_log_driver`: the engine's default log driver (the
        log is rotated when it is Docker's own default, json-file)."""
        named: dict[str, object] = {"name": self.name} if self.name else {}
        if daemon_log_driver == LOG_DRIVER:
            named["log_config"] = {"type": LOG_DRIVER, "config": log_options(self.host_env)}
        return {
            **named,
            "image": self.image,
            "command": self.command(),
            "environment": self.environment(),
            "volumes": self.mounts(),
            "device_requests": device_requests(self.gpus),
            "network_mode": self.network,
            "labels": {LABEL_MODULE: self.module, LABEL_LAUNCHER: "run.py"},
            "init": True,  # signals reach python and zombies are reaped
            "detach": True,
        }

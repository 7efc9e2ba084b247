"""A module's spec: `modules/<name>/module.yaml`, the one file that says what a module needs
around its code (its environment, a GPU, secrets, env vars, volumes, Compose settings).

The launcher, the inner CLI, the Makefile and `compose.yaml` all derive from it (README,
"Adding a module"). A folder without the file gets `ModuleSpec(name=<folder>)`: no secrets, no
GPU, `environment.yml` if it has one; so a bare `__init__.py` exposing `MODULE` still runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from validator.errors import ConfigError

SPEC_FILE = "module.yaml"
MAX_SPEC_BYTES = 64 * 1024
# Every validator gets these from the core; a module cannot redeclare them.
CORE_SECRETS = ("FLOCK_API_KEY",)
CORE_ENV = (
    "TASK_IDS",
    "FLOCK_API_URL",
    "TIME_SLEEP",
    "ASSIGNMENT_LOOKUP_INTERVAL",
    "VALIDATOR_MIN_FREE_MB",
    "VALIDATOR_HF_CACHE_MAX_GB",  # the shared HF cache's budget (validator/kit/hf_cache.py)
)
# The checkout (or the image's /app) that holds validator/, modules/ and configs/: computed here,
# once, for the launcher, the registry and the dev tools.
REPO_ROOT = Path(__file__).resolve().parent.parent
# The container paths the image owns (Dockerfile): a module's volumes go elsewhere under /data.
STATE_PATH = "/data/state"
CONFIG_PATH = "/app/configs"
RESERVED_PATHS = ("/app", STATE_PATH)
# Keys of a Compose service that the generator writes from the spec; `compose:` may not set them.
GENERATED_SERVICE_KEYS = frozenset(
    {
        "build",
        "image",
        "environment",
        "volumes",
        "deploy",
        "command",
        "entrypoint",
        "env_file",
        "stop_grace_period",
        "healthcheck",
    }
)
# A stop lets the assignment in progress finish; killed sooner, it would be scored again.
DEFAULT_STOP_GRACE_SECONDS = 120
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
VOLUME_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


class ModuleSpec(BaseModel):
    """What `modules/<name>/module.yaml` may say; every key but `name` is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    summary: str = ""
    environment: str = Field(
        default="environment.yml", description="the conda environment file, in the module folder"
    )
    gpu: bool = Field(default=False, description="run.py gives it all GPUs unless told otherwise")
    secrets: dict[str, str] = Field(
        default_factory=dict, description="env var -> what it is for; required at start-up"
    )
    env: list[str] = Field(
        default_factory=list, description="other env vars passed to the container when set"
    )
    volumes: dict[str, str] = Field(
        default_factory=dict,
        description="name -> container path; the Docker volume is flock-validator-<name>",
    )
    compose: dict[str, Any] = Field(
        default_factory=dict, description="more Compose service settings (shm_size, ...)"
    )
    status_port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="the port of the status page and /metrics in compose.yaml (127.0.0.1 of "
        "the host network), with a healthcheck on /healthz; each module its own",
    )
    stop_grace_seconds: int = Field(
        default=DEFAULT_STOP_GRACE_SECONDS,
        gt=0,
        le=24 * 3600,
        description="how long a stop waits for the assignment in progress before killing it: "
        "longer than one scoring takes on this module's slowest host",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, name: str) -> str:
        if not name.isidentifier() or name != name.lower():
            raise ValueError(f"{name!r} is not a lower-case Python identifier")
        return name

    @field_validator("environment")
    @classmethod
    def _plain_file_name(cls, environment: str) -> str:
        if not environment or "/" in environment or "\\" in environment or environment[0] == ".":
            raise ValueError(f"{environment!r} must be a file name in the module folder")
        return environment

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, secrets: dict[str, str]) -> dict[str, str]:
        for name in secrets:
            _check_env_name(name, "secret")
            if name in CORE_SECRETS:
                raise ValueError(f"{name} is the core's own secret; do not declare it")
        return secrets

    @field_validator("env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        for name in names:
            _check_env_name(name, "env var")
            if name in CORE_ENV or name in CORE_SECRETS:
                raise ValueError(f"{name} is passed by the core already; do not declare it")
        return names

    @field_validator("volumes")
    @classmethod
    def _volume_paths(cls, volumes: dict[str, str]) -> dict[str, str]:
        for name, path in volumes.items():
            if not VOLUME_NAME.fullmatch(name):
                raise ValueError(f"volume name {name!r}: use lower-case letters, digits and -")
            if not path.startswith("/data/") or ".." in path.split("/"):
                raise ValueError(f"volume {name}: {path!r} must be a path under /data/")
            if any(path == r or path.startswith(r + "/") for r in RESERVED_PATHS):
                raise ValueError(f"volume {name}: {path!r} is the validator's own")
        return volumes

    @field_validator("compose")
    @classmethod
    def _free_compose_keys(cls, compose: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(GENERATED_SERVICE_KEYS & set(compose))
        if taken:
            raise ValueError(f"{', '.join(taken)} are written from the spec; not settable here")
        return compose

    @model_validator(mode="after")
    def _secret_is_not_also_env(self) -> ModuleSpec:
        both = sorted(set(self.secrets) & set(self.env))
        if both:
            raise ValueError(f"{', '.join(both)} is listed as a secret and as an env var")
        return self

    def needs(self, secret: str) -> bool:
        return secret in CORE_SECRETS or secret in self.secrets


def _check_env_name(name: str, what: str) -> None:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r}: use upper-case letters, digits and _")
    if name.startswith("VALIDATOR_"):
        raise ValueError(f"{what} {name!r}: VALIDATOR_* names are the validator's own")


def load_spec(folder: Path) -> ModuleSpec:
    """The spec of the module in `folder`; the default one when it has no spec file.

    Raises ConfigError naming the file and the key for a spec that is not valid.
    """
    path = folder / SPEC_FILE
    if not path.is_file():
        return ModuleSpec(name=folder.name)
    where = f"modules/{folder.name}/{SPEC_FILE}"
    if path.stat().st_size > MAX_SPEC_BYTES:
        raise ConfigError(f"{where}: over {MAX_SPEC_BYTES} bytes")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of keys, e.g. `name: {folder.name}`")
    try:
        spec = ModuleSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(top)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigError(f"{where}: {problems}") from None
    if spec.name != folder.name:
        raise ConfigError(f"{where}: name {spec.name!r} must equal the folder's, {folder.name!r}")
    return spec


def module_folders(repo_root: Path) -> list[str]:
    """The names of the module folders in `repo_root/modules`: those with an `__init__.py`."""
    modules = repo_root / "modules"
    if not modules.is_dir():
        return []
    return sorted(
        folder.name
        for folder in modules.iterdir()
        if folder.is_dir() and folder.name.isidentifier() and (folder / "__init__.py").is_file()
    )


def discover_specs(modules_dir: Path) -> dict[str, ModuleSpec]:
    """The spec of every module folder in `modules_dir`, by name: what `make images` and the
    Compose generator work from."""
    return {name: load_spec(modules_dir / name) for name in module_folders(modules_dir.parent)}

"""A module's spec: `modules/<name>/module.yaml`, the one file that says what a module needs
around its code (its environment, a GPU, secrets, env vars, volumes, Compose settings).

The launcher, the inner CLI, the Makefile and `compose.yaml` all derive from it
(docs/adding-a-module.md). What a module is is decided here, once (`find_module_folders`): a
folder `modules/<identifier>/` holding both `__init__.py` and `module.yaml`. The registry, run.py,
the Compose and Kubernetes generators, the requirements generator and the Makefile's
`MODULES` (folders with both files) all use that rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from validator.errors import ConfigError, UnknownModuleError

SPEC_FILE = "module.yaml"
PACKAGE_FILE = "__init__.py"
# The folder under a root that holds the modules: `modules` is a namespace package, so every
# folder of that name on the Python path adds modules (the tests' fixture module, a third
# party's), each found by the same rule.
MODULES_DIR = "modules"
MAX_SPEC_BYTES = 64 * 1024
# The commands of run.py and `python -m validator`: the first word of either names a command or a
# module, so no module takes one of these names.
COMMANDS = frozenset({"run", "doctor", "report", "release", "compose", "kubernetes"})
# Every validator gets these from the core; a module cannot redeclare them.
CORE_SECRETS = ("FLOCK_API_KEY",)
CORE_ENV = (
    "TASK_IDS",
    "FLOCK_API_URL",
    "TIME_SLEEP",
    "ASSIGNMENT_LOOKUP_INTERVAL",
    "VALIDATOR_MIN_FREE_MB",
    "VALIDATOR_HF_CACHE_MAX_GB",  # the shared HF cache's budget (validator/outbound/hf_cache.py)
)
# The checkout (or the image's /app) that holds validator/, modules/ and configs/: computed here,
# once, for the launcher, the registry and the dev tools.
REPO_ROOT = Path(__file__).resolve().parent.parent
# The container paths the image owns (Dockerfile): a module's volumes go elsewhere under /data.
STATE_PATH = "/data/state"
# What the report calls the state dir when run.py mounts a volume there ("volume <name>").
STATE_SOURCE_ENV = "VALIDATOR_STATE_SOURCE"
# What `--check`'s messages call its input when run.py mounts it (its host path).
CHECK_SOURCE_ENV = "VALIDATOR_CHECK_SOURCE"
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
# A memory size as Kubernetes writes it, in the binary units a node's memory is counted in.
MEMORY_SIZE = re.compile(r"([1-9][0-9]*)(Mi|Gi)")
VOLUME_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
# A task type as the Fed Ledger's task list writes one (`training`).
TASK_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# The model a YAML file is read into (load_yaml_model).
M = TypeVar("M", bound=BaseModel)


class MemorySpec(BaseModel):
    """What one validator of the module needs in host memory (a Kubernetes pod's request: the
    scheduler places it where this much is free) and the most it may take (its limit: past
    it the kernel kills it, exit 137, and the pod is restarted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request: str = Field(description="e.g. 16Gi: what it holds while it scores")
    limit: str = Field(description="e.g. 32Gi: its peak, with room")

    @field_validator("request", "limit")
    @classmethod
    def _size(cls, size: str) -> str:
        if not MEMORY_SIZE.fullmatch(size):
            raise ValueError(f"{size!r}: a whole number of Mi or Gi, e.g. 512Mi or 16Gi")
        return size

    @model_validator(mode="after")
    def _limit_covers_request(self) -> MemorySpec:
        if memory_bytes(self.limit) < memory_bytes(self.request):
            raise ValueError(f"limit {self.limit} is under request {self.request}")
        return self


def memory_bytes(size: str) -> int:
    number, unit = MEMORY_SIZE.fullmatch(size).groups()  # type: ignore[union-attr]
    return int(number) * 2 ** {"Mi": 20, "Gi": 30}[unit]


DEFAULT_MEMORY = MemorySpec(request="2Gi", limit="8Gi")


def _check_task_type(name: str) -> str:
    if not TASK_TYPE.fullmatch(name):
        raise ValueError(f"task type {name!r}: letters, digits and _.:- (64 at most)")
    return name


class UnknownTaskType(BaseModel):
    """A module whose tasks' `task_type` in the Fed Ledger's task list is not yet known: why,
    and the names the network's code gives those tasks, none confirmed by a task list. A
    listed task of one of these names is taken for this module's: started under this module,
    and refused under any other (validator/ledger/task_types.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unknown: str = Field(min_length=1, max_length=600, description="why it is not known yet")
    names: tuple[str, ...] = Field(
        default=(), description="the names the network's code gives these tasks"
    )

    @field_validator("names")
    @classmethod
    def _names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            _check_task_type(name)
        return names


class ProtocolPin(BaseModel):
    """The network's code a module's rules follow: a repository, the folder of this module's
    rules in it, and the commit we compared with (validator/observe/drift.py watches for
    commits after it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    path: str = Field(default="", pattern=r"^[A-Za-z0-9_./-]*$")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")


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
    required_env: dict[str, str] = Field(
        default_factory=dict,
        description="env var -> what it is for: a setting that is no secret and that the "
        "module cannot start without; it joins `env` (passed when set), and a start or a "
        "doctor without it names it with the missing secrets",
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
    memory: MemorySpec = Field(
        default=DEFAULT_MEMORY,
        description="host memory of one validator: `request` and `limit` of a Kubernetes pod",
    )
    test_venv: Literal["shared", "own"] = Field(
        default="shared",
        description="where the module's host tests (tests/<name>/) run: `shared`, the dev venv "
        "(.venv, which installs requirements-<name>.txt); `own`, a venv of its own "
        "(.venv-<name>), for a stack that conflicts with the dev venv's",
    )

    protocol: ProtocolPin | None = Field(
        default=None, description="the network's repository, folder and commit the rules follow"
    )
    config_schema: str | None = Field(
        default=None,
        pattern=r"^([a-z_][a-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$",
        description="where MODULE.config_schema is defined: `schemas.LoraConfig` (a file of "
        "the module folder that imports without the module's own dependencies) or "
        "`FixtureConfig` (the module's __init__.py); run.py and the doctor then check "
        "configs/ on the host, before any container starts",
    )
    cuda: str | None = Field(
        default=None,
        pattern=r"^[0-9]+\.[0-9]+$",
        description="the CUDA version of the module's GPU libraries (torch's wheel), e.g. "
        "13.0: run.py and the doctor check that the host's NVIDIA driver runs it",
    )
    task_type: str | UnknownTaskType | None = Field(
        default=None,
        description="the `task_type` of this module's tasks in the Fed Ledger's task list "
        "(`training`), or `{unknown: why, names: [...]}` while it is not known: the validator "
        "and the doctor refuse a task whose type is another module's. None (not declared): "
        "taken as unknown, with no names",
    )
    penalty_rules: str = Field(
        default="",
        max_length=600,
        description="what the network does with a submission it cannot score (its penalty "
        "score, or failed), in a sentence or two: the status page shows it beside the results",
    )

    @model_validator(mode="before")
    @classmethod
    def _required_env_is_passed(cls, raw: Any) -> Any:
        """The names of `required_env` join `env`, first: whatever passes a module's env vars
        to its container passes them too, and the spec names each once."""
        if not isinstance(raw, dict):
            return raw
        required, env = raw.get("required_env"), raw.get("env") or []
        if not isinstance(required, dict) or not isinstance(env, list):
            return raw  # the fields' own checks say what is wrong
        return {**raw, "env": [*(name for name in required if name not in env), *env]}

    @field_validator("name")
    @classmethod
    def _identifier(cls, name: str) -> str:
        if not name.isidentifier() or name != name.lower():
            raise ValueError(f"{name!r} is not a lower-case Python identifier")
        if name in COMMANDS:
            raise ValueError(
                f"{name!r} is a command (python run.py {name}): give the module another name"
            )
        return name

    @field_validator("task_type")
    @classmethod
    def _task_type(cls, task_type: str | UnknownTaskType | None) -> str | UnknownTaskType | None:
        return _check_task_type(task_type) if isinstance(task_type, str) else task_type

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

    def task_type_names(self) -> frozenset[str]:
        """The `task_type`s a listed task of this module may have: its declared one, or while
        that is not known the names the network's code gives it (none when undeclared)."""
        if isinstance(self.task_type, str):
            return frozenset({self.task_type})
        return frozenset(self.task_type.names if self.task_type else ())


def _check_env_name(name: str, what: str) -> None:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r}: use upper-case letters, digits and _")
    if name.startswith("VALIDATOR_"):
        raise ValueError(f"{what} {name!r}: VALIDATOR_* names are the validator's own")


def yaml_problems(exc: ValidationError) -> str:
    """A YAML file's problems in one line, each at its dotted key: `name: Field required`."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or '(top)'}: {error['msg']}"
        for error in exc.errors()
    )


def load_yaml_model(path: Path, where: str, max_bytes: int, model: type[M], shape: str) -> M:
    """`model` of the YAML mapping in the file at `path`, or ConfigError in one line that
    names `where`: over `max_bytes`, not YAML, not a mapping (`shape` says what it must be),
    or not valid (each problem at its key)."""
    if path.stat().st_size > max_bytes:
        raise ConfigError(f"{where}: over {max_bytes} bytes")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        # PyYAML's message spans lines (a caret under the spot); one line here.
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {shape}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {yaml_problems(exc)}") from None


def load_spec(folder: Path) -> ModuleSpec:
    """The spec of the module in `folder`.

    Raises ConfigError naming the file (and the key) for a spec that is missing or not valid.
    """
    path = folder / SPEC_FILE
    where = f"modules/{folder.name}/{SPEC_FILE}"
    if not path.is_file():
        raise ConfigError(f"{where} is missing: every module has a spec (docs/adding-a-module.md)")
    spec = load_yaml_model(
        path,
        where,
        MAX_SPEC_BYTES,
        ModuleSpec,
        f"must be a mapping of keys, e.g. `name: {folder.name}`",
    )
    if spec.name != folder.name:
        raise ConfigError(f"{where}: name {spec.name!r} must equal the folder's, {folder.name!r}")
    return spec


def is_module_folder(folder: Path) -> bool:
    """The one rule: a module is a folder `modules/<identifier>/` with an `__init__.py` (so
    that `modules.<name>` imports) and a `module.yaml` (so that its container can be built and
    run). The Makefile's MODULES applies the same rule to this checkout's modules/."""
    return (
        folder.name.isidentifier()
        and (folder / PACKAGE_FILE).is_file()
        and (folder / SPEC_FILE).is_file()
    )


def find_module_folders(*roots: Path) -> dict[str, Path]:
    """Every module under `<root>/modules/` of each root (this checkout's when none is given),
    name -> folder, sorted by name. Where two roots hold the same name the first wins, as an
    import of `modules.<name>` would. Specs are not read: a bad one is reported by the module's
    own `load_spec`, not by every command that lists the modules."""
    found: dict[str, Path] = {}
    for root in roots or (REPO_ROOT,):
        modules = root / MODULES_DIR
        if not modules.is_dir():
            continue
        for folder in sorted(modules.iterdir()):
            if folder.name not in found and is_module_folder(folder):
                found[folder.name] = folder
    return dict(sorted(found.items()))


def find_modules(*roots: Path) -> dict[str, ModuleSpec]:
    """The spec of every module under the roots (see `find_module_folders`), by name; raises
    ConfigError for the first spec that is not valid."""
    return {name: load_spec(folder) for name, folder in find_module_folders(*roots).items()}


def readable_modules(*roots: Path) -> dict[str, ModuleSpec]:
    """The spec of every module under the roots whose spec reads, by name: what the others
    declare (their task types) must not depend on a third party's broken spec, which that
    module's own commands report."""
    found = {}
    for name, folder in find_module_folders(*roots).items():
        try:
            found[name] = load_spec(folder)
        except ConfigError:
            continue
    return found


def module_folder(name: str, *roots: Path) -> Path:
    """The folder of module `name` under the roots (this checkout's when none is given), found
    without importing it (its dependencies may be missing here). Raises UnknownModuleError
    listing the modules that exist, and saying what a folder of that name lacks."""
    known = find_module_folders(*roots)
    if name.isidentifier() and name in known:
        return known[name]
    listing = ", ".join(known) or "none found"
    message = f"unknown module {name!r}; available modules: {listing}"
    if name.isidentifier():
        for root in roots or (REPO_ROOT,):
            folder = root / MODULES_DIR / name
            lacking = [f for f in (PACKAGE_FILE, SPEC_FILE) if not (folder / f).is_file()]
            if folder.is_dir() and lacking:
                message += (
                    f" (modules/{name}/ has no {' and no '.join(lacking)}: a module needs both;"
                    " python -m devkit.scaffold writes a complete one)"
                )
                break
    raise UnknownModuleError(message)

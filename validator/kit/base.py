"""The module plugin API (docs/module-api.md).

A module lives in `modules/<name>/`, and its `__init__.py` exposes a subclass of
`BaseValidationModule` as `MODULE`. The orchestrator builds one instance per distinct resolved
config and calls `validate()` once per assignment, then `cleanup()`. A module names its config
and input types as the class's parameters, `BaseValidationModule[MyConfig, MyInput]`, so that a
type checker reads `self.config` and `validate`'s argument as the module's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from validator.sandbox.child_result import ChildLimits


class BaseConfig(BaseModel):
    """Operator settings of a module, read from `configs/`. Unknown keys are errors, so a typo in
    a config file is reported instead of silently ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class BaseInputData(BaseModel):
    """One assignment's input: the assignment's `data` over the submission's. The API may add
    fields a module does not use, so extra fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # The fields a trainer submits (`task_submission.data`); every other field defines the task
    # and is taken from the assignment's `data` only, so that a submitter cannot supply one the
    # task left out. None: any field from either, as upstream merges them.
    submitter_fields: ClassVar[frozenset[str] | None] = None
    # Fields holding a URL that the loop fetches: http(s) only there (a local path would read
    # this host's files); `--check` also takes a local path.
    url_fields: ClassVar[frozenset[str]] = frozenset()


class BaseMetrics(BaseModel):
    """What is submitted as the assignment's `data` when it is completed."""

    model_config = ConfigDict(frozen=True, extra="forbid")


ConfigT = TypeVar("ConfigT", bound=BaseConfig)
InputT = TypeVar("InputT", bound=BaseInputData)


class BaseValidationModule(ABC, Generic[ConfigT, InputT]):
    config_schema: ClassVar[type[BaseConfig]] = BaseConfig
    input_data_schema: ClassVar[type[BaseInputData]] = BaseInputData
    metrics_schema: ClassVar[type[BaseMetrics]] = BaseMetrics
    # The tasks' Fed Ledger type is the spec's (module.yaml `task_type`); a class that still sets
    # this is read where the spec declares none, with a warning (validator/config.py).
    task_type: ClassVar[str] = ""

    def __init__(self, config: ConfigT) -> None:
        self.config = config

    @classmethod
    def check_setup(cls, config: ConfigT) -> str | None:
        """The module's start-up checks of what it needs around it (an endpoint, its key, texts
        it reads), for one resolved config. The validator calls it for every distinct config of
        its tasks before it asks for any assignment, and the doctor calls it for its row; a
        failure stops the validator at start (exit 3) with no assignment taken. Raise
        `ConfigError` or `OperatorError` naming what to fix, every missing setting at once.
        Cheap: seconds at most, no base model loaded. Returns what was checked, in a few
        words, for the doctor's row; None: nothing to check (the default)."""
        return None

    @classmethod
    def child_limits(cls, config: ConfigT) -> dict[str, ChildLimits]:
        """The bounds of the module's own bounded children (`run_child`) under one resolved
        config, each keyed by the config keys that set it (`{"inference_memory_bytes": ...}`).
        The validator checks them, with the kit's own children's (`SUBMISSION_LIMITS`),
        against its hard limits before it asks for any assignment, and the doctor in its
        module setup row: a bound no child could take (a child cannot raise a hard limit it
        inherits) stops the validator (exit 3) with one line naming it and what to set. A
        bound that grows with an assignment: its smallest. Default: none of its own."""
        return {}

    @abstractmethod
    def validate(self, data: InputT) -> BaseMetrics:
        """Score one submission. Raise `OperatorError` for operator-side problems,
        `TransientError` for network faults; any other exception fails the assignment."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Called after every assignment, scored or not: remove downloaded submission files."""

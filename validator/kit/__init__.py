"""The one import for module authors (docs/module-api.md): everything a module needs from the
validator, and nothing of the loop.

    from validator.kit import BaseValidationModule, SubmissionRejected, current_scope

Names are loaded on first use, so a module that needs no torch (rl) does not import it through
`check_lora_against_base` or the warm-base helpers. What is not listed in `__all__` is the
validator's own and may move.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it (a module's own name maps to itself: `hub`); the same
# names, in the same order, are __all__ below.
_WHERE = {
    # the plugin contract
    "BaseConfig": "validator.kit.base",
    "BaseInputData": "validator.kit.base",
    "BaseMetrics": "validator.kit.base",
    "BaseValidationModule": "validator.kit.base",
    # what validate() raises (validator/errors.py: the failure contract)
    "SubmissionRejected": "validator.errors",
    "RecoverableException": "validator.errors",
    "OperatorError": "validator.errors",
    "ConfigError": "validator.errors",
    "TransientError": "validator.errors",
    "DeviceError": "validator.errors",
    # the runtime scope: host work, notes, heartbeats, progress
    "Scope": "validator.kit.scope",
    "HostPhase": "validator.kit.scope",
    "current_scope": "validator.kit.scope",
    "Progress": "validator.kit.scope",
    # the run context: this process's settings (state dir, HF cache budget, secrets)
    "RunContext": "validator.kit.run_context",
    "current_run": "validator.kit.run_context",
    # files and processes
    "WorkArea": "validator.kit.workdirs",
    "fetch_validation_set": "validator.kit.downloads",
    "overall_deadline": "validator.kit.deadline",
    "CallAbandoned": "validator.kit.deadline",
    "wait_or_stop": "validator.kit.deadline",
    "loads_bounded": "validator.kit.safe_json",
    "JsonRefused": "validator.errors",
    "run_child": "validator.kit.child_process",
    "ChildLimits": "validator.kit.child_process",
    "ChildOutcome": "validator.kit.child_process",
    "inspect_in_child": "validator.kit.boundary",
    "SUBMISSION_LIMITS": "validator.kit.boundary",
    "CHILD_ENV": "validator.kit.boundary",
    "read_child_file": "validator.kit.child_files",
    "write_new": "validator.kit.child_files",
    "discard": "validator.kit.child_files",
    "ChildFileRefused": "validator.kit.child_files",
    # the Hugging Face Hub, with deadlines and the failure contract
    "hub": "validator.kit.hub",
    "fetch_base_model": "validator.kit.hub",
    "check_lora_against_base": "validator.kit.adapter_bounds",
    "ranks_of": "validator.kit.adapter_bounds",
    "replicated_layers": "validator.kit.adapter_bounds",
    "check_layer_replication": "validator.kit.adapter_bounds",
    "check_adapter_patterns": "validator.kit.adapter_patterns",
    "LoraTensor": "validator.kit.adapter_bounds",
    # a warm base: one base kept loaded, each adapter applied to it and undone bit for bit, the
    # base checked after every assignment (torch and peft); where models run
    "PristineWeights": "validator.kit.pristine",
    "BaseNotRestored": "validator.errors",
    "merge_targets": "validator.kit.pristine",
    "forget_peft": "validator.kit.pristine",
    "BaseFingerprint": "validator.kit.fingerprint",
    "base_intact": "validator.kit.fingerprint",
    "WarmBase": "validator.kit.warm_base",
    "HeldBase": "validator.kit.warm_base",
    "adapter_applied": "validator.kit.warm_base",
    "reading_base": "validator.kit.warm_base",
    "pick_device": "validator.kit.warm_base",
    # text in reasons and logs
    "quoted": "validator.text",
    "one_line": "validator.text",
}

__all__ = [
    "BaseConfig",
    "BaseInputData",
    "BaseMetrics",
    "BaseValidationModule",
    "SubmissionRejected",
    "RecoverableException",
    "OperatorError",
    "ConfigError",
    "TransientError",
    "DeviceError",
    "Scope",
    "HostPhase",
    "current_scope",
    "Progress",
    "RunContext",
    "current_run",
    "WorkArea",
    "fetch_validation_set",
    "overall_deadline",
    "CallAbandoned",
    "wait_or_stop",
    "loads_bounded",
    "JsonRefused",
    "run_child",
    "ChildLimits",
    "ChildOutcome",
    "inspect_in_child",
    "SUBMISSION_LIMITS",
    "CHILD_ENV",
    "read_child_file",
    "write_new",
    "discard",
    "ChildFileRefused",
    "hub",
    "fetch_base_model",
    "check_lora_against_base",
    "ranks_of",
    "replicated_layers",
    "check_layer_replication",
    "check_adapter_patterns",
    "LoraTensor",
    "PristineWeights",
    "BaseNotRestored",
    "merge_targets",
    "forget_peft",
    "BaseFingerprint",
    "base_intact",
    "WarmBase",
    "HeldBase",
    "adapter_applied",
    "reading_base",
    "pick_device",
    "quoted",
    "one_line",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'validator.kit' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ above
    from validator.errors import (
        BaseNotRestored,
        ConfigError,
        DeviceError,
        JsonRefused,
        OperatorError,
        RecoverableException,
        SubmissionRejected,
        TransientError,
    )
    from validator.kit import hub
    from validator.kit.adapter_bounds import (
        LoraTensor,
        check_layer_replication,
        check_lora_against_base,
        ranks_of,
        replicated_layers,
    )
    from validator.kit.adapter_patterns import check_adapter_patterns
    from validator.kit.base import BaseConfig, BaseInputData, BaseMetrics, BaseValidationModule
    from validator.kit.boundary import CHILD_ENV, SUBMISSION_LIMITS, inspect_in_child
    from validator.kit.child_files import ChildFileRefused, discard, read_child_file, write_new
    from validator.kit.child_process import ChildLimits, ChildOutcome, run_child
    from validator.kit.deadline import CallAbandoned, overall_deadline, wait_or_stop
    from validator.kit.downloads import fetch_validation_set
    from validator.kit.fingerprint import BaseFingerprint, base_intact
    from validator.kit.hub import fetch_base_model
    from validator.kit.pristine import PristineWeights, forget_peft, merge_targets
    from validator.kit.run_context import RunContext, current_run
    from validator.kit.safe_json import loads_bounded
    from validator.kit.scope import HostPhase, Progress, Scope, current_scope
    from validator.kit.warm_base import (
        HeldBase,
        WarmBase,
        adapter_applied,
        pick_device,
        reading_base,
    )
    from validator.kit.workdirs import WorkArea
    from validator.text import one_line, quoted

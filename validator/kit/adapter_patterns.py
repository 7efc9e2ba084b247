"""The module patterns of an adapter's config, run in a bounded child before peft runs them in
the validator's process. peft matches `target_modules` (as one pattern), the
keys of `rank_pattern` and `alpha_pattern`, `exclude_modules`, `layers_pattern` and
`modules_to_save` as regular expressions against every module name of the base; a pattern that
backtracks (`(?:.|.|.|.)*Z|.*_proj`) takes minutes per name, in the validator's own process.

The child (validator/sandbox/pattern_child.py) runs the same matches against the same names under a
small CPU limit: when it finishes, peft's matches cost the validator no more than that; when it does
not, the adapter is the submission's fault. For modules that apply adapters with peft (lora,
llm_judge).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from torch import nn

from validator import sandbox
from validator.kit.boundary import SUBMISSION_LIMITS, inspect_in_child
from validator.sandbox.child_process import ChildLimits

CHILD = Path(sandbox.__file__).with_name("pattern_child.py")
# A real adapter's patterns match a 7B base's thousand module names in milliseconds; peft
# repeats the work in the validator's process, so this is also what it may cost there.
PATTERN_LIMITS = ChildLimits(
    wall_seconds=60.0,
    cpu_seconds=10.0,
    memory_bytes=SUBMISSION_LIMITS.memory_bytes,
    file_bytes=SUBMISSION_LIMITS.file_bytes,
)


class _Probed(BaseModel):
    patterns: int


def check_adapter_patterns(config_file: Path, base: nn.Module, work: Path) -> int:
    """Runs the adapter config's module patterns against `base`'s module names in a bounded
    child; returns how many there were. SubmissionRejected when one does not compile or they
    do not finish within PATTERN_LIMITS."""
    names = [name for name, _ in base.named_modules()]
    answer = inspect_in_child(
        CHILD,
        {"config": str(config_file), "names": names},
        work=work,
        what="adapter_config.json's module patterns",
        answer=_Probed,
        limits=PATTERN_LIMITS,
    )
    return answer.patterns

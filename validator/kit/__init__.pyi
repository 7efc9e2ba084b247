# isort: skip_file
# (the order and the groups below are the kit's table of contents, not alphabetical)
"""The names of `validator.kit`, in one table: type checkers and editors read these imports,
and at run time `lazy_loader.attach_stub` (scientific-python SPEC 1) reads the same ones to make
the kit's `__getattr__`, `__dir__` and `__all__` (validator/kit/__init__.py). A name is public
once it is imported here; each is imported on first use.

Only `from .x import Y as Y` and `from . import x as x` lines, relative and within the kit, as
attach_stub requires (`as Y`: what a stub re-exports, PEP 484). A name defined outside the kit
comes through a kit module that re-exports it, named after what it faces: `errors`
(validator/errors.py), `text` (validator/text.py), `scope` (validator/scope.py), `run_context`
(validator/run_context.py), `outbound` (validator/outbound/), `sandbox` (validator/sandbox/).
Every file of the kit is named here (tests/test_rooms.py).
"""

# the plugin contract
from .base import (
    BaseConfig as BaseConfig,
    BaseInputData as BaseInputData,
    BaseMetrics as BaseMetrics,
    BaseValidationModule as BaseValidationModule,
)

# what validate() raises (validator/errors.py: the failure contract)
from .errors import (
    SubmissionRejected as SubmissionRejected,
    OperatorError as OperatorError,
    ConfigError as ConfigError,
    TransientError as TransientError,
    DeviceError as DeviceError,
)

# the runtime scope: host work, notes, penalties, heartbeats, progress
from .scope import (
    Scope as Scope,
    HostPhase as HostPhase,
    PenaltyKind as PenaltyKind,
    PENALTY_KINDS as PENALTY_KINDS,
    current_scope as current_scope,
    Progress as Progress,
)
from .progress import watch_bytes as watch_bytes

# the run context: this process's settings (state dir, HF cache budget, secrets)
from .run_context import RunContext as RunContext, current_run as current_run

# files and processes
from .workdirs import WorkArea as WorkArea
from .downloads import fetch_validation_set as fetch_validation_set
from .outbound import (
    overall_deadline as overall_deadline,
    CallAbandoned as CallAbandoned,
    wait_or_stop as wait_or_stop,
)
from .outbound import loads_bounded as loads_bounded
from .errors import JsonRefused as JsonRefused

# answers from outside: one bounded reader (a cap per kind of call, docs/reliability.md)
from .outbound import (
    fetch_answer as fetch_answer,
    Answer as Answer,
    Cap as Cap,
    ANSWER_CAPS as ANSWER_CAPS,
    capped_session as capped_session,
    capped_event_hooks as capped_event_hooks,
    reading_at_most as reading_at_most,
)
from .errors import AnswerTooLarge as AnswerTooLarge
from .sandbox import (
    run_child as run_child,
    ChildLimits as ChildLimits,
    ChildOutcome as ChildOutcome,
)
from .boundary import (
    inspect_in_child as inspect_in_child,
    SUBMISSION_LIMITS as SUBMISSION_LIMITS,
    CHILD_ENV as CHILD_ENV,
)
from .sandbox import (
    read_child_file as read_child_file,
    write_new as write_new,
    discard as discard,
    ChildFileRefused as ChildFileRefused,
)

# the Hugging Face Hub, with deadlines and the failure contract
from . import hub as hub
from .base_models import fetch_base_model as fetch_base_model
from .listing import (
    checked_listing as checked_listing,
    MAX_LISTED_FILES as MAX_LISTED_FILES,
)
from .adapter_bounds import (
    check_lora_against_base as check_lora_against_base,
    ranks_of as ranks_of,
    replicated_layers as replicated_layers,
    check_layer_replication as check_layer_replication,
)
from .adapter_patterns import check_adapter_patterns as check_adapter_patterns
from .adapter_bounds import LoraTensor as LoraTensor

# a warm base: one base kept loaded, each adapter applied to it and undone bit for bit, the
# base checked after every assignment (torch and peft); where models run
from .pristine import PristineWeights as PristineWeights
from .errors import BaseNotRestored as BaseNotRestored
from .pristine import merge_targets as merge_targets, forget_peft as forget_peft
from .fingerprint import BaseFingerprint as BaseFingerprint, base_intact as base_intact
from .warm_base import (
    WarmBase as WarmBase,
    HeldBase as HeldBase,
    adapter_applied as adapter_applied,
    reading_base as reading_base,
    pick_device as pick_device,
)

# text in reasons and logs
from .text import quoted as quoted, one_line as one_line, short_commit as short_commit

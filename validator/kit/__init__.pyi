# isort: skip_file
# (the order and the groups below are the kit's table of contents, not alphabetical)
"""The names of `validator.kit`, in one table: type checkers and editors read these imports, and
at run time validator/kit/__init__.py reads the same ones to load each name on first use. A
name is public once it is imported here, from the module that defines it; docs/module-api.md's
list of names is written from this table (`python -m scripts.kit_docs`).

Only `from X import Y as Y` lines (`as Y`: what a stub re-exports, PEP 484), each group under
a one-line comment that titles it. Every file of the kit is named here (tests/test_rooms.py).
"""

# the plugin contract
from .base import (
    BaseConfig as BaseConfig,
    BaseInputData as BaseInputData,
    BaseMetrics as BaseMetrics,
    BaseValidationModule as BaseValidationModule,
)

# what validate() raises: the failure contract
from validator.errors import (
    SubmissionRejected as SubmissionRejected,
    OperatorError as OperatorError,
    ConfigError as ConfigError,
    TransientError as TransientError,
    DeviceError as DeviceError,
)

# the runtime scope: host work, notes, penalties, heartbeats, progress
from validator.scope import (
    Scope as Scope,
    HostPhase as HostPhase,
    PenaltyKind as PenaltyKind,
    PENALTY_KINDS as PENALTY_KINDS,
    current_scope as current_scope,
    Progress as Progress,
)
from .progress import watch_bytes as watch_bytes

# the run context: this process's settings (state dir, HF cache budget, secrets)
from validator.run_context import RunContext as RunContext, current_run as current_run

# files, deadlines and bounded JSON
from .workdirs import WorkArea as WorkArea
from .downloads import fetch_validation_set as fetch_validation_set
from validator.outbound.deadline import (
    overall_deadline as overall_deadline,
    CallAbandoned as CallAbandoned,
    wait_or_stop as wait_or_stop,
)
from validator.outbound.safe_json import loads_bounded as loads_bounded
from validator.errors import JsonRefused as JsonRefused

# answers from outside: one bounded reader, a cap per kind of call (docs/reliability.md)
from validator.outbound.bounded_reader import (
    fetch_answer as fetch_answer,
    Answer as Answer,
    capped_session as capped_session,
    capped_event_hooks as capped_event_hooks,
)
from validator.outbound.answer_caps import (
    Cap as Cap,
    ANSWER_CAPS as ANSWER_CAPS,
    reading_at_most as reading_at_most,
)
from validator.errors import AnswerTooLarge as AnswerTooLarge

# bounded children: what a submission brings that could run, or that a library parses
from validator.sandbox.child_process import run_child as run_child
from validator.sandbox.child_result import (
    ChildLimits as ChildLimits,
    ChildOutcome as ChildOutcome,
)
from .boundary import (
    inspect_in_child as inspect_in_child,
    SUBMISSION_LIMITS as SUBMISSION_LIMITS,
    CHILD_ENV as CHILD_ENV,
)
from validator.sandbox.child_files import (
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

# adapters: checked against their base before peft reads them
from .adapter_bounds import (
    check_lora_against_base as check_lora_against_base,
    ranks_of as ranks_of,
    replicated_layers as replicated_layers,
    check_layer_replication as check_layer_replication,
    LoraTensor as LoraTensor,
)
from .adapter_patterns import check_adapter_patterns as check_adapter_patterns

# a warm base: one base kept loaded, each adapter applied and undone bit for bit (torch, peft)
from .pristine import (
    PristineWeights as PristineWeights,
    merge_targets as merge_targets,
    forget_peft as forget_peft,
)
from validator.errors import BaseNotRestored as BaseNotRestored
from .fingerprint import BaseFingerprint as BaseFingerprint, base_intact as base_intact
from .warm_base import (
    WarmBase as WarmBase,
    HeldBase as HeldBase,
    adapter_applied as adapter_applied,
    reading_base as reading_base,
    pick_device as pick_device,
)

# text in reasons and logs
from validator.text import quoted as quoted, one_line as one_line, short_commit as short_commit

# earlier spellings: a module's own aliases, each with the release that removes it
from validator._moved import (
    moved_name as moved_name,
    alias as alias,
    MovedPathWarning as MovedPathWarning,
)

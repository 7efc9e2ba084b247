"""The runtime scope as a module author imports it, re-exported from validator/scope.py, where
the loop enters a scope of its own for each assignment (validator/state/phases.py). Import the
names from `validator.kit` (its one table: `validator/kit/__init__.pyi`).
"""

from validator.scope import PENALTY_KINDS as PENALTY_KINDS
from validator.scope import HostPhase as HostPhase
from validator.scope import PenaltyKind as PenaltyKind
from validator.scope import Progress as Progress
from validator.scope import Scope as Scope
from validator.scope import current_scope as current_scope

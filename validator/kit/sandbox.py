"""Bounded children as a module author uses them: `run_child` and its limits and outcomes, and
the reading and writing of a child's folder, re-exported from validator/sandbox/ (Landlock,
seccomp, the reaper and the child servers stay there). Import the names from `validator.kit`
(its one table: `validator/kit/__init__.pyi`).
"""

from validator.sandbox.child_files import ChildFileRefused as ChildFileRefused
from validator.sandbox.child_files import discard as discard
from validator.sandbox.child_files import read_child_file as read_child_file
from validator.sandbox.child_files import write_new as write_new
from validator.sandbox.child_process import ChildLimits as ChildLimits
from validator.sandbox.child_process import ChildOutcome as ChildOutcome
from validator.sandbox.child_process import run_child as run_child

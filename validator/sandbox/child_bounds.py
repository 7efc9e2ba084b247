"""A bounded child's bounds against the validator's own hard limits, which every child inherits
and none can raise (without CAP_SYS_RESOURCE, which the module image's user has not): checked
at start and by the doctor (`ChildLimits.check_fits`, from validator/config.py), so that a
bound the host cannot give stops the validator with one line, never a submission's failure.
What the child arms is validator/sandbox/child_limits.py's `arm_limits`; what its set-up says
when one is refused comes back through `run_child` as the same error (`refused`).
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from validator.errors import ChildBoundUnfit
from validator.sandbox.child_limits import CPU_HARD_MARGIN

if TYPE_CHECKING:
    from validator.sandbox.child_result import ChildLimits

CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class Bound:
    """One limit a child sets: its bound in a ChildLimits (None: not set), what the child's
    hard limit must exceed it by at least, and how to word it."""

    name: str  # the rlimit, as getrlimit names it
    rlimit: int
    value: Callable[[ChildLimits], float | None]
    room: int  # the hard limit must be at least value + room (a whole number, rounded up)
    what: str  # the bound in words, with {n}
    unit: str  # the limit's
    ulimit: str  # the shell's command that shows it
    container: str  # where a container's comes from


BOUNDS = (
    # The child's address space after its preloads (its interpreter: more than nothing), plus
    # memory_bytes.
    Bound(
        "RLIMIT_AS",
        resource.RLIMIT_AS,
        lambda limits: limits.memory_bytes,
        1,
        "an address space of {n} bytes on top of its interpreter's",
        "bytes",
        "ulimit -Hv",
        "the Docker daemon's own (its unit's LimitAS=): --ulimit has no address space",
    ),
    # Its CPU seconds after the preloads, plus cpu_seconds, one more, and the margin to SIGKILL.
    Bound(
        "RLIMIT_CPU",
        resource.RLIMIT_CPU,
        lambda limits: limits.cpu_seconds,
        1 + CPU_HARD_MARGIN,
        "{n:g} CPU seconds (and {room} more)",
        "s",
        "ulimit -Ht",
        "--ulimit cpu=",
    ),
    Bound(
        "RLIMIT_FSIZE",
        resource.RLIMIT_FSIZE,
        lambda limits: limits.file_bytes,
        0,
        "files of {n} bytes",
        "bytes",
        "ulimit -Hf",
        "--ulimit fsize=",
    ),
)


def may_raise_hard_limits() -> bool:
    """Whether this process (so its children) holds CAP_SYS_RESOURCE: then a child raises what
    it inherited, and no hard limit is in its way."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except OSError:
        pass
    return False


def unfit(source: str, limits: ChildLimits, lower: str | None) -> str | None:
    """The one line that says which of `limits` (set by `source`) this process's hard limits
    leave no room for, which limit, and what to set (`lower`: the setting that lowers it; None:
    only the hard limit can move); None when each fits."""
    for bound in BOUNDS:
        value = bound.value(limits)
        hard = resource.getrlimit(bound.rlimit)[1]
        if value is None or hard == resource.RLIM_INFINITY or math.ceil(value) + bound.room <= hard:
            continue
        what = bound.what.format(n=value, room=bound.room)
        return (
            f"{source}: a bounded child needs {what}, more than this process's hard "
            f"{bound.name} of {hard} {bound.unit} leaves, and a child cannot raise it: raise "
            f"that hard limit where the validator starts (`{bound.ulimit}` shows it; in a "
            f"container, {bound.container})" + (f" or lower {lower}" if lower else "")
        )
    return None


def check_fits(limits: ChildLimits, source: str, lower: str | None) -> None:
    """ChildBoundUnfit with `unfit`'s line when one of `limits` does not fit; nothing where
    children may raise hard limits."""
    if may_raise_hard_limits():
        return
    line = unfit(source, limits, lower)
    if line is not None:
        raise ChildBoundUnfit(line)


def refused(said: str) -> ChildBoundUnfit:
    """What a child's set-up said when it could not take a limit (before any submission byte:
    no submission is at fault)."""
    return ChildBoundUnfit(
        f"a bounded child could not take its limits: {said}; raise this process's hard limits "
        "where the validator starts (`ulimit -H`; in a container, the Docker daemon's own or "
        "--ulimit) or lower the module's bound; no submission is at fault, the assignment is "
        "kept"
    )

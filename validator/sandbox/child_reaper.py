"""What keeps a bounded child (child_process.py) away from the processes around it:
the Linux process flags that the validator, the child servers and the fresh path's first process
set on themselves. Standard library only: child_entry.py, run as `python -I`, loads
this file by its path.

- Non-dumpable (`make_undumpable`, PR_SET_DUMPABLE 0): a process of the same user without
  CAP_SYS_PTRACE (a bounded child; the module image runs as uid 10001 without capabilities)
  can no longer ptrace it or read its /proc/<pid>/environ, mem, fd or cwd; it leaves no core
  dump. Fork keeps it (a server's children are non-dumpable too: none can read another's
  memory); execve undoes it (a fresh process starts dumpable and sets it again).
- A subreaper (`become_subreaper`, PR_SET_CHILD_SUBREAPER): a descendant whose parent ended,
  even one in a session of its own (setsid, a double fork), becomes this process's child rather
  than init's; `kill_orphans` then kills it and reaps it. Neither fork nor execve passes it on.
- A parent-death signal (`set_parent_death_signal`, PR_SET_PDEATHSIG): the parent's death takes
  this process along.

Elsewhere than Linux each is a no-op.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

from .kernel import prctl

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
# The exit code of a process whose parent was already gone when it set its parent-death signal.
EXIT_ORPHAN = 87
# Rounds of kill_orphans: each kills what the last one's victims had started.
SWEEP_ROUNDS = 100


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl; False where it failed or there is none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl(option, value)
    except OSError:
        return False
    return True


def make_undumpable() -> bool:
    """This process non-dumpable (see the module's docstring); False where it is not."""
    return _prctl(PR_SET_DUMPABLE, 0)


def become_subreaper() -> bool:
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(parent: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # The parent may have died before prctl: then no signal will ever come.
    if os.getppid() != parent:
        os._exit(EXIT_ORPHAN)


def child_pids() -> set[int]:
    """This process's children, ended and not yet reaped ones included."""
    me = os.getpid()
    try:
        found: set[int] = set()
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children", encoding="ascii") as handle:
                found.update(int(pid) for pid in handle.read().split())
        return found
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        return {pid for pid in pids if _parent(pid) == me}


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def kill_orphans(keep: set[int]) -> None:
    """Kills and reaps every child of this subreaper that is not in `keep`: what a bounded child
    started and left (it became ours when its parent ended). What each of them started becomes
    ours as it dies, and goes in the next round."""
    for _ in range(SWEEP_ROUNDS):
        strays = child_pids() - keep
        if not strays:
            return
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in strays:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def stay_as_reaper(handed: tuple[int, ...] = ()) -> None:
    """The fresh path's first process: forks the script's process and returns in it only (with
    a parent-death signal from here). Here: waits for it, kills what it left, then ends as it
    ended (the same code, or the same signal), so that the validator reads the same outcome.
    SIGTERM (the validator's stop: over time, interrupted) kills the script's process first.
    `handed`: descriptors that only the script's process keeps (closed here after the fork)."""
    make_undumpable()
    become_subreaper()
    keep = child_pids()
    reaper = os.getpid()
    state = {"script": 0, "stopped": False}

    def stop(*_: object) -> None:
        state["stopped"] = True
        if state["script"]:
            os.kill(state["script"], signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        set_parent_death_signal(reaper)
        return
    state["script"] = pid
    for fd in handed:
        os.close(fd)
    if state["stopped"]:  # stopped before the fork returned
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    kill_orphans(keep)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL: its action is the default already
        os.kill(reaper, -code)
        code = 128 - code
    os._exit(code)

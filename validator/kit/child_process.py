"""Running a submission's code-like inputs (an ONNX policy, a chat template, a tokenizer) in a
child process that the validator can always bound and stop. For modules.

`run_child(script, args, cwd=..., limits=...)` starts `python -I` on this file, which sets the
child up and then runs `script` as `__main__` with `args`:

- no secrets: the child's environment is PATH, HOME (its folder) and what the caller adds;
- its own process group (a new session), so that one kill reaches everything it started;
- a parent-death signal (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`): a validator killed with
  SIGKILL, or one that dies any other way, takes the child with it;
- limits armed after the trusted `preload` imports (transformers costs seconds of CPU and
  hundreds of MB of address space before any submission file is read): CPU seconds
  (RLIMIT_CPU, on top of what the imports used), memory (RLIMIT_AS, on top of the address space
  after the imports), the size of any file it writes (RLIMIT_FSIZE), and a wall clock that the
  parent enforces by killing the group;
- a pid record in `cwd` (`.child-<token>.pid`): a run killed before it could kill its child
  leaves the record, and `kill_strays` (called by validator/kit/workdirs.py when it sweeps an
  abandoned work folder at start-up) kills the process if /proc/<pid>/cmdline still carries
  the record's token (pids are reused).

The parent waits by polling, so a signal handler runs at once: a second stop signal
(`Interrupted`) or Ctrl-C ends the wait, and the child's group is killed on the way out. While it
waits it beats the heartbeat (validator/kit/scope.py): a bounded child is work going on, not a
stuck validator. The outcome says which limit a child ran into, for the caller to word the
rejection.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

RECORD_PREFIX = ".child-"
RECORD_SUFFIX = ".pid"
# Exit codes of the set-up below: the script ran out of memory, or the parent was already gone.
EXIT_MEMORY = 86
EXIT_ORPHAN = 87
POLL_SECONDS = 0.05
HEARTBEAT_SECONDS = 5.0
STDERR_TAIL = 2000
# What a child killed by a signal (an abort) wrote last when an allocation failed at its memory
# limit: Python, C++, glibc, and Rust's "memory allocation of N bytes failed" (tokenizers).
MEMORY_MARKS = ("MemoryError", "bad_alloc", "Cannot allocate", "memory allocation of")
# A child past its CPU limit gets SIGXCPU; if it survives that, SIGKILL this much later.
CPU_HARD_MARGIN = 2
PR_SET_PDEATHSIG = 1


class ChildOutcome(Enum):
    OK = "finished"
    OVER_CPU = "exceeded its CPU time limit"
    OVER_MEMORY = "exceeded its memory limit"
    OVER_TIME = "exceeded its wall-clock limit"
    CRASHED = "crashed"


@dataclass(frozen=True)
class ChildLimits:
    wall_seconds: float  # the parent kills the group after this long
    cpu_seconds: float | None = None  # CPU time after the preload imports
    memory_bytes: int | None = None  # address space after the preload imports
    file_bytes: int | None = None  # the largest file the child may write (its stderr too)


@dataclass(frozen=True)
class ChildResult:
    outcome: ChildOutcome
    exit_code: int  # negative: the signal that ended it
    stderr_tail: str  # the last STDERR_TAIL characters of its stderr
    limits: ChildLimits

    def describe(self) -> str:
        """The outcome in words, with the limit it hit: "exceeded its CPU time limit (60 s)"."""
        if self.outcome is ChildOutcome.CRASHED:
            last = self.stderr_tail.strip().splitlines()[-1:] or ["no error output"]
            return f"crashed (exit {self.exit_code}): {last[0][-300:]}"
        limit = {
            ChildOutcome.OVER_CPU: self.limits.cpu_seconds,
            ChildOutcome.OVER_TIME: self.limits.wall_seconds,
            ChildOutcome.OVER_MEMORY: self.limits.memory_bytes,
        }.get(self.outcome)
        if limit is None:
            return self.outcome.value
        if self.outcome is ChildOutcome.OVER_MEMORY:
            return f"{self.outcome.value} ({limit} bytes)"
        return f"{self.outcome.value} ({limit:g} s)"


def run_child(
    script: Path,
    args: list[str],
    *,
    cwd: Path,
    limits: ChildLimits,
    env: dict[str, str] | None = None,
    preload: tuple[str, ...] = (),
) -> ChildResult:
    """Runs `python -I script *args` in `cwd` under `limits` (see the module's docstring) and
    returns how it ended. Raises only what interrupts the wait (a stop signal's exception),
    after killing the child."""
    # Here: the child side below imports nothing of ours.
    from validator.kit.scope import current_scope  # noqa: PLC0415

    heartbeat = current_scope().heartbeat

    cwd.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    spec_path = cwd / f"{RECORD_PREFIX}{token}.json"
    record = cwd / f"{RECORD_PREFIX}{token}{RECORD_SUFFIX}"
    stderr_path = cwd / f"{RECORD_PREFIX}{token}.stderr"
    spec = {
        "script": str(script),
        "args": [str(a) for a in args],
        "parent": os.getpid(),
        "preload": list(preload),
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.file_bytes,
    }
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), **(env or {})}
    command = [sys.executable, "-I", str(Path(__file__).resolve()), str(spec_path), token]
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
        )
    record.write_text(json.dumps({"pid": process.pid, "token": token}), encoding="utf-8")
    status: int | None = None
    cpu = 0.0
    timed_out = False
    try:
        deadline = time.monotonic() + limits.wall_seconds
        beat = time.monotonic() + HEARTBEAT_SECONDS
        while True:
            pid, wait_status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                status, cpu = wait_status, usage.ru_utime + usage.ru_stime
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= beat:
                heartbeat()
                beat = now + HEARTBEAT_SECONDS
            time.sleep(POLL_SECONDS)  # a signal handler's exception ends the wait here
    finally:
        # Whatever happened (done, over time, a stop signal): nothing of the child outlives
        # this call. The leader is reaped; other members of its group, if any, are killed.
        _kill_group(process.pid)
        if status is None:
            _, status, _ = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        record.unlink(missing_ok=True)
        spec_path.unlink(missing_ok=True)
    tail = _tail(stderr_path)
    stderr_path.unlink(missing_ok=True)
    code = process.returncode
    return ChildResult(_outcome(code, tail, timed_out, cpu, limits), code, tail, limits)


def _outcome(
    code: int, tail: str, timed_out: bool, cpu: float, limits: ChildLimits
) -> ChildOutcome:
    if timed_out:
        return ChildOutcome.OVER_TIME
    if code == 0:
        return ChildOutcome.OK
    over_cpu = limits.cpu_seconds is not None and cpu >= limits.cpu_seconds
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and over_cpu):
        return ChildOutcome.OVER_CPU  # SIGKILL: RLIMIT_CPU's hard limit, if SIGXCPU was survived
    if code == EXIT_MEMORY or code == -signal.SIGKILL:
        # SIGKILL that the parent did not send, under the CPU limit: the kernel's OOM killer.
        return ChildOutcome.OVER_MEMORY
    if code < 0 and any(mark in tail for mark in MEMORY_MARKS):
        return ChildOutcome.OVER_MEMORY
    if code == 1 and tail.rstrip().endswith("MemoryError"):
        return ChildOutcome.OVER_MEMORY
    return ChildOutcome.CRASHED


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone already (a reaped leader and no other member)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - STDERR_TAIL))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def kill_strays(folder: Path) -> int:
    """Kills the children recorded under `folder` (an abandoned work folder, whose owner is
    dead) that are still running; returns how many. A pid whose command line lacks the
    record's token is another process that reuses the pid, and is left alone."""
    killed = 0
    for record in folder.rglob(f"{RECORD_PREFIX}*{RECORD_SUFFIX}"):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
            pid, token = int(data["pid"]), str(data["token"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no such process any more, or not a record of ours
        if pid > 1 and token.encode() in cmdline.split(b"\0"):
            _kill_group(pid)
            try:
                os.kill(pid, signal.SIGKILL)  # a leader that left its group
            except (ProcessLookupError, PermissionError):
                pass
            killed += 1
    return killed


# --- the child's side: `python -I child_process.py SPEC TOKEN` ----------------------------------


def _set_parent_death_signal(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl: then no signal will ever come.
    if os.getppid() != parent:
        os._exit(EXIT_ORPHAN)


def _arm_limits(spec: dict) -> None:
    import resource  # noqa: PLC0415

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action dumps core
    if spec.get("cpu_seconds") is not None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime + float(spec["cpu_seconds"])) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + CPU_HARD_MARGIN))
    if spec.get("memory_bytes") is not None:
        limit = _address_space() + int(spec["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if spec.get("file_bytes") is not None:
        # Past it a write fails (SIGXFSZ is ignored, so the write raises instead).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(spec["file_bytes"]),) * 2)


def _address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child_main(spec_path: str) -> None:
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    _set_parent_death_signal(int(spec["parent"]))
    import importlib  # noqa: PLC0415
    import runpy  # noqa: PLC0415

    for name in spec["preload"]:
        importlib.import_module(name)
    _arm_limits(spec)
    sys.argv = [spec["script"], *spec["args"]]
    try:
        runpy.run_path(spec["script"], run_name="__main__")
    except MemoryError:
        os._exit(EXIT_MEMORY)


if __name__ == "__main__":
    _child_main(sys.argv[1])

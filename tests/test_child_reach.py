"""A bounded child against the processes around it (validator/sandbox/child_seccomp.py, the
calls that act on another process), through the kit's `run_child` on both paths (forked from
the pre-imported server; the fresh-process fallback), with real processes.

A stand-in validator (non-dumpable, as `python -m validator` makes itself; every capability
dropped under a root test run, as in the module image) runs the children and gives them its
pid. Each call that could cut its limits, renice it, pin it to one CPU, signal it or reach its
memory is tried on it, on the child's parent (the server, or the fresh path's first process),
on process groups and users, and on the child itself: refused (EPERM) on all but the child
itself, where what a child needs still works; the stand-in's limits, priority, affinity and
scheduling are those it had. The x32 entry answers ENOSYS, and i386's `int 0x80` kills the
child before its call acts. Other processes are only ever probed with signal 0, and groups and
users with ids no process has: the old code let those calls through without harm here.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.children import drop_capabilities

REPO_ROOT = Path(__file__).resolve().parents[1]
# No process has this uid or process group: the "a user" and "a group" forms act on nobody.
NOBODY = 54321
# The child: each call on each target; "done" or the errno's name.
PROBE = """
import ctypes, errno, fcntl, json, mmap, os, platform, resource, signal, struct, sys, threading
validator, parent, own = int(sys.argv[1]), os.getppid(), os.getpid()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": dict(tkill=200, tgkill=234, sigqueue=129, tgsigqueue=297, setattr=314,
                   ioprio_set=251, ioprio_get=252, getfd=438, vm_readv=310, madvise=440,
                   mrelease=448, kcmp=312, perf=298, migrate=256, move=279, ptrace=101,
                   robust=274, prlimit=302),
    "aarch64": dict(tkill=130, tgkill=131, sigqueue=138, tgsigqueue=240, setattr=274,
                    ioprio_set=30, ioprio_get=31, getfd=438, vm_readv=270, madvise=440,
                    mrelease=448, kcmp=272, perf=241, migrate=238, move=239, ptrace=117,
                    robust=100, prlimit=261),
}[platform.machine()]

def raw(name, *args):
    def call():
        number = NR[name] if isinstance(name, str) else name
        if libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a
                                                 for a in args]) < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    return call

def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def queued():
    info = ctypes.create_string_buffer(128)
    struct.pack_into("iii", info, 0, 0, 0, -1)  # si_signo 0, si_errno, si_code SI_QUEUE
    return info

def sched_attr(policy, nice):
    return ctypes.create_string_buffer(struct.pack("IIqiIQQQ", 48, policy, 0, nice, 0, 0, 0, 0))

buffer = ctypes.create_string_buffer(64)
iovec = ctypes.create_string_buffer(struct.pack("QQ", ctypes.addressof(buffer), 64))
mask = ctypes.create_string_buffer(struct.pack("Q", 1))
perf = ctypes.create_string_buffer(struct.pack("II", 1, 128) + bytes(120))  # SOFTWARE, size
read_end, write_end = os.pipe()
IDLE_IO = 3 << 13

def on(pid):
    return {
        "prlimit nofile": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (16, 16))),
        "prlimit fsize": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (4096,) * 2)),
        "prlimit cpu": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (3600, 3600))),
        "setpriority": attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
        "ioprio_set": attempt(raw("ioprio_set", 1, pid, IDLE_IO)),
        "sched_setaffinity": attempt(lambda: os.sched_setaffinity(pid, {0})),
        "sched_setscheduler": attempt(
            lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
        "sched_setparam": attempt(lambda: os.sched_setparam(pid, os.sched_param(0))),
        "sched_setattr": attempt(raw("setattr", pid, sched_attr(5, 0), 0)),  # SCHED_IDLE
        "kill": attempt(lambda: os.kill(pid, 0)),
        "tkill": attempt(raw("tkill", pid, 0)),
        "tgkill": attempt(raw("tgkill", pid, pid, 0)),
        "rt_sigqueueinfo": attempt(raw("sigqueue", pid, 0, queued())),
        "rt_tgsigqueueinfo": attempt(raw("tgsigqueue", pid, pid, 0, queued())),
        "pidfd_open": attempt(lambda: os.close(os.pidfd_open(pid))),
        "pidfd_send_signal": attempt(lambda: signal.pidfd_send_signal(
            os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY), 0)),
        "process_vm_readv": attempt(raw("vm_readv", pid, iovec, 1, iovec, 1, 0)),
        "kcmp": attempt(raw("kcmp", own, pid, 1, 0, 0)),  # KCMP_VM
        "perf_event_open": attempt(raw("perf", perf, pid, -1, -1, 0)),
        "migrate_pages": attempt(raw("migrate", pid, 64, mask, mask)),
        "move_pages": attempt(raw("move", pid, 0, None, None, None, 0)),
        "ptrace": attempt(raw("ptrace", 16, pid, 0, 0)),  # PTRACE_ATTACH
        "get_robust_list": attempt(raw("robust", pid, buffer, buffer)),
        "F_SETOWN": attempt(lambda: fcntl.fcntl(read_end, fcntl.F_SETOWN, pid)),
        "F_SETOWN_EX": attempt(lambda: fcntl.fcntl(read_end, 15, struct.pack("ii", 1, pid))),
        "FIOSETOWN": attempt(lambda: fcntl.ioctl(read_end, 0x8901, struct.pack("i", pid))),
    }

def groups():
    return {
        "kill 0": attempt(lambda: os.kill(0, 0)),
        "kill -1": attempt(lambda: os.kill(-1, 0)),
        "killpg parent": attempt(lambda: os.killpg(os.getpgid(parent), 0)),
        "setpriority group": attempt(lambda: os.setpriority(os.PRIO_PGRP, NOBODY, 19)),
        "setpriority user": attempt(lambda: os.setpriority(os.PRIO_USER, NOBODY, 19)),
        "ioprio_set user": attempt(raw("ioprio_set", 3, NOBODY, IDLE_IO)),
        "F_SETOWN group": attempt(lambda: fcntl.fcntl(read_end, fcntl.F_SETOWN, -validator)),
        "x32 prlimit64": attempt(raw(NR["prlimit"] | 0x40000000, validator, 7, buffer, 0))
        if platform.machine() == "x86_64" else "ENOSYS",
    }

def itself():
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    cpus = os.sched_getaffinity(0)
    ioprio = libc.syscall(ctypes.c_long(NR["ioprio_get"]), ctypes.c_long(1), ctypes.c_long(0))
    handled = []
    signal.signal(signal.SIGUSR1, lambda *_: handled.append(1))
    main = threading.get_ident()
    from_thread = {}
    def worker():
        from_thread["kill"] = attempt(lambda: os.kill(own, 0))
        from_thread["pthread_kill main"] = attempt(lambda: signal.pthread_kill(main, 0))
        from_thread["sched_setaffinity 0"] = attempt(lambda: os.sched_setaffinity(0, cpus))
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    return {
        "setrlimit": attempt(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)),
        "prlimit": attempt(lambda: resource.prlimit(own, resource.RLIMIT_NOFILE, nofile)),
        "prlimit 0": attempt(lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, nofile)),
        "setpriority": attempt(lambda: os.setpriority(os.PRIO_PROCESS, own, nice)),
        "setpriority 0": attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, nice)),
        "ioprio_set": attempt(raw("ioprio_set", 1, 0, ioprio)),
        "sched_setaffinity": attempt(lambda: os.sched_setaffinity(own, cpus)),
        "sched_setscheduler": attempt(
            lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))),
        "sched_setparam": attempt(lambda: os.sched_setparam(own, os.sched_param(0))),
        "sched_setattr": attempt(raw("setattr", 0, sched_attr(0, nice), 0)),
        "kill": attempt(lambda: os.kill(own, 0)),
        "tkill": attempt(raw("tkill", own, 0)),
        "tgkill": attempt(lambda: signal.pthread_kill(main, 0)),
        "rt_sigqueueinfo": attempt(raw("sigqueue", own, 0, queued())),
        "raise SIGUSR1": attempt(lambda: signal.raise_signal(signal.SIGUSR1)),
        "handled": handled,
        "pidfd_open": attempt(lambda: os.close(os.pidfd_open(own))),
        "F_SETOWN": attempt(lambda: fcntl.fcntl(read_end, fcntl.F_SETOWN, own)),
        "from a thread": from_thread,
        "pidfd_getfd": attempt(raw("getfd", os.pidfd_open(own), 0, 0)),
        "process_vm_readv": attempt(raw("vm_readv", own, iovec, 1, iovec, 1, 0)),
        "process_madvise": attempt(raw("madvise", os.pidfd_open(own), iovec, 1, 20, 0)),
        "process_mrelease": attempt(raw("mrelease", os.pidfd_open(own), 0)),
        "kcmp": attempt(raw("kcmp", own, own, 1, 0, 0)),
    }

seen = {"validator": on(validator), "parent": on(parent), "groups": groups(), "own": itself()}
json.dump(seen, open("seen.json", "w"))
"""
# The child: i386's prlimit64 (340) through `int 0x80` on the validator, its RLIMIT_NOFILE
# (7) cut to 16: code and data in one page below 4 GiB (MAP_32BIT), rbx kept for the caller.
INT80 = """
import ctypes, mmap, struct, sys
page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,
                 prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
base = ctypes.addressof(ctypes.c_char.from_buffer(page))
assert base < 2**32
page[2048:2064] = struct.pack("QQ", 16, 16)
# push rbx; mov eax, 340; mov ebx, pid; mov ecx, 7; mov edx, rlimit; xor esi, esi; int 0x80;
# pop rbx; ret
word = lambda value: struct.pack("<I", value)
code = b"".join((b"\\x53\\xb8", word(340), b"\\xbb", word(int(sys.argv[1])), b"\\xb9", word(7),
                 b"\\xba", word(base + 2048), b"\\x31\\xf6\\xcd\\x80\\x5b\\xc3"))
page[: len(code)] = code
ctypes.CFUNCTYPE(ctypes.c_int)(base)()
"""
# The validator: what it is, then the probe and the int 0x80 child on each path, then what it is.
VALIDATOR = """
import json, os, resource, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from validator.sandbox.child_reaper import make_undumpable
make_undumpable()  # what validator/__main__.py does first
from validator.sandbox import child_server
from validator.kit import ChildLimits, run_child

def state():
    limits = {{name: resource.getrlimit(getattr(resource, name))
              for name in ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU")}}
    return {{"limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "cpus": sorted(os.sched_getaffinity(0)), "policy": os.sched_getscheduler(0),
            "param": os.sched_getparam(0).sched_priority}}

def run(script, work):
    result = run_child(Path(script), [str(os.getpid())], cwd=Path(work),
                       limits=ChildLimits(60), preload=("json",))
    return result.exit_code, result.stderr_tail[-300:]

before = state()
found = {{}}
for path in ("served", "fresh"):
    if path == "fresh":
        child_server.server_for = lambda *_args, **_kwargs: None
    code, tail = run({probe!r}, {work!r} + "/" + path)
    seen = json.load(open({work!r} + "/" + path + "/seen.json")) if code == 0 else tail
    found[path] = {{"seen": seen, "int80": run({int80!r}, {work!r} + "/int80-" + path)}}
caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")]
print(json.dumps({{"before": before, "after": state(), "found": found, "caps": caps[0]}}))
"""
CALLS_ON_OTHERS = (
    "prlimit nofile",
    "prlimit fsize",
    "prlimit cpu",
    "setpriority",
    "ioprio_set",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "process_vm_readv",
    "kcmp",
    "perf_event_open",
    "migrate_pages",
    "move_pages",
    "ptrace",
    "get_robust_list",
    "F_SETOWN",
    "F_SETOWN_EX",
    "FIOSETOWN",
)
# What a child does to itself and needs (its own limits, priority, affinity; signals to itself
# and between its threads), and what it never needs even on itself.
OWN_CALLS = {
    "setrlimit": "done",
    "prlimit": "done",
    "prlimit 0": "done",
    "setpriority": "done",
    "setpriority 0": "done",
    "ioprio_set": "done",
    "sched_setaffinity": "done",
    "sched_setscheduler": "done",
    "sched_setparam": "done",
    "sched_setattr": "done",
    "kill": "done",
    "tkill": "done",
    "tgkill": "done",
    "rt_sigqueueinfo": "done",
    "raise SIGUSR1": "done",
    "handled": [1],
    "pidfd_open": "done",
    "F_SETOWN": "done",
    "from a thread": {"kill": "done", "pthread_kill main": "done", "sched_setaffinity 0": "done"},
    "pidfd_getfd": "EPERM",
    "process_vm_readv": "EPERM",
    "process_madvise": "EPERM",
    "process_mrelease": "EPERM",
    "kcmp": "EPERM",
}


@pytest.fixture(scope="module")
def reach(tmp_path_factory) -> dict:
    """What the stand-in validator saw: its state before and after, and each path's probe."""
    tmp = tmp_path_factory.mktemp("reach")
    scripts = {name: tmp / f"{name}.py" for name in ("probe", "int80", "validator")}
    scripts["probe"].write_text(PROBE.replace("NOBODY", str(NOBODY)))
    scripts["int80"].write_text(INT80)
    scripts["validator"].write_text(
        VALIDATOR.format(
            root=str(REPO_ROOT),
            probe=str(scripts["probe"]),
            int80=str(scripts["int80"]),
            work=str(tmp / "work"),
        )
    )
    done = subprocess.run(
        [sys.executable, str(scripts["validator"])],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=drop_capabilities if os.geteuid() == 0 else None,  # noqa: PLW1509
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert int(found["caps"], 16) == 0  # as the module image runs it
    return found


def test_the_validator_keeps_its_limits_priority_affinity_and_scheduling(reach):
    assert reach["after"] == reach["before"]


@pytest.mark.parametrize("path", ["served", "fresh"])
@pytest.mark.parametrize("target", ["validator", "parent"])
def test_every_call_on_another_process_is_refused(reach, path, target):
    seen = reach["found"][path]["seen"]
    assert isinstance(seen, dict), seen  # the probe ran to its end
    assert seen[target] == dict.fromkeys(CALLS_ON_OTHERS, "EPERM"), seen[target]


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_groups_users_and_the_x32_entry_are_refused(reach, path):
    assert reach["found"][path]["seen"]["groups"] == {
        "kill 0": "EPERM",
        "kill -1": "EPERM",
        "killpg parent": "EPERM",
        "setpriority group": "EPERM",
        "setpriority user": "EPERM",
        "ioprio_set user": "EPERM",
        "F_SETOWN group": "EPERM",
        "x32 prlimit64": "ENOSYS",
    }


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_what_a_child_does_to_itself_still_works(reach, path):
    assert reach["found"][path]["seen"]["own"] == OWN_CALLS


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386's int 0x80 is x86_64's only")
@pytest.mark.parametrize("path", ["served", "fresh"])
def test_int_0x80_kills_the_child_before_its_call_acts(reach, path):
    code, tail = reach["found"][path]["int80"]
    assert code == -signal.SIGSYS, tail
    assert reach["after"]["limits"]["RLIMIT_NOFILE"] == reach["before"]["limits"]["RLIMIT_NOFILE"]

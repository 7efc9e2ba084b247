"""A seccomp-BPF filter for a bounded child, installed after its Landlock rules and before the
submission's first byte: it closes what Landlock leaves open (other socket families, any
connection, new processes, a file's metadata, calls on another process). Standard library only:
child_entry.py loads it in a `python -I` child. What is denied is decided in child_process.py;
each rule and why: docs/internals.md, "The seccomp filter".
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
import sys
import threading
from collections.abc import Iterable
from typing import TypedDict

from . import protocol
from .kernel import no_new_privs, syscall

NOT_AVAILABLE = (
    "seccomp filters are not available (an old kernel or a container profile refusing them): "
    "bounded children may open sockets of any family (UDP, MPTCP: a TCP Landlock does not "
    "see), connect to any Unix socket bound to a path, change file modes, owners and times, "
    "and start processes (each with its own memory limit)"
)
SECCOMP_SET_MODE_FILTER, SECCOMP_GET_ACTION_AVAIL = 1, 2
SECCOMP_FILTER_FLAG_TSYNC = 1
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
CLONE_THREAD = 0x00010000
# The ioctls that set a file's flags (FS_IOC_SETFLAGS, its 32-bit twin, FS_IOC_FSSETXATTR): on a
# file of this user's, even one opened read-only, and Landlock does not see them.
SET_FLAGS_IOCTLS = (0x40086602, 0x40046602, 0x401C5820)
# The ioctls that make a process the owner of a file's SIGIO (FIOSETOWN, SIOCSPGRP): a pid behind
# a pointer, which a filter cannot read.
OWNER_IOCTLS = (0x8901, 0x8902)
F_SETOWN, F_SETOWN_EX = 8, 15
X32_BIT = 0x40000000

# BPF opcodes: load a word at an offset of struct seccomp_data, jump on equal / >= / bits set,
# return. seccomp_data: nr at 0, arch at 4, args at 16 + 8 * i (the low half first: both arches
# are little-endian).
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR, ARCH, ARG0, ARG1, ARG2 = 0, 4, 16, 24, 32
ARG4_LOW, ARG4_HIGH = 48, 52  # sendto's dest_addr: a pointer, both halves

# One BPF instruction: (code, jump if true, jump if false, k).
Instruction = tuple[int, int, int, int]


class SyscallTable(TypedDict):
    """An architecture's numbers: a syscall's, or a group's (see TABLES)."""

    audit_arch: int
    seccomp: int
    socket: tuple[int, ...]
    connect: int
    sendto: int
    sendmsg: tuple[int, ...]
    clone: int
    process: tuple[int, ...]
    clone3: int
    io_uring: tuple[int, ...]
    metadata: tuple[int, ...]
    ioctl: int
    self_or_zero: tuple[int, ...]
    self_only: tuple[int, ...]
    which_who: tuple[tuple[int, int], ...]  # (syscall, the `which` that means a process)
    never: tuple[int, ...]
    fcntl: int
    x32: bool


# Per architecture: the AUDIT_ARCH value, the seccomp syscall's number, and the numbers of the
# syscalls in each group (aarch64's generic table has no fork, chmod, chown or utime of old).
TABLES: dict[str, SyscallTable] = {
    "x86_64": {
        "audit_arch": 0xC000003E,
        "seccomp": 317,
        "socket": (41, 53),  # socket, socketpair
        "connect": 42,
        "sendto": 44,
        "sendmsg": (46, 307),  # sendmsg, sendmmsg
        "clone": 56,
        "process": (57, 58),  # fork, vfork
        "clone3": 435,
        "io_uring": (425, 426, 427),
        # chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat
        # utime utimes futimesat utimensat
        # setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat
        # removexattrat file_setattr
        "metadata": (
            90,
            91,
            268,
            452,
            92,
            93,
            94,
            260,
            132,
            235,
            261,
            280,
            188,
            189,
            190,
            197,
            198,
            199,
            463,
            466,
            469,
        ),  # fmt: skip
        "ioctl": 16,
        # On another process: prlimit64 sched_setaffinity sched_setparam sched_setscheduler
        # sched_setattr migrate_pages move_pages get_robust_list (pid 0: itself);
        # kill tkill tgkill rt_sigqueueinfo rt_tgsigqueueinfo pidfd_open (its own pid only);
        # setpriority and ioprio_set, with their "a process" value of `which`;
        # pidfd_send_signal pidfd_getfd process_vm_readv process_vm_writev process_madvise
        # process_mrelease kcmp perf_event_open ptrace (never)
        "self_or_zero": (302, 203, 142, 144, 314, 256, 279, 274),
        "self_only": (62, 200, 234, 129, 297, 434),
        "which_who": ((141, 0), (251, 1)),
        "never": (424, 438, 310, 311, 440, 448, 312, 298, 101),
        "fcntl": 72,
        "x32": True,
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,
        "seccomp": 277,
        "socket": (198, 199),
        "connect": 203,
        "sendto": 206,
        "sendmsg": (211, 269),
        "clone": 220,
        "process": (),
        "clone3": 435,
        "io_uring": (425, 426, 427),
        # fchmod fchmodat fchmodat2 fchown fchownat utimensat
        # setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat
        # removexattrat file_setattr
        "metadata": (52, 53, 452, 55, 54, 88, 5, 6, 7, 14, 15, 16, 463, 466, 469),
        "ioctl": 29,
        "self_or_zero": (261, 122, 118, 119, 274, 238, 239, 100),
        "self_only": (129, 130, 131, 138, 240, 434),
        "which_who": ((140, 0), (30, 1)),
        "never": (424, 438, 270, 271, 440, 448, 272, 241, 117),
        "fcntl": 25,
        "x32": False,
    },
}


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def available() -> bool:
    """Whether this kernel takes a filter that can kill a process and answer an errno (Linux
    4.14 on); False on a foreign architecture or where seccomp(2) is refused."""
    table = TABLES.get(platform.machine())
    if not sys.platform.startswith("linux") or table is None:
        return False
    for action in (RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW):
        value = ctypes.c_uint32(action)
        try:
            syscall(
                table["seccomp"], ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL), ctypes.c_uint(0),
                ctypes.byref(value),
            )  # fmt: skip
        except OSError:
            return False
    return True


class _Probe(TypedDict):
    lock: threading.Lock
    available: bool | None  # None: not probed yet


_probe = _Probe(lock=threading.Lock(), available=None)


def rules(
    families: tuple[int, ...],
    no_processes: bool,
    no_metadata: bool,
    no_connect: bool = False,
    no_others: bool = False,
) -> protocol.SyscallRules | None:
    """The validator's side: what `apply` gets in the child; None where seccomp filters are not
    available, said in one warning line per process (probed once)."""
    with _probe["lock"]:
        found = _probe["available"]
        if found is None:
            found = _probe["available"] = available()
            if not found:
                logging.getLogger(__name__).warning(NOT_AVAILABLE)
        if not found:
            return None
    return protocol.SyscallRules(
        arch=platform.machine(),
        families=list(families),
        no_processes=no_processes,
        no_metadata=no_metadata,
        no_connect=no_connect,
        no_others=no_others,
    )


def program(
    arch: str,
    families: list[int],
    no_processes: bool,
    no_metadata: bool,
    no_connect: bool = False,
    own_pid: int | None = None,
) -> list[Instruction]:
    """The filter as (code, jt, jf, k) instructions. Each rule is a test on the syscall's
    number that skips its own short block when it does not match: all jumps are short.
    `own_pid`: the process that installs it, the only one its calls may act on (None: no such
    rule)."""
    table = TABLES[arch]
    code: list[Instruction] = [(LD_ABS, 0, 0, ARCH), (JEQ, 1, 0, table["audit_arch"])]
    code += [(RET, 0, 0, RET_KILL_PROCESS), (LD_ABS, 0, 0, NR)]
    if table["x32"]:
        code += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]

    def deny(numbers: Iterable[int], errno_value: int) -> None:
        for number in numbers:
            code.extend([(JEQ, 0, 1, number), (RET, 0, 0, RET_ERRNO | errno_value)])

    def when(number: int, block: list[Instruction]) -> None:
        code.append((JEQ, 0, len(block), number))
        code.extend(block)  # each block ends in a return; the accumulator is not needed after

    deny(table["io_uring"], errno.ENOSYS)
    for number in table["socket"]:
        block = [(LD_ABS, 0, 0, ARG0)]
        for family in families:
            block += [(JEQ, 0, 1, family), (RET, 0, 0, RET_ALLOW)]
        when(number, [*block, (RET, 0, 0, RET_ERRNO | errno.EACCES)])
    if no_connect:
        deny([table["connect"], *table["sendmsg"]], errno.EACCES)
        # sendto without an address (what send() is) goes on; with one, refused.
        when(table["sendto"], _no_address())
    if no_processes:
        deny(table["process"], errno.EPERM)
        deny([table["clone3"]], errno.ENOSYS)
        thread = [(LD_ABS, 0, 0, ARG0), (JSET, 0, 1, CLONE_THREAD), (RET, 0, 0, RET_ALLOW)]
        when(table["clone"], [*thread, (RET, 0, 0, RET_ERRNO | errno.EPERM)])
    if no_metadata:
        deny(table["metadata"], errno.EPERM)
    if own_pid is not None:
        deny(table["never"], errno.EPERM)
        for number, block in _others(table, own_pid):
            when(number, block)
    requests = (SET_FLAGS_IOCTLS if no_metadata else ()) + (
        OWNER_IOCTLS if own_pid is not None else ()
    )
    if requests:
        refused = [(JEQ, 0, 1, request) for request in requests]
        block = [(LD_ABS, 0, 0, ARG1)]
        for test in refused:
            block += [test, (RET, 0, 0, RET_ERRNO | errno.EPERM)]
        when(table["ioctl"], [*block, (RET, 0, 0, RET_ALLOW)])
    code.append((RET, 0, 0, RET_ALLOW))
    return code


def _no_address() -> list[Instruction]:
    """sendto's block: allowed without a destination address (both halves of the pointer 0)."""
    refused = (RET, 0, 0, RET_ERRNO | errno.EACCES)
    no_address = [(LD_ABS, 0, 0, ARG4_LOW), (JEQ, 0, 3, 0), (LD_ABS, 0, 0, ARG4_HIGH)]
    return [*no_address, (JEQ, 0, 1, 0), (RET, 0, 0, RET_ALLOW), refused]


def _allowed_if(offset: int, values: tuple[int, ...]) -> list[Instruction]:
    """A block: allowed when the word at `offset` is one of `values`, else EPERM."""
    block = [(LD_ABS, 0, 0, offset)]
    block += [(JEQ, len(values) - i, 0, value) for i, value in enumerate(values)]
    return [*block, (RET, 0, 0, RET_ERRNO | errno.EPERM), (RET, 0, 0, RET_ALLOW)]


def _others(table: SyscallTable, own: int) -> list[tuple[int, list[Instruction]]]:
    """(syscall, block) for each call that names a process: allowed on `own` only. A pid
    argument is compared as the kernel reads it, its low 32 bits."""
    blocks = [(number, _allowed_if(ARG0, (own, 0))) for number in table["self_or_zero"]]
    blocks += [(number, _allowed_if(ARG0, (own,))) for number in table["self_only"]]
    for number, which in table["which_who"]:
        # `which` must say "a process" (not a group or a user: who 0 is every process of the
        # user), then `who` must be itself; the jump lands on the refusal.
        blocks.append(
            (number, [(LD_ABS, 0, 0, ARG0), (JEQ, 0, 3, which), *_allowed_if(ARG1, (own, 0))])
        )
    # fcntl: F_SETOWN_EX refused, F_SETOWN only to itself (or none), any other command allowed.
    owner = [(LD_ABS, 0, 0, ARG1), (JEQ, 4, 0, F_SETOWN_EX), (JEQ, 0, 4, F_SETOWN)]
    blocks.append((table["fcntl"], [*owner, *_allowed_if(ARG2, (own, 0))]))
    return blocks


def apply(given: protocol.SyscallRules | None) -> None:
    """The child's side: what `rules` gave, installed before the submission's first byte. A
    refusal raises, and so fails the child's set-up: where the validator found seccomp, a child
    never runs without the filter."""
    if not given:
        return
    arch = given["arch"]
    code = program(
        arch, given["families"], given["no_processes"], given["no_metadata"],
        given["no_connect"], os.getpid() if given["no_others"] else None,
    )  # fmt: skip
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    prog = _Program(len(code), ctypes.cast(buffer, ctypes.c_void_p))
    no_new_privs()
    syscall(
        TABLES[arch]["seccomp"], ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog),
    )  # fmt: skip

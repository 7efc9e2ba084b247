"""A seccomp-BPF filter for a bounded child, installed after its Landlock rules and before the
submission's first byte: it closes what Landlock leaves open (issue 32, the second attack).

- sockets: `socket`/`socketpair` of any family but those allowed (AF_UNIX) fail with EACCES: no
  MPTCP (IPPROTO_MPTCP is a TCP that Landlock's TCP rule does not see), UDP, raw, netlink or
  any other family, on every kernel, Landlock or not; io_uring, which can open a socket or set
  an extended attribute without these syscalls, answers ENOSYS;
- connections (issue 40): `connect` fails with EACCES for every family, and so does `sendto`
  with an address and every `sendmsg`/`sendmmsg` (a filter cannot read the address a msghdr
  points to): a Unix socket bound to a path (the Docker engine's, which is host root) is as
  out of reach as TCP. A child needs none: it talks to its parent through files in its folder
  and inherits no socket (child_entry.py closes every descriptor past stderr), and a
  `socketpair` it makes itself still works with send/recv;
- file metadata: the chmod, chown, utime and xattr-setting families, and the ioctls setting a
  file's flags, fail with EPERM (Landlock does not cover them: a child could make the base
  model in the HF cache unreadable);
- processes: fork, vfork, and clone without CLONE_THREAD fail with EPERM; clone3 answers ENOSYS
  (glibc then starts threads with clone). Threads still start; so RLIMIT_AS, per process,
  bounds a child's memory whole, and there is no fork bomb;
- a foreign architecture (i386's `int 0x80` on x86_64) kills the process; x86_64's x32 calls
  answer ENOSYS.

The filter reaches the process's threads (TSYNC: the fresh path's preloads may have started
some) and everything it would start. Standard library only: validator/sandbox/child_entry.py, run
as `python -I`, loads this file by its path. What is denied is decided in one place,
validator/sandbox/child_process.py (CHILD_SOCKET_FAMILIES, CHILD_NO_CONNECT, CHILD_NO_PROCESSES,
CHILD_NO_METADATA).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import platform
import struct
import sys
import threading

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
X32_BIT = 0x40000000

# BPF opcodes: load a word at an offset of struct seccomp_data, jump on equal / >= / bits set,
# return. seccomp_data: nr at 0, arch at 4, args at 16 + 8 * i (the low half first: both arches
# are little-endian).
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24
ARG4_LOW, ARG4_HIGH = 48, 52  # sendto's dest_addr: a pointer, both halves

# Per architecture: the AUDIT_ARCH value, the seccomp syscall's number, and the numbers of the
# syscalls in each group (aarch64's generic table has no fork, chmod, chown or utime of old).
TABLES = {
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


_probe = {"lock": threading.Lock(), "available": None}


def rules(
    families: tuple[int, ...], no_processes: bool, no_metadata: bool, no_connect: bool = False
) -> dict | None:
    """The validator's side: what `apply` gets in the child; None where seccomp filters are not
    available, said in one warning line per process (probed once)."""
    with _probe["lock"]:
        if _probe["available"] is None:
            _probe["available"] = available()
            if not _probe["available"]:
                logging.getLogger(__name__).warning(NOT_AVAILABLE)
        if not _probe["available"]:
            return None
    return {
        "arch": platform.machine(),
        "families": list(families),
        "no_processes": no_processes,
        "no_metadata": no_metadata,
        "no_connect": no_connect,
    }


def program(
    arch: str, families: list[int], no_processes: bool, no_metadata: bool, no_connect: bool = False
) -> list:
    """The filter as (code, jt, jf, k) instructions. Each rule is a test on the syscall's
    number that skips its own short block when it does not match: all jumps are short."""
    table = TABLES[arch]
    kill, allow = RET_KILL_PROCESS, RET_ALLOW
    code = [(LD_ABS, 0, 0, ARCH), (JEQ, 1, 0, table["audit_arch"]), (RET, 0, 0, kill)]
    code.append((LD_ABS, 0, 0, NR))
    if table["x32"]:
        code += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]

    def deny(numbers, errno_value: int) -> None:
        for number in numbers:
            code.extend([(JEQ, 0, 1, number), (RET, 0, 0, RET_ERRNO | errno_value)])

    def when(number: int, block: list) -> None:
        code.append((JEQ, 0, len(block), number))
        code.extend(block)  # each block ends in a return; the accumulator is not needed after

    deny(table["io_uring"], errno.ENOSYS)
    for number in table["socket"]:
        block = [(LD_ABS, 0, 0, ARG0)]
        for family in families:
            block += [(JEQ, 0, 1, family), (RET, 0, 0, allow)]
        when(number, [*block, (RET, 0, 0, RET_ERRNO | errno.EACCES)])
    if no_connect:
        refused = (RET, 0, 0, RET_ERRNO | errno.EACCES)
        deny([table["connect"], *table["sendmsg"]], errno.EACCES)
        # sendto without an address (what send() is) goes on; with one, refused.
        no_address = [(LD_ABS, 0, 0, ARG4_LOW), (JEQ, 0, 3, 0), (LD_ABS, 0, 0, ARG4_HIGH)]
        when(table["sendto"], [*no_address, (JEQ, 0, 1, 0), (RET, 0, 0, allow), refused])
    if no_processes:
        deny(table["process"], errno.EPERM)
        deny([table["clone3"]], errno.ENOSYS)
        thread = [(LD_ABS, 0, 0, ARG0), (JSET, 0, 1, CLONE_THREAD), (RET, 0, 0, allow)]
        when(table["clone"], [*thread, (RET, 0, 0, RET_ERRNO | errno.EPERM)])
    if no_metadata:
        deny(table["metadata"], errno.EPERM)
        block = [(LD_ABS, 0, 0, ARG1)]
        for request in SET_FLAGS_IOCTLS:
            block += [(JEQ, 0, 1, request), (RET, 0, 0, RET_ERRNO | errno.EPERM)]
        when(table["ioctl"], [*block, (RET, 0, 0, allow)])
    code.append((RET, 0, 0, allow))
    return code


def apply(given: dict | None) -> None:
    """The child's side: what `rules` gave, installed before the submission's first byte. A
    refusal raises, and so fails the child's set-up: where the validator found seccomp, a child
    never runs without the filter."""
    if not given:
        return
    arch = given["arch"]
    code = program(
        arch, [int(f) for f in given["families"]], bool(given["no_processes"]),
        bool(given["no_metadata"]), bool(given.get("no_connect")),
    )  # fmt: skip
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    prog = _Program(len(code), ctypes.cast(buffer, ctypes.c_void_p))
    no_new_privs()
    syscall(
        TABLES[arch]["seccomp"], ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog),
    )  # fmt: skip

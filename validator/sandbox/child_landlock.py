"""Landlock (Linux's unprivileged self-sandboxing, since 5.13) for a bounded child: after
`confine`, the process and everything it starts may write only beneath the folders and to the
files it was given, neither bind nor connect a TCP socket (ABI 4, Linux 6.7), and neither signal
a process nor reach an abstract Unix socket outside itself and what it started (ABI 6, 6.12).
Reads, execution and other sockets are left as they were (other sockets, file modes and new
processes are the seccomp filter's, validator/sandbox/child_seccomp.py): a child must read the
submission, the installed libraries and the base model's files. Standard library only:
validator/sandbox/child_entry.py, run as `python -I`, loads this file by its path.

What a child may write is decided in one place, validator/sandbox/child_process.py (`confinement`);
the validator probes the ABI once (`abi`), and where there is none (an old kernel, Landlock off,
a seccomp profile refusing the calls) the children run unconfined after one warning line.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
from typing import TypedDict

from . import protocol
from .kernel import no_new_privs, syscall

# The syscalls' numbers in the generic table (x86_64 and aarch64 share them).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
ARCHES = ("x86_64", "aarch64")
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
NOT_AVAILABLE = (
    "Landlock is not available (an old kernel, Landlock off, or a seccomp profile refusing "
    "it): bounded children run unconfined, able to write wherever this user can"
)
NO_TCP_RULE = (
    "Landlock ABI {abi} has no TCP rule (Linux 6.7): bounded children's TCP is closed only by "
    "the seccomp filter (Unix sockets only), and is open where seccomp is not available"
)
NO_SCOPES = (
    "Landlock ABI {abi} has no scopes (Linux 6.12): bounded children may signal the validator, "
    "its child servers and any other process of this user, and reach abstract Unix sockets"
)

# Filesystem rights: the write-type ones only (EXECUTE 1<<0, READ_FILE 1<<2 and READ_DIR 1<<3
# are not handled, so they stay allowed everywhere).
WRITE_FILE = 1 << 1
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: a rename or link into another folder
TRUNCATE = 1 << 14  # ABI 3
WRITE_ABI1 = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM
)
# What a rule on a file (not a folder) may grant of those.
FILE_RIGHTS = WRITE_FILE | TRUNCATE
# Network rights (ABI 4): handled with no rule, so both are denied on every port.
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
# Scopes (ABI 6): no connecting to an abstract Unix socket, and no signal to a process, that
# was made outside this process and what it starts (its parent, the validator).
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    # A kernel that knows fewer fields takes the larger struct as long as the rest is zero.
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi() -> int:
    """Landlock's ABI version here; 0 where it is absent, disabled, or refused (ENOSYS,
    EOPNOTSUPP, a seccomp profile's EPERM)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ARCHES:
        return 0
    try:
        return syscall(
            SYS_CREATE_RULESET, ctypes.c_void_p(None), ctypes.c_size_t(0),
            ctypes.c_uint32(CREATE_RULESET_VERSION),
        )  # fmt: skip
    except OSError:
        return 0


class _Probe(TypedDict):
    lock: threading.Lock
    abi: int | None  # None: not probed yet


_probe = _Probe(lock=threading.Lock(), abi=None)


def rules(
    folders: list[str], files: list[str], no_tcp: bool, scoped: bool
) -> protocol.Confinement | None:
    """The validator's side: what `confine` gets in the child; None where there is no Landlock,
    said in one warning line per process (the ABI is probed once)."""
    with _probe["lock"]:
        version = _probe["abi"]
        if version is None:
            version = _probe["abi"] = abi()
            _warn_missing(version, no_tcp, scoped)
    if not version:
        return None
    return protocol.Confinement(
        abi=version, folders=folders, files=files, no_tcp=no_tcp, scoped=scoped
    )


def _warn_missing(version: int, no_tcp: bool, scoped: bool) -> None:
    """One warning line for each part of the rules this kernel cannot apply."""
    log = logging.getLogger(__name__)
    if not version:
        log.warning(NOT_AVAILABLE)
        return
    if no_tcp and version < 4:
        log.warning(NO_TCP_RULE.format(abi=version))
    if scoped and version < 6:
        log.warning(NO_SCOPES.format(abi=version))


def write_rights(version: int) -> int:
    return WRITE_ABI1 | (REFER if version >= 2 else 0) | (TRUNCATE if version >= 3 else 0)


def apply(given: protocol.Confinement | None) -> None:
    """The child's side: what `rules` gave, applied before the submission's first byte. A
    refusal raises, and so fails the child's set-up: where the validator found Landlock, a
    child never runs unconfined."""
    if given:
        confine(
            given["abi"],
            given["folders"],
            given["files"],
            no_tcp=given["no_tcp"],
            scoped=given["scoped"],
        )


def confine(
    version: int, folders: list[str], files: list[str], *, no_tcp: bool, scoped: bool
) -> None:
    """Restricts this process (and what it starts) to writing beneath `folders` and to `files`;
    no TCP bind or connect when `no_tcp`, and no signal or abstract Unix socket out of its own
    processes when `scoped`, each where the ABI has it. Raises OSError when the kernel refuses
    (the caller's ABI probe said it would not)."""
    fs = write_rights(version)
    net = BIND_TCP | CONNECT_TCP if no_tcp and version >= 4 else 0
    scope = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scoped and version >= 6 else 0
    attr = _RulesetAttr(fs, net, scope)
    ruleset = syscall(
        SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
        ctypes.c_uint32(0),
    )  # fmt: skip
    try:
        for paths, rights in ((folders, fs), (files, fs & FILE_RIGHTS)):
            for path in paths:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = _PathBeneathAttr(rights, fd)
                    syscall(
                        SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0),
                    )  # fmt: skip
                finally:
                    os.close(fd)
        no_new_privs()
        syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)

"""The Linux calls that the sandbox's child-side files make through ctypes (child_landlock.py,
child_seccomp.py, child_reaper.py), written once. Standard library only, as they are: in a
bounded child, child_entry.py loads this folder as a package of its own, without the validator.
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctypes import _CArgObject, _SimpleCData

    # What a raw syscall takes: a plain int, a C scalar, a pointer (`ctypes.byref`).
    Argument = int | _SimpleCData[Any] | _CArgObject

PR_SET_NO_NEW_PRIVS = 38


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _checked(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def syscall(number: int, *args: Argument) -> int:
    """The raw syscall; its result, or OSError with its errno."""
    return _checked(_libc().syscall(ctypes.c_long(number), *args))


def prctl(option: int, value: int) -> None:
    """Linux's prctl with one argument; OSError with its errno where it fails."""
    _checked(_libc().prctl(option, value, 0, 0, 0))


def no_new_privs() -> None:
    """This process and what it starts can never gain privileges (setuid, file capabilities):
    what Landlock and a seccomp filter ask of an unprivileged process first."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)

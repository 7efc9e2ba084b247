"""The messages between the validator and a bounded child's side (child_entry.py): one typed
definition that both import, JSON on the wire. Standard library only: a `python -I` child loads
it beside child_entry.py, without the validator.

Every message is read through `decode` or `decode_reply`, which take at most their bound of
bytes and check each field against the definitions below (types, finite numbers, a pid that is
a child's): the parent uses nothing a child's side says unchecked, nor the child's side anything
malformed.
"""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from typing import Any, TypedDict, TypeVar, Union, final

MAX_MESSAGE_BYTES = 1 << 20  # a request: its script's arguments and environment
MAX_REPLY_BYTES = 1 << 16  # a server's reply: a pid, an end, a reason
# What a server's refusal or a set-up's refused limit may say; past it, cut.
MAX_REASON_CHARS = 2000

# Words outside JSON: on the server's control socket, a child's connection, its status pipe.
READY = b"ready"  # the server, once its preloads are imported (anything else: why it cannot)
KILL = b"kill"  # the parent, on a child's connection: kill its group (closing it does too)
ARMED = b"1"  # a child's set-up, on its status pipe: its limits are armed
REFUSED = b"L"  # a child's set-up, then the limit the host refused; the set-up ends there


class ProtocolError(ValueError):
    """A message that is not one of this protocol's: too large, not JSON, or not the shape."""


# --- the request: what the child's side is told -------------------------------------------------


class Confinement(TypedDict):
    """The Landlock rules (child_landlock.py): writes only beneath `folders` and to `files`."""

    abi: int
    folders: list[str]
    files: list[str]
    no_tcp: bool
    scoped: bool


class SyscallRules(TypedDict):
    """The seccomp filter (child_seccomp.py): socket families, and what else it refuses."""

    arch: str
    families: list[int]
    no_processes: bool
    no_metadata: bool
    no_connect: bool
    no_others: bool


class Bounds(TypedDict):
    """The limits the child arms after its preloads (child_limits.py); None: not bounded."""

    cpu_seconds: float | None
    memory_bytes: int | None
    file_bytes: int | None


class Request(Bounds):
    """What the child's side is told on either path: the script, and what confines it."""

    script: str
    args: list[str]
    confine: Confinement | None
    syscalls: SyscallRules | None


class ServedRequest(Request):
    """To a pre-imported server, with the caller's connection and the child's stderr."""

    cwd: str
    env: dict[str, str]
    token: str  # written over the server's placeholder on the child's command line


class FreshRequest(Request):
    """To `child_entry.py run SPEC`, a fresh interpreter that imports the preloads itself."""

    parent: int  # the validator's pid: its death kills the child
    preload: list[str]
    status: int  # the status pipe's descriptor, which the script never holds


# --- the server's replies, on the caller's connection --------------------------------------------


@final  # final: `"pid" in reply` tells the replies apart for a type checker too
class Started(TypedDict):
    """The child is set up: in its own session, confined, its limits armed or refused."""

    pid: int


class _Ended(TypedDict):
    code: int  # its exit code; negative: the signal that ended it
    cpu: float  # CPU seconds it used


@final
class Ended(_Ended, total=False):
    """The child ended: its group killed, its leader reaped, what it left killed."""

    refused: str  # the limit its set-up could not take


@final
class NotStarted(TypedDict):
    """The request could not be served; the caller runs a fresh process instead."""

    error: str


Reply = Started | Ended | NotStarted
M = TypeVar("M")


def encode(message: Request | Reply) -> bytes:
    return json.dumps(message).encode()


def decode(data: bytes, kind: type[M]) -> M:
    """`data` as a message of `kind` (a TypedDict above); ProtocolError otherwise."""
    value = _loads(data)
    wrong = _mismatch(value, kind)
    if wrong:
        raise ProtocolError(f"not a {kind.__name__}: {wrong}")
    return typing.cast(M, value)


def decode_reply(data: bytes) -> Reply:
    """A server's reply: Started, Ended or NotStarted, whichever `data` is; ProtocolError for
    anything else, a pid that is no child's included (a kill of pid 0 or -1 is everyone's)."""
    value = _loads(data, MAX_REPLY_BYTES)
    for kind in (Started, Ended, NotStarted):
        if not _mismatch(value, kind):
            if kind is Started and value["pid"] <= 1:
                raise ProtocolError(f"pid {value['pid']} is no child's")
            return typing.cast(Reply, value)
    raise ProtocolError(f"not a reply of a child server: {_shown(value)}")


def reason(text: str) -> str:
    """A refusal's text as a message carries it: bounded."""
    return text[:MAX_REASON_CHARS]


def _loads(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    if len(data) > max_bytes:
        raise ProtocolError(f"{len(data)} bytes, over {max_bytes}")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def _mismatch(value: Any, kind: type) -> str:
    """What in `value` does not fit TypedDict `kind` ("" when it fits)."""
    if not isinstance(value, dict):
        return f"a {type(value).__name__}, not an object"
    hints = _hints(kind)
    # A TypedDict class's own attribute, which `type` does not declare.
    required: frozenset[str] = kind.__required_keys__  # type: ignore[attr-defined]
    missing, unknown = required - value.keys(), value.keys() - hints.keys()
    if missing or unknown:
        return f"keys missing {sorted(missing)}, unknown {sorted(map(str, unknown))}"
    for key, item in value.items():
        if not _fits(item, hints[key]):
            return f"{key} = {_shown(item)}"
    return ""


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if typing.is_typeddict(hint):
        return not _mismatch(value, hint)
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(key, args[0]) and _fits(item, args[1]) for key, item in value.items()
        )
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    raise TypeError(f"no check for {hint!r}")  # a field of a type this reader does not know


def _shown(value: Any) -> str:
    return repr(value)[:200]

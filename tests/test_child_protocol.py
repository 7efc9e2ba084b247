"""The messages between the validator and a bounded child's side (validator/sandbox/protocol.py):
one typed definition both sides import; what the parent reads is checked against it, so a reply
that is not the protocol's (a pid that would kill everyone, a non-finite number, a key too many)
retires the server instead of being used."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from validator.sandbox import child_process, child_server, protocol
from validator.sandbox.child_result import ChildLimits

LIMITS = ChildLimits(wall_seconds=5.0, cpu_seconds=2.0, memory_bytes=None, file_bytes=1024)


def reply_read_by_the_parent(message: bytes) -> protocol.Reply | None:
    """`message` as the validator reads a server's reply on a child's connection."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        theirs.send(message)
        return child_process._receive(ours, float("inf"), lambda: None)


@pytest.mark.parametrize(
    "reply",
    [
        {"pid": 4242},
        {"code": 0, "cpu": 0.25},
        {"code": -9, "cpu": 3, "refused": "RLIMIT_AS of 5 bytes is above the hard limit"},
        {"error": "OSError: fork failed"},
    ],
)
def test_the_parent_takes_each_reply_of_the_protocol(reply):
    assert reply_read_by_the_parent(json.dumps(reply).encode()) == reply


@pytest.mark.parametrize(
    "message",
    [
        b'{"pid": 0}',  # os.killpg(0) is the validator's own group
        b'{"pid": -1}',  # kill(-1) is every process the user may signal
        b'{"pid": true}',
        b'{"pid": "12"}',
        b'{"pid": 12, "code": 0}',
        b'{"code": 0, "cpu": NaN}',
        b'{"code": 0, "cpu": Infinity}',
        b'{"code": 0.5, "cpu": 1}',
        b'{"code": 0}',
        b'{"code": 0, "cpu": 1, "refused": 7}',
        b'{"error": null}',
        b"[12]",
        b"ready",
        b"[" * 50_000 + b"]" * 50_000,
        json.dumps({"error": "x" * protocol.MAX_REPLY_BYTES}).encode(),
    ],
)
def test_a_reply_outside_the_protocol_retires_the_server(message):
    with pytest.raises(child_server.ServerGone, match="it answered"):
        reply_read_by_the_parent(message)


def test_the_requests_the_parent_builds_are_the_childs_definition(tmp_path: Path):
    base = child_process._request(Path("/x/child.py"), ["a", "b"], tmp_path, LIMITS)
    served = protocol.ServedRequest(**base, cwd=str(tmp_path), env={"PATH": "/bin"}, token="t")
    fresh = protocol.FreshRequest(**base, parent=1234, preload=["numpy"], status=5)
    assert protocol.decode(protocol.encode(served), protocol.ServedRequest) == served
    assert protocol.decode(protocol.encode(fresh), protocol.FreshRequest) == fresh
    assert base["args"] == ["a", "b"] and base["memory_bytes"] is None
    with pytest.raises(protocol.ProtocolError, match="not a FreshRequest: keys missing"):
        protocol.decode(protocol.encode(served), protocol.FreshRequest)
    served_wrong = {**served, "env": {"PATH": 1}}
    with pytest.raises(protocol.ProtocolError, match="not a ServedRequest: env = "):
        protocol.decode(json.dumps(served_wrong).encode(), protocol.ServedRequest)


def test_every_field_of_the_definition_is_one_the_reader_checks():
    # A field of a type `decode` cannot check would raise TypeError at the first message.
    kinds = [protocol.ServedRequest, protocol.FreshRequest, protocol.Started, protocol.Ended]
    for kind in [*kinds, protocol.NotStarted, protocol.Confinement, protocol.SyscallRules]:
        for hint in protocol._hints(kind).values():
            protocol._fits(object(), hint)

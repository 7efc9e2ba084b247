"""A bounded child's seccomp filter (validator/sandbox/child_seccomp.py, installed by
validator/sandbox/child_entry.py after the Landlock rules), on both paths (forked from the
pre-imported server; the fresh-process fallback), with real children: what Landlock leaves open
is closed. No socket but a Unix one (MPTCP, a TCP that Landlock's TCP rule does not see, and UDP
reach no listener); no change of a file's mode or times, in its folder or outside; no new
process (threads still start). And one warning line for each Landlock feature a kernel lacks."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from tests.helpers.children import PROBE_ATTEMPT, run_probe
from validator.sandbox import child_landlock, child_seccomp

SOCKETS = (
    PROBE_ATTEMPT
    + """
def mptcp():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262) as sock:  # IPPROTO_MPTCP
        sock.settimeout(10)
        sock.connect(("127.0.0.1", int(sys.argv[1])))
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"out", ("127.0.0.1", int(sys.argv[2])))
def unix():
    left, right = socket.socketpair()
    left.sendall(b"x")
    assert right.recv(1) == b"x"
seen = {"mptcp": attempt(mptcp), "udp": attempt(udp), "netlink":
        attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)), "unix": attempt(unix)}
json.dump(seen, open("seen.json", "w"))
"""
)
# The Docker engine's socket answers `GET /version` to whoever connects (host root where the
# validator runs as root or in the docker group): a listener bound to a path stands in for it,
# and a datagram one for /dev/log and the like.
CONNECTIONS = (
    PROBE_ATTEMPT
    + """
def stream():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(sys.argv[1])
        sock.sendall(b"GET /version HTTP/1.0\\r\\n\\r\\n")
def datagram():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"out", sys.argv[2])
def message():
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendmsg([b"out"], [], 0, sys.argv[2])
def pair():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    left.send(b"x")
    assert right.recv(1) == b"x"
seen = {"stream": attempt(stream), "datagram": attempt(datagram), "sendmsg": attempt(message),
        "pair": attempt(pair)}
json.dump(seen, open("seen.json", "w"))
"""
)
METADATA = (
    PROBE_ATTEMPT
    + """
import fcntl, struct
def set_flags(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x40086602, struct.pack("l", 0x40))  # FS_IOC_SETFLAGS: no dump
    finally:
        os.close(fd)
seen = {}
for where, path in (("outside", sys.argv[1]), ("inside", "mine.txt")):
    if where == "inside":
        open(path, "w").write("mine")
    seen[where] = {
        "chmod": attempt(lambda: os.chmod(path, 0)),
        "utime": attempt(lambda: os.utime(path, (0, 0))),
        "chown": attempt(lambda: os.chown(path, os.getuid(), os.getgid())),
        "xattr": attempt(lambda: os.setxattr(path, "user.planted", b"1")),
        "flags": attempt(lambda: set_flags(path)),
    }
json.dump(seen, open("seen.json", "w"))
"""
)
PROCESSES = (
    PROBE_ATTEMPT
    + """
import subprocess
def fork():
    if os.fork() == 0:
        os._exit(0)
ran = []
def thread():
    worker = threading.Thread(target=lambda: ran.append(1))
    worker.start()
    worker.join()
seen = {"fork": attempt(fork), "subprocess": attempt(lambda: subprocess.run(["true"])),
        "thread": attempt(thread), "ran": ran}
json.dump(seen, open("seen.json", "w"))
"""
)


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_opens_no_socket_but_a_unix_one(tmp_path, monkeypatch, path):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with socket.create_server(("127.0.0.1", 0)) as tcp, udp:
        udp.bind(("127.0.0.1", 0))
        ports = [str(tcp.getsockname()[1]), str(udp.getsockname()[1])]
        seen, _work = run_probe(tmp_path, monkeypatch, path, SOCKETS, ports)
        tcp.setblocking(False)
        udp.setblocking(False)
        with pytest.raises(BlockingIOError):
            tcp.accept()  # no MPTCP connection reached the TCP listener
        with pytest.raises(BlockingIOError):
            udp.recv(10)
    assert seen == {
        "mptcp": "PermissionError",
        "udp": "PermissionError",
        "netlink": "PermissionError",
        "unix": "done",
    }, seen


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_connects_to_no_unix_socket_bound_to_a_path(tmp_path, monkeypatch, path):
    engine_path, log_path = str(tmp_path / "docker.sock"), str(tmp_path / "log.sock")
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with engine, log:
        engine.bind(engine_path)
        engine.listen(8)
        log.bind(log_path)
        seen, _work = run_probe(tmp_path, monkeypatch, path, CONNECTIONS, [engine_path, log_path])
        engine.setblocking(False)
        log.setblocking(False)
        with pytest.raises(BlockingIOError):
            engine.accept()  # no connection reached the engine's stand-in
        with pytest.raises(BlockingIOError):
            log.recv(10)
    assert seen == {
        "stream": "PermissionError",
        "datagram": "PermissionError",
        "sendmsg": "PermissionError",
        "pair": "done",
    }, seen


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_changes_no_files_mode_owner_or_times(tmp_path, monkeypatch, path):
    outside = tmp_path / "model.safetensors"  # stands in for the base model in the HF cache
    outside.write_bytes(b"weights")
    before = os.stat(outside)
    seen, _work = run_probe(tmp_path, monkeypatch, path, METADATA, [str(outside)])
    refused = {name: "PermissionError" for name in ("chmod", "utime", "chown", "xattr", "flags")}
    assert seen == {"outside": refused, "inside": refused}, seen
    after = os.stat(outside)
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
    inside = os.stat(tmp_path / "work" / "mine.txt")
    assert inside.st_mode & 0o777 and inside.st_mtime > 0


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_starts_no_process_but_threads_run(tmp_path, monkeypatch, path):
    seen, _work = run_probe(tmp_path, monkeypatch, path, PROCESSES, [])
    assert seen == {
        "fork": "PermissionError",
        "subprocess": "PermissionError",
        "thread": "done",
        "ran": [1],
    }, seen


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (3, [child_landlock.NO_TCP_RULE.format(abi=3), child_landlock.NO_SCOPES.format(abi=3)]),
        (5, [child_landlock.NO_SCOPES.format(abi=5)]),
        (7, []),
    ],
)
def test_each_missing_landlock_feature_is_one_warning_line(monkeypatch, caplog, version, expected):
    # The kernel's answer to the ABI probe, as an older kernel gives it; probed once a process.
    monkeypatch.setattr(child_landlock, "abi", lambda: version)
    monkeypatch.setitem(child_landlock._probe, "abi", None)
    with caplog.at_level(logging.WARNING, logger=child_landlock.__name__):
        for _ in range(3):
            assert child_landlock.rules(["/x"], [], no_tcp=True, scoped=True)["abi"] == version
    assert [record.getMessage() for record in caplog.records] == expected


def test_the_filter_is_there_to_test():
    # These tests run where children are filtered: a kernel without seccomp fails here, loudly.
    assert child_seccomp.available()


def test_without_seccomp_one_warning_line_and_no_filter(monkeypatch, caplog):
    # The probe's answer on a kernel or container profile without seccomp filters.
    monkeypatch.setattr(child_seccomp, "available", lambda: False)
    monkeypatch.setitem(child_seccomp._probe, "available", None)
    with caplog.at_level(logging.WARNING, logger=child_seccomp.__name__):
        found = [child_seccomp.rules((socket.AF_UNIX,), True, True, True) for _ in range(3)]
    assert found == [None] * 3
    assert [record.getMessage() for record in caplog.records] == [child_seccomp.NOT_AVAILABLE]

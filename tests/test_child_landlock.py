"""A bounded child (validator/sandbox/child_process.py) writes only beneath its own folder and holds
no TCP, on both paths (forked from the pre-imported server; the fresh-process fallback): the
Landlock rules of validator/sandbox/child_landlock.py, applied before the script runs. A sibling
folder stands in for the HF cache (the base model's files) and the state dir. Where the kernel
refuses Landlock (a real seccomp filter here), children run unconfined after one warning line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers.children import PROBE_ATTEMPT, run_probe
from validator.sandbox import child_landlock

MODEL = b"the base model's weights"
# The child: each attempt's outcome, by name, in its own folder.
WRITER = (
    PROBE_ATTEMPT
    + """
cache = sys.argv[1]
def overwrite():
    with open(os.path.join(cache, "model.safetensors"), "r+b") as handle:
        handle.write(b"poisoned")
def create():
    open(os.path.join(cache, "planted.py"), "w").write("print('owned')")
def own():
    os.makedirs("sub", exist_ok=True)
    open(os.path.join("sub", "mine.txt"), "w").write("mine")
    os.replace(os.path.join("sub", "mine.txt"), "mine.txt")
    open(os.devnull, "w").write("anything")
seen = {
    "overwrite": attempt(overwrite),
    "create": attempt(create),
    "delete": attempt(lambda: os.unlink(os.path.join(cache, "model.safetensors"))),
    "own": attempt(own),
    "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace"),
}
json.dump(seen, open("seen.json", "w"))
"""
)
# The child: connects to the TCP port and the abstract Unix socket given, says how that went.
CONNECT = """
import json, os, socket, sys
def attempt(family, address):
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(address)
        return "connected"
    except OSError as exc:
        return type(exc).__name__
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace")
seen = {
    "tcp": attempt(socket.AF_INET, ("127.0.0.1", int(sys.argv[1]))),
    "abstract": attempt(socket.AF_UNIX, "\\0" + sys.argv[2]),
    "parent": parent,
}
json.dump(seen, open("seen.json", "w"))
"""
# The child: a signal to itself, to its parent and to the validator (the test). It may not start
# a process (validator/sandbox/child_seccomp.py), so its own processes are itself.
SIGNAL = """
import json, os, signal, sys
def attempt(pid):
    try:
        os.kill(pid, signal.SIGCONT)  # harmless wherever it lands
        return "sent"
    except OSError as exc:
        return type(exc).__name__
seen = {
    "own": attempt(os.getpid()),
    "parent": attempt(os.getppid()),
    "validator": attempt(int(sys.argv[1])),
    "parent_cmdline": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(errors="replace"),
}
json.dump(seen, open("seen.json", "w"))
"""


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_writes_only_beneath_its_own_folder(tmp_path, monkeypatch, path):
    assert child_landlock.abi() >= 1, "this kernel has no Landlock: children run unconfined"
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    (cache / "model.safetensors").write_bytes(MODEL)
    seen, work = run_probe(tmp_path, monkeypatch, path, WRITER, [str(cache)])
    assert seen["overwrite"] == "PermissionError", seen
    assert seen["create"] == "PermissionError", seen
    assert seen["delete"] == "PermissionError", seen
    assert (cache / "model.safetensors").read_bytes() == MODEL
    assert sorted(p.name for p in cache.iterdir()) == ["model.safetensors"]
    # Its own folder (a subfolder, a rename within it, /dev/null) as before.
    assert seen["own"] == "done", seen
    assert (work / "mine.txt").read_text() == "mine"
    assert _served(seen) == (path == "served"), seen["parent"]


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_cannot_connect_over_tcp_or_to_an_abstract_socket(tmp_path, monkeypatch, path):
    if child_landlock.abi() < 6:
        pytest.skip("Landlock's TCP rules and scopes need ABI 6 (Linux 6.12); this kernel is older")
    name = f"flock-landlock-test-{uuid.uuid4().hex}"
    with (
        socket.create_server(("127.0.0.1", 0)) as tcp,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as abstract,
    ):
        abstract.bind("\0" + name)
        abstract.listen()
        port = tcp.getsockname()[1]
        seen, work = run_probe(tmp_path, monkeypatch, path, CONNECT, [str(port), name])
        assert seen["tcp"] == "PermissionError", seen
        assert seen["abstract"] == "PermissionError", seen
        # A connection the kernel completed would wait in the backlog: there is none.
        for server in (tcp, abstract):
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()
    assert _served(seen) == (path == "served"), seen["parent"]


@pytest.mark.parametrize("path", ["served", "fresh"])
def test_a_child_signals_only_its_own_processes(tmp_path, monkeypatch, path):
    if child_landlock.abi() < 6:
        pytest.skip("Landlock's signal scope needs ABI 6 (Linux 6.12); this kernel is older")
    seen, work = run_probe(tmp_path, monkeypatch, path, SIGNAL, [str(os.getpid())])
    assert seen["own"] == "sent", seen
    assert seen["parent"] == "PermissionError", seen  # the server, or the fresh path's reaper
    assert seen["validator"] == "PermissionError", seen
    assert _served({"parent": seen["parent_cmdline"]}) == (path == "served"), seen


def _served(seen: dict) -> bool:
    """Whether the child's parent was a child server (else the fresh path's first process)."""
    return "child_entry.py" in seen["parent"] and "serve" in seen["parent"]


# A validator on a kernel that refuses Landlock: a seccomp filter (set up with ctypes) answers
# its create_ruleset with ENOSYS, as an old kernel does; then three children, the last fresh.
NO_LANDLOCK = """
import ctypes, json, logging, sys
sys.path.insert(0, {root!r})

class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]

class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

ENOSYS, ERRNO, ALLOW = 38, 0x00050000, 0x7FFF0000
rules = (Filter * 4)(
    Filter(0x20, 0, 0, 0),  # load the syscall's number
    Filter(0x15, 0, 1, 444),  # landlock_create_ruleset?
    Filter(0x06, 0, 0, ERRNO | ENOSYS),
    Filter(0x06, 0, 0, ALLOW),
)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Program(4, rules)), 0, 0) == 0  # the filter
from pathlib import Path
from validator.sandbox import child_landlock, child_server
from validator.sandbox.child_process import ChildLimits, run_child

warnings = []
handler = logging.Handler()
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("validator").addHandler(handler)
outside = Path({outside!r})
child = Path({child!r})
codes = []
for n in range(3):
    if n == 2:
        child_server.server_for = lambda *_args, **_kwargs: None
    result = run_child(child, [str(outside / str(n))], cwd=Path({work!r}), limits=ChildLimits(60),
                       preload=("json",))
    codes.append(result.exit_code)
print(json.dumps({{"abi": child_landlock.abi(), "codes": codes, "warnings": warnings}}))
"""


def test_without_landlock_children_run_unconfined_after_one_warning_line(tmp_path):
    outside, child, validator = tmp_path / "outside", tmp_path / "child.py", tmp_path / "v.py"
    outside.mkdir()
    child.write_text("import sys\nopen(sys.argv[1], 'w').write('written')\n")
    root = str(Path(__file__).resolve().parents[1])
    validator.write_text(
        NO_LANDLOCK.format(
            root=root, outside=str(outside), child=str(child), work=str(tmp_path / "work")
        )
    )
    done = subprocess.run(
        [sys.executable, str(validator)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["abi"] == 0  # as an old kernel answers
    assert seen["codes"] == [0, 0, 0], (seen, done.stderr)
    assert [p.read_text() for p in sorted(outside.iterdir())] == ["written"] * 3
    assert seen["warnings"] == [child_landlock.NOT_AVAILABLE], seen

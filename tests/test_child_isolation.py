"""A bounded child (validator/sandbox/child_process.py, boundary.py) against the validator that
started it, with real processes on both paths (forked from the pre-imported
server; the fresh-process fallback):

- it cannot read the validator's environment or memory (`python -m validator` makes itself
  non-dumpable first thing; a stand-in validator that does the same runs the children). The
  pair runs without privileges, as in the module image (uid 10001, no capabilities): root's
  CAP_SYS_PTRACE reads any process, so under a root test run the stand-in validator is started
  with every capability dropped from its bounding set (it stays uid 0: an interpreter under
  /root, as in a root sandbox, cannot be started as another user). It checks that it holds no
  capability; the drop is never skipped;
- nothing it starts outlives it: a child may not start a process at all (its seccomp filter,
  tests/test_child_seccomp.py); on a kernel without seccomp the subreaper still covers it: with
  the filter off, a sleeper double-forked into a session of its own is gone once the call
  returns, whether the child returned or was killed at its wall clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.validator_cli import API_KEY, validator_env, write_config
from tests.helpers.children import drop_capabilities, wait_until
from validator.sandbox import child_seccomp, child_server
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "flock-SECRET-f4-7731"
# The child: what it can read of the process whose pid it is given.
SNOOP = """
import json, sys
request = json.load(open(sys.argv[1]))
def read(name):
    try:
        with open(f"/proc/{request['pid']}/{name}", "rb") as handle:
            return handle.read(4096).decode(errors="replace")
    except OSError as exc:
        return type(exc).__name__
json.dump({name: read(name) for name in ("environ", "mem", "cmdline")},
          open(request["result"], "w"))
"""
# The validator: its start-up, then one child on each path, both told its pid.
VALIDATOR = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from pydantic import BaseModel
from validator.sandbox.child_reaper import make_undumpable
make_undumpable()  # what validator/__main__.py does first
from validator.sandbox import child_seccomp, child_server
from validator.kit.boundary import inspect_in_child

class Seen(BaseModel):
    environ: str
    mem: str
    cmdline: str

def snoop(work):
    return inspect_in_child(Path({snoop!r}), {{"pid": __import__("os").getpid()}},
                            work=Path(work), what="snoop", answer=Seen).model_dump()

served = snoop({work!r} + "/served")
child_server.server_for = lambda *_args, **_kwargs: None
fresh = snoop({work!r} + "/fresh")
caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")]
print(json.dumps({{"served": served, "fresh": fresh, "caps": caps[0]}}))
"""


def test_a_child_cannot_read_the_validators_environment_or_memory(tmp_path):
    snoop, validator = tmp_path / "snoop.py", tmp_path / "validator.py"
    snoop.write_text(SNOOP)
    validator.write_text(
        VALIDATOR.format(root=str(REPO_ROOT), snoop=str(snoop), work=str(tmp_path / "work"))
    )
    root = os.geteuid() == 0  # see the module's docstring
    done = subprocess.run(
        [sys.executable, str(validator)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FLOCK_API_KEY": SECRET},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=drop_capabilities if root else None,  # noqa: PLW1509 - pytest's one thread
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert int(seen["caps"], 16) == 0  # as the module image runs it
    for path in ("served", "fresh"):
        assert SECRET not in json.dumps(seen[path]), path
        assert seen[path]["environ"] == "PermissionError", (path, seen[path])
        assert seen[path]["mem"] == "PermissionError", (path, seen[path])
        # The right process, and /proc readable as such: only the protected files are refused.
        assert str(validator) in seen[path]["cmdline"], (path, seen[path])


# What a process of the validator's user (without capabilities) makes of the process given's
# environment; never its text (the test's own environment is in it).
READ = """
import sys
try:
    environ = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
    print("holds the key" if sys.argv[2].encode() in environ else "read")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_the_validator_is_non_dumpable_from_its_start(tmp_path):
    # The real CLI, held inside a scoring (the fixture module's `slow/`) while it is read.
    env = validator_env(tmp_path)
    release = tmp_path / "release"
    write_config(
        tmp_path,
        "fixture",
        {"marker_dir": str(tmp_path), "release_file": str(release), "slow_seconds": 120},
    )
    check = tmp_path / "input.json"
    check.write_text(json.dumps({"hg_repo_id": "slow/x"}))
    unprivileged = drop_capabilities if os.geteuid() == 0 else None
    validator = subprocess.Popen(
        [sys.executable, "-m", "validator", "fixture", "--check", str(check)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=unprivileged,  # noqa: PLW1509 - pytest's one thread
    )
    try:
        assert wait_until(lambda: (tmp_path / "slow_x.started").exists() or validator.poll())
        assert validator.poll() is None, validator.stderr.read() if validator.stderr else ""
        read = subprocess.run(
            [sys.executable, "-c", READ, str(validator.pid), API_KEY],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=unprivileged,  # noqa: PLW1509 - pytest's one thread
        )
    finally:
        release.touch()
        _, err = validator.communicate(timeout=120)
    assert validator.returncode == 0, err
    assert read.stdout.strip() == "PermissionError", read.stdout


# Double-forks a `sleep 600` into a session of its own, writes its pid once it runs `sleep`
# (its end of a close-on-exec pipe closes at the exec), then returns or hangs (argv[1]).
ESCAPE = """
import os, sys, time
read_end, write_end = os.pipe()
middle = os.fork()
if middle == 0:
    os.setsid()
    sleeper = os.fork()
    if sleeper == 0:
        os.execvp("sleep", ["sleep", "600"])
    os.close(write_end)
    os.read(read_end, 1)
    open("sleeper", "w").write(str(sleeper))
    os._exit(0)
os.close(write_end)
os.waitpid(middle, 0)
if sys.argv[1] == "hang":
    time.sleep(600)
"""


def sleeping(pid: int) -> bool:
    """Whether `pid` is still the child's `sleep 600`, running (not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return cmdline == b"sleep\x00600\x00" and state != "Z"


@pytest.mark.parametrize("path", ["served", "fresh"])
@pytest.mark.parametrize(
    ("how", "limits", "outcome"),
    [
        ("return", ChildLimits(60), ChildOutcome.OK),
        ("hang", ChildLimits(wall_seconds=2), ChildOutcome.OVER_TIME),
    ],
    ids=["returned", "killed-over-time"],
)
def test_nothing_a_child_starts_outlives_it(tmp_path, monkeypatch, path, how, limits, outcome):
    # As on a kernel without seccomp: the validator's probe found none, so no filter is sent.
    monkeypatch.setitem(child_seccomp._probe, "available", False)
    if path == "fresh":
        monkeypatch.setattr(child_server, "server_for", lambda *_args, **_kwargs: None)
    child, run = tmp_path / "escape.py", tmp_path / "run"
    child.write_text(ESCAPE)
    result = run_child(child, [how], cwd=run, limits=limits, preload=("json",))
    sleeper = int((run / "sleeper").read_text())
    try:
        assert result.outcome is outcome, result
        assert not sleeping(sleeper)
    finally:
        if sleeping(sleeper):  # the old code's escapee: not left to the machine
            os.kill(sleeper, signal.SIGKILL)

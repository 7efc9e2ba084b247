"""The rl policy's child process does not outlive the validator (issue 23, item 7): a validator
killed with SIGKILL, or stopped with a second signal, while a policy spins, leaves no policy
process behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx

from devkit.tiny_policies import slow_policy

REPO_ROOT = Path(__file__).resolve().parents[2]
FEATURES, VENUES = 4, 3

PARENT = """
import signal, sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
import numpy as np
from devkit.tiny_policies import validation_arrays
from modules.rl.inference import Limits, run_policy
from validator.entrypoint import _install_signal_handlers
from validator.runner import Interrupted

_install_signal_handlers(threading.Event())
x, _ = validation_arrays(4, {features}, {venues})
limits = Limits(threads=1, seconds=600, memory_bytes=4 * 1024**3)
try:
    run_policy(Path({model!r}), x, {venues}, 512, limits, Path({work!r}))
except Interrupted:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the test's later signals
    sys.exit(130)
"""


def sandbox_pid(work: Path, timeout: float = 120.0) -> tuple[int, str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for record in work.glob(".child-*.pid"):
            if record.stat().st_size:
                data = json.loads(record.read_text())
                return data["pid"], data["token"]
        time.sleep(0.1)
    raise AssertionError(f"no policy process started in {work}")


def running(pid: int, token: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and token.encode() in cmdline


def gone(pid: int, token: str, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and running(pid, token):
        time.sleep(0.1)
    return not running(pid, token)


def start(tmp_path: Path) -> tuple[subprocess.Popen, int, str]:
    model = tmp_path / "model.onnx"
    onnx.save_model(slow_policy(FEATURES, VENUES), str(model))
    work = tmp_path / "inference"
    script = tmp_path / "parent.py"
    script.write_text(
        PARENT.format(
            root=str(REPO_ROOT), features=FEATURES, venues=VENUES, model=str(model), work=str(work)
        )
    )
    process = subprocess.Popen([sys.executable, str(script)])
    pid, token = sandbox_pid(work)
    time.sleep(1)  # the policy is spinning by now
    assert running(pid, token)
    return process, pid, token


def test_a_killed_validator_takes_the_policy_process_along(tmp_path):
    process, pid, token = start(tmp_path)
    process.kill()
    process.wait(timeout=60)
    assert gone(pid, token)


def test_a_second_stop_signal_kills_the_policy_process(tmp_path):
    process, pid, token = start(tmp_path)
    process.send_signal(signal.SIGTERM)
    # Again until it ends: two signals sent at once may reach the handler as one.
    for _ in range(30):
        time.sleep(1)
        process.send_signal(signal.SIGTERM)
        if process.poll() is not None:
            break
    assert process.wait(timeout=60) == 130
    assert gone(pid, token, timeout=5)

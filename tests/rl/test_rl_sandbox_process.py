"""The rl policy's child process does not outlive the validator: a validator
killed with SIGKILL, or stopped with a second signal, while a policy spins, leaves no policy
process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import onnx

from devkit.tiny_policies import slow_policy
from tests.helpers.children import alive, gone, record_in, stop_again_until_it_ends, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
FEATURES, VENUES = 4, 3

PARENT = """
import signal, sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
import numpy as np
from devkit.tiny_policies import validation_arrays
from modules.rl.inference import run_policy
from validator.kit import ChildLimits
from validator.entrypoint import _install_signal_handlers
from validator.runner import Interrupted

_install_signal_handlers(threading.Event())
x, _ = validation_arrays(4, {features}, {venues})
limits = ChildLimits(wall_seconds=600, memory_bytes=4 * 1024**3)
try:
    run_policy(Path({model!r}), x, {venues}, 512, limits, Path({work!r}))
except Interrupted:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the test's later signals
    sys.exit(130)
"""


def start(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
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
    record = record_in(work, timeout=120)
    assert alive(record["pid"], record["token"])
    return process, record


def test_a_killed_validator_takes_the_policy_process_along(tmp_path):
    process, record = start(tmp_path)
    process.kill()
    process.wait(timeout=60)
    assert gone(record)


def test_a_second_stop_signal_kills_the_policy_process(tmp_path):
    process, record = start(tmp_path)
    process.send_signal(signal.SIGTERM)
    assert not wait_until(lambda: process.poll() is not None, timeout=1)  # the first: go on
    stop_again_until_it_ends(process, tries=30)
    assert process.wait(timeout=60) == 130
    assert gone(record, timeout=5)

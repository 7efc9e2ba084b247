"""validator/sandbox/child_process.py with real child processes: each limit ends a child with its
own outcome, the child gets no secret, a stop signal or the parent's death ends the child, and a
child left by a killed run is killed when its work folder is swept at start-up."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.children import alive, record_in, stop_again_until_it_ends, wait_until
from validator.kit.workdirs import LOCK_NAME, ROOT_NAME, WorkArea
from validator.sandbox.child_files import RECORD_PREFIX, RECORD_SUFFIX
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

REPO_ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True:\n    pass\n"


def script(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_a_child_that_finishes_is_ok_and_gets_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOCK_API_KEY", "flock-SECRET-123")
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_456")
    child = script(
        tmp_path,
        "import json, os, sys\n"
        "json.dump({'env': dict(os.environ), 'argv': sys.argv[1:]}, open('out.json', 'w'))\n",
    )
    result = run_child(child, ["a", "b"], cwd=tmp_path / "run", limits=ChildLimits(60, 30))
    assert result.outcome is ChildOutcome.OK and result.exit_code == 0
    out = json.loads((tmp_path / "run" / "out.json").read_text())
    assert out["argv"] == ["a", "b"]
    assert "FLOCK_API_KEY" not in out["env"] and "HF_TOKEN" not in out["env"]
    assert "SECRET" not in json.dumps(out["env"])
    assert not list((tmp_path / "run").glob(f"{RECORD_PREFIX}*"))  # nothing of ours left


@pytest.mark.parametrize(
    ("body", "limits", "outcome"),
    [
        (BUSY, ChildLimits(wall_seconds=120, cpu_seconds=1), ChildOutcome.OVER_CPU),
        (
            "data = bytearray(4 * 1024**3)\n",
            ChildLimits(wall_seconds=120, memory_bytes=256 * 1024**2),
            ChildOutcome.OVER_MEMORY,
        ),
        (  # what Rust (tokenizers) does when an allocation fails at the limit: abort
            "import os, sys\nsys.stderr.write('memory allocation of 96 bytes failed\\n')\n"
            "sys.stderr.flush()\nos.abort()\n",
            ChildLimits(wall_seconds=60, memory_bytes=256 * 1024**2),
            ChildOutcome.OVER_MEMORY,
        ),
        ("import time\ntime.sleep(600)\n", ChildLimits(wall_seconds=1), ChildOutcome.OVER_TIME),
        ("raise SystemExit(3)\n", ChildLimits(wall_seconds=60), ChildOutcome.CRASHED),
    ],
    ids=["cpu", "memory", "rust-allocation", "time", "crash"],
)
def test_each_limit_ends_the_child_with_its_outcome(tmp_path, body, limits, outcome):
    result = run_child(script(tmp_path, body), [], cwd=tmp_path / "run", limits=limits)
    assert result.outcome is outcome, result
    assert outcome.value in result.describe()


def test_a_child_over_its_file_limit_cannot_fill_the_disk(tmp_path):
    body = "open('big', 'wb').write(b'x' * 10 * 1024**2)\n"
    limits = ChildLimits(wall_seconds=60, file_bytes=1024**2)
    result = run_child(script(tmp_path, body), [], cwd=tmp_path / "run", limits=limits)
    assert result.outcome is ChildOutcome.CRASHED and "File too large" in result.stderr_tail
    assert (tmp_path / "run" / "big").stat().st_size <= 1024**2


PARENT = """
import signal, sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
from validator.sandbox.child_process import ChildLimits, run_child
from validator.entrypoint import _install_signal_handlers
from validator.runner import Interrupted

stop = threading.Event()
_install_signal_handlers(stop)  # the validator's own: a second signal interrupts


def mark_first_stop():  # what the test waits for instead of a clock
    stop.wait()
    Path({work!r}, "first-stop-seen").write_text("seen")


threading.Thread(target=mark_first_stop, daemon=True).start()
try:
    run_child(Path({child!r}), [], cwd=Path({work!r}), limits=ChildLimits(wall_seconds=600))
except Interrupted:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the test's later signals
    print("interrupted", flush=True)
    sys.exit(130)
"""


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    child = script(tmp_path, BUSY)
    work = tmp_path / "work"
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT.format(root=str(REPO_ROOT), child=str(child), work=str(work)))
    process = subprocess.Popen(
        [sys.executable, str(parent)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    record = record_in(work)
    assert alive(record["pid"], record["token"])
    return process, record


def test_a_second_stop_signal_ends_the_wait_and_kills_the_child(tmp_path):
    process, record = start_parent(tmp_path)
    process.send_signal(signal.SIGTERM)  # the first: finish the current step
    assert wait_until(lambda: (tmp_path / "work" / "first-stop-seen").exists())
    assert process.poll() is None and alive(record["pid"])  # handled, and nothing ended
    stop_again_until_it_ends(process, tries=30)  # the second: now
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in output, output
    assert not alive(record["pid"], record["token"])


def test_a_killed_parent_takes_its_child_along(tmp_path):
    process, record = start_parent(tmp_path)
    process.kill()  # SIGKILL: no handler, no finally; only the parent-death signal is left
    process.wait(timeout=60)
    assert wait_until(lambda: not alive(record["pid"], record["token"]))


def test_a_stray_of_a_killed_run_is_killed_when_its_folder_is_swept(tmp_path):
    root = tmp_path / "area"
    # The folder of a run that was killed: its lock file is there, and nobody holds it.
    folder = root / ROOT_NAME / "mod-killed"
    (folder / "run").mkdir(parents=True)
    (folder / LOCK_NAME).touch()
    # A child whose parent-death signal did not reach it (another parent, a subreaper): it
    # carries its record's token on its command line, as run_child's children do.
    token, other = "a" * 32, "b" * 32
    code = "import time; time.sleep(600)"
    stray = subprocess.Popen([sys.executable, "-c", code, token], start_new_session=True)
    # A process that took a recorded pid over (pid reuse): its command line lacks the token.
    bystander = subprocess.Popen([sys.executable, "-c", code, other])
    try:
        for pid, name in ((stray.pid, token), (bystander.pid, "c" * 32)):
            record = folder / "run" / f"{RECORD_PREFIX}{name}{RECORD_SUFFIX}"
            record.write_text(json.dumps({"pid": pid, "token": name}))
        assert wait_until(lambda: alive(stray.pid, token) and alive(bystander.pid, other))
        WorkArea("mod", str(root))  # the next start sweeps
        stray.wait(timeout=60)
        assert stray.returncode == -signal.SIGKILL
        assert bystander.poll() is None
        assert not folder.exists()
    finally:
        for process in (stray, bystander):
            process.kill()
            process.wait()

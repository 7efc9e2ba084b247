"""validator/sandbox/child_server.py and child_entry.py with real processes: a child forked from a
pre-imported server finds no secret in its own environment or its parent's, meets each limit,
is the server's child, is killed with the validator (the server too); threads share a server; a
server that dies or cannot start gives way to a fresh process with one warning line."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.children import alive, is_child_server, parent_of, record_in, wait_until
from validator.sandbox import child_server
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRETS = {"FLOCK_API_KEY": "flock-SECRET-123", "HF_TOKEN": "hf_SECRET_456"}
# Writes what the child can see of its environment and its parent's, and who its parent is.
ENVIRON = """
import json, os
def read(path):
    try:
        return open(path, 'rb').read().decode(errors='replace')
    except OSError as exc:
        return 'unreadable: ' + str(exc)
json.dump({
    'self': read('/proc/self/environ'),
    'parent': read(f'/proc/{os.getppid()}/environ'),
    'environ': dict(os.environ),
    'ppid': os.getppid(),
    'parent_cmdline': read(f'/proc/{os.getppid()}/cmdline'),
}, open('out.json', 'w'))
"""
VALIDATOR = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from validator.sandbox.child_process import ChildLimits, run_child
result = run_child(Path({child!r}), [], cwd=Path({work!r}), limits=ChildLimits(60, 30),
                   env={{"OMP_NUM_THREADS": "1"}}, preload=("json",))
print(result.outcome.name, flush=True)
"""

# The parent of the child's parent (a fresh child's parent is the process the validator started).
GRANDPARENT = (
    "import os\n"
    "def grandparent():\n"
    "    with open(f'/proc/{os.getppid()}/stat') as stat:\n"
    "        return stat.read().rsplit(')', 1)[1].split()[1]\n"
)


def served(cmdline: str) -> bool:
    """Whether a command line (NUL-separated) is a child server's."""
    parts = cmdline.split("\0")
    return "serve" in parts and any(part.endswith("child_entry.py") for part in parts)


def script(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_a_served_child_finds_no_secret_in_its_environment_or_its_parents(tmp_path):
    # A validator whose own environment (as the kernel keeps it) holds the secrets.
    child, work = script(tmp_path, ENVIRON), tmp_path / "work"
    validator = tmp_path / "validator.py"
    validator.write_text(VALIDATOR.format(root=str(REPO_ROOT), child=str(child), work=str(work)))
    env = {"PATH": "/usr/bin:/bin", **SECRETS}
    done = subprocess.run(
        [sys.executable, str(validator)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip() == "OK", done.stderr
    seen = json.loads((work / "out.json").read_text())
    assert "SECRET" not in json.dumps(seen)
    assert seen["environ"]["OMP_NUM_THREADS"] == "1" and seen["environ"]["HOME"] == str(work)
    if os.geteuid() == 0:  # read, not refused: the server's own
        assert "OMP_NUM_THREADS=1" in seen["parent"]
    else:  # the server is non-dumpable (tests/test_child_isolation.py)
        assert seen["parent"].startswith("unreadable: [Errno 13]")
    assert served(seen["parent_cmdline"])  # forked from the server, not the validator


@pytest.mark.parametrize(
    ("body", "limits", "outcome"),
    [
        ("while True:\n    pass\n", ChildLimits(120, cpu_seconds=1), ChildOutcome.OVER_CPU),
        (
            "data = bytearray(4 * 1024**3)\n",
            ChildLimits(120, memory_bytes=256 * 1024**2),
            ChildOutcome.OVER_MEMORY,
        ),
        ("import time\ntime.sleep(600)\n", ChildLimits(wall_seconds=1), ChildOutcome.OVER_TIME),
        (
            "open('big', 'wb').write(b'x' * 4 * 1024**2)\n",
            ChildLimits(60, file_bytes=1024**2),
            ChildOutcome.CRASHED,
        ),
    ],
    ids=["cpu", "memory", "time", "file"],
)
def test_a_served_child_meets_each_limit(tmp_path, body, limits, outcome):
    marker = "import os\nopen('parent', 'w').write(open(f'/proc/{os.getppid()}/cmdline').read())\n"
    run = tmp_path / "run"
    result = run_child(
        script(tmp_path, marker + body), [], cwd=run, limits=limits, preload=("json",)
    )
    assert result.outcome is outcome, result
    assert served((run / "parent").read_text())  # it was the server's child
    if outcome is ChildOutcome.CRASHED:
        assert "File too large" in result.stderr_tail
        assert (run / "big").stat().st_size <= 1024**2


def test_a_child_runs_isolated_as_main_with_its_arguments_and_exit_handlers(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "planted.py").write_text("")  # in its folder: not importable under -I
    (tmp_path / "beside.py").write_text("")  # beside the script: not importable either
    body = (
        "import json, sys\n"
        "found = []\n"
        "for name in ('planted', 'beside'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "        found.append(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        "json.dump({'found': found, 'argv': sys.argv, 'isolated': sys.flags.isolated,\n"
        "           'name': __name__}, open('out.json', 'w'))\n"
        "import atexit\n"  # the script's own exit handlers run (the server's do not)
        "atexit.register(lambda: open('exited', 'w').write('yes'))\n"
    )
    child = script(tmp_path, body)
    result = run_child(child, ["a", "b"], cwd=run, limits=ChildLimits(60), preload=("json",))
    assert result.outcome is ChildOutcome.OK, result
    out = json.loads((run / "out.json").read_text())
    assert out == {"found": [], "argv": [str(child), "a", "b"], "isolated": 1, "name": "__main__"}
    assert (run / "exited").read_text() == "yes"


def test_threads_share_a_server_and_each_gets_its_own_end(tmp_path):
    body = "import sys\nraise SystemExit(int(sys.argv[1]))\n"
    child = script(tmp_path, body)
    results: dict[int, int] = {}

    def one(code: int) -> None:
        work = tmp_path / f"run-{code}"
        result = run_child(child, [str(code)], cwd=work, limits=ChildLimits(60), preload=("json",))
        results[code] = result.exit_code

    threads = [threading.Thread(target=one, args=(code,)) for code in range(4, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert results == {code: code for code in range(4, 10)}


def test_a_server_that_dies_under_a_child_gives_way_to_a_fresh_process(tmp_path, caplog):
    # The server dies under its child (killed from here: a child may not signal it, see
    # tests/test_child_landlock.py); a fresh process then runs the child to its end.
    body = (
        "import os, signal\n"
        "cmdline = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().split(b'\\0')\n"
        "if b'serve' in cmdline:\n"
        "    open('server', 'w').write(str(os.getppid()))\n"
        "    signal.pause()\n"
        f"{GRANDPARENT}open('ran-fresh', 'w').write(grandparent())\n"
    )
    run = tmp_path / "run"
    preload = ("json", "csv")

    def kill_the_server() -> None:
        if wait_until(lambda: (run / "server").exists() and (run / "server").read_text()):
            os.kill(int((run / "server").read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server)
    killer.start()
    with caplog.at_level(logging.WARNING, logger="validator.sandbox.child_server"):
        result = run_child(
            script(tmp_path, body), [], cwd=run, limits=ChildLimits(60), preload=preload
        )
    killer.join()
    assert result.outcome is ChildOutcome.OK, result
    # Forked by the fresh process that the validator started (and that reaps what it leaves).
    assert (run / "ran-fresh").read_text() == str(os.getpid())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "failed" in warnings[0].getMessage()
    # The next child gets a new server.
    again = run_child(
        script(tmp_path, ENVIRON, "env.py"), [], cwd=run, limits=ChildLimits(60), preload=preload
    )
    assert again.outcome is ChildOutcome.OK
    assert served(json.loads((run / "out.json").read_text())["parent_cmdline"])


def test_a_server_that_cannot_start_gives_way_to_a_fresh_process(tmp_path, caplog):
    preload = ("no_such_module_for_the_server",)
    child = script(tmp_path, "pass\n")
    with caplog.at_level(logging.WARNING, logger="validator.sandbox.child_server"):
        results = [
            run_child(child, [], cwd=tmp_path / "run", limits=ChildLimits(60), preload=preload)
            for _ in range(child_server.MAX_STARTS + 1)
        ]
    # The fresh process fails as it always did: the import is the caller's.
    for result in results:
        assert result.outcome is ChildOutcome.CRASHED
        assert "ModuleNotFoundError" in result.stderr_tail
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == child_server.MAX_STARTS, warnings  # one a start, then none
    assert "preload failed" in warnings[0] and "from now on" in warnings[-1]


KILLED = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from validator.sandbox.child_process import ChildLimits, run_child
run_child(Path({child!r}), [], cwd=Path({work!r}), limits=ChildLimits(600), preload=("json",))
"""


def test_a_killed_validator_takes_the_server_and_its_child_along(tmp_path):
    child, work = script(tmp_path, "while True:\n    pass\n"), tmp_path / "work"
    validator = tmp_path / "validator.py"
    validator.write_text(KILLED.format(root=str(REPO_ROOT), child=str(child), work=str(work)))
    process = subprocess.Popen([sys.executable, str(validator)])
    record = record_in(work)
    server = parent_of(record["pid"])
    assert alive(record["pid"], record["token"]) and is_child_server(server)
    assert parent_of(server) == process.pid
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert wait_until(lambda: not alive(server) and not alive(record["pid"], record["token"]))


@pytest.mark.parametrize(
    ("body", "limits", "outcome"),
    [
        ("while True:\n    pass\n", ChildLimits(120, cpu_seconds=1), ChildOutcome.OVER_CPU),
        (
            "data = bytearray(4 * 1024**3)\n",
            ChildLimits(120, memory_bytes=256 * 1024**2),
            ChildOutcome.OVER_MEMORY,
        ),
        ("import time\ntime.sleep(600)\n", ChildLimits(wall_seconds=1), ChildOutcome.OVER_TIME),
    ],
    ids=["cpu", "memory", "time"],
)
def test_the_fresh_process_fallback_meets_each_limit(tmp_path, monkeypatch, body, limits, outcome):
    monkeypatch.setattr(child_server, "server_for", lambda *_args, **_kwargs: None)
    marker = f"{GRANDPARENT}open('parent', 'w').write(grandparent())\n"
    run = tmp_path / "run"
    result = run_child(
        script(tmp_path, marker + body), [], cwd=run, limits=limits, preload=("json",)
    )
    assert result.outcome is outcome, result
    assert (run / "parent").read_text() == str(os.getpid())  # see the test above

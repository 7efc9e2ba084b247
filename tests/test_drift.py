"""The protocol drift watch against a GitHub stand-in on 127.0.0.1: current,
behind (a WARNING naming the commits, the metric, the status page's line), unknown (said once),
the cache that spares a restart the question, and the switch that turns it off."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request

import pytest

from devkit.github_api import LocalGitHub
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, validator_env, wait_for
from validator.observe import drift
from validator.observe.observer import StatusBoard
from validator.observe.status_server import StatusServer
from validator.observe.telemetry import REGISTRY
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.spec import REPO_ROOT, ModuleSpec, ProtocolPin, load_spec

REPO = "FLock-io/FLock-validator"
FOLDER = "validator/modules/rl"
PIN = "a" * 40


def spec_pinned(name: str = "rl") -> ModuleSpec:
    return ModuleSpec(name=name, protocol=ProtocolPin(repo=REPO, path=FOLDER, commit=PIN))


def behind_of(module: str) -> float | None:
    return REGISTRY.get_sample_value("flock_validator_protocol_commits_behind", {"module": module})


@pytest.fixture
def github():
    with LocalGitHub() as served:
        served.add_commit(REPO, "0" * 40, "older work", [FOLDER + "/old.py"])
        served.add_commit(REPO, PIN, "the commit we compared with", [FOLDER + "/rules.py"])
        served.add_commit(REPO, "1" * 40, "docs only", ["README.md"])  # not the module's folder
        yield served


def watch(spec, tmp_path, api):
    return drift.DriftWatch(spec, tmp_path, threading.Event(), api)


def test_current_then_behind_names_the_commits(github, tmp_path, caplog):
    spec = spec_pinned("drift_a")
    watcher = watch(spec, tmp_path, github.endpoint)
    caplog.set_level(logging.INFO, logger=drift.__name__)
    watcher.report(drift.check(spec.name, spec.protocol, tmp_path, github.endpoint))
    assert behind_of("drift_a") == 0
    assert "its newest change there" in drift.status_line()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # The network moves: two commits touch the folder after the pin.
    github.add_commit(REPO, "2" * 40, "feat: new reward\n\nlong body", [FOLDER + "/reward.py"])
    github.add_commit(REPO, "3" * 40, "fix: clip", [FOLDER + "/reward.py"])
    (tmp_path / "protocol-drift-drift_a.json").unlink()  # the interval has passed
    watcher.report(drift.check(spec.name, spec.protocol, tmp_path, github.endpoint))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "2 commit(s) after aaaaaaa" in warnings[0]
    assert "3333333 fix: clip; 2222222 feat: new reward" in warnings[0]
    assert "long body" not in warnings[0] and "docs only" not in warnings[0]
    assert behind_of("drift_a") == 2
    assert "3333333 fix: clip" in drift.status_line()


def test_a_restart_within_the_interval_asks_nothing(github, tmp_path):
    spec = spec_pinned("drift_b")
    first = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
    asked = len(github.requests)
    assert asked == 2 and first.state == "current"
    again = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
    assert len(github.requests) == asked and again == first
    # Another pin (the module was brought up to date) is asked about again.
    other = ProtocolPin(repo=REPO, path=FOLDER, commit="0" * 40)
    moved = drift.check(spec.name, other, tmp_path, github.endpoint)
    assert len(github.requests) == asked + 2
    assert [sha[:1] for sha, _ in moved.commits] == ["a"]  # the old pin is behind by one


def test_offline_is_unknown_said_once(tmp_path, caplog):
    spec = spec_pinned("drift_c")
    watcher = watch(spec, tmp_path, "http://127.0.0.1:9")
    caplog.set_level(logging.INFO, logger=drift.__name__)
    for _ in range(3):
        (tmp_path / "protocol-drift-drift_c.json").unlink(missing_ok=True)
        watcher.report(drift.check(spec.name, spec.protocol, tmp_path, "http://127.0.0.1:9"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "unknown (GitHub unreachable" in lines[0]
    assert behind_of("drift_c") == -1


def test_the_thread_and_the_status_page(github, tmp_path, monkeypatch):
    monkeypatch.setenv(drift.API_ENV, github.endpoint)
    monkeypatch.setenv(drift.WATCH_ENV, "off")
    stop = threading.Event()
    assert drift.start_drift_watch(spec_pinned("drift_d"), tmp_path, stop) is None
    monkeypatch.delenv(drift.WATCH_ENV)
    github.add_commit(REPO, "4" * 40, "feat: moved", [FOLDER + "/x.py"])
    watcher = drift.start_drift_watch(spec_pinned("drift_d"), tmp_path, stop)
    try:
        for _ in range(200):
            if behind_of("drift_d") == 1:
                break
            stop.wait(0.05)
        assert behind_of("drift_d") == 1
        server = StatusServer("127.0.0.1", 0, StatusBoard("fixture"), tmp_path)
        server.start()
        try:
            with urllib.request.urlopen(f"{server.address}/", timeout=10) as response:
                page = response.read().decode()
        finally:
            server.stop()
        assert "<p id='protocol'>" in page and "4444444 feat: moved" in page
    finally:
        stop.set()
        watcher.thread.join(10)
    assert not watcher.thread.is_alive()


def test_every_module_pins_the_network():
    for name, repo in (
        ("lora", "FLock-io/llm-loss-validator"),
        ("rl", REPO),
        ("llm_judge", REPO),
    ):
        pin = load_spec(REPO_ROOT / "modules" / name).protocol
        assert pin is not None and pin.repo == repo
        assert name == "lora" or pin.path == f"validator/modules/{name}"


def pinned_module(root, github) -> dict[str, str]:
    """A module `pinned` (the fixture module's code, a spec with a protocol pin) importable
    beside the fixture modules; the env a validator child needs to find it and the stand-in."""
    folder = root / "modules" / "pinned"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("from modules.fixture import MODULE  # noqa: F401\n")
    (folder / "module.yaml").write_text(
        "name: pinned\ntask_type: pinned\n"
        f"protocol:\n  repo: {REPO}\n  path: {FOLDER}\n  commit: '{PIN}'\n"
    )
    env = validator_env(root)
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env['PYTHONPATH']}"
    env[drift.API_ENV] = github.endpoint
    del env[drift.WATCH_ENV]
    return env


def test_the_validator_starts_the_watch_and_the_flag_turns_it_off(github, tmp_path):
    github.add_commit(REPO, "5" * 40, "feat: scoring changed", [FOLDER + "/x.py"])
    env = pinned_module(tmp_path, github)
    with Simulator({"tasks": [task(1, ["ok/a", "ok/b"], task_type="pinned")]}, tmp_path) as sim:
        args = loop_args("pinned", sim.api_url, "1", "--max-assignments", "1")
        first = run_validator(args, env)
        asked = len(github.requests)
        (tmp_path / "state" / "protocol-drift-pinned.json").unlink()
        off = run_validator([*args, "--no-protocol-watch"], env)
    assert first.returncode == 0 and off.returncode == 0, first.stderr + off.stderr
    warned = [line for line in first.stderr.splitlines() if "WARNING" in line]
    assert len(warned) == 1 and "5555555 feat: scoring changed" in warned[0], first.stderr
    assert asked == 2 and len(github.requests) == asked  # off: GitHub never asked
    assert "protocol drift" not in off.stderr


# -- what the watch reads and keeps -----------------------------------------------------------

MIB = 1 << 20
# What the loopback's socket buffers may hold beyond what the client read.
IN_FLIGHT = 12 * MIB
# A child that asks once honestly, then once more with a padded answer, and says its peak
# memory over each (VmHWM, reset in between) and what the watch made of the second.
PEAK_CHILD = """
import json, sys
from pathlib import Path
from tests.helpers.peak_rss import peak_bytes, reset_peak
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.observe import drift
from validator.spec import ProtocolPin
api, repo, folder, pin = sys.argv[1:5]
pin = ProtocolPin(repo=repo, path=folder, commit=pin)
honest = drift.ask(pin, api)
assert honest.state == "current", honest
honest_peak = peak_bytes()
reset_peak()
hostile = drift.ask(pin, api)
print(json.dumps({"honest": honest_peak, "hostile": peak_bytes(), "why": hostile.why,
                  "state": hostile.state}))
"""


def peak_of_a_padded_answer(github, size: int, *, gzip: bool = False) -> dict:
    github.pad_next(1, size, after=2, gzip=gzip)  # the hostile ask's first listing
    command = [sys.executable, "-c", PEAK_CHILD, github.endpoint, REPO, FOLDER, PIN]
    done = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_a_huge_listing_is_read_to_its_cap_and_never_parsed(github, gzip):
    # Read whole, a 200 MB listing takes the validator from 43 MB to 1,749 MB, holds the GIL
    # 19 s and runs past the 30 s deadline. Gzip-encoded it is 140 kB on the wire and 40 MB decoded.
    measured = peak_of_a_padded_answer(github, 40 * MIB, gzip=gzip)
    assert measured["state"] == "unknown"
    cap = ANSWER_CAPS["github.commits"].max_bytes
    assert measured["why"] == f"an answer over its cap of {cap} bytes"
    ((length, sent),) = wait_for(lambda: github.padded, 30, "the server's record")
    assert sent <= ANSWER_CAPS["github.commits"].max_bytes + IN_FLIGHT < length or gzip
    assert measured["hostile"] <= 1.5 * measured["honest"], measured


def test_a_damaged_cache_is_said_deleted_and_asked_again(github, tmp_path, caplog):
    spec = spec_pinned("drift_e")
    path = drift.cache_file(tmp_path, spec.name)
    good = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
    record = json.loads(path.read_text())
    caplog.set_level(logging.INFO, logger=drift.__name__)
    damaged = [
        b"\x00garbage",
        path.read_bytes()[:-10],  # cut
        json.dumps({**record, "checked_at": "yesterday"}).encode(),  # turned the watch off
        json.dumps({**record, "state": "behind", "count": 2, "commits": [["x", "y"]]}).encode(),
        json.dumps({**record, "extra": "k" * 100_000}).encode(),  # grown
    ]
    for data in damaged:
        path.write_bytes(data)
        asked = len(github.requests)
        caplog.clear()
        again = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
        assert (again.state, again.count) == (good.state, good.count)
        assert len(github.requests) == asked + 2  # GitHub asked again
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and f"the cache {path} is damaged" in warned[0], warned
        assert json.loads(path.read_text())["state"] == "current"  # written afresh


def test_the_cache_keeps_a_few_names_of_a_page_of_commits(github, tmp_path, caplog):
    spec = spec_pinned("drift_f")
    for index in range(130):
        github.add_commit(REPO, f"{index + 10:040x}", f"change {index}", [FOLDER + "/x.py"])
    watcher = watch(spec, tmp_path, github.endpoint)
    caplog.set_level(logging.INFO, logger=drift.__name__)
    found = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
    assert found.count == drift.PAGE and len(found.commits) == drift.NAMED
    assert os.path.getsize(drift.cache_file(tmp_path, spec.name)) < 1024
    assert drift.check(spec.name, spec.protocol, tmp_path, github.endpoint) == found  # cached
    watcher.report(found)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "at least 100 commit(s)" in warning and "and 95 more" in warning
    assert behind_of("drift_f") == drift.PAGE


def test_a_listed_sha_that_is_not_40_hex_digits_is_unknown(github, tmp_path):
    spec = spec_pinned("drift_g")
    github.add_commit(REPO, "not-a-sha\nforged line", "evil", [FOLDER + "/x.py"])
    found = drift.check(spec.name, spec.protocol, tmp_path, github.endpoint)
    assert (found.state, found.why) == ("unknown", "an answer of an unexpected shape")

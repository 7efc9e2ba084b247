"""Workers sharing one HF cache: two processes fetching one base download it once,
and a budget (`--hf-cache-max-gb`) evicts the least recently used base no worker is using.
Real worker processes (tests/helpers/hf_cache_worker.py) against the local hub on 127.0.0.1;
the assertions are on what the hub served and what the cache holds (`scan_cache_dir`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from huggingface_hub import scan_cache_dir
from safetensors.numpy import save

from devkit.hf_hub import LocalHub
from devkit.tiny_repos import build_base, files_of
from devkit.validator_cli import run_validator, validator_env
from validator.entrypoint import main as validator_main
from validator.errors import ConfigError
from validator.options import HF_CACHE_BUDGET_ENV
from validator.outbound import hf_cache
from validator.spec import REPO_ROOT

WORKER = [sys.executable, "-m", "tests.helpers.hf_cache_worker"]
WEIGHT_FLOATS = 2000  # 8000 bytes of weights per repo: a budget of 2.5 repos is ~20 KB


class Worker:
    """One worker process, driven a command at a time (tests/helpers/hf_cache_worker.py)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._stderr = log.open("w")
        self.process = subprocess.Popen(
            WORKER, cwd=REPO_ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )  # fmt: skip

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def answer(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the worker ended; its log:\n{self.log.read_text()}"
        return json.loads(line)

    def ask(self, line: str) -> Any:
        self.send(line)
        answer = self.answer()
        assert not (isinstance(answer, dict) and "error" in answer), answer
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            self.send("quit")
            self.process.wait(timeout=60)
        self._stderr.close()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LocalHub]:
    with LocalHub(tmp_path / "hub") as local:
        yield local


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


def worker_env(hub: LocalHub, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VALIDATOR_"))}
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(cache.parent / "hf-home"),
        HF_HUB_CACHE=str(cache),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        PYTHONPATH=str(REPO_ROOT),
        **extra,
    )
    return env


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
        worker.close()


def wait_for(condition: Any, what: str, limit_s: float = 120.0) -> None:
    """Waits for a state (an upper bound only: the test asserts states, never durations)."""
    give_up = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < give_up, f"never happened: {what}"
        time.sleep(0.05)


# -- one download for two workers ---------------------------------------------------------------


def test_two_workers_fetching_one_base_at_once_download_it_once(
    hub: LocalHub, cache: Path, tmp_path: Path, workers: list[Worker]
) -> None:
    source = build_base(tmp_path / "models")
    hub.add_repo("base/tiny", files_of(source))
    # The weights' bytes wait until both workers have asked for their headers: both are then
    # inside the download of the same file at the same time, however the machine schedules them.
    release = hub.hold_bodies("model.safetensors")
    env = worker_env(hub, cache)
    workers.extend(Worker(env, tmp_path / f"worker-{i}.log") for i in range(2))
    for worker in workers:
        worker.send("fetch base/tiny")
    wait_for(
        lambda: hub.file_requests("HEAD").count("model.safetensors") == 2,
        "both workers asked for the weights' headers",
    )
    release.set()
    first, second = (worker.answer() for worker in workers)

    served = Counter(hub.bodies_served())
    assert served["model.safetensors"] == 1
    assert set(served.values()) == {1}, served  # every file's content was sent once
    expected = {name: _sha256(path) for name, path in files_of(source).items()}
    assert first == second  # the same snapshot, file for file
    assert first["files"] == {name: expected[name] for name in first["files"]}
    assert "model.safetensors" in first["files"] and "config.json" in first["files"]
    assert first["tensors"] > 0
    assert [repo.repo_id for repo in scan_cache_dir(cache).repos] == ["base/tiny"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the budget ---------------------------------------------------------------------------------


def add_small_base(hub: LocalHub, repo_id: str, seed: int) -> int:
    """A base of a config and ~8 KB of safetensors weights; the bytes it takes in a cache."""
    weights = np.random.default_rng(seed).standard_normal(WEIGHT_FLOATS).astype(np.float32)
    files = {
        "config.json": json.dumps({"model_type": "tiny", "seed": seed}).encode(),
        "model.safetensors": save({"weight": weights}),
    }
    hub.add_repo(repo_id, files)
    return sum(len(data) for data in files.values())


def cached(cache: Path) -> dict[str, int]:
    return {repo.repo_id: repo.size_on_disk for repo in scan_cache_dir(cache).repos}


def budget_env(hub: LocalHub, cache: Path, budget: float) -> dict[str, str]:
    return worker_env(hub, cache, **{HF_CACHE_BUDGET_ENV: repr(budget / 1e9)})


def test_the_budget_evicts_the_least_recently_used_base_no_worker_is_using(
    hub: LocalHub, cache: Path, tmp_path: Path, workers: list[Worker]
) -> None:
    size = max(add_small_base(hub, f"base/{name}", seed) for seed, name in enumerate("abcde"))
    budget = 3.5 * size  # three bases and a half (~29 KB): a fourth must make room
    env = budget_env(hub, cache, budget)
    one, two = Worker(env, tmp_path / "one.log"), Worker(env, tmp_path / "two.log")
    workers.extend([one, two])

    one.ask("begin")
    one.ask("fetch base/a")  # a scoring on worker one uses a: it stays marked in use
    two.ask("fetch base/b")
    two.ask("fetch base/c")
    assert set(cached(cache)) == {"base/a", "base/b", "base/c"}
    # d needs room: a is the least recently used but in use; b, used before c, goes.
    two.ask("fetch base/d")
    assert set(cached(cache)) == {"base/a", "base/c", "base/d"}
    assert sum(cached(cache).values()) <= budget
    assert "evicted base/b" in (tmp_path / "two.log").read_text()

    # Everything in use: d by a scoring on worker two; a, c and e by the one on worker one.
    # The fetch of e goes on over the budget, with one warning.
    two.ask("begin")
    two.ask("fetch base/d")
    one.ask("fetch base/c")  # inside worker one's scoring: c stays in use until it ends
    one.ask("fetch base/e")
    assert set(cached(cache)) == {"base/a", "base/c", "base/d", "base/e"}
    assert sum(cached(cache).values()) > budget
    assert (tmp_path / "one.log").read_text().count("over its budget") == 1

    # The scorings end: the next fetch brings the cache under its budget again.
    two.ask("end")
    one.ask("end")
    two.ask("fetch base/b")
    assert "base/b" in cached(cache) and len(cached(cache)) == 3
    assert sum(cached(cache).values()) <= budget


def headers_asked(hub: LocalHub, repo_id: str, name: str) -> int:
    return sum(
        1 for method, path, _ in list(hub.requests)
        if method == "HEAD" and path.startswith(f"/{repo_id}/resolve/") and path.endswith(name)
    )  # fmt: skip


def test_a_base_being_fetched_is_never_evicted(
    hub: LocalHub, cache: Path, tmp_path: Path, workers: list[Worker]
) -> None:
    """A base is in use from before its download: an evictor with nothing else to free leaves
    it, and deletes it once no one uses it."""
    add_small_base(hub, "base/a", 0)
    add_small_base(hub, "base/b", 1)
    env = budget_env(hub, cache, 1)  # one byte: every base not in use is over it
    one, two = Worker(env, tmp_path / "one.log"), Worker(env, tmp_path / "two.log")
    workers.extend([one, two])
    release = hub.hold_bodies("model.safetensors")
    one.send("fetch base/b")  # inside its download of b's weights until released
    wait_for(lambda: headers_asked(hub, "base/b", "model.safetensors") == 1, "one fetches b")
    assert set(cached(cache)) == {"base/b"}  # its config is in; its weights are coming
    two.send("fetch base/a")
    # Two has evicted what it could before fetching a: not b, which one is fetching.
    wait_for(lambda: headers_asked(hub, "base/a", "model.safetensors") == 1, "two fetches a")
    assert set(cached(cache)) == {"base/a", "base/b"}
    release.set()
    for worker in (one, two):
        answer = worker.answer()
        assert "error" not in answer and answer["tensors"] == 1
    two.ask("fetch base/a")
    assert set(cached(cache)) == {"base/a"}  # b, no longer in use, went to make room


def test_a_mirror_sharing_a_held_base_commits_is_evicted_alone(
    hub: LocalHub, cache: Path, tmp_path: Path, workers: list[Worker]
) -> None:
    """base/b is a mirror of base/a: the same commit. The idle one is deleted, never the one a
    worker holds, both ways round (huggingface_hub's delete_revisions takes the first repo of a
    hash in the cache folder's listing order: one of the two rounds meets it, whatever the
    file system lists first)."""
    commit = "ab" * 20
    for repo_id in ("base/a", "base/b"):
        hub.add_repo(
            repo_id, {"config.json": b"{}", "model.safetensors": _weights(0)}, commit=commit
        )
    add_small_base(hub, "base/c", 2)
    add_small_base(hub, "base/d", 3)
    env = budget_env(hub, cache, 1)  # one byte: every base not in use is over it
    one, two = Worker(env, tmp_path / "one.log"), Worker(env, tmp_path / "two.log")
    workers.extend([one, two])

    one.ask("begin")
    held_a = one.ask("fetch base/a")
    two.ask("begin")
    two.ask("fetch base/b")
    two.ask("end")
    assert set(cached(cache)) == {"base/a", "base/b"}
    two.ask("fetch base/c")  # b is idle: it goes; a, held by one, stays
    assert set(cached(cache)) == {"base/a", "base/c"}
    assert _files_in(Path(held_a["path"])) == held_a["files"]
    evicted = f"evicted base/b, least recently used: its folder {cache}/models--base--b (revision"
    assert f"{evicted} abababababab (main), 8" in (tmp_path / "two.log").read_text()

    two.ask("begin")
    two.ask("fetch base/b")  # c, idle, goes
    one.ask("end")
    assert set(cached(cache)) == {"base/a", "base/b"}
    one.ask("fetch base/d")  # the other way round: a is idle, b held by two
    assert set(cached(cache)) == {"base/b", "base/d"}
    assert (
        f"evicted base/a, least recently used: its folder {cache}/models--base--a"
        in (tmp_path / "one.log").read_text()
    )
    assert "evicted base/b" not in (tmp_path / "one.log").read_text()
    assert two.ask("fetch base/b")["files"] == held_a["files"]  # still whole: nothing fetched
    assert Counter(hub.bodies_served())["model.safetensors"] == 5  # a, b, c, b again, d


def _weights(seed: int) -> bytes:
    weights = np.random.default_rng(seed).standard_normal(WEIGHT_FLOATS).astype(np.float32)
    return save({"weight": weights})


def _files_in(snapshot: Path) -> dict[str, str]:
    return {path.name: _sha256(path) for path in sorted(snapshot.iterdir())}


# -- settings -----------------------------------------------------------------------------------


def test_the_budget_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HF_CACHE_BUDGET_ENV, raising=False)
    assert hf_cache.budget_bytes() is None
    monkeypatch.setenv(HF_CACHE_BUDGET_ENV, "200")
    assert hf_cache.budget_bytes() == 200 * 10**9
    monkeypatch.setenv(HF_CACHE_BUDGET_ENV, "0.00002")
    assert hf_cache.budget_bytes() == 20_000
    for bad in ("0", "-1", "lots", "inf", "nan"):
        monkeypatch.setenv(HF_CACHE_BUDGET_ENV, bad)
        with pytest.raises(ConfigError, match=f"{HF_CACHE_BUDGET_ENV}='{bad}'"):
            hf_cache.budget_bytes()


def test_the_option_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HF_CACHE_BUDGET_ENV, "50")
    given = validator_main.make_context("validator", ["fixture", "--hf-cache-max-gb", "200"])
    assert given.params["hf_cache_max_gb"] == 200.0  # the option wins over the variable
    assert validator_main.make_context("validator", ["fixture"]).params["hf_cache_max_gb"] == 50
    monkeypatch.delenv(HF_CACHE_BUDGET_ENV)
    assert validator_main.make_context("validator", ["fixture"]).params["hf_cache_max_gb"] is None


@pytest.mark.parametrize(
    ("args", "env_change"),
    [(["--hf-cache-max-gb", "0"], {}), ([], {HF_CACHE_BUDGET_ENV: "lots"})],
)
def test_a_bad_budget_is_a_usage_error(
    tmp_path: Path, args: list[str], env_change: dict[str, str]
) -> None:
    result = run_validator(
        ["fixture", "--task_ids", "1", *args], validator_env(tmp_path, **env_change)
    )
    assert result.returncode == 2
    assert "Invalid value for '--hf-cache-max-gb'" in result.stderr

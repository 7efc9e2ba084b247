"""Time from a command to the validator's first Fed Ledger call, measured by the simulator.

Three ways to start, in one run, on the same machine:
  baseline  `python -m validator` on the host, no container
  warm      `python run.py` with the module image already built (the usual restart)
  rebuild   `python run.py --rebuild` after a code change (environment layer cached)
Needs a Docker engine and the local stand-in base (`make docker-engine`). Prints medians and
ratios against the baseline; asserts nothing.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.docker_env import launcher_env, make_module_repo
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import validator_env

RUNS = 3


def first_call_after(sim: Simulator, started: float) -> float:
    times = [r["time"] for r in sim.state()["requests"] if r["time"] >= started]
    if not times:
        raise RuntimeError("the validator made no API call")
    return min(times) - started


def timed(sim: Simulator, command: list[str], env: dict[str, str]) -> float:
    started = time.time()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=600)
    return first_call_after(sim, started)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        tmp_path = Path(tmp)
        repo = make_module_repo(tmp_path / "repo")
        with Simulator({"tasks": [task(1, [])]}, tmp_path) as sim:
            inner = [
                "fixture",
                "--task_ids",
                "1",
                "--api-url",
                sim.api_url,
                "--max-assignments",
                "1",
            ]
            # Each run gets one fresh submission and ends after it (--max-assignments 1).
            launcher = [
                sys.executable,
                str(repo / "run.py"),
                *inner[:1],
                "--gpus",
                "none",
                *inner[1:],
                "--assignment-lookup-interval",
                "0.1",
            ]
            host = [sys.executable, "-m", "validator", *inner]
            env_host = validator_env(tmp_path)
            env_docker = launcher_env()

            def one(command, env):
                sim.add_submission(1, {"hg_repo_id": "ok/bench"})
                return timed(sim, command, env)

            one(launcher, env_docker)  # make sure the image exists
            baseline = statistics.median(one(host, env_host) for _ in range(RUNS))
            warm = statistics.median(one(launcher, env_docker) for _ in range(RUNS))
            marker = repo / "validator" / "__init__.py"
            rebuilds = []
            for i in range(RUNS):
                marker.write_text(marker.read_text() + f"# bench {i}\n")
                rebuilds.append(one([*launcher, "--rebuild"], env_docker))
            rebuild = statistics.median(rebuilds)

    print(f"time from command to first API call (median of {RUNS}):")
    rows = [
        ("baseline", "python -m validator on the host", baseline),
        ("warm", "run.py, image present", warm),
        ("rebuild", "run.py after a code change", rebuild),
    ]
    for name, what, seconds in rows:
        print(f"  {name:9} {what:34} {seconds:6.2f} s  ({seconds / baseline:.1f}x baseline)")


if __name__ == "__main__":
    main()

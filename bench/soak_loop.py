"""A year of work, the loop's side (`make bench-soak`): the validator as a real process against
the Fed Ledger simulator (its own process), in two parts. Prints figures; asserts nothing.

rate   200 task ids with nothing to validate, the simulator's rate-limit window and the
       validator's lookup interval equal: the lookups the simulator answered 429 (the API's
       window counts when it received each lookup), the least gap it saw between two lookups of
       a task, and what each idle lookup cost the validator: bytes written to the storage layer
       (/proc/PID/io write_bytes: the state dir on a real disk, its log file too) and CPU time.
       The window is 18 s instead of the network's 180 s (a tenth: 200 tasks make 11 lookups a
       second, each a few ms, so the loop is still idle most of the time): what decides a 429
       when lookups are timed from their sending is the jitter between sending and arriving,
       which does not shrink with the window, so the shorter window is the harsher test.
rl     the rl module with real children (the sandboxed ONNX runner of each assignment) on tiny
       policies from a local hub, at least 1,000 assignments: the validator's RSS, open fds,
       threads and child processes sampled every few seconds, against the assignments finished.

--validator DIR runs the validator from another checkout (a `git archive` of an earlier
commit: its `python -m validator` and its modules), for before-and-after figures against the
same simulator.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from devkit import FIXTURE_MODULES, REPO_ROOT
from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.tiny_policies import linear_policy, npz_bytes, to_bytes, validation_arrays
from devkit.validator_cli import start_validator, validator_env

LOOKUP = "/tasks/request-validation-assignment/"
FEATURES, VENUES, ROWS = 8, 4, 256
POLICIES = 10  # distinct policy repos the submissions point to
RL_TASKS = 4
SAMPLE_S = 2.0


def start(root: Path, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`python -m validator` of the checkout at `root`, its output into `log`."""
    return start_validator(args, {**env, "PYTHONPATH": f"{root}:{FIXTURE_MODULES}"}, log, root)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def io_and_cpu(pid: int) -> tuple[int, float]:
    """(write_bytes, user + system CPU seconds) of a process so far."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    return proc.io_counters().write_bytes, times.user + times.system


def lookups(sim: Simulator) -> list[dict[str, Any]]:
    return sim.lookups()


def wait_until(check, timeout: float, what: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if process.poll() is not None:
            raise RuntimeError(f"the validator exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} in {timeout:.0f} s")
        time.sleep(0.5)


# --- rate: 200 tasks at the window --------------------------------------------------------


def rate(root: Path, tmp: Path, tasks: int, window: float, windows: int) -> dict[str, Any]:
    data = {"tasks": [task(n, []) for n in range(1, tasks + 1)]}
    with Simulator(data, tmp, rate_limit_seconds=window, in_thread=False) as sim:
        env = validator_env(tmp, VALIDATOR_PROTOCOL_WATCH="off")
        ids = ",".join(str(n) for n in range(1, tasks + 1))
        args = ["fixture", "--task_ids", ids, "--api-url", sim.api_url]
        args += ["--assignment-lookup-interval", str(window), "--time-sleep", str(window)]
        process = start(root, args, env, tmp / "validator.log")
        try:
            wait_until(lambda: len(lookups(sim)) >= tasks, 120, "a first round", process)
            first = len(lookups(sim))
            written0, cpu0 = io_and_cpu(process.pid)
            time.sleep(windows * window)
            written1, cpu1 = io_and_cpu(process.pid)
            seen = lookups(sim)
        finally:
            stop(process)
    measured = len(seen) - first
    every, counted = gaps_by_task(seen, every=True), gaps_by_task(seen, every=False)
    return {
        "lookups": len(seen),
        "answered 429": sum(r["status"] == 429 for r in seen),
        # Between two lookups of a task, refused ones too: under 1, the API saw one too soon.
        "least gap received / window": min(every) / window,
        # Between two it counted: a refused lookup's task waited this long for its next.
        "longest gap counted / window": max(counted) / window,
        "idle lookups measured": measured,
        "bytes written per idle lookup": (written1 - written0) / max(measured, 1),
        "CPU ms per idle lookup": 1000 * (cpu1 - cpu0) / max(measured, 1),
    }


def gaps_by_task(requests: list[dict[str, Any]], *, every: bool) -> list[float]:
    """Gaps between the lookups of each task as the simulator received them: all of them, or
    only those it counted (not answered 429)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for request in requests:
        if every or request["status"] != 429:
            by_task[request["path"].rpartition("/")[2]].append(request["received"])
    return [b - a for times in by_task.values() for a, b in zip(times, times[1:], strict=False)]


# --- rl: real children, 1,000 assignments ---------------------------------------------------


def publish(hub: LocalHub) -> tuple[list[str], str]:
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=11)
    hub.add_repo("flock/rl-sets", {"val.npz": npz_bytes(X=x, Info=info)})
    repos = []
    for n in range(POLICIES):
        repo = f"trainer{n}/policy"
        hub.add_repo(repo, {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, n))})
        repos.append(repo)
    return repos, f"{hub.endpoint}/flock/rl-sets/resolve/main/val.npz"


def sample(pid: int) -> dict[str, float]:
    proc = psutil.Process(pid)
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    return {
        "rss_mib": proc.memory_info().rss / 2**20,
        "fds": proc.num_fds(),
        "threads": int(status["Threads"]),
        "children": len(proc.children(recursive=True)),
        "written_mib": proc.io_counters().write_bytes / 2**20,
    }


def rl(root: Path, tmp: Path, assignments: int) -> list[dict[str, float]]:
    per_task = -(-assignments // RL_TASKS)
    with LocalHub(tmp / "hub") as hub:
        repos, set_url = publish(hub)
        data = {"validation_set_url": set_url, "max_params": 10**6}
        tasks = [
            task(t, [repos[(t * per_task + n) % POLICIES] for n in range(per_task)], **data)
            for t in range(1, RL_TASKS + 1)
        ]
        for entry in tasks:
            entry["task_type"] = "rl"
        with Simulator({"tasks": tasks}, tmp, in_thread=False) as sim:
            env = validator_env(tmp, HF_ENDPOINT=hub.endpoint, VALIDATOR_PROTOCOL_WATCH="off")
            env.pop("HF_TOKEN", None)
            env["HF_HOME"] = str(tmp / "hf-home")
            ids = ",".join(str(t) for t in range(1, RL_TASKS + 1))
            args = ["rl", "--task_ids", ids, "--api-url", sim.api_url, "--max-assignments"]
            args += [str(assignments), "--assignment-lookup-interval", "0.05", "--time-sleep", "1"]
            process = start(root, args, env, tmp / "validator-rl.log")
            samples = []
            started = time.monotonic()
            try:
                while process.poll() is None:
                    try:
                        point = sample(process.pid)
                    except (psutil.NoSuchProcess, FileNotFoundError):
                        break
                    point["seconds"] = time.monotonic() - started
                    point["finished"] = len(sim.submissions())
                    samples.append(point)
                    time.sleep(SAMPLE_S)
                code = process.wait()
                finished = len(sim.submissions())
            finally:
                stop(process)
    if code != 0:
        tail = (tmp / "validator-rl.log").read_text()[-2000:]
        raise RuntimeError(f"the rl validator exited {code}:\n{tail}")
    samples.append({**samples[-1], "finished": finished, "seconds": time.monotonic() - started})
    return samples


def print_rl(samples: list[dict[str, float]], assignments: int) -> None:
    total = samples[-1]["finished"]
    print(f"rl: {total} assignments in {samples[-1]['seconds']:.0f} s")
    print(f"{'finished':>9} {'s':>6} {'RSS MiB':>8} {'fds':>4} {'threads':>7} {'children':>8}")
    marks = [0, *(assignments * k // 8 for k in range(1, 9))]
    shown = set()
    for point in samples:
        mark = next((m for m in marks if point["finished"] >= m and m not in shown), None)
        if mark is None:
            continue
        shown.add(mark)
        print(
            f"{point['finished']:>9} {point['seconds']:>6.0f} {point['rss_mib']:>8.1f} "
            f"{point['fds']:>4} {point['threads']:>7} {point['children']:>8}"
        )
    warm = [p for p in samples if p["finished"] >= total // 10]
    for key in ("rss_mib", "fds", "threads", "children"):
        values = [p[key] for p in warm]
        middle = statistics.median(values)
        print(f"  {key}: min {min(values):g}, median {middle:g}, max {max(values):g}")
    half = [p for p in warm if p["finished"] >= total // 2]
    if len(half) > 1:
        grow = half[-1]["rss_mib"] - half[0]["rss_mib"]
        print(f"  RSS over the second half: {grow:+.1f} MiB")
    per = 1024 * (samples[-1]["written_mib"] - warm[0]["written_mib"])
    per /= max(samples[-1]["finished"] - warm[0]["finished"], 1)
    print(f"  KiB written per assignment (after the first tenth): {per:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["rate", "rl", "all"], default="all")
    parser.add_argument("--validator", type=Path, default=REPO_ROOT, help="its checkout")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--window", type=float, default=18.0, help="seconds (network: 180)")
    parser.add_argument("--windows", type=int, default=6, help="windows measured")
    parser.add_argument("--assignments", type=int, default=1000)
    args = parser.parse_args(argv)
    root = args.validator.resolve()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"validator: {root}")
    with tempfile.TemporaryDirectory(prefix="bench-soak-loop-", dir="/var/tmp") as name:
        tmp = Path(name)
        if args.part in ("rate", "all"):
            (tmp / "rate").mkdir()
            figures = rate(root, tmp / "rate", args.tasks, args.window, args.windows)
            print(f"rate: {args.tasks} tasks, window = interval = {args.window:g} s")
            for key, value in figures.items():
                print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
        if args.part in ("rl", "all"):
            (tmp / "rl").mkdir()
            print_rl(rl(root, tmp / "rl", args.assignments), args.assignments)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A year of work on one validator (`make bench-soak`): what each step costs on a journal of a
million assignments, beside the same on a small one, as ratios.

The journals are a seed written through the journal's own code, copied by SQL over a span of
time proportional to their size (devkit/journals.py: a million over a year, ten thousand over
3.65 days). On each, and on an empty state dir:

  start     seconds from `python -m validator` to its first Fed Ledger request (the simulator's
            stamp), the least of 5 (the machine's other work only adds)
  loop      the validator's CPU per lookup (user+system, /proc) while it looks up 20 tasks of the
            Fed Ledger simulator back to back (an interval of 1 ms: every pass a lookup)
  report    `python -m validator report`: seconds, CPU seconds (user+system: what the machine's
            other work does not change) and peak RSS; `--html`; the status page's /report (a
            StatusServer in this process, its report child timed by one GET)

and once: a version 2 journal of 100,000 rows (10% failed, with their events) migrated on open;
with this version's upkeep, the big journal compacted to --journal-keep-days 30 (seconds, the
longest step, bytes per assignment before and after) and the report again.

    python -m bench.soak [--rows 1000000] [--small 10000] [--seed 1000] [--migrate 100000]

The same file runs against an earlier checkout (PYTHONPATH=that checkout, this file and
devkit/journals.py copied in): what that version lacks is printed as n/a. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from devkit import REPO_ROOT
from devkit.journals import JOURNAL_FILE, file_bytes, spread, write_seed
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import validator_env
from validator.state import store
from validator.state.journal import Journal

try:  # this version's upkeep; an earlier checkout has none
    from validator.state.upkeep import Upkeep
except ImportError:
    Upkeep = None  # type: ignore[assignment,misc]

TASKS = [str(i) for i in range(1, 21)]
YEAR_S = 365 * 24 * 3600.0
LOOP_WINDOW_S = 8.0
TICK = os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--migrate", type=int, default=100_000)
    args = parser.parse_args()
    version = sys.version.split()[0]
    print(f"# {REPO_ROOT} at schema version {store.SCHEMA_VERSION}, Python {version}")
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        root = Path(tmp)
        seed = root / "seed"
        started = time.perf_counter()
        write_seed(seed, args.seed)
        print(f"seed: {args.seed} assignments through the journal in {_s(started)}")
        with Simulator({"tasks": [task(int(t), []) for t in TASKS]}, root) as sim:
            figures = {
                "empty": measure(sim, root / "empty", root),
                "small": measure(sim, build(seed, root / "small", args.small, args.seed), root),
                "big": measure(sim, build(seed, root / "big", args.rows, args.seed), root),
            }
            if Upkeep is not None:
                figures["compacted"] = compact(sim, root / "big", root)
        table(figures)
        migration(root / "v2", args.migrate)


def _s(started: float) -> str:
    return f"{time.perf_counter() - started:.1f} s"


def build(seed: Path, folder: Path, rows: int, seed_rows: int) -> Path:
    """`rows` finished assignments over rows/1e6 of a year, ending now."""
    started = time.perf_counter()
    folder.mkdir()
    shutil.copy(seed / JOURNAL_FILE, folder / JOURNAL_FILE)
    held = spread(folder, max(1, rows // seed_rows), YEAR_S * rows / 1_000_000)
    print(f"{folder.name}: {held} rows, {file_bytes(folder) / held:.0f} bytes each, {_s(started)}")
    return folder


def measure(sim: Simulator, state: Path, root: Path, label: str = "") -> dict[str, float | None]:
    state.mkdir(exist_ok=True)
    found: dict[str, float | None] = {"start_s": start_seconds(sim, state, root)}
    found["loop_cpu_ms"] = loop_cpu(sim, state, root)
    if (state / JOURNAL_FILE).exists():
        found.update(report_figures(state))
    print(f"{label or state.name}: {_cells(found)}", flush=True)
    return found


def _cells(found: dict[str, float | None]) -> str:
    return ", ".join(f"{name} {_cell(value)}" for name, value in found.items())


def validator_args(sim: Simulator, interval: str, *extra: str) -> list[str]:
    args = ["fixture", "--task_ids", ",".join(TASKS), "--api-url", sim.api_url]
    args += ["--time-sleep", "1", "--assignment-lookup-interval", interval, *extra]
    if Upkeep is not None:
        args += ["--journal-keep-days", "0"]  # measured apart: compact()
    return args


def spawn(sim: Simulator, state: Path, root: Path, interval: str) -> subprocess.Popen:
    env = validator_env(root, VALIDATOR_STATE_DIR=str(state))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env["PYTHONPATH"]])
    log = open(root / f"{state.name}.log", "a")  # noqa: SIM115 - the child's
    return subprocess.Popen(
        [sys.executable, "-m", "validator", *validator_args(sim, interval)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def requests_after(sim: Simulator, since: float) -> list[float]:
    return sorted(r["time"] for r in sim.state()["requests"] if r["time"] >= since)


def start_seconds(sim: Simulator, state: Path, root: Path) -> float:
    """From the command to the first Fed Ledger request, the least of 5."""
    found = []
    for _ in range(5):
        started = time.time()
        process = spawn(sim, state, root, "180")
        deadline = time.monotonic() + 120
        while not requests_after(sim, started) and time.monotonic() < deadline:
            time.sleep(0.02)
        stop(process)
        first = requests_after(sim, started)
        found.append(first[0] - started if first else float("inf"))
    return min(found)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def loop_cpu(sim: Simulator, state: Path, root: Path) -> float | None:
    """The validator's CPU milliseconds per lookup, over LOOP_WINDOW_S once it has looked each
    task up twice (its start behind it)."""
    process = spawn(sim, state, root, "0.001")
    try:
        started = time.time()
        deadline = time.monotonic() + 300
        while len(requests_after(sim, started)) < 3 * len(TASKS):
            if time.monotonic() > deadline or process.poll() is not None:
                return None
            time.sleep(0.05)
        begin, cpu = time.time(), cpu_seconds(process.pid)
        time.sleep(LOOP_WINDOW_S)
        cpu = cpu_seconds(process.pid) - cpu
        lookups = len([r for r in sim.lookups() if r["time"] >= begin])
    finally:
        stop(process)
    return 1000 * cpu / lookups if lookups else None


def timed_child(command: list[str]) -> tuple[float, float, float]:
    """Seconds, CPU seconds and peak RSS (MB) of a child."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{command} failed")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def report_figures(state: Path) -> dict[str, float | None]:
    report = [sys.executable, "-m", "validator", "report", "--state-dir", str(state)]
    text_s, text_cpu, text_mb = timed_child(report)
    html_s, html_cpu, html_mb = timed_child([*report, "--html", str(state.parent / "r.html")])
    page_s, page_cpu = status_page_report(state)
    return {
        "report_s": text_s,
        "report_cpu_s": text_cpu,
        "report_mb": text_mb,
        "html_s": html_s,
        "html_cpu_s": html_cpu,
        "html_mb": html_mb,
        "page_s": page_s,
        "page_cpu_s": page_cpu,
    }


def status_page_report(state: Path) -> tuple[float, float]:
    """One GET of /report on a fresh status server: the report drawn by its child. A page of
    text instead (the drawing ran past the server's REPORT_TIMEOUT_S) is said."""
    from validator.observe.observer import StatusBoard
    from validator.observe.status_server import StatusServer

    server = StatusServer("127.0.0.1", 0, StatusBoard("fixture"), state)
    server.start()
    try:
        cpu = _children_cpu()
        started = time.perf_counter()
        with urllib.request.urlopen(f"{server.address}/report", timeout=120) as answer:
            page = answer.read()
        seconds = time.perf_counter() - started
        cpu = _children_cpu() - cpu
    finally:
        server.stop()
    if b"plot-throughput" not in page:
        print(f"{state.name}: /report gave text, its drawing past the timeout: {page[:60]!r}")
    return seconds, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compact(sim: Simulator, state: Path, root: Path) -> dict[str, float | None]:
    """The big journal's first upkeep at --journal-keep-days 30, as the validator runs it at
    its first idle moment: every step timed; then the same figures on what it left."""
    rows = _count(state)
    before = file_bytes(state)
    journal = Journal(state, min_free_mb=0)
    upkeep = Upkeep(journal, 30)
    steps, started = [], time.perf_counter()
    while True:
        step = time.perf_counter()
        more = upkeep.step(time.time())
        steps.append(time.perf_counter() - step)
        if not more:
            break
    total = time.perf_counter() - started
    journal.close()
    after, kept = file_bytes(state), _count(state)
    print(
        f"compacted: {rows} -> {kept} rows in full, {total:.1f} s in {len(steps)} steps: the "
        f"whole-file check {steps[0]:.2f} s, then each step at most {max(steps[1:]):.2f} s; "
        f"{before / 1e6:.0f} MB -> {after / 1e6:.0f} MB: {before / rows:.0f} -> "
        f"{after / rows:.0f} bytes per assignment held",
        flush=True,
    )
    found = measure(sim, state, root, "compacted")
    found.update({"compact_s": total, "step_max_s": max(steps[1:]), "bytes_each": after / rows})
    return found


def _count(state: Path) -> int:
    with sqlite3.connect(state / JOURNAL_FILE) as db:
        found = db.execute("SELECT count(*) FROM assignments").fetchone()[0]
    db.close()
    return int(found)


def migration(folder: Path, rows: int) -> None:
    """A version 2 journal of `rows` (one in 10 failed, each with its events) opened."""
    folder.mkdir()
    with sqlite3.connect(folder / JOURNAL_FILE) as db:
        db.executescript(store.SCHEMA_V2 + "PRAGMA user_version = 2;")
        db.executemany(
            "INSERT INTO assignments (id, module, task_id, state, input, metrics, outcome,"
            " received_at, updated_at) VALUES (?, 'fixture', '1', 'submitted', '{}', ?, ?, ?, ?)",
            (
                (str(i), None if i % 10 == 0 else '{"loss": 0.5}',
                 "failed" if i % 10 == 0 else "completed", float(i), float(i) + 1)
                for i in range(rows)
            ),
        )  # fmt: skip
        trail = ("received", "scoring", "failed", "submitted")
        db.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?)",
            ((str(i), float(i), state, "why") for i in range(rows) for state in trail),
        )
    db.close()
    started = time.perf_counter()
    Journal(folder, min_free_mb=0).close()
    print(f"migration: a version 2 journal of {rows} rows opened in {_s(started)}")


def table(figures: dict[str, dict[str, float | None]]) -> None:
    names = ["start_s", "loop_cpu_ms", "report_s", "report_cpu_s", "report_mb", "html_s"]
    names += ["html_cpu_s", "html_mb", "page_s", "page_cpu_s"]
    later = [f"{key} / small" for key in ("big", "compacted") if key in figures]
    print("\n| figure | " + " | ".join([*figures, *later]) + " |")
    print("|---|" + "---:|" * (len(figures) + len(later)))
    for name in names:
        cells = [_cell(found.get(name)) for found in figures.values()]
        small = figures["small"].get(name)
        ratios = [
            f"{found[name] / small:.1f}x" if small and found.get(name) else "n/a"
            for key, found in figures.items()
            if key in ("big", "compacted")
        ]
        print(f"| {name} | " + " | ".join(cells + ratios) + " |")
    print("\n(the ratios: big / small, compacted / small; compacted: the big journal after its")
    print("first upkeep at --journal-keep-days 30)")
    empty, big = figures["empty"].get("loop_cpu_ms"), figures["big"].get("loop_cpu_ms")
    if empty and big:
        print(f"\nloop CPU per lookup, big / empty journal: {big / empty:.1f}x")


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    main()

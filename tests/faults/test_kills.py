"""`kill -9` at random moments of the loop, each followed by a restart on the same state dir: the
real CLI against the Fed Ledger simulator, with slow scorings so that kills land in them too.

What must hold at the end (checked in the simulator, which saw every call):
- 0 lost: every assignment the validator journaled ends completed or failed in the simulator;
- 0 double: the API took no assignment's result twice.

The one gap no validator can close is an assignment handed out in the instant between the API's
answer and the journal's commit: the process that asked for it is dead and nothing on disk
names it. Such an orphan stays `validating` until the API expires it and hands the submission
out again. It is counted apart, and each must be the very last call of its trial, which proves
the kill fell in that instant and not in a gap of the loop. The same goes for an update sent
again after a kill between the API taking it and the journal recording it: the API refuses
the repeat ("not in validating status"), and each must follow its trial's last call.

Set FAULT_SEED to replay a run's kill times (the seed is in the figure).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from devkit.simulator.process import Simulator, task
from tests.faults.figures import record
from tests.faults.ledger import (
    FINAL,
    LOOKUP,
    UPDATE,
    Ledger,
    journal_notes,
    journal_rows,
    reached_api,
    target,
)
from tests.helpers.cli import LoopCli

TRIALS = 12  # each a validator start and a kill; a new seed every run; 12 take about 14 s
KILL_WINDOW_S = (0.0, 0.6)
SLOW_SECONDS = 0.15
DRAIN_S = 30  # a few seconds normally
# Every lookup and update takes this long, as over a real network, so that kills land in them.
LATENCY = [
    {"endpoint": endpoint, "kind": "delay", "delay_seconds": 0.1, "count": None}
    for endpoint in ("request", "update")
]
# Which step a kill interrupted, when no call was in flight: the last line of the trial's
# --debug log that tells.
STEPS = [
    ("scoring", re.compile(r"received assignment|: scoring \(attempt")),
    ("submit", re.compile(r": scored |cannot be validated")),
    ("between", re.compile(r"submitted as|next lookup|-> \d+|results to submit")),
]


@dataclass(frozen=True)
class Trial:
    first_request: int  # index in the simulator's request log of this run's first call
    killed_at: float
    log: str


def moment_of(trial: Trial, last_call: dict) -> str:
    if last_call["time"] > trial.killed_at:  # answered to a dead process
        return "submit" if target(last_call, UPDATE) else "lookup"
    for line in reversed(trial.log.splitlines()):
        for step, pattern in STEPS:
            if pattern.search(line):
                return step
    return "start-up"


def request_count(sim: Simulator) -> int:
    return len(sim.state()["requests"])


def add_work(sim: Simulator, trial: int, repos: list[str]) -> None:
    """Two or three new submissions per trial, so that every restart has work to be killed in."""
    new = [(1 + trial % 2, f"slow/t{trial}"), (2 - trial % 2, f"ok/t{trial}")]
    if trial % 4 == 0:
        new.append((1, f"broken/t{trial}"))
    for task_id, repo in new:
        sim.add_submission(task_id, {"hg_repo_id": repo})
        repos.append(repo)


def run_trial(sim: Simulator, cli: LoopCli, args: list[str], log: Path, delay: float):
    first = request_count(sim)
    process = cli.start(args, log)
    # Kill times count from the run's first API call: Python's start-up is not the loop.
    cli.wait_for(lambda: request_count(sim) > first, 30, "the validator's first API call")
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = process.wait(10)
    # Anything but our SIGKILL means the validator stopped on its own: a crash.
    assert code == -signal.SIGKILL, f"exit {code} before the kill:\n{log.read_text()}"
    # A call the dead process left in flight is answered (and logged) after the delay; the next
    # run's calls must come after it in the log, or they would look like this run's.
    time.sleep(0.05)
    cli.wait_for(lambda: sim.state()["in_flight"] == 0, 10, "the simulator to answer the dead run")
    return Trial(first, killed_at, log.read_text())


def drain(
    sim: Simulator, cli: LoopCli, args: list[str], log: Path, repos: list[str]
) -> tuple[int, bool]:
    """A last run, left alone until every submission was handed out and finished (or for
    DRAIN_S); its first request's index, and whether it got there."""
    state_dir = Path(cli.env["VALIDATOR_STATE_DIR"])

    def done() -> bool:
        ledger = Ledger.of(sim)
        journaled = journal_rows(state_dir)
        handed = {ledger.repo(a) for a in ledger.assignments}
        open_ = [a for a in ledger.unfinished() if a in journaled]
        return handed == set(repos) and not open_

    first = request_count(sim)
    process = cli.start(args, log)
    # Until its first call the process has no SIGTERM handler yet: the default one would kill it.
    cli.wait_for(lambda: request_count(sim) > first, 30, "the last run's first API call")
    try:
        cli.wait_for(done, DRAIN_S, "the last run to finish every submission", interval=0.2)
        finished = True
    except AssertionError:
        finished = False  # the checks below say what is missing
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(30) == 0, log.read_text()
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return first, finished


def segment_ends(starts: list[int], total: int) -> dict[int, int]:
    """For each request index, the index of the last request of the same run."""
    ends: dict[int, int] = {}
    bounds = [*starts, total]
    for begin, end in zip(bounds, bounds[1:], strict=False):
        for index in range(begin, end):
            ends[index] = end - 1
    return ends


def test_kill_9_at_random_moments_loses_nothing_and_submits_nothing_twice(tmp_path, cli):
    seed = int(os.environ.get("FAULT_SEED") or random.SystemRandom().randrange(1_000_000))
    rng = random.Random(seed)
    cli.config({"slow_seconds": SLOW_SECONDS, "marker_dir": str(tmp_path)})
    repos = ["slow/a", "ok/b", "slow/c", "broken/d"]
    tasks = [task(1, repos[:2]), task(2, repos[2:])]
    began = time.monotonic()
    with Simulator({"tasks": tasks}, tmp_path, faults=LATENCY) as sim:
        args = cli.args(sim.api_url, "1,2", "--debug")
        trials = []
        for n in range(TRIALS):
            add_work(sim, n, repos)
            delay = rng.uniform(*KILL_WINDOW_S)
            trials.append(run_trial(sim, cli, args, tmp_path / f"trial{n}.log", delay))
        drain_start, drained = drain(sim, cli, args, tmp_path / "drain.log", repos)
        ledger = Ledger.of(sim)
    elapsed = time.monotonic() - began
    rows = journal_rows(tmp_path / "state")
    context = f"seed {seed}; logs in {tmp_path}"

    # The k-th assignment is the k-th lookup the API answered 200: the log is in call order.
    handed_at = [i for i, r in enumerate(ledger.requests) if target(r, LOOKUP) and reached_api(r)]
    assert len(handed_at) == len(ledger.assignments), context
    last_of_run = segment_ends(
        [t.first_request for t in trials] + [drain_start], len(ledger.requests)
    )

    lost = [a for a in ledger.unfinished() if a in rows]
    orphans = [a for a in ledger.unfinished() if a not in rows]
    for orphan in orphans:
        index = handed_at[int(orphan) - 1]
        assert last_of_run[index] == index, f"assignment {orphan} orphaned mid-run; {context}"
    repeats = ledger.repeats()
    for index in repeats:
        assignment = target(ledger.requests[index], UPDATE)
        taken = next(
            i
            for i, r in enumerate(ledger.requests)
            if target(r, UPDATE) == assignment and reached_api(r)
        )
        assert last_of_run[taken] == taken, f"update {assignment} sent again mid-run; {context}"

    assert lost == [], f"journaled but never finished: {lost}; {context}"
    assert ledger.doubles() == [], f"{ledger.accepted()}; {context}"
    assert {ledger.repo(a) for a in ledger.assignments} == set(repos), context
    assert set(rows) | set(orphans) == set(ledger.assignments), context
    for assignment, row in rows.items():
        # dropped only for a repeat the API refused because it already had the result
        assert row["state"] in ("submitted", "dropped"), (row, context)
        assert ledger.assignments[assignment]["status"] in FINAL, (row, context)
    assert drained, f"the last run did not finish every submission; {context}"
    killed_thrice = 0
    for assignment, row in ledger.assignments.items():
        if row["status"] != "failed" or ledger.repo(assignment).startswith("broken/"):
            continue
        # A kill during scoring counts as a crash: three in a row fail the submission, by design.
        # The history, not the row: a kill after the API took the failure but before the journal
        # knew leaves the row with the API's refusal of the repeat (dropped).
        notes = journal_notes(tmp_path / "state", assignment)
        assert any("scoring ended the process 3 times" in note for note in notes), (notes, context)
        killed_thrice += 1

    moments = Counter(
        moment_of(trial, ledger.requests[last_of_run[trial.first_request]]) for trial in trials
    )
    finished = sum(1 for row in ledger.assignments.values() if row["status"] in FINAL)
    record(
        f"kill -9 at random moments, {TRIALS} trials + restarts (seed {seed})",
        f"kills in {', '.join(f'{n} {m}' for m, n in moments.most_common())}; "
        f"{len(repos)} submissions, {finished} submitted, {len(lost)} lost, "
        f"{len(ledger.doubles())} double, {len(orphans)} orphaned in flight, "
        f"{len(repeats)} repeat refused, {killed_thrice} failed after 3 kills; {elapsed:.0f} s",
    )

"""`make demo`: the validator loop end to end, offline, in about ten seconds.

Starts the Fed Ledger simulator on 127.0.0.1 with two tasks, runs `python -m validator` with the
test module `fixture` until five assignments are finished (one of them a submission that cannot
be validated), then prints what the simulator received, a failure with why (the report's
reason, from the state dir).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from devkit import FIXTURE_MODULES, REPO_ROOT
from devkit.demo_secrets import API_KEY, HF_TOKEN, run_checking_log
from devkit.simulator.process import Simulator, task
from validator.report.summary import summarize

TASKS = [
    task(1, ["ok/alice-adapter", "broken/mallory-adapter", "ok/bob"], context_length=4096),
    task(2, ["ok/carol-adapter", "ok/dave"], context_length=2048),
]


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="flock-demo-") as tmp,
        Simulator({"tasks": TASKS}, Path(tmp), api_key=API_KEY) as sim,
    ):
        print(f"Fed Ledger simulator: {sim.api_url}", flush=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(FIXTURE_MODULES),
            "FLOCK_API_KEY": API_KEY,
            "HF_TOKEN": HF_TOKEN,
            "VALIDATOR_STATE_DIR": str(Path(tmp) / "state"),
        }
        command = [
            sys.executable,
            "-m",
            "validator",
            "fixture",
            "--task_ids",
            "1,2",
            "--api-url",
            sim.api_url,
            "--assignment-lookup-interval",
            "0.5",
            "--time-sleep",
            "1",
            "--max-assignments",
            "5",
        ]
        print("$ python -m validator fixture --task_ids 1,2 --max-assignments 5 ...", flush=True)
        code = run_checking_log(command, REPO_ROOT, env)
        repos = {
            a["id"]: a["task_submission"]["data"]["hg_repo_id"] for a in sim.state()["assignments"]
        }
        summary, _ = summarize(Path(tmp) / "state")
        why = {f.id: f"  <- {f.kind}: {f.reason}" for f in summary.failures if f.kind}
        print(f"\nvalidator exit code {code}; the Fed Ledger received:")
        for result in sim.submissions():
            assignment = result["assignment_id"]
            print(
                f"  assignment {assignment} ({repos[assignment]}): "
                f"{result['status']} {result['data'] or ''}{why.get(str(assignment), '')}"
            )
        return code


if __name__ == "__main__":
    sys.exit(main())

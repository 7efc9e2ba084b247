"""What a demo leaves to look at (scripts/demo.py, demo_rl.py, demo_llm_judge.py).

`make demo` runs each module's validator to the end, prints what the Fed Ledger received with
why each penalty is one (the report's reasons, from the state volume), writes the report page
to demo-output/<module>-report.html, then removes its volumes and says where to look.

`make demo-serve` (DEMO_SERVE=1) keeps the validator running once its assignments are done:
its status page and /report are served on 127.0.0.1 until Ctrl-C, and its state volume is kept
(`docker volume rm` removes it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from devkit import REPO_ROOT
from devkit.demo_secrets import redacted_words
from devkit.simulator.process import Simulator

SERVE_ENV = "DEMO_SERVE"
OUTPUT = REPO_ROOT / "demo-output"
LISTENING = re.compile(r"status page on (http://127\.0\.0\.1:\d+)")
WAIT_S = 1800.0  # for a demo's assignments, building its image included


def serving() -> bool:
    """`make demo-serve`: keep the validator and its state once the assignments are done."""
    return os.environ.get(SERVE_ENV) == "1"


def run_args(count: int) -> list[str]:
    """How the validator of a demo ends: after `count` assignments, or, served, never (Ctrl-C)
    with its status page on a free port of 127.0.0.1."""
    return ["--http-port", "0"] if serving() else ["--max-assignments", str(count)]


def report(module: str, state_volume: str, *options: str) -> subprocess.CompletedProcess[str]:
    """`run.py report MODULE OPTIONS` on the demo's state volume (in the module's image)."""
    command = [sys.executable, str(REPO_ROOT / "run.py"), "report", module]
    return subprocess.run(
        [*command, "--state-volume", state_volume, *options],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def reasons(module: str, state_volume: str) -> dict[int, str]:
    """Why each penalty of the run is one, by assignment id: "kind: reason" (the report's)."""
    done = report(module, state_volume, "--json")
    if done.returncode != 0:
        print(f"(no reasons: the report failed: {done.stderr.strip()[-300:]})")
        return {}
    failures = json.loads(done.stdout)["failures"]
    return {int(f["id"]): f"{f['kind']}: {f['reason']}" for f in failures if f.get("kind")}


def print_results(
    sim: Simulator, code: int | None, module: str, state_volume: str, score: Callable[[dict], str]
) -> dict[str, str]:
    """What the Fed Ledger received, a line per submission: `score(data)` its figures, and a
    penalty's kind and reason. `code`: the validator's exit code (None: still running). Returns
    the reasons shown, by repo."""
    why = reasons(module, state_volume)
    state = sim.state()
    repos = {a["id"]: a["task_submission"]["data"]["hg_repo_id"] for a in state["assignments"]}
    ended = "" if code is None else f"validator exit code {code}; "
    print(f"\n{ended}the Fed Ledger received:")
    shown = {}
    for result in state["submissions"]:
        repo = repos[result["assignment_id"]]
        reason = why.get(result["assignment_id"], "")
        if reason:
            shown[repo] = reason
        arrow = f"  <- {reason[:160]}" if reason else ""
        print(f"  {repo:22} {result['status']:9} {score(result['data'] or {})}{arrow}")
    return shown


def expect_reasons(shown: dict[str, str], penalized: dict[str, str]) -> int:
    """1 unless each of `penalized` (repo -> its penalty's kind) was shown with that kind: the
    demo's own check that its summary explains every penalty."""
    missing = [repo for repo, kind in penalized.items() if not shown.get(repo, "").startswith(kind)]
    for repo in missing:
        print(f"demo: {repo} shows no {penalized[repo]} reason", file=sys.stderr)
    return 1 if missing else 0


def where_to_look(module: str, state_volume: str) -> int:
    """The report page of the run, written before its volumes go, and how to see it live; 1
    when the page could not be written."""
    OUTPUT.mkdir(exist_ok=True)
    page = OUTPUT / f"{module}-report.html"
    page.unlink(missing_ok=True)
    done = report(module, state_volume, "--html", str(page))
    if done.returncode != 0 or not page.is_file():
        print(f"demo: the report was not written: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    print(f"\nTo look at: {page.relative_to(REPO_ROOT)} (the report of this run)")
    print(
        f"  make demo-serve DEMO={module}: the same run, its status page and report served on "
        "127.0.0.1 until Ctrl-C, its state kept"
    )
    return 0


def serve_until_stopped(
    command: Sequence[str],
    env: Mapping[str, str],
    sim: Simulator,
    count: int,
    show: Callable[[], None],
    state_volume: str,
) -> int:
    """Runs the validator until the Fed Ledger has `count` results, calls `show()`, then keeps
    it serving its status page until Ctrl-C; its exit code (1 when redaction rewrote part of a
    word in its log, as run_checking_log)."""
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=dict(env), stderr=subprocess.PIPE, text=True, errors="replace"
    )
    lines: list[str] = []
    reader = threading.Thread(target=_echo, args=(process, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(sim.submissions()) < count and process.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        page = next((m.group(1) for line in lines if (m := LISTENING.search(line))), None)
        if process.poll() is None and page is not None:
            show()
            print(f"\nstatus page: {page}/  report: {page}/report  (Ctrl-C to stop)")
            print(f"state kept in volume {state_volume} (docker volume rm {state_volume})")
            process.wait()
    except KeyboardInterrupt:
        pass  # Ctrl-C reached run.py too: it stops the validator's container
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        code = process.wait()
        reader.join(10)
    if redacted_words(lines) and code in (0, 130, -signal.SIGINT):
        print("demo: redaction rewrote part of a word in the validator's log", file=sys.stderr)
        return 1
    return 0 if code in (130, -signal.SIGINT) else code


def _echo(process: subprocess.Popen, lines: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        lines.append(line)


def remove_volumes(*names: str) -> None:
    for name in names:
        subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True)

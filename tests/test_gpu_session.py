"""bench/gpu_session.sh, the one script a lent GPU machine runs (lora and llm_judge under one
deadline), rehearsed on this CPU: `--rehearse` runs its steps at tiny shapes with the
repository's venvs, writing each step's report and the session's list to $OUT as it goes; a
deadline too short for a step skips it, saying so, and still returns what ran."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_session.sh"


def rehearse(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--rehearse"],
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_rehearsal_runs_every_step_and_writes_each_report(tmp_path: Path) -> None:
    done = rehearse(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    session = (tmp_path / "session.txt").read_text()
    for name in ("lora-fp32", "llm_judge-warm"):
        assert f"{name}: exit 0 in" in session
    assert "0 steps failed" in session and "llm_judge-fla, llm_judge-0.8b: not rehearsed" in session
    assert "torch" in (tmp_path / "env.txt").read_text()
    lora = (tmp_path / "lora-fp32.txt").read_text()
    # GPU mode's steps, each of which reported: scoring both paths, the adapter cycle, the
    # Trainer's agreement, the per-assignment comparison.
    assert "ours: the module's default path" in lora and "largest per conversation" in lora
    assert "restored bit for bit: yes" in lora
    assert "bpc agreement" in lora and "per assignment (scoring plus model work)" in lora
    warm = (tmp_path / "llm_judge-warm.txt").read_text()
    assert "warm merges bit-identical to the reload's: all" in warm
    assert "fingerprint check alone" in warm
    assert "one decode step (one answer)" in warm  # the check priced in an assignment's steps


def test_a_deadline_too_short_skips_steps_and_keeps_what_ran(tmp_path: Path) -> None:
    done = rehearse(tmp_path, PARTS="lora", DEADLINE_S="25")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    session = (tmp_path / "session.txt").read_text().splitlines()
    assert session[0].startswith("env: ") and "budget 25 s" in session[0]
    assert (
        session[1].startswith("lora-fp32: skipped, ")
        and "left of the session's budget" in (session[1])
    )
    assert session[-1].startswith("session: ") and (tmp_path / "lora-fp32.txt").exists()
    assert not (tmp_path / "llm_judge-warm.txt").exists()  # PARTS=lora: llm_judge not run

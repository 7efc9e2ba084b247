"""A hostile Hub's listing of a repo with hundreds of thousands of files, read by the kit's hub
(validator/kit/hub.py `model_info`) in a child process of the test's venv, under
huggingface_hub 0.x (requests) or 1.x (httpx) (read whole, a listing of 10^6 files costs the
validator's process +669 MB). Shared by tests/test_answer_caps.py and
tests/llm_judge/test_judge_caps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devkit import REPO_ROOT
from devkit.hf_hub import LocalHub
from devkit.validator_cli import wait_for
from validator.outbound.answer_caps import ANSWER_CAPS

MIB = 1 << 20
FILES = 400_000  # an 18 MB listing: read whole and decoded, 250 MB of Python objects
IN_FLIGHT = 12 * MIB  # what the loopback's socket buffers may hold beyond what was read

# Asks for an honest listing, then (its peak memory reset) for a submission's and a base
# model's hostile ones; prints the peaks and what each ask raised.
CHILD = """
import json
from tests.helpers.peak_rss import peak_bytes, reset_peak
from validator.kit import hub
hub.model_info("org/honest", "submission org/honest", submission=True, files_metadata=True)
honest = peak_bytes()
reset_peak()
said = {}
for repo, submission in (("org/flood", True), ("org/base", False)):
    try:
        hub.model_info(repo, repo, submission=submission, files_metadata=True)
        said[repo] = "accepted"
    except Exception as exc:
        said[repo] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"honest": honest, "hostile": peak_bytes(), "said": said}))
"""


def hostile_listing_is_capped(tmp: Path) -> dict:
    """The child's figures, once checked: both hostile listings refused (the submission's
    fault for its own repo, transient for a base model), each read to its cap at most, and the
    child's peak within 1.5x the honest one."""
    with LocalHub(tmp / "hub") as hub:
        for repo in ("org/honest", "org/flood", "org/base"):
            hub.add_repo(repo, {"config.json": b"{}", "model.safetensors": b"x" * 100})
        hub.flood_listing("org/flood", FILES)
        hub.flood_listing("org/base", FILES)
        env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
        env.update(
            HF_ENDPOINT=hub.endpoint,
            HF_HOME=str(tmp / "hf-home"),
            HF_HUB_CACHE=str(tmp / "hf-home" / "hub"),
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            PYTHONPATH=str(REPO_ROOT),
        )
        done = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=REPO_ROOT, env=env, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        measured = json.loads(done.stdout)
        sent = wait_for(lambda: len(hub.listings_sent) == 2 and list(hub.listings_sent), 30, "")
    cap = ANSWER_CAPS["hub.listing"]
    said = measured["said"]
    over = f"over the {cap.max_bytes} bytes a hub.listing answer may have"
    assert said["org/flood"].startswith("SubmissionRejected: org/flood: GET "), said
    assert said["org/base"].startswith("TransientError: org/base: GET "), said
    assert over in said["org/flood"] and over in said["org/base"], said
    assert [repo for repo, _, _ in sent] == ["org/flood", "org/base"]
    for _repo, length, bytes_sent in sent:
        assert bytes_sent <= cap.max_bytes + IN_FLIGHT < length
    assert measured["hostile"] <= 1.5 * measured["honest"], measured
    return {**measured, "sent": [s for _, _, s in sent], "length": sent[0][1]}

"""A validator worker's use of a shared HF cache, as a separate process a test drives line by
line on stdin (tests/test_hf_cache.py). The environment (HF_ENDPOINT, HF_HUB_CACHE,
VALIDATOR_HF_CACHE_MAX_GB) says which hub, cache and budget.

    begin          a scoring begins (the scope the loop enters around validate())
    fetch <repo>   fetch <repo> in the scoring begun, or in a scoring of its own when none is:
                   the base stays marked in use until the scoring ends
    end            the scoring ends
    quit

Each fetch answers one JSON line: the snapshot's path, the sha256 of each of its files, and the
number of tensors its safetensors weights load with; a failure answers {"error": ...}. Other
commands answer "ok". Logs go to stderr.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from contextlib import ExitStack

from safetensors.numpy import load_file

from validator.kit import fetch_base_model
from validator.scope import Scope, entered


def fetched(repo_id: str) -> dict[str, object]:
    path = fetch_base_model(repo_id)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}
    tensors = sum(len(load_file(p)) for p in sorted(path.glob("*.safetensors")))
    json.loads((path / "config.json").read_text())
    return {"path": str(path), "files": files, "tensors": tensors}


def fetch_in(scoring: ExitStack | None, repo_id: str) -> dict[str, object]:
    with ExitStack() as own:
        if scoring is None:
            own.enter_context(entered(Scope()))
        try:
            return fetched(repo_id)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    scoring: ExitStack | None = None
    for line in sys.stdin:
        command, _, repo_id = line.strip().partition(" ")
        answer: object = "ok"
        if command == "begin":
            scoring = ExitStack()
            scoring.enter_context(entered(Scope()))
        elif command == "fetch":
            answer = fetch_in(scoring, repo_id)
        elif command == "end" and scoring is not None:
            scoring.close()
            scoring = None
        elif command == "quit":
            break
        print(json.dumps(answer), flush=True)
    if scoring is not None:
        scoring.close()


if __name__ == "__main__":
    main()

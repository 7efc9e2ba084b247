"""Runs the real `python -m validator` CLI as a subprocess, as the launcher would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devkit import FIXTURE_MODULES, REPO_ROOT

API_KEY = "sk-flock-TEST-9f8e7d6c5b4a"
HF_TOKEN = "hf_TESTtoken1234567890abcdef"


# Defaults the validator takes from the environment that an operator may have exported (for
# compose, say): inherited, they would stand in for what a test leaves out on purpose.
OPERATOR_DEFAULTS = ("TASK_IDS", "VALIDATOR_MODULE")


def env_with_test_secrets(**settings: str) -> dict[str, str]:
    """This process's environment with the tests' own key and token in place of any real ones,
    and without the operator's defaults."""
    return {
        **{k: v for k, v in os.environ.items() if k not in OPERATOR_DEFAULTS},
        "FLOCK_API_KEY": API_KEY,
        "HF_TOKEN": HF_TOKEN,
        "PYTHONUNBUFFERED": "1",
        # Tests never ask GitHub (the protocol drift watch); its own tests turn it on.
        "VALIDATOR_PROTOCOL_WATCH": "off",
        **settings,
    }


def validator_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment with the fixture modules importable, a private state and config dir, and
    quick API retries so that fault tests stay short."""
    (tmp_path / "configs").mkdir(exist_ok=True)
    defaults = {
        "PYTHONPATH": str(FIXTURE_MODULES),
        "VALIDATOR_STATE_DIR": str(tmp_path / "state"),
        "VALIDATOR_CONFIG_DIR": str(tmp_path / "configs"),
        "VALIDATOR_API_RETRIES": "1",
        "VALIDATOR_API_BACKOFF": "0.05",
    }
    return env_with_test_secrets(**{**defaults, **extra})


def write_config(tmp_path: Path, module: str, config: dict, task_id: str | None = None) -> Path:
    folder = tmp_path / "configs" if task_id is None else tmp_path / "configs" / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task_id if task_id is not None else module}.json"
    path.write_text(json.dumps(config))
    return path


def loop_args(module: str, api_url: str, task_ids: str, *extra: str) -> list[str]:
    return [
        module,
        "--task_ids",
        task_ids,
        "--api-url",
        api_url,
        "--time-sleep",
        "0.3",
        "--assignment-lookup-interval",
        "0.2",
        *extra,
    ]


def run_validator(
    args: list[str],
    env: dict[str, str],
    timeout: float = 60,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m validator *args` to its end; `preexec_fn` runs in the child before the exec
    (a lowered hard limit, dropped capabilities)."""
    return subprocess.run(
        [sys.executable, "-m", "validator", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec_fn,  # noqa: PLW1509 - a test's, in a process of one thread
    )


def start_validator(
    args: list[str], env: dict[str, str], log_path: Path, root: Path = REPO_ROOT
) -> subprocess.Popen:
    """`python -m validator` of the checkout at `root`, its output into `log_path`."""
    with open(log_path, "wb") as log:  # the child has its own descriptor of it
        return subprocess.Popen(
            [sys.executable, "-m", "validator", *args],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

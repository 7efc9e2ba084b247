"""A malformed secret never reaches a log, and never hangs the validator: the real CLI (and the
real launcher, up to Docker) against the Fed Ledger simulator.

The case guarded: a key with a trailing carriage return, copied from a Windows `.env`, makes
requests raise an error quoting the key, which must neither reach a log nor be retried forever.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    REPO_ROOT,
    env_with_test_secrets,
    loop_args,
    run_validator,
    validator_env,
)
from tests.faults.figures import record
from validator.errors import ConfigError
from validator.ledger.client import FedLedgerClient

# Random-looking, and sharing no four characters with any message, so a found fragment is a leak.
KEY = "fk-Zq7Wx2Rv9Ty4Pm6Kd3Hn8Jc"
TOKEN = "hf_Lm4Np7Qr2St9Uv5Wx8Yz3Ab"
REFUSAL_TIMEOUT_S = 30  # a refusal takes about a second; more means it went on to the loop


def fragments(secret: str, length: int) -> list[str]:
    return [secret[i : i + length] for i in range(len(secret) - length + 1)]


def leaked(text: str, secret: str, length: int = 8) -> list[str]:
    """Each run of `length` characters of `secret` that `text` shows."""
    return [fragment for fragment in fragments(secret, length) if fragment in text]


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[Simulator]:
    """Accepts only the stripped key: anything else is refused with 401 (exit 3)."""
    data = {"tasks": [task(12, ["ok/a", "ok/b", "ok/c", "ok/d"])]}
    with Simulator(data, tmp_path_factory.mktemp("sim"), api_key=KEY) as simulator:
        yield simulator


def test_a_key_with_a_trailing_cr_or_spaces_is_stripped_and_never_logged(tmp_path, sim):
    outputs = []
    for n, (key, token) in enumerate([(KEY + "\r", TOKEN + "\r\n"), (f"  {KEY} ", f"\t{TOKEN}")]):
        before = len(sim.submissions())
        (tmp_path / str(n)).mkdir()
        env = validator_env(tmp_path / str(n), FLOCK_API_KEY=key, HF_TOKEN=token)
        args = loop_args("fixture", sim.api_url, "12", "--max-assignments", "2", "--debug")
        result = run_validator(args, env, timeout=60)  # before the fix: retried forever
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert len(sim.submissions()) == before + 2
        assert leaked(output, KEY) == [] and leaked(output, TOKEN) == [], output[-3000:]
        outputs.append(output)
    fragments_seen = sum(len(leaked(o, KEY)) + len(leaked(o, TOKEN)) for o in outputs)
    record(
        "key/token with trailing CR, surrounding spaces",
        f"stripped, 4 submitted, {fragments_seen} secret fragments in 2 --debug logs",
    )


@pytest.mark.parametrize(
    ("variable", "value", "flaw"),
    [
        ("FLOCK_API_KEY", KEY[:12] + "\r" + KEY[12:], "a control character"),
        ("FLOCK_API_KEY", "\ufeff" + KEY, "a non-ASCII character"),  # a byte-order mark
        ("FLOCK_API_KEY", " \r\n", "only whitespace"),
        ("HF_TOKEN", TOKEN[:5] + "\x07" + TOKEN[5:], "a control character"),
    ],
    ids=[
        "key with an inner CR",
        "key after a byte-order mark",
        "key of whitespace",
        "BEL in token",
    ],
)
def test_a_malformed_secret_exits_2_at_once_naming_only_its_variable(
    tmp_path, sim, variable, value, flaw
):
    env = validator_env(tmp_path, **{variable: value})
    requests_before = len(sim.state()["requests"])
    result = run_validator(
        loop_args("fixture", sim.api_url, "12", "--debug"), env, timeout=REFUSAL_TIMEOUT_S
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert variable in result.stderr and flaw in result.stderr, result.stderr
    assert leaked(output, value.strip(), length=4) == [], output
    assert len(sim.state()["requests"]) == requests_before  # refused before any request


def test_the_launcher_strips_and_refuses_by_the_same_rule_before_docker(tmp_path):
    # No Docker engine: a secret run.py accepts gets as far as reaching for it (exit 3).
    def launch(key: str) -> subprocess.CompletedProcess[str]:
        env = env_with_test_secrets(
            FLOCK_API_KEY=key, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"
        )
        command = [sys.executable, str(REPO_ROOT / "run.py"), "lora", "--task_ids", "1"]
        return subprocess.run(
            [*command, "--gpus", "none"],
            env=env,
            capture_output=True,
            text=True,
            timeout=REFUSAL_TIMEOUT_S,
        )

    stripped = launch(KEY + "\r")
    assert stripped.returncode == 3 and "cannot reach the Docker engine" in stripped.stderr
    refused = launch(KEY[:12] + "\r" + KEY[12:])
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "[run.py] error: --flock-api-key / FLOCK_API_KEY contains a control character"
    )
    assert leaked(refused.stdout + refused.stderr, KEY, length=4) == []


def test_a_request_that_cannot_be_built_stops_instead_of_retrying(tmp_path):
    # An API URL without a host fails the same way on every try, before anything is sent.
    args = loop_args("fixture", "http:///api/v1", "12")
    result = run_validator(args, validator_env(tmp_path), timeout=REFUSAL_TIMEOUT_S)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "GET /tasks/list cannot be sent (InvalidURL" in result.stderr
    assert "check --api-url" in result.stderr


def test_the_client_refuses_a_header_it_cannot_send_without_quoting_it(sim):
    # A key that bypassed the start-up rule (the client used from other code).
    client = FedLedgerClient(KEY + "\r", sim.api_url, retries=1, backoff=0.01)
    lookups = len(sim.lookups(12))
    try:
        with pytest.raises(ConfigError) as refused:
            client.request_assignment("12")
    finally:
        client.close()
    assert "FLOCK_API_KEY" in str(refused.value)
    assert leaked(str(refused.value), KEY, length=4) == [], refused.value
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert len(sim.lookups(12)) == lookups

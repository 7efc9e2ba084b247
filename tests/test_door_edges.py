"""The door's edges: every missing setting named at once (at start and in the doctor), one
warning for workers that would sit idle, `--check`'s one line per problem saying whose it is,
non-finite numbers, special config files and deep answers refused, log lines that stay lines.
run.py and `python -m validator` run in this process (click's runner) where they stop at the
door, with DOCKER_HOST pointing nowhere; as children where they go further."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.commands.doctor import doctor as host_doctor
from launcher.engine.containers import ContainerSpec
from tests.helpers.hostile_server import HostileServer, answer
from tests.helpers.run_py import NOWHERE, run_py
from validator.doctor.command import main as inner_doctor
from validator.entrypoint import main as validator_main
from validator.observe.logs import OneLineFormatter
from validator.spec import CHECK_SOURCE_ENV

KEY = "flock-key-0123456789"
# llm_judge's settings, none given: the keys as secrets, the judge's URL as a required env var.
JUDGE_UNSET: dict[str, str | None] = {
    "FLOCK_API_KEY": KEY,
    "HF_TOKEN": None,
    "OPENAI_API_KEY": None,
    "OPENAI_BASE_URL": None,
}
JUDGE_URL = "missing OPENAI_BASE_URL: the judge endpoint's URL, e.g. https://.../v1, for llm_judge"


# -- every missing setting at once ------------------------------------------------------------


@pytest.mark.parametrize("command", ["run.py", "python -m validator"])
def test_every_missing_setting_is_named_in_one_line_at_start(command):
    """Before, llm_judge's start named the keys, then (once given) the judge texts and the URL
    its start-up checks found: one problem per try."""
    if command == "run.py":
        result = run_py("llm_judge", "--task_ids", "12", "--gpus", "none", **JUDGE_UNSET)
        [line] = result.stderr.splitlines()
    else:
        result = CliRunner().invoke(validator_main, ["llm_judge", "--task_ids", "12"],
                                    env=JUDGE_UNSET)  # fmt: skip
        line = result.output.splitlines()[-1]
    assert result.exit_code == 2, result.output
    for missing in ("missing --hf-token / HF_TOKEN", "missing OPENAI_API_KEY", JUDGE_URL):
        assert missing in line, line


def test_the_judge_url_alone_missing_stops_run_py_before_docker():
    keys = {"HF_TOKEN": "hf_abcdefabcdef0123", "OPENAI_API_KEY": "sk-abcdefabcdef0123"}
    result = run_py("llm_judge", "--task_ids", "12", "--gpus", "none", **{**JUDGE_UNSET, **keys})
    assert result.exit_code == 2  # before: past the door, to "cannot reach the Docker engine"
    assert result.stderr == f"[run.py] error: {JUDGE_URL} (only --check runs without it)\n"


@pytest.mark.integration  # the doctor asks `docker compose version`, a child process
def test_the_doctors_settings_row_names_the_missing_judge_url():
    keys = {"HF_TOKEN": "hf_abcdefabcdef0123", "OPENAI_API_KEY": "sk-abcdefabcdef0123"}
    closed = "http://127.0.0.1:9"  # the Fed Ledger and the Hub: refused at once
    args = ["llm_judge", "--task_ids", "12", "--api-url", closed, "--timeout", "10"]
    env = {"DOCKER_HOST": NOWHERE, "HF_ENDPOINT": closed, **JUDGE_UNSET, **keys}
    result = CliRunner().invoke(host_doctor, args, env=env)
    [row] = [line for line in result.stdout.splitlines() if line.startswith("settings ")]
    assert row.split()[1] == "failed" and JUDGE_URL in row, row  # before: ok
    assert result.exit_code == 1


# -- workers that would sit idle --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (["lora", "--gpus", "0,1,2,3", "--task_ids", "11,12"], "4 workers share 2 task ids"),
        (["rl", "--workers", "3", "--task_ids", "21"], "3 workers share 1 task id:"),
        (["lora", "--gpus", "0,1,2,3", "--task_ids", "11,12,13,14"], None),
        (["rl", "--task_ids", "21"], None),
    ],
)
def test_more_workers_than_task_ids_is_one_warning_line(args, warned):
    result = run_py(*args, "--plan")
    assert result.exit_code == 0, result.output
    assert all(json.loads(line)["index"] >= 0 for line in result.stdout.splitlines())
    if warned is None:
        assert result.stderr == ""
        return
    [line] = result.stderr.splitlines()  # before: nothing
    assert line.startswith(f"[run.py] warning: {warned}") and "sit idle" in line, line


# -- numbers and files refused at the door ----------------------------------------------------


@pytest.mark.parametrize(
    ("command", "args", "env", "said"),
    [
        ("validator", [], {"ASSIGNMENT_LOOKUP_INTERVAL": "nan"}, "--assignment-lookup-interval"),
        ("validator", ["--time-sleep", "inf"], {}, "--time-sleep': 'inf'"),
        ("validator", ["--hf-cache-max-gb", "nan"], {}, "--hf-cache-max-gb': 'nan'"),
        ("validator", ["--health-stale-seconds", "-inf"], {}, "--health-stale-seconds'"),
        ("validator", ["--api-backoff", "NaN"], {}, "--api-backoff': 'NaN'"),
        ("doctor", ["nosuch", "--timeout", "nan"], {}, "--timeout': 'nan'"),
        ("run.py", ["--time-sleep", "nan"], {}, "--time-sleep': 'nan'"),
        ("run.py", [], {"ASSIGNMENT_LOOKUP_INTERVAL": "inf"}, "--assignment-lookup-interval"),
        ("run.py", ["--restart-delay", "inf"], {}, "--restart-delay': 'inf'"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_at_the_door(command, args, env, said):
    """Before, nan passed every range: ASSIGNMENT_LOOKUP_INTERVAL=nan made one lookup, then a
    busy loop that /healthz called healthy."""
    if command == "run.py":
        result = run_py("rl", "--task_ids", "12", *args, "--plan", **env)
        output = result.stderr
    else:
        main = validator_main if command == "validator" else inner_doctor
        result = CliRunner().invoke(main, args if command == "doctor" else ["fixture", *args],
                                    env=env)  # fmt: skip
        output = result.output
    assert result.exit_code == 2, output
    assert said in output and "is not a finite number" in output, output


def _deep(path: Path) -> None:
    path.write_text("[" * 5000 + "]" * 5000)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda p: p.symlink_to("/dev/zero"),
            "(a link to /dev/zero) is a character device, not a regular file: give a JSON file",
        ),  # fmt: skip
        (_fifo, " is a FIFO, not a regular file"),
        (lambda p: p.mkdir(), " is a folder, not a regular file"),
        (_deep, ": JSON nested deeper than 32 levels"),
        (lambda p: p.write_text('{"seed": NaN}'), ": NaN is not a number JSON has"),
        (lambda p: p.write_text(" " * (1 << 20) + "{}"), ": over 1048576 bytes"),
        (lambda p: p.symlink_to(p.parent / "gone.json"), ".json (a link to "),
    ],
    ids=["dev-zero", "fifo", "folder", "deep", "nan", "big", "dangling"],
)
def test_a_config_that_is_no_plain_json_file_is_one_line_before_docker(tmp_path, make, said):
    """Before, a link to /dev/zero was read until memory ran out, a FIFO waited for a writer,
    5,000 levels were a RecursionError, and a dangling link was skipped as no file."""
    configs = tmp_path / "configs"
    (configs / "tasks").mkdir(parents=True)
    make(configs / "tasks" / "12.json")
    result = run_py("rl", "--task_ids", "12", "--config-dir", str(configs), "--plan")
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"[run.py] error: {configs}/tasks/12.json") and said in line, line


# -- --check: whose fault, one line each ------------------------------------------------------


def write_input(tmp_path: Path, **fields: str) -> str:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(fields))
    return str(path)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_with_the_hub_unreachable_is_one_line_and_exit_3(tmp_path, cli):
    """Before: exit 1, "validator crashed" and a traceback of 108 lines."""
    cli.env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    result = cli.run(["fixture", "--check", write_input(tmp_path, hg_repo_id="hub/x")])
    assert result.returncode == 3, result.stderr
    [line] = error_lines(result.stderr)
    assert "Traceback" not in result.stderr and "crashed" not in result.stderr
    assert "transient fault, not the submission's: TransientError: submission hub/x: could " \
        "not reach the Hub" in line  # fmt: skip
    assert line.endswith("(the Hub: HF_ENDPOINT; a judge: OPENAI_BASE_URL; a proxy), then run "
                         "--check again")  # fmt: skip


def test_check_with_a_missing_field_names_it_and_the_host_path(tmp_path, cli):
    """Before: pydantic's text, its line breaks as `\\n`, the container's path and pydantic's
    URL. run.py names the file it mounted (the unit test below)."""
    cli.env[CHECK_SOURCE_ENV] = "/home/operator/input.json"
    result = cli.run(["fixture", "--check", write_input(tmp_path, revision="main")])
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.endswith(
        "error: /home/operator/input.json: assignment input does not fit FixtureModule: "
        "missing field 'hg_repo_id'"
    ), line


def test_run_py_names_the_check_input_by_the_path_it_mounted(tmp_path):
    given = tmp_path / "in.json"
    given.write_text("{}")
    spec = ContainerSpec("image", "fixture", [], {}, tmp_path, {}, check_file=given)
    assert spec.environment()[CHECK_SOURCE_ENV] == str(given.resolve())
    no_check = ContainerSpec("image", "fixture", [], {}, tmp_path, {})
    assert CHECK_SOURCE_ENV not in no_check.environment()


def test_a_hub_answer_nested_too_deep_is_the_senders_not_a_recursion_error(tmp_path, cli):
    """huggingface_hub parses the listing itself: before, 20,000 levels were a RecursionError
    in its `.json()`, an unexpected error of the module."""
    deep = b"[" * 20_000 + b"]" * 20_000

    def respond(_request):
        yield answer(deep, headers=["Content-Type: application/json"])

    with HostileServer(respond) as hub:
        cli.env["HF_ENDPOINT"] = hub.url
        result = cli.run(["fixture", "--check", write_input(tmp_path, hg_repo_id="hub/deep")])
    assert result.returncode == 1, result.stderr
    assert "RecursionError" not in result.stderr and "Traceback" not in result.stderr
    [line] = error_lines(result.stderr)
    assert "the submission would be marked failed: " in line
    assert "the answer nests deeper than the 64 levels any answer may have" in line, line


# -- log lines --------------------------------------------------------------------------------


def test_control_characters_reach_no_log_line_raw(tmp_path, cli):
    """A submission's repo id in the module's INFO line: ESC, CSI as one C1 character, CR and a
    Unicode line break, each written as its escape (before, C1 went through raw)."""
    repo = "ok/\x1b[2J\x9b31m\r\u2028x"
    result = cli.run(["fixture", "--check", write_input(tmp_path, hg_repo_id=repo)])
    assert result.returncode == 0, result.stderr
    for raw in ("\x1b", "\x9b", "\r", "\u2028"):
        assert raw not in result.stderr
    assert "scoring ok/\\x1b[2J\\x9b31m\\r\\u2028x at revision main" in result.stderr


@pytest.mark.parametrize("debug", [False, True])
def test_a_traceback_never_follows_an_info_line(debug):
    """A record below WARNING that carries an exception (a library's): its line alone, and the
    traceback in a DEBUG record of its own under --debug; a traceback under an ERROR keeps its
    lines, each escaped and indented, so that an exception's text cannot forge a record."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter(debug))
    log = logging.getLogger("tests.door_edges")
    log.addHandler(handler)
    log.propagate, log.level = False, logging.DEBUG
    try:
        raise ValueError("bad\n2026-01-01 00:00:00,000 INFO validator.runner: forged\x9b")
    except ValueError:
        log.info("retrying %s", "x", exc_info=True)
        log.error("failed", exc_info=True)
    finally:
        log.removeHandler(handler)
        log.propagate, log.level = True, logging.NOTSET
    lines = stream.getvalue().splitlines()
    records = [line for line in lines if not line.startswith("    ")]
    levels = [line.split(" ")[2] for line in records]
    assert levels == (["INFO", "DEBUG", "ERROR"] if debug else ["INFO", "ERROR"]), lines
    assert records[0].endswith("retrying x" if debug else "retrying x (its traceback with --debug)")
    assert "    Traceback (most recent call last):" in lines
    assert "    2026-01-01 00:00:00,000 INFO validator.runner: forged\\x9b" in lines

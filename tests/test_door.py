"""The door: run.py checks every option, the validator's included, every task id and
every config file before it touches Docker (`--plan` too), in one line; the validator runs each
module's own start-up checks before its first lookup; a green doctor is followed by a validator
that starts; a host whose NVIDIA driver is too old for the module's CUDA is stopped in one line.
run.py runs in this process (click's runner) with DOCKER_HOST pointing nowhere: a test that
reached the engine would say so."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat

import click
import pytest
from click.testing import CliRunner

from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import (
    loop_args,
    run_validator,
    start_validator,
    validator_env,
    wait_for,
    write_config,
)
from launcher.commands.doctor import doctor as host_doctor
from launcher.commands.forwarded import FORWARDED_SECTION, NOT_FORWARDED, forwarded_args
from launcher.commands.run import FORWARDED, run
from launcher.doctor import rows as doctor_rows
from tests.helpers.run_py import run_py
from validator.doctor.command import main as inner_doctor
from validator.entrypoint import RunOptions
from validator.entrypoint import main as validator_main
from validator.spec import REPO_ROOT, find_module_folders, load_spec

LOOKUP = "/api/v1/tasks/request-validation-assignment/12"
TYPES = {"lora": "training", "rl": "rl"}  # each module's tasks in the Fed Ledger's list


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--gpu", "0"], {}, "No such option '--gpu'. (Did you mean one of: '--gpus'"),
        (["--task-id", "12"], {}, "(Did you mean one of: '--task-ids', '--task_ids'?)"),
        (["--gpu", "0"], {}, "(see python run.py --help)"),
        (["--max-assignment", "3"], {}, "Did you mean '--max-assignments'?"),
        (["--time-sleep", "soon"], {}, "Invalid value for '--time-sleep': 'soon'"),
        (["--state-dir", "/x"], {}, "No such option '--state-dir'. (Did you mean one of"),
        (["--task_ids", "12,abc"], {}, "'abc' is not a task id: give the Fed Ledger's task ids"),
        ([], {"TASK_IDS": "abc"}, "'abc' is not a task id"),
        (["--json"], {}, "--json is the report's: python run.py report MODULE --json"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2_before_docker(args, env, said):
    """Before, an option run.py did not know went to the validator unchecked, and failed only
    once the container ran, after a first image build of minutes."""
    result = run_py("lora", *(["--task_ids", "12"] if "TASK_IDS" not in env else []), *args,
                    "--plan", **env)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # no plan
    [line] = result.stderr.splitlines()
    assert line.startswith("[run.py] error: ") and said in line, line


def test_configs_are_checked_on_the_host_naming_its_file_and_the_key_meant(tmp_path):
    configs = tmp_path / "configs"
    (configs / "tasks").mkdir(parents=True)
    (configs / "rl.json").write_text(json.dumps({"seeed": 1}))
    result = run_py("rl", "--task_ids", "12", "--config-dir", str(configs), "--plan")
    assert result.exit_code == 2
    assert f"{configs}/rl.json: unknown key 'seeed' (did you mean 'seed'?)" in result.stderr
    (configs / "rl.json").write_text("{}")
    (configs / "tasks" / "12.json").write_text(json.dumps({"supported_base_models": []}))
    result = run_py("lora", "--task_ids", "12", "--config-dir", str(configs), "--plan")
    assert result.exit_code == 2
    assert f"{configs}/tasks/12.json: key 'supported_base_models'" in result.stderr
    result = run_py("rl", "--task_ids", "13", "--config-dir", str(configs), "--plan")
    assert result.exit_code == 0, result.output  # only the files of the tasks given


def test_the_validators_options_go_on_as_given():
    result = run_py("rl", "--workers", "2", "--task_ids", "1,2", "--http-port", "9000", "--plan")
    assert [json.loads(line)["http_port"] for line in result.stdout.splitlines()] == [9000, 9010]
    context = run.make_context(
        "run.py", ["rl", "--task_ids", "1", "--time-sleep", "3", "--debug", "--no-protocol-watch"]
    )
    passthrough = forwarded_args(context, FORWARDED.values())
    assert passthrough == ["--time-sleep", "3.0", "--debug", "--no-protocol-watch"]


def test_every_validator_option_is_run_pys_and_help_lists_them_the_modules_and_commands():
    """One definition: each of the validator's options is an option of run.py (its own where
    run.py has one of that name, the validator's otherwise), or refused naming what to give."""
    own = {name for param in run.params for name in param.opts}
    for param in validator_main.params:
        if isinstance(param, click.Option):
            assert set(param.opts) <= own or param.name in NOT_FORWARDED, param.opts
    page = run_py("--help").output
    forwarded = page.split(FORWARDED_SECTION, 1)[1]
    for name in ("--http-port", "--hf-cache-max-gb", "--min-free-mb", "--no-protocol-watch",
                 "--records-keep", "--max-assignments", "--debug"):  # fmt: skip
        assert name in forwarded, name
    assert "--gpus" not in forwarded and "--api-retries" not in page  # hidden stays hidden
    assert ", ".join(find_module_folders()) in page
    assert "python run.py doctor [MODULE]" in page and "python run.py report MODULE" in page


def test_the_validators_command_line_is_one_frozen_options_object():
    """Each parameter of `python -m validator` is a field of RunOptions, and nothing else is:
    the run (the door, --check, build_loop) reads that one object, which nothing changes."""
    assert {f.name for f in dataclasses.fields(RunOptions)} == {
        param.name for param in validator_main.params
    }
    context = validator_main.make_context("validator", ["fixture", "--task_ids", "3,3,12"])
    options = RunOptions(**context.params)
    assert (options.module, options.task_ids, options.time_sleep) == ("fixture", ["3", "12"], 180)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.time_sleep = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("command", [host_doctor, inner_doctor], ids=["run.py", "validator"])
def test_every_doctor_option_has_help(command):
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, param.opts


def stand_in_nvidia_smi(tmp_path, version: str) -> str:
    """A `nvidia-smi` that answers the driver query with `version`: what cannot exist here."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho {version}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return f"{folder}:{os.environ['PATH']}"


@pytest.mark.integration  # the stand-in nvidia-smi is a child process
def test_a_driver_too_old_for_the_modules_cuda_stops_run_py_and_fails_the_doctor(
    tmp_path, monkeypatch
):
    secrets = {"FLOCK_API_KEY": "flock-key-0123456789", "HF_TOKEN": "hf_token0123456789"}
    old = stand_in_nvidia_smi(tmp_path, "535.183.01")
    result = run_py("lora", "--gpus", "0", "--task_ids", "12", PATH=old, **secrets)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        "[run.py] error: NVIDIA driver 535.183.01: lora's CUDA 13.0 needs driver R580 "
        "(580.65.06) or newer -> upgrade the driver (R580 or newer), or run without GPUs: "
        "--gpus none"
    ]
    monkeypatch.setenv("PATH", old)
    row = doctor_rows.driver_row(load_spec(REPO_ROOT / "modules" / "lora"))
    assert row.result == "failed" and row.detail.startswith("NVIDIA driver 535.183.01: lora's")
    assert run_py("lora", "--gpus", "none", "--task_ids", "12", PATH=old, **secrets).exit_code == 3
    new = stand_in_nvidia_smi(tmp_path, "580.82.07")
    result = run_py("lora", "--gpus", "0", "--task_ids", "12", PATH=new, **secrets)
    assert result.exit_code == 3 and "cannot reach the Docker engine" in result.stderr  # past it


def test_module_setup_fails_before_any_lookup(tmp_path):
    """The module's own start-up checks run before the first lookup: exit 3, the Fed Ledger
    asked nothing. Before, they ran when the first assignment's scoring started the module."""
    write_config(tmp_path, "fixture", {"setup_problem": "set FIXTURE_URL: the fixture's server"})
    env = validator_env(tmp_path)
    with Simulator({"tasks": [task(12, ["ok/abc"])]}, tmp_path) as sim:
        args = loop_args("fixture", sim.api_url, "12", "--max-assignments", "1")
        result = run_validator(args, env)
        assert result.returncode == 3, result.stderr
        assert "module fixture's start-up checks: set FIXTURE_URL" in result.stderr
        assert sim.state()["requests"] == []


@pytest.mark.parametrize("module", ["lora", "rl"])
def test_a_green_doctor_is_followed_by_a_validator_that_starts(tmp_path, module):
    env = validator_env(tmp_path)
    write_config(
        tmp_path, module, {"supported_base_models": ["tiny/base"]} if module == "lora" else {}
    )
    with (
        Simulator({"tasks": [task(12, [], task_type=TYPES[module])]}, tmp_path) as sim,
        LocalHub(tmp_path / "hub") as hub,
    ):
        hub.add_repo("tiny/base", {"config.json": b"{}"})
        env = {**env, "HF_ENDPOINT": hub.endpoint, "FLOCK_API_URL": sim.api_url}
        # The HF cache's floor (40 GiB, for a real base) is lowered to this base's few bytes:
        # what this machine's disk has free is not what the test is about.
        doctor = CliRunner().invoke(
            inner_doctor, [module, "--task_ids", "12", "--hf-min-free-gb", "0.001"], env=env
        )
        assert doctor.exit_code == 0, doctor.output
        asked = len(sim.state()["requests"])
        process = start_validator(loop_args(module, sim.api_url, "12"), env, tmp_path / "log")
        try:
            wait_for(
                lambda: any(r["path"] == LOOKUP for r in sim.state()["requests"][asked:]),
                120,
                f"{module}'s first lookup",
            )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)

"""The doctor: each check against a real server on 127.0.0.1 (the Fed Ledger
simulator, the local hub, a server that answers oddly) or the real Docker engine, its ok row and
the failing row of each fix; the key never shows; only the read-only task list is asked for;
every check within its deadline and an answer of the wrong shape a row, never a traceback.
The module's own start-up checks (llm_judge's judge) are in tests/llm_judge/test_judge_setup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import docker
import pytest
from click.testing import CliRunner

from devkit.hf_hub import LocalHub
from devkit.simulator.process import Simulator, task
from launcher.commands.doctor import doctor as host_doctor_command
from launcher.doctor import host as host_doctor
from launcher.doctor import rows as doctor_rows
from tests.helpers.odd_server import TRICKLE, OddServer
from validator.doctor.checks import clock_row
from validator.doctor.command import main as inner_doctor
from validator.doctor.rows import CHECK_FAILED
from validator.spec import REPO_ROOT, load_spec

KEY = "flock-SECRET-key-0123456789"
HF_TOKEN = "hf_SECRETtoken0123456789"
BASES = ["tiny/open-base", "tiny/gated-base"]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    data = {"tasks": [task(12, ["alice/adapter"])]}
    with Simulator(data, tmp_path_factory.mktemp("sim"), api_key=KEY) as sim:
        yield sim


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with LocalHub(tmp_path_factory.mktemp("hub")) as served:
        served.add_repo(BASES[0], {"config.json": b"{}"})
        served.add_repo(BASES[1], {"config.json": b"{}"}, require_token=HF_TOKEN)
        yield served


@pytest.fixture
def config_dir(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    for module in ("lora", "llm_judge"):
        (folder / f"{module}.json").write_text(json.dumps({"supported_base_models": BASES}))
    return folder


def rows_of(output: str) -> dict[str, tuple[str, str]]:
    """check -> (result, text) from the table (the header and the summary left out)."""
    rows = {}
    for line in output.splitlines()[1:-1]:
        check, _, rest = line.partition("  ")
        result, _, text = rest.strip().partition("  ")
        rows[check.strip()] = (result.strip(), text.strip())
    return rows


def run_inner(module: str, args: list[str], env: dict[str, str]):
    result = CliRunner().invoke(inner_doctor, [module, *args], env=env)
    return result.exit_code, result.output


def lora_env(ledger, hub, key=KEY, token=HF_TOKEN) -> dict[str, str]:
    return {
        "FLOCK_API_KEY": key,
        "HF_TOKEN": token,
        "FLOCK_API_URL": ledger.api_url,
        "HF_ENDPOINT": hub.endpoint,
    }


def test_all_good_is_exit_0_and_asks_only_the_task_list(ledger, hub, config_dir, tmp_path):
    before = len(ledger.state()["requests"])
    code, output = run_inner(
        "lora",
        [
            "--config-dir",
            str(config_dir),
            "--state-dir",
            str(tmp_path / "state"),
            "--hf-cache-dir",
            str(tmp_path),
            "--hf-min-free-gb",
            "0.001",
            "--task_ids",
            "12",
        ],
        lora_env(ledger, hub),
    )
    rows = rows_of(output)
    assert code == 0, output
    assert {check: result for check, (result, _) in rows.items()} == {
        "settings": "ok",
        "configs": "ok",
        "Fed Ledger": "ok",
        "clock": "ok",
        "task types": "ok",
        "disk: journal": "ok",
        "disk: HF cache": "ok",
        "HF token": "ok",
        "HF bases": "ok",
        "module setup": "ok",
    }
    assert "2/2 reachable" in rows["HF bases"][1]
    assert KEY not in output and HF_TOKEN not in output
    asked = [(r["method"], r["path"]) for r in ledger.state()["requests"][before:]]
    assert asked == [("GET", "/api/v1/tasks/list")]  # never a lookup: no assignment taken
    # the gated base was asked with the token and answered
    assert ("HEAD", f"/{BASES[1]}/resolve/main/config.json", 200) in hub.requests


def test_wrong_key_fails_naming_the_variable_and_never_shows_it(ledger, hub, config_dir):
    wrong = "flock-WRONG-key-9876543210"
    code, output = run_inner(
        "lora", ["--config-dir", str(config_dir)], lora_env(ledger, hub, key=wrong)
    )
    result, text = rows_of(output)["Fed Ledger"]
    assert code == CHECK_FAILED
    assert result == "failed" and "FLOCK_API_KEY" in text and "401" in text
    assert wrong not in output


def test_gated_base_without_access_and_refused_token(ledger, hub, config_dir):
    code, output = run_inner(
        "lora", ["--config-dir", str(config_dir)], lora_env(ledger, hub, token="")
    )
    rows = rows_of(output)
    assert code == CHECK_FAILED
    assert rows["HF token"][0] == "failed" and "HF_TOKEN" in rows["HF token"][1]
    assert rows["HF bases"][0] == "failed"
    assert f"gated, no access: {BASES[1]}" in rows["HF bases"][1]
    code, output = run_inner(
        "lora", ["--config-dir", str(config_dir)], lora_env(ledger, hub, token="hf_wrong_0000000")
    )
    assert rows_of(output)["HF token"][0] == "failed"
    assert "refused" in rows_of(output)["HF token"][1]


def test_hub_unreachable(ledger, config_dir):
    class Closed:
        endpoint = "http://127.0.0.1:9"

    code, output = run_inner("lora", ["--config-dir", str(config_dir)], lora_env(ledger, Closed))
    result, text = rows_of(output)["HF bases"]
    assert code == CHECK_FAILED
    assert result == "failed" and "unreachable" in text and "HF_ENDPOINT" in text


def test_disk_under_the_floor(ledger, hub, config_dir, tmp_path):
    code, output = run_inner(
        "rl",
        [
            "--config-dir",
            str(config_dir),
            "--state-dir",
            str(tmp_path),
            "--min-free-mb",
            str(10**9),
        ],
        lora_env(ledger, hub),
    )
    result, text = rows_of(output)["disk: journal"]
    assert code == CHECK_FAILED
    assert result == "failed" and "under the 1000000000 MiB floor" in text


def test_clock_skew_is_a_warning():
    date = "Fri, 27 Nov 2026 01:00:00 GMT"
    assert clock_row(date, 1795741200.0 + 3).result == "ok"
    skewed = clock_row(date, 1795741200.0 + 120)
    assert skewed.result == "warning" and "+120 s" in skewed.detail


def test_gpu_memory_against_the_need():
    smi = "0, NVIDIA H100, 81000\n1, NVIDIA H100, 2000\n"
    assert doctor_rows.gpu_memory_row(smi, 16).result == "failed"
    assert "GPU 1 (2 GiB free)" in doctor_rows.gpu_memory_row(smi, 16).detail
    assert doctor_rows.gpu_memory_row(smi.splitlines()[0], 16).result == "ok"


@pytest.mark.docker
def test_host_rows_against_the_real_engine(engine):
    client = docker.from_env()
    spec = load_spec(REPO_ROOT / "modules" / "lora")
    runtimes = client.info().get("Runtimes") or {}
    gpu = doctor_rows.gpu_row(client, spec, None, 16)
    if "nvidia" not in runtimes:  # this CI host: the row says why it cannot pass
        assert gpu.result == "failed" and "no NVIDIA runtime" in gpu.detail
        assert "Container Toolkit" in gpu.fix
    else:
        assert gpu.result == "warning"  # no image given to look from
    tag = host_doctor.image_tag(spec)
    assert doctor_rows.image_row(client, spec, tag).result == "warning"
    assert "--build-only" in doctor_rows.image_row(client, spec, tag).fix
    # Any image the engine holds stands in for a build of these sources.
    image = next(image for image in client.images.list() if image.tags)
    image.tag(tag)
    try:
        row = doctor_rows.image_row(client, spec, tag)
        assert row.result == "ok" and tag in row.detail
    finally:
        client.images.remove(tag)


@pytest.mark.docker
def test_run_py_doctor_in_a_child(ledger, engine, tmp_path):
    """run.py's dispatch, the host rows and the inner ones in one table; usage is exit 2."""
    env = {**os.environ, "FLOCK_API_KEY": KEY, "FLOCK_API_URL": ledger.api_url}
    done = subprocess.run(
        [sys.executable, "run.py", "doctor", "rl", "--min-free-gb", "0.001"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = rows_of(done.stdout)
    assert rows["Docker engine"][0] == "ok", done.stdout + done.stderr
    assert rows["GPU"] == ("ok", "not needed: rl runs on the CPU")
    assert rows["Fed Ledger"][0] == "ok"
    assert KEY not in done.stdout + done.stderr
    failed = any(result == "failed" for result, _ in rows.values())
    assert done.returncode == (CHECK_FAILED if failed else 0)
    unknown = subprocess.run(
        [sys.executable, "-m", "validator", "doctor", "nosuchmodule"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and "unknown module" in unknown.stderr


def test_every_check_answers_within_its_deadline_and_a_wrong_shape_is_a_row(hub, config_dir):
    """A Fed Ledger that trickles its task list is a failed row when the deadline passes (not
    a doctor that waits as long as the server goes on), the other rows come all the same; a
    task list of the wrong shape names what is wrong."""
    with OddServer({"/api/v1/tasks/list": TRICKLE, "/odd/tasks/list": [{"id": 12}, 5]}) as odd:
        env = lora_env(SimpleNamespace(api_url=odd.root_url + "/api/v1"), hub)
        args = ["--config-dir", str(config_dir), "--task_ids", "12", "--timeout", "2"]
        code, output = run_inner("lora", args, env)
        rows = rows_of(output)
        assert code == CHECK_FAILED, output
        assert rows["Fed Ledger"][0] == rows["clock"][0] == "failed"
        assert rows["Fed Ledger"][1].startswith("no answer within 2 s"), output
        assert rows["HF bases"][0] == "ok" and rows["configs"][0] == "ok"
        code, output = run_inner("lora", [*args, "--api-url", odd.root_url + "/odd"], env)
        result, text = rows_of(output)["Fed Ledger"]
        assert result == "failed" and "not a task list: [1]: Input should be" in text, output
        assert "Traceback" not in output


def test_a_green_doctor_needs_valid_configs_and_every_setting(ledger, hub, config_dir):
    """An unknown key in a config is a failed row naming the file and the key meant
    (the validator stops on it at start), every missing setting is named at once, and the
    module's own checks (here the fixture's) run as the validator runs them."""
    (config_dir / "tasks").mkdir()
    (config_dir / "tasks" / "12.json").write_text(json.dumps({"scael": 2}))
    env = {"FLOCK_API_URL": ledger.api_url, "FLOCK_API_KEY": ""}
    code, output = run_inner("fixture", ["--config-dir", str(config_dir), "--task_ids", "12"], env)
    rows = rows_of(output)
    assert code == CHECK_FAILED
    assert rows["configs"][0] == "failed"
    assert (
        f"{config_dir}/tasks/12.json: unknown key 'scael' (did you mean 'scale'?)"
        in (rows["configs"][1])
    )
    assert rows["module setup"][0] == "skipped"  # its configs first
    code, output = run_inner("fixture", ["--config-dir", str(config_dir)], env)
    assert rows_of(output)["settings"] == (
        "failed",
        "missing --task_ids / TASK_IDS; missing --flock-api-key / FLOCK_API_KEY -> set them in "
        "the environment (or .env) or give their options",
    )
    (config_dir / "fixture.json").write_text(json.dumps({"setup_problem": "no FIXTURE_URL set"}))
    code, output = run_inner("fixture", ["--config-dir", str(config_dir)], env)
    result, text = rows_of(output)["module setup"]
    assert result == "failed" and "module fixture's start-up checks: no FIXTURE_URL set" in text


def test_with_the_engine_down_every_check_that_needs_it_is_a_row(ledger, config_dir):
    """With the Docker engine down, each row that needs it is still a row (8 rows, not 5)
    that says what it needs; the others run as usual."""
    env = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "FLOCK_API_KEY": KEY,
           "FLOCK_API_URL": ledger.api_url}  # fmt: skip
    args = ["rl", "--config-dir", str(config_dir), "--task_ids", "12", "--timeout", "20"]
    result = CliRunner().invoke(host_doctor_command, args, env=env)
    rows = rows_of(result.output)
    assert result.exit_code == CHECK_FAILED
    assert rows["Docker engine"][0] == "failed"
    for check in ("GPU", "image", "disk: Docker volumes", "journal volumes", "module setup"):
        found, text = rows[check]
        assert found == "skipped" and text.startswith("needs the Docker engine"), (check, text)
    assert rows["Fed Ledger"][0] == "ok" and rows["configs"][0] == "ok"
    assert rows["settings"] == ("ok", "task ids 12; FLOCK_API_KEY set")
    # Task 12 is a lora task (`training`): run.py's doctor judges it as the validator would.
    found, text = rows["task types"]
    assert found == "failed" and "python run.py lora --task_ids 12" in text, text

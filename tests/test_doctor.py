"""The doctor (issue 34): each check against a real server on 127.0.0.1 (the Fed Ledger
simulator, the local hub, the local judge) or the real Docker engine, its ok row and the failing
row of each fix; the key never shows; only the read-only task list is asked for."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker
import pytest
from click.testing import CliRunner

from devkit.hf_hub import LocalHub
from devkit.judge_server import LocalJudge
from devkit.simulator.process import Simulator, task
from launcher import doctor as host_doctor
from validator.doctor import main as inner_doctor
from validator.observe.doctor import CHECK_FAILED
from validator.observe.doctor_checks import (
    Settings,
    clock_row,
    judge_texts_row,
    judge_texts_source,
)
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
        "Fed Ledger": "ok",
        "clock": "ok",
        "disk: journal": "ok",
        "disk: HF cache": "ok",
        "HF token": "ok",
        "HF bases": "ok",
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


def test_judge_models_listed_or_missing(ledger, hub, config_dir, tmp_path):
    with LocalJudge(models=["judge-a"]) as judge:
        env = {
            **lora_env(ledger, hub),
            "OPENAI_BASE_URL": judge.endpoint,
            "OPENAI_API_KEY": judge.api_key,
        }
        args = ["--config-dir", str(config_dir), "--state-dir", str(tmp_path)]
        code, output = run_inner("llm_judge", [*args, "--judge-model", "judge-a"], env)
        assert rows_of(output)["judge endpoint"][0] == "ok", output
        code, output = run_inner("llm_judge", [*args, "--judge-model", "judge-zz"], env)
        rows = rows_of(output)
        assert code == CHECK_FAILED
        assert rows["judge endpoint"][0] == "failed" and "judge-zz" in rows["judge endpoint"][1]
        assert judge.api_key not in output
        code, output = run_inner("llm_judge", args, {**env, "OPENAI_API_KEY": "sk-wrong-000000"})
        assert rows_of(output)["judge endpoint"] == ("failed", "HTTP 401 -> check OPENAI_API_KEY")
        assert "sk-wrong-000000" not in output


class _Texts(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        found = self.path == "/texts/prompt.py"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_judge_texts_fetched_cached_or_neither(config_dir, tmp_path):
    """A prompt_source on 127.0.0.1 (the module takes plain http there): it answers; it does
    not but the module's cache file (keyed by the folder) stands in; neither: failed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Texts)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    folder = f"http://127.0.0.1:{server.server_address[1]}/texts/"
    config = json.loads((config_dir / "llm_judge.json").read_text())
    (config_dir / "llm_judge.json").write_text(json.dumps({**config, "prompt_source": folder}))
    spec = load_spec(REPO_ROOT / "modules" / "llm_judge")
    settings = Settings(spec, KEY, None, config_dir=config_dir, state_dir=tmp_path)
    try:
        row = judge_texts_row(settings)
        assert row.result == "ok" and folder in row.detail
    finally:
        server.shutdown()
        server.server_close()
    row = judge_texts_row(settings)
    assert row.result == "failed" and "prompt_source: builtin" in row.fix
    key = hashlib.sha256(folder.encode()).hexdigest()[:32]
    (tmp_path / f"judge-texts-{key}.json").write_text("{}")
    assert judge_texts_row(settings).result == "warning"
    # By default the texts come from the pinned commit of the network's folder.
    default = Settings(spec, KEY, None, config_dir=REPO_ROOT / "configs", state_dir=tmp_path)
    pin = spec.protocol
    assert judge_texts_source(default) == (
        f"https://raw.githubusercontent.com/{pin.repo}/{pin.commit}/{pin.path}/"
    )


def test_clock_skew_is_a_warning():
    date = "Fri, 27 Nov 2026 01:00:00 GMT"
    assert clock_row(date, 1795741200.0 + 3).result == "ok"
    skewed = clock_row(date, 1795741200.0 + 120)
    assert skewed.result == "warning" and "+120 s" in skewed.detail


def test_gpu_memory_against_the_need():
    smi = "0, NVIDIA H100, 81000\n1, NVIDIA H100, 2000\n"
    assert host_doctor.gpu_memory_row(smi, 16).result == "failed"
    assert "GPU 1 (2 GiB free)" in host_doctor.gpu_memory_row(smi, 16).detail
    assert host_doctor.gpu_memory_row(smi.splitlines()[0], 16).result == "ok"


@pytest.mark.docker
def test_host_rows_against_the_real_engine(engine):
    client = docker.from_env()
    spec = load_spec(REPO_ROOT / "modules" / "lora")
    runtimes = client.info().get("Runtimes") or {}
    gpu = host_doctor.gpu_row(client, spec, None, 16)
    if "nvidia" not in runtimes:  # this CI host: the row says why it cannot pass
        assert gpu.result == "failed" and "no NVIDIA runtime" in gpu.detail
        assert "Container Toolkit" in gpu.fix
    else:
        assert gpu.result == "warning"  # no image given to look from
    tag = host_doctor.image_tag(spec)
    assert host_doctor.image_row(client, spec, tag).result == "warning"
    assert "--build-only" in host_doctor.image_row(client, spec, tag).fix
    # Any image the engine holds stands in for a build of these sources.
    image = next(image for image in client.images.list() if image.tags)
    image.tag(tag)
    try:
        row = host_doctor.image_row(client, spec, tag)
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


def test_judge_texts_on_the_host_leave_the_cache_to_the_container(config_dir):
    """run.py doctor cannot see the state volume: an unreachable source is a warning there."""
    config = json.loads((config_dir / "llm_judge.json").read_text())
    (config_dir / "llm_judge.json").write_text(
        json.dumps({**config, "prompt_source": "http://127.0.0.1:9/texts/"})
    )
    spec = load_spec(REPO_ROOT / "modules" / "llm_judge")
    row = judge_texts_row(Settings(spec, KEY, None, config_dir=config_dir))
    assert row.result == "warning" and "in the container" in row.detail

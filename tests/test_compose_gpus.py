"""compose.gpus.yaml: one service per GPU from a host file, checked against the specs and, with
a real Compose v2, by `docker compose config`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from devkit.docker_env import launcher_env
from launcher.deploy.compose import write_compose
from launcher.deploy.compose_gpus import (
    GPUS_FILE,
    HOSTS_FILE,
    PORT_STEP,
    load_hosts,
    render_gpus,
)
from launcher.deploy.compose_services import specs_with_files
from launcher.fleet.plan import FleetOptions, plan
from tests.helpers.run_py import run_py
from validator.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_module(root: Path, name: str, spec_text: str) -> None:
    folder = root / "modules" / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("MODULE = None\n")
    (folder / "module.yaml").write_text(spec_text)


def test_the_committed_per_gpu_file_is_what_the_specs_and_the_host_file_say():
    specs = specs_with_files(REPO_ROOT)
    text = render_gpus(specs, load_hosts(REPO_ROOT / HOSTS_FILE, specs))
    assert (REPO_ROOT / GPUS_FILE).read_text() == text, "run `make compose`"


def test_a_host_file_change_makes_the_per_gpu_file_stale(tmp_path, capsys):
    write_module(tmp_path, "heavy", "name: heavy\ngpu: true\nstatus_port: 9200\n")
    hosts = tmp_path / HOSTS_FILE
    hosts.parent.mkdir(parents=True)
    hosts.write_text("heavy: [0]\n")
    assert write_compose(tmp_path, False, None, None) == 0
    assert write_compose(tmp_path, True, None, None) == 0
    hosts.write_text("heavy: [0, 1]\n")
    assert write_compose(tmp_path, True, None, None) == 1
    assert f"{GPUS_FILE} is not what the module specs say" in capsys.readouterr().err
    assert write_compose(tmp_path, False, None, None) == 0
    services = yaml.safe_load((tmp_path / GPUS_FILE).read_text())["services"]
    assert list(services) == ["validator-heavy-gpu0", "validator-heavy-gpu1"]


def test_each_worker_gets_one_gpu_its_shard_its_journal_and_its_port():
    specs = specs_with_files(REPO_ROOT)
    document = yaml.safe_load((REPO_ROOT / GPUS_FILE).read_text())
    services = document["services"]
    hosts = yaml.safe_load((REPO_ROOT / HOSTS_FILE).read_text())
    expected = [
        f"validator-{module}-gpu{gpu}" if gpus else f"validator-{module}"
        for module, gpus in hosts.items()
        for gpu in (gpus or [None])
    ]
    assert list(services) == expected
    for module, gpus in hosts.items():
        spec = specs[module]
        workers = gpus or [None]
        for shard, gpu in enumerate(workers):
            name = f"{module}-gpu{gpu}" if gpu is not None else module
            body = services[f"validator-{name}"]
            environment = body["environment"]
            assert environment["VALIDATOR_SHARD"] == f"{shard}/{len(workers)}"
            assert environment["TASK_IDS"].startswith(f"${{{module.upper()}_TASK_IDS:?")
            port = spec.status_port + shard * PORT_STEP
            assert environment["VALIDATOR_HTTP_PORT"] == str(port)
            assert f"127.0.0.1:{port}/healthz" in body["healthcheck"]["test"][-1]
            # The journal is the volume run.py gives worker `shard` on these GPUs:
            # one name, so that a host moves between the two with its journals.
            (key,) = [v.split(":")[0] for v in body["volumes"] if v.endswith(":/data/state")]
            options = FleetOptions(
                module, ",".join(map(str, gpus)) or None, spec.gpu, None, None, None,
                ",".join(str(k) for k in range(len(workers))), None, spec.status_port,
            )  # fmt: skip
            assert document["volumes"][key]["name"] == plan(options)[shard].state_volume
            assert body["stop_grace_period"] == f"{spec.stop_grace_seconds}s"
            for secret in spec.secrets:
                assert secret in environment
            if gpu is None:
                assert "deploy" not in body
            else:
                (device,) = body["deploy"]["resources"]["reservations"]["devices"]
                assert device["device_ids"] == [str(gpu)]
    ports = [s["environment"]["VALIDATOR_HTTP_PORT"] for s in services.values()]
    assert len(ports) == len(set(ports))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nosuch: [0]\n", "no module 'nosuch' with a spec"),
        ("lora: [0, 1]\nllm_judge: [1]\n", "GPU 1 is listed twice (lora, llm_judge)"),
        ("lora: [0, 0]\n", "GPU 0 is listed twice (lora, lora)"),
        ("rl: [0]\n", "rl is CPU-only (gpu: false); give it []"),
        ("lora: []\n", "lora needs a GPU per worker"),
        ("lora: [first]\n", "'first' is not a GPU index or GPU-<uuid>"),
        ('lora: ["0\\n"]\n', "'0\\n' is not a GPU index or GPU-<uuid>"),
        ("lora: [\u0663]\n", "'\u0663' is not a GPU index or GPU-<uuid>"),
        ("lora: 0\n", "lora: Input should be a valid list"),
        ("- lora\n", "must map module names to GPU lists"),
        ("lora: [0\n", "not valid YAML"),
    ],
)
def test_a_bad_host_file_is_one_line_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "host.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_hosts(path, specs_with_files(REPO_ROOT))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_command_reports_a_bad_host_file_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "host.yaml"
    path.write_text("rl: [3]\n")
    output = tmp_path / "compose.gpus.mine.yaml"
    assert write_compose(REPO_ROOT, False, path, output) == 2
    assert "rl is CPU-only" in capsys.readouterr().err
    assert not output.exists()


def test_another_host_file_needs_its_own_output(tmp_path):
    # Written over the committed compose.gpus.yaml, it would leave the repository stale.
    result = run_py("compose", "--repo", str(tmp_path), "--hosts", str(tmp_path / "h.yaml"))
    assert result.exit_code == 2
    assert "--hosts needs --gpus-output" in result.stderr


def test_colliding_status_ports_are_refused(tmp_path):
    write_module(tmp_path, "alpha", "name: alpha\ngpu: true\nstatus_port: 9100\n")
    write_module(tmp_path, "beta", "name: beta\ngpu: true\nstatus_port: 9110\n")
    specs = specs_with_files(tmp_path)
    with pytest.raises(ConfigError, match="status port 9110 of validator-beta-gpu2 is also"):
        render_gpus(specs, {"alpha": ["0", "1"], "beta": ["2"]})


def test_docker_compose_accepts_the_per_gpu_file(engine):
    env = launcher_env(LORA_TASK_IDS="1", LLM_JUDGE_TASK_IDS="2", RL_TASK_IDS="3")
    run = ["docker", "compose", "-f", GPUS_FILE, "config", "--format", "json"]
    result = subprocess.run(run, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    gpu1 = services["validator-lora-gpu1"]
    assert gpu1["environment"]["TASK_IDS"] == "1"
    assert gpu1["environment"]["VALIDATOR_SHARD"] == "1/2"
    (device,) = gpu1["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["1"]
    assert services["validator-llm_judge-gpu3"]["environment"]["TASK_IDS"] == "2"
    # Each module's task ids are its own, and required: one missing names itself.
    missing = {k: v for k, v in env.items() if k != "LLM_JUDGE_TASK_IDS"}
    result = subprocess.run(run, cwd=REPO_ROOT, env=missing, capture_output=True, text=True)
    assert result.returncode != 0
    assert "set LLM_JUDGE_TASK_IDS" in result.stderr

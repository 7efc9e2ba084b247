"""run.py and the module image against a real Docker engine and the Fed Ledger simulator; the
image also on its own, as a pod runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from devkit.docker_env import (
    LOCAL_BASE,
    launcher_env,
    make_module_repo,
    run_py_command,
    unique_volumes,
)
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import API_KEY, HF_TOKEN, wait_for
from tests.helpers.docker_env import require_engine

LABEL = "org.flock-validator.module=fixture"


@pytest.fixture(scope="module")
def engine():
    return require_engine()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory):
    # Start from no fixture image, so that the first run really builds (from cached layers).
    for image in engine.images.list(name="flock-validator-fixture"):
        engine.images.remove(image.id, force=True)
    return make_module_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture
def volumes(engine):
    names = unique_volumes()
    yield names
    for name in names[1::2]:
        try:
            engine.volumes.get(name).remove(force=True)
        except Exception:  # noqa: BLE001 - a volume never created is fine
            pass


def run_py(repo, *args, env=None, timeout=300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_py_command(repo, *args),
        env=env or launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def loop_args(sim, task_ids, *extra):
    return [
        "fixture",
        "--gpus",
        "none",
        "--task_ids",
        task_ids,
        "--api-url",
        sim.api_url,
        "--assignment-lookup-interval",
        "0.2",
        "--time-sleep",
        "0.3",
        *extra,
    ]


def fixture_containers(engine):
    return engine.containers.list(all=True, filters={"label": LABEL})


def check_input(tmp_path, **fields):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_check_builds_the_image_then_reuses_it(engine, repo, tmp_path):
    first = run_py(
        repo, "fixture", "--gpus", "none", "--check", check_input(tmp_path, hg_repo_id="ok/abc")
    )
    assert first.returncode == 0, first.stderr
    assert "building image" in first.stderr
    assert json.loads(first.stdout.strip().splitlines()[-1])["repo_length"] == 6
    # No --gpus: the fixture's spec asks for no GPU, so none is requested (CI has no runtime).
    second = run_py(repo, "fixture", "--check", check_input(tmp_path, hg_repo_id="ok/abcd"))
    assert second.returncode == 0, second.stderr
    assert "(gpus: none)" in second.stderr
    assert "(already built)" in second.stderr
    assert "building image" not in second.stderr
    assert second.stdout.strip() == json.dumps(
        {"loss": 0.07, "repo_length": 7, "context_length": 0}
    )


def test_image_is_labelled_non_root_and_free_of_secrets(engine, repo, tmp_path):
    result = run_py(
        repo, "fixture", "--gpus", "none", "--check", check_input(tmp_path, hg_repo_id="ok/a")
    )
    assert result.returncode == 0, result.stderr
    tag = result.stderr.split("starting fixture in ")[1].split()[0]
    image = engine.images.get(tag)
    labels = image.labels
    assert labels["org.flock-validator.module"] == "fixture"
    assert tag.endswith(":" + labels["org.flock-validator.source-hash"][:12])
    assert image.attrs["Config"]["User"] == "10001"
    uid = engine.containers.run(tag, entrypoint=["id", "-u"], remove=True, network_mode="host")
    assert uid.strip() == b"10001"
    baked = json.dumps(image.attrs) + json.dumps(image.history())
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in baked
        assert secret not in result.stdout + result.stderr


# Wheels, dev tools and the build stage's inputs, wherever they are in an image. As root, to
# see every folder; -xdev: the image's own files, not /proc or /sys.
FIND_BUILD_LEFTOVERS = (
    "find / -xdev \\( -name '*.whl' -o -name devkit -o -path '*/validator/simulator'"
    " -o -path /opt/flock \\) -print"
)


def found_in(engine, image: str, command: str) -> list[str]:
    output = engine.containers.run(
        image, entrypoint=["sh", "-c", command], user="0", remove=True, network_mode="host"
    )
    return output.decode().split()


def test_the_image_holds_the_product_only(engine, repo):
    """No dev tool (devkit/, the simulator), no wheel, nothing the environment was installed
    from; and its tag does not move when the wheelhouse or devkit/ does."""
    built = run_py(repo, "fixture", "--build-only")
    assert built.returncode == 0, built.stderr
    tag = built.stdout.strip()
    # The code, the configs, and the hash of the sources the build computed.
    assert found_in(engine, tag, "ls /app") == ["configs", "modules", "source-hash", "validator"]
    [source] = found_in(engine, tag, "cat /app/source-hash")
    assert source == engine.images.get(tag).labels["org.flock-validator.source-hash"]
    assert source.startswith(tag.partition(":")[2])
    # The base's own (Debian's python3-venv keeps pip's and setuptools' wheels) and no more.
    leftovers = found_in(engine, tag, FIND_BUILD_LEFTOVERS)
    assert set(leftovers) == set(found_in(engine, LOCAL_BASE, FIND_BUILD_LEFTOVERS))
    steps = " ".join(layer.get("CreatedBy", "") for layer in engine.images.get(tag).history())
    assert "wheels" not in steps and "/opt/flock" not in steps
    # The inputs of the build stage and the dev tools are not what the tag stands for.
    (repo / "wheels" / "extra-1.0-py3-none-any.whl").write_bytes(b"not a wheel")
    (repo / "devkit" / "new_tool.py").write_text("")
    try:
        again = run_py(repo, "fixture", "--build-only")
    finally:
        (repo / "wheels" / "extra-1.0-py3-none-any.whl").unlink()
        (repo / "devkit" / "new_tool.py").unlink()
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == tag
    assert "(already built)" in again.stderr


def test_code_change_rebuilds_without_reinstalling_the_environment(engine, repo, tmp_path):
    warm = run_py(
        repo, "fixture", "--gpus", "none", "--check", check_input(tmp_path, hg_repo_id="ok/a")
    )
    assert warm.returncode == 0, warm.stderr
    marker = repo / "validator" / "__init__.py"
    original = marker.read_text()
    marker.write_text(original + "# changed by a test\n")
    try:
        result = run_py(
            repo, "fixture", "--gpus", "none", "--check", check_input(tmp_path, hg_repo_id="ok/a")
        )
    finally:
        marker.write_text(original)
    assert result.returncode == 0, result.stderr
    assert "building image" in result.stderr
    install_step = result.stderr.split("RUN sh /opt/flock/install-env.sh")[1].split("Step ")[0]
    assert "Using cache" in install_step


def test_run_py_validates_assignments_and_exits_after_max(engine, repo, tmp_path, volumes):
    tasks = [task(1, ["ok/a", "broken/b"], context_length=64), task(2, ["ok/cc"])]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        result = run_py(repo, *loop_args(sim, "1,2", "--max-assignments", "3", *volumes))
        assert result.returncode == 0, result.stderr
        statuses = sorted(s["status"] for s in sim.submissions())
        assert statuses == ["completed", "completed", "failed"]
    assert "the validator finished (exit 0)" in result.stderr
    assert fixture_containers(engine) == []
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in result.stdout + result.stderr


def test_run_py_report_reads_the_module_state_volume(engine, repo, tmp_path, volumes):
    tasks = [task(1, ["ok/a", "broken/b"])]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        result = run_py(repo, *loop_args(sim, "1", "--max-assignments", "2", *volumes))
        assert result.returncode == 0, result.stderr
    state = volumes[volumes.index("--state-volume") + 1]
    report = run_py(repo, "report", "fixture", "--json", "--state-volume", state)
    assert report.returncode == 0, report.stderr
    body = json.loads(report.stdout)
    assert body["by_task"] == {"1": {"completed": 1, "failed": 1}} and body["records"] == 2
    page = tmp_path / "report.html"
    report = run_py(repo, "report", "fixture", "--html", str(page), "--state-volume", state)
    assert report.returncode == 0, report.stderr
    assert page.read_text().count("data:image/png;base64,") == 3


def test_ctrl_c_stops_the_container_and_leaves_none(engine, repo, tmp_path, volumes):
    with Simulator({"tasks": [task(1, [])]}, tmp_path) as sim:
        process = subprocess.Popen(
            run_py_command(repo, *loop_args(sim, "1", *volumes)),
            env=launcher_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: len(sim.lookups()) >= 2, 120, "the container's lookups")
        [container] = fixture_containers(engine)
        # Docker's default log driver, rotated (launcher/engine/containers.py): 5 files of 10 MB.
        if engine.info()["LoggingDriver"] == "json-file":
            assert container.attrs["HostConfig"]["LogConfig"] == {
                "Type": "json-file",
                "Config": {"max-size": "10m", "max-file": "5"},
            }
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stopping the validator" in stderr
    assert "stopped by signal" in stderr
    assert fixture_containers(engine) == []


def test_exit_100_is_restarted_until_the_assignment_fails(engine, repo, tmp_path, volumes):
    with Simulator({"tasks": [task(1, ["cuda/x"])]}, tmp_path) as sim:
        result = run_py(
            repo,
            *loop_args(sim, "1", "--max-assignments", "1", "--restart-delay", "0.2", *volumes),
        )
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["failed"]
    assert result.stderr.count("asked for a restart (exit 100)") == 3


def test_exit_3_is_not_restarted(engine, repo, tmp_path, volumes):
    with Simulator({"tasks": [task(1, ["operator/x"])]}, tmp_path) as sim:
        result = run_py(repo, *loop_args(sim, "1", "--restart-delay", "0.2", *volumes))
        assert sim.submissions() == []
    assert result.returncode == 3
    assert "needs operator action (exit 3)" in result.stderr
    assert "restart" not in result.stderr.replace("--restart-delay", "")
    assert result.stderr.count("[run.py] starting fixture") == 1


def test_journal_lives_in_the_state_volume_across_runs(engine, repo, tmp_path, volumes):
    down = {"endpoint": "update", "kind": "status", "status": 503, "count": None}
    with Simulator({"tasks": [task(1, ["ok/a"])]}, tmp_path, faults=[down]) as sim:
        process = subprocess.Popen(
            run_py_command(repo, *loop_args(sim, "1", "--max-assignments", "1", *volumes)),
            env=launcher_env(VALIDATOR_API_RETRIES="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: any(r["fault"] for r in sim.state()["requests"]), 120, "a failed submit")
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
        assert sim.submissions() == []
        sim.clear_faults()
        result = run_py(repo, *loop_args(sim, "1", "--max-assignments", "1", *volumes))
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
    assert "1 results to submit" in result.stderr


def test_a_stop_kills_after_stop_timeout_and_the_next_run_does_not_count_it(
    engine, repo, tmp_path, volumes
):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "fixture.json").write_text(json.dumps({"slow_seconds": 300}))
    with Simulator({"tasks": [task(1, ["slow/honest"])]}, tmp_path) as sim:
        args = loop_args(sim, "1", "--max-assignments", "1", "--config-dir", str(configs))
        process = subprocess.Popen(
            run_py_command(repo, *args, "--stop-timeout", "2", *volumes),
            env=launcher_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: sim.state()["assignments"], 120, "the assignment to be handed out")
        time.sleep(2)  # into the scoring, which would take 300 s
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        assert time.monotonic() - stopped < 30, stderr  # 2 s of grace, not the scoring's 300
        assert sim.submissions() == []
        (configs / "fixture.json").write_text(json.dumps({"slow_seconds": 0}))
        result = run_py(repo, *args, *volumes)
        assert result.returncode == 0, result.stderr
        assert [s["status"] for s in sim.submissions()] == ["completed"]
    assert "was stopped (a stop signal, then killed) while scoring" in result.stderr


@pytest.mark.parametrize(
    ("args", "env_change", "code", "message"),
    [
        (
            ["nosuch", "--task_ids", "1"],
            {},
            2,
            "unknown module 'nosuch'; available modules: fixture",
        ),
        (["fixture", "--task_ids", "1"], {"FLOCK_API_KEY": ""}, 2, "missing --flock-api-key"),
        (["fixture", "--task_ids", "1", "--gpus", "first"], {}, 2, "--gpus 'first'"),
        (["fixture", "--task_ids", "1", "--gpus", "all"], {}, 3, "run without GPUs: --gpus none"),
        (
            ["fixture", "--task_ids", "1", "--gpus", "none"],
            {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
            3,
            "cannot reach the Docker engine",
        ),
    ],
)
def test_operator_mistakes_get_clear_errors(engine, repo, args, env_change, code, message):
    result = run_py(repo, *args, env=launcher_env(**env_change))
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert fixture_containers(engine) == []


@pytest.mark.parametrize("by", ["option", "environment"])
def test_a_base_that_cannot_be_pulled_is_one_line_naming_it(engine, repo, by):
    # By digest, as a build needs it; no registry has it, and CI reaches none: fails fast.
    base = f"local/does-not-exist@sha256:{'0' * 64}"
    args, env = ["fixture", "--build-only"], launcher_env(VALIDATOR_BASE_IMAGE=base)
    if by == "option":
        args, env = [*args, "--base-image", base], launcher_env()
    result = run_py(repo, *args, env=env, timeout=120)
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"[run.py] error: base image '{base}' cannot be pulled (")
    assert errors[0].endswith(
        "; pick another with --base-image / VALIDATOR_BASE_IMAGE (a mambaorg/micromamba CUDA "
        'image by digest, see docs/images.md "The base image")'
    )
    assert "Traceback" not in result.stderr
    assert "Step " not in result.stderr  # refused before the build, not at its FROM step
    assert result.stdout == ""


def test_the_image_runs_as_a_pod_from_its_environment_alone(engine, repo, tmp_path):
    built = run_py(repo, "fixture", "--build-only")
    assert built.returncode == 0, built.stderr
    tag = built.stdout.strip()
    config = engine.images.get(tag).attrs["Config"]
    assert "VALIDATOR_MODULE=fixture" in config["Env"]
    assert config["Entrypoint"] == ["/opt/conda/bin/python", "-m", "validator"]
    assert not config["Cmd"]  # nothing to override: a pod passes no command
    # The repo's configs are the defaults where none can be mounted (lora needs its list).
    listing = engine.containers.run(
        tag, entrypoint=["ls", "/app/configs"], remove=True, network_mode="host"
    )
    assert b"lora.json" in listing.split()
    with Simulator({"tasks": [task(1, ["ok/a", "broken/b"])]}, tmp_path) as sim:
        # What a pod template sets; no command, no volume, no --init.
        environment = {
            "FLOCK_API_KEY": API_KEY,
            "HF_TOKEN": HF_TOKEN,
            "TASK_IDS": "1",
            "FLOCK_API_URL": sim.api_url,
            "ASSIGNMENT_LOOKUP_INTERVAL": "0.2",
            "TIME_SLEEP": "0.3",
        }
        container = engine.containers.run(
            tag, environment=environment, network_mode="host", detach=True
        )
        try:
            wait_for(lambda: len(sim.submissions()) == 2, 120, "both submissions")
            container.stop(timeout=30)  # a pod's stop: SIGTERM, then the step finishes
            code = container.wait(timeout=60)["StatusCode"]
            logs = container.logs().decode()
        finally:
            container.remove(force=True)
        assert sorted(s["status"] for s in sim.submissions()) == ["completed", "failed"]
    assert code == 0, logs
    assert "stopped by signal" in logs
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in logs

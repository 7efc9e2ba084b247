"""`run.py MODULE --pull` against a real registry on 127.0.0.1 (Debian's docker-registry): the
released image of the checkout's version is pulled and run without a build; a tag the registry
lacks, or a registry nobody answers at, is one line and a build here instead."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest

from devkit.docker_env import launcher_env, make_module_repo, run_py_command
from devkit.local_registry import LocalRegistry, free_port
from launcher.errors import UsageError
from launcher.images import BuildSpec, source_hash
from launcher.published import DEFAULT_REGISTRY, checkout_version, published_image, release_outputs
from tests.helpers.docker_env import require_engine
from validator.spec import REPO_ROOT


@pytest.fixture(scope="module")
def engine():
    return require_engine()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory):
    return make_module_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def local_build(engine, repo) -> str:
    """The fixture module's image as this checkout builds it (the tag run.py prints)."""
    built = run_py(repo, "fixture", "--build-only")
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


def run_py(repo, *args) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_py_command(repo, *args), env=launcher_env(), capture_output=True, text=True, timeout=300
    )


def test_pull_runs_the_released_image_without_a_build(
    engine, repo, registry, local_build, tmp_path
):
    # What the release workflow does for a version tag: push the module's image as
    # <registry>/flock-validator-<module>:<version>. Then only the registry holds that tag.
    version = checkout_version(repo)
    released = f"{registry.address}/flock-validator-fixture:{version}"
    engine.images.get(local_build).tag(released)
    pushed = list(engine.api.push(released, stream=True, decode=True))
    assert not [line for line in pushed if "error" in line], pushed
    engine.images.remove(released)
    check = tmp_path / "input.json"
    check.write_text(json.dumps({"hg_repo_id": "ok/abc"}))
    asked_before = len(registry.requests())
    try:
        result = run_py(
            repo, "fixture", "--pull", "--registry", registry.address, "--check", str(check)
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1])["repo_length"] == 6
        assert f"[run.py] pulling the published image {released}\n" in result.stderr
        assert f"[run.py] starting fixture in {released} " in result.stderr
        assert "building image" not in result.stderr
        assert "already built" not in result.stderr
        # The registry was asked for the tag (HEAD or GET of its manifest) during the run.
        manifest = re.compile(
            rf'(GET|HEAD) /v2/flock-validator-fixture/manifests/{version} .*" 200'
        )
        assert any(manifest.match(line) for line in registry.requests()[asked_before:])
        # Pulled once: a second start uses what the engine now has.
        again = run_py(repo, "fixture", "--pull", "--registry", registry.address, "--build-only")
        assert again.stdout.strip().splitlines()[-1] == released
        assert f"using the published image {released} (already pulled)" in again.stderr
    finally:
        engine.images.remove(released, force=True)


@pytest.mark.parametrize(
    ("where", "reason"),
    [("missing", "no such tag"), ("closed", "the registry cannot be reached")],
)
def test_pull_falls_back_to_a_build_with_one_line(
    engine, repo, registry, local_build, where, reason
):
    owner = f"{registry.address}/nobody" if where == "missing" else f"127.0.0.1:{free_port()}"
    released = f"{owner}/flock-validator-fixture:{checkout_version(repo)}"
    result = run_py(repo, "fixture", "--pull", "--registry", owner, "--build-only")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "published image" in line]
    assert lines == [
        f"[run.py] pulling the published image {released}",
        f"[run.py] published image {released} not pulled ({reason}): building it here",
    ]
    # The build here: the image run.py builds without --pull (already built by the fixture).
    assert result.stdout.strip().splitlines()[-1] == local_build
    assert f"using image {local_build}" in result.stderr


# The generated rl service, its journal in a volume of this test.
RL_OVERRIDE = """
services:
  validator-rl:
    volumes: !override
      - rl-state:/data/state
volumes:
  rl-state:
    name: ${STATE_VOLUME}
"""


def test_compose_pulls_the_released_image_instead_of_building(engine, repo, registry, local_build):
    # Any validator image will do under the released name: the container is created, not run.
    released = f"{registry.address}/flock-validator-rl:{checkout_version(repo)}"
    engine.images.get(local_build).tag(released)
    pushed = list(engine.api.push(released, stream=True, decode=True))
    assert not [line for line in pushed if "error" in line], pushed
    engine.images.remove(released)
    (repo / "compose.pull-test.yaml").write_text(RL_OVERRIDE)
    project, volume = f"fvtest{uuid.uuid4().hex[:8]}", f"fv-test-pull-{uuid.uuid4().hex[:8]}"
    files = ["-p", project, "-f", "compose.yaml", "-f", "compose.pull-test.yaml"]
    env = launcher_env(TASK_IDS="1", VALIDATOR_IMAGE_REGISTRY=registry.address, STATE_VOLUME=volume)
    try:
        result = subprocess.run(
            ["docker", "compose", *files, "up", "--no-start", "validator-rl"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        container = engine.containers.get(f"{project}-validator-rl-1")
        assert container.image.id == engine.images.get(local_build).id
        assert "load build definition" not in result.stdout + result.stderr  # no build ran
    finally:
        subprocess.run(["docker", "compose", *files, "down"], cwd=repo, env=env, timeout=120)
        engine.volumes.get(volume).remove(force=True)
        engine.images.remove(released, force=True)


def test_the_released_image_is_named_from_the_checkout_version(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "x"\nversion = "1.2.3"\n'
        '\n[tool.other]\nversion = "9"\n'
    )
    assert checkout_version(tmp_path) == "1.2.3"
    assert published_image(DEFAULT_REGISTRY, "llm_judge", "1.2.3") == (
        "ghcr.io/flock-io/flock-validator-llm_judge:1.2.3"
    )
    assert published_image("127.0.0.1:5000/me/", "rl", "1.2.3") == (
        "127.0.0.1:5000/me/flock-validator-rl:1.2.3"
    )
    for bad in ("https://ghcr.io/x", "ghcr.io/X Y", ""):
        with pytest.raises(UsageError, match="give a registry and owner"):
            published_image(bad, "rl", "1.2.3")


def test_a_release_tag_must_be_the_checkout_version():
    version = checkout_version(REPO_ROOT)
    outputs = release_outputs(REPO_ROOT, "rl", "FLock-io", f"v{version}")
    assert outputs["repository"] == "ghcr.io/flock-io/flock-validator-rl"
    assert outputs["version"] == version
    # The label a release carries is the one run.py's default build of this checkout carries.
    assert outputs["source_hash"] == source_hash(BuildSpec("rl", REPO_ROOT))
    with pytest.raises(UsageError, match=f"is not v{version}"):
        release_outputs(REPO_ROOT, "rl", "flock-io", "v0.0.0-not-this")

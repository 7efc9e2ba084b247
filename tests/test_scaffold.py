"""`python -m devkit.scaffold NAME`: a module that works with no edit, proven in a copy of the
repo (its --check, its generated tests, its image, its Compose service); and the old spelling,
`python -m validator new-module`, an alias that warns (tests/test_scaffold_venv.py: a module
with a pip dependency of its own, tested in its own venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from devkit.docker_env import launcher_env, make_module_repo
from devkit.scaffold import FILES, ScaffoldError, check_name, scaffold
from devkit.validator_cli import REPO_ROOT

NAME = "word_stats"


def run(repo, *args, env=None, timeout=300):
    return subprocess.run(
        list(args), cwd=repo, capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    repo = make_module_repo(tmp_path_factory.mktemp("scaffold") / "repo")
    # Its image's locks resolved from the wheelhouse alone, as a host without an index would.
    offline = {**os.environ, "UV_OFFLINE": "1", "UV_FIND_LINKS": str(repo / "wheels")}
    result = run(repo, sys.executable, "-m", "devkit.scaffold", NAME, env=offline)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return repo, result.stdout


def test_it_writes_the_module_its_config_example_and_tests(scaffolded):
    repo, output = scaffolded
    for target in FILES.values():
        path = repo / target.format(name=NAME)
        assert path.is_file(), path
        assert f"wrote {target.format(name=NAME)}" in output
    for lock in ("production", "cpu"):
        assert f"wrote modules/{NAME}/locks/{lock}.txt" in output
    assert f"validator-{NAME}:" in (repo / "compose.yaml").read_text()


def test_its_check_prints_metrics_with_no_edit(scaffolded):
    repo, _ = scaffolded
    example = f"modules/{NAME}/example_input.json"
    result = run(repo, sys.executable, "-m", "validator", NAME, "--check", example)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    # "the quick brown fox jumps over the lazy dog": 9 words, 8 distinct.
    assert metrics == {"score": pytest.approx(8 / 9), "words": 9}


def test_its_generated_tests_pass(scaffolded):
    repo, _ = scaffolded
    test_file = f"tests/{NAME}/test_{NAME}_module.py"
    result = run(repo, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout


def test_its_image_builds_and_compose_lists_its_service(scaffolded, engine):
    repo, _ = scaffolded
    client = engine
    env = launcher_env(TASK_IDS="1")
    result = run(repo, sys.executable, "run.py", NAME, "--build-only", env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    tag = result.stdout.strip().splitlines()[-1]
    try:
        assert tag.startswith(f"flock-validator-{NAME}:")
        image = client.images.get(tag)
        assert image.attrs["Config"]["Env"].count(f"VALIDATOR_MODULE={NAME}") == 1
    finally:
        client.images.remove(tag, force=True)
    config = run(repo, "docker", "compose", "config", "--format", "json", env=env)
    assert config.returncode == 0, config.stderr
    service = json.loads(config.stdout)["services"][f"validator-{NAME}"]
    assert service["build"]["args"]["MODULE"] == NAME
    assert "deploy" not in service  # its spec wants no GPU


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("lora", "module 'lora' exists already"),
        ("2fast", "not a valid module name"),
        ("word-stats", "not a valid module name"),
        ("WordStats", "module names are lower case"),
        ("class", "a Python keyword"),
        ("_hidden", "private"),
        ("naïve", "not a valid module name"),
        ("doctor", r"is a command \(python run.py doctor\)"),
    ],
)
def test_it_refuses_taken_and_invalid_names_writing_nothing(name, message):
    with pytest.raises(ScaffoldError, match=message):
        check_name(name, REPO_ROOT)


def test_it_refuses_a_name_whose_files_exist_and_writes_nothing(tmp_path):
    (tmp_path / "modules").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "judge.json").write_text("{}")
    with pytest.raises(ScaffoldError, match=r"configs/judge.json exists already"):
        scaffold("judge", tmp_path)
    assert not (tmp_path / "modules" / "judge").exists()


def test_the_command_line_refusal_is_one_line_and_exit_2():
    result = run(REPO_ROOT, sys.executable, "-m", "devkit.scaffold", "lora")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: module 'lora' exists already (modules/lora/)"


def test_the_old_command_still_works_and_warns_naming_the_new_one():
    result = run(REPO_ROOT, sys.executable, "-m", "validator", "new-module", "lora")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "warning: python -m validator new-module has moved to python -m devkit.scaffold NAME "
        "(the old one goes in 0.3)",
        "error: module 'lora' exists already (modules/lora/)",
    ]


def test_the_old_command_in_an_image_names_the_new_one_in_one_line():
    # An image has validator/ and its module, no devkit/: importing it fails as there.
    image_like = (
        "import runpy, sys; sys.modules['devkit'] = None; "
        "sys.argv = ['validator', 'new-module', 'judge']; "
        "runpy.run_module('validator', run_name='__main__')"
    )
    result = run(REPO_ROOT, sys.executable, "-c", image_like)
    assert result.returncode == 1
    assert result.stderr == (
        "error: new-module is a dev tool, not in this image: run "
        "`python -m devkit.scaffold NAME` in a checkout of the repository\n"
    )


def test_a_requirement_it_cannot_write_is_refused_writing_nothing(tmp_path):
    (tmp_path / "modules").mkdir()
    with pytest.raises(ScaffoldError, match="not a pip requirement such as roman==5.2"):
        scaffold("judge", tmp_path, pip=("roman: 5",))
    assert not (tmp_path / "modules" / "judge").exists()


def test_a_scaffolded_spec_is_the_default_one_written_out(tmp_path):
    (tmp_path / "modules").mkdir()
    scaffold("judge", tmp_path, summary="answers graded by LLM judges")
    spec = yaml.safe_load((tmp_path / "modules" / "judge" / "module.yaml").read_text())
    assert spec == {
        "name": "judge",
        "summary": "answers graded by LLM judges",
        "environment": "environment.yml",
        "gpu": False,
        "secrets": {},
        "env": [],
        "volumes": {},
        # Not known until a task list shows it: said, so that no module is left without one.
        "task_type": {
            "unknown": "no judge task of the Fed Ledger's task list seen yet",
            "names": [],
        },
        "test_venv": "shared",
    }
    assert (tmp_path / "requirements-judge.txt").is_file()  # its (empty) host requirements
    assert (tmp_path / "tests" / "judge" / "test_judge_module.py").is_file()


def test_the_product_never_imports_the_dev_tools():
    # An image holds run.py's launcher, validator/ and modules/, never devkit/.
    import ast

    found = []
    for folder in ("validator", "launcher", "modules"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                found += [f"{path}: {n}" for n in names if n.split(".")[0] == "devkit"]
    assert found == []

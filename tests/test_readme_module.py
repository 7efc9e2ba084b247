"""A module written from docs/adding-a-module.md alone works, without touching validator/."""

import json
import re

import pytest

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import REPO_ROOT, loop_args, run_validator, validator_env

FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```\w*\n(?P<body>.*?)```", re.S)


@pytest.fixture
def readme_module(tmp_path) -> dict[str, str]:
    """Writes every file docs/adding-a-module.md shows under tmp_path, as a module author would."""
    files = {
        m["path"]: m["body"]
        for m in FILE_BLOCK.finditer((REPO_ROOT / "docs" / "adding-a-module.md").read_text())
    }
    assert "modules/hello/__init__.py" in files and "configs/hello.json" in files, files.keys()
    for path, body in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    assert not (tmp_path / "modules" / "__init__.py").exists()
    # The secret its spec declares; without it the loop would not start.
    return validator_env(tmp_path, PYTHONPATH=str(tmp_path), HELLO_API_KEY="hello-TEST-key")


def test_readme_module_checks_an_input(tmp_path, readme_module):
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"hg_repo_id": "alice/x", "context_length": 7}))
    result = run_validator(["hello", "--check", str(path)], readme_module)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"score": 2.0 * 7 / 7}


def test_readme_module_requires_the_secret_its_spec_declares(readme_module):
    del readme_module["HELLO_API_KEY"]
    result = run_validator(["hello", "--task_ids", "5"], readme_module)
    assert result.returncode == 2
    assert "missing HELLO_API_KEY: the greeting service's key, for hello" in result.stderr


def test_readme_module_validates_assignments(tmp_path, readme_module):
    tasks = [task(5, ["alice/adapter", "no-slash"], task_type="hello", context_length=26)]
    with Simulator({"tasks": tasks}, tmp_path) as sim:
        result = run_validator(
            loop_args("hello", sim.api_url, "5", "--max-assignments", "2"), readme_module
        )
        assert result.returncode == 0, result.stderr
        results = sorted((s["status"], s["data"]) for s in sim.submissions())
    assert results == [("completed", {"score": 2.0 * 26 / 13}), ("failed", None)]

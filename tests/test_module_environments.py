"""A module's image and the host tests must run the same stack: versions are part of the
scoring protocol. requirements-<name>.txt is written from the module's environment.yml (`make
requirements`, devkit/requirements.py) for every module, and where its tests run is its spec's
`test_venv`, which the Makefile reads as well."""

from __future__ import annotations

import subprocess

import pytest

from devkit.requirements import main as requirements_main
from devkit.requirements import pip_requirements, render, requirements_file
from validator.spec import REPO_ROOT, find_modules

SPECS = find_modules(REPO_ROOT)
# Pins the network's reference validators run; a change here changes scores.
PROTOCOL_PINS = {
    "lora": ("transformers==4.49.0", "huggingface-hub==0.29.1"),
    "rl": ("onnxruntime==1.32.0", "numpy==2.4.6"),
    "llm_judge": ("transformers==5.3.0", "peft==0.18.1", "huggingface-hub==1.5.0"),
}


def host_requirements(name: str) -> list[str]:
    lines = requirements_file(REPO_ROOT, name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_module_has_its_requirements_written_from_its_environment(name):
    path = requirements_file(REPO_ROOT, name)
    assert path.is_file(), "run `make requirements`"
    assert path.read_text() == render(REPO_ROOT, SPECS[name]), "run `make requirements`"
    environment = REPO_ROOT / "modules" / name / SPECS[name].environment
    assert host_requirements(name) == pip_requirements(environment)


def test_no_requirements_file_is_stale():
    assert requirements_main(["--check"]) == 0, "run `make requirements`"


@pytest.mark.parametrize("name", sorted(PROTOCOL_PINS))
def test_the_protocol_pins_are_in_the_image_and_on_the_host(name):
    assert name in SPECS
    for pin in PROTOCOL_PINS[name]:
        assert pin in host_requirements(name)


def test_a_stack_of_its_own_never_enters_the_dev_venv():
    # llm_judge's transformers 5 conflicts with lora's 4: its tests run in .venv-llm_judge.
    assert SPECS["llm_judge"].test_venv == "own"
    dev = (REPO_ROOT / "requirements-dev.txt").read_text()
    for name, spec in SPECS.items():
        if spec.test_venv == "own":
            assert f"requirements-{name}.txt" not in dev, name


def test_the_makefile_finds_the_modules_and_venvs_the_specs_say():
    listing = subprocess.run(
        ["make", "--no-print-directory", "-s", "list-modules"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert listing.splitlines() == [
        f"modules: {' '.join(sorted(SPECS))}",
        f"own venv: {' '.join(n for n, s in sorted(SPECS.items()) if s.test_venv == 'own')}",
    ]


def test_an_edited_environment_makes_its_requirements_stale_until_written(tmp_path, capsys):
    folder = tmp_path / "modules" / "alpha"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "module.yaml").write_text("name: alpha\n")
    environment = "name: alpha\ndependencies:\n  - python=3.11\n  - pip:\n      - {pins}\n"
    (folder / "environment.yml").write_text(environment.format(pins="attrs==25.3.0"))
    (tmp_path / "requirements-dev.txt").write_text("pytest\n")  # hand-written: left alone
    repo = ["--repo", str(tmp_path)]
    assert requirements_main(["--check", *repo]) == 1
    assert requirements_main(repo) == 0
    assert host_lines(tmp_path / "requirements-alpha.txt") == ["attrs==25.3.0"]
    assert requirements_main(["--check", *repo]) == 0
    (folder / "environment.yml").write_text(environment.format(pins="attrs==25.4.0"))
    assert requirements_main(["--check", *repo]) == 1
    assert "requirements-alpha.txt not what the environment files say" in capsys.readouterr().err
    assert requirements_main(repo) == 0
    assert host_lines(tmp_path / "requirements-alpha.txt") == ["attrs==25.4.0"]
    (folder / "module.yaml").unlink()  # no longer a module: its generated file goes
    assert requirements_main(repo) == 0
    assert not (tmp_path / "requirements-alpha.txt").exists()
    assert (tmp_path / "requirements-dev.txt").read_text() == "pytest\n"


def host_lines(path):
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]

"""A module's image and the host tests must run the same stack: versions are part of the
scoring protocol. Every module with a `requirements-<name>.txt` for its host tests is checked."""

import pytest
import yaml

from devkit.validator_cli import REPO_ROOT
from validator.spec import discover_specs

SPECS = discover_specs(REPO_ROOT / "modules")
# Pins the network's reference validators run; a change here changes scores.
PROTOCOL_PINS = {
    "lora": ("transformers==4.49.0", "huggingface-hub==0.29.1"),
    "rl": ("onnxruntime==1.32.0", "numpy==2.4.6"),
    "llm_judge": ("transformers==5.3.0", "peft==0.18.1", "huggingface-hub==1.5.0"),
}
# Stacks that conflict with the dev venv's: their tests run in .venv-<name> (Makefile STACKS).
OWN_VENV = {"llm_judge"}


def pip_section(name: str) -> list[str]:
    environment = REPO_ROOT / "modules" / name / SPECS[name].environment
    spec = yaml.safe_load(environment.read_text())
    return next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))


def host_requirements(name: str) -> list[str]:
    lines = (REPO_ROOT / f"requirements-{name}.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", sorted(PROTOCOL_PINS))
def test_image_pins_equal_the_host_test_pins(name):
    assert name in SPECS
    host = host_requirements(name)
    assert sorted(pip_section(name)) == sorted(host)
    for pin in PROTOCOL_PINS[name]:
        assert pin in host
    in_dev_venv = f"-r requirements-{name}.txt" in (REPO_ROOT / "requirements-dev.txt").read_text()
    assert in_dev_venv != (name in OWN_VENV)
    if name in OWN_VENV:
        assert (REPO_ROOT / "tests" / name / "conftest.py").is_file()


def test_every_module_with_host_requirements_is_checked():
    with_requirements = {
        name for name in SPECS if (REPO_ROOT / f"requirements-{name}.txt").exists()
    }
    assert with_requirements == set(PROTOCOL_PINS)

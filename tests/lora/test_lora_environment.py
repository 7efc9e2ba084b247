"""The lora image and the host tests must run the same stack: versions are part of the protocol."""

import yaml

from devkit.validator_cli import REPO_ROOT


def test_image_pins_equal_the_host_test_pins():
    spec = yaml.safe_load((REPO_ROOT / "modules" / "lora" / "environment.yml").read_text())
    image = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    host = [
        line.strip()
        for line in (REPO_ROOT / "requirements-lora.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert sorted(image) == sorted(host)
    assert "transformers==4.49.0" in host and "huggingface-hub==0.29.1" in host

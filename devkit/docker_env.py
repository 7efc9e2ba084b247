"""What the Docker tests, `make bench-launcher` and the demos need around a real engine: the
local stand-in base's build settings, and a copy of this repo with the test module `fixture`
added under modules/, as a module author would add one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from devkit import FIXTURE_MODULES, REPO_ROOT
from devkit.validator_cli import env_with_test_secrets

LOCAL_BASE = "local/base:bookworm"
# The offline wheelhouse (`make wheels`), read by the image build's `env` stage only.
WHEELHOUSE = REPO_ROOT / "wheels"


def make_module_repo(dest: Path, name: str = "fixture") -> Path:
    """A copy of the repo's tracked and untracked-but-not-ignored files, plus the wheelhouse,
    plus the test module as modules/<name> (its spec and environment included): under a name
    of its own, a suite's images, containers and labels are apart from another's running beside
    it on the same engine."""
    files = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for path in filter(None, files):
        source = REPO_ROOT / path
        if source.is_file():
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / path)
    shutil.copytree(WHEELHOUSE, dest / "wheels", dirs_exist_ok=True)
    module = dest / "modules" / name
    shutil.copytree(
        FIXTURE_MODULES / "modules" / "fixture",
        module,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    spec = module / "module.yaml"
    spec.write_text(spec.read_text().replace("\nname: fixture\n", f"\nname: {name}\n", 1))
    return dest


def launcher_env(**extra: str) -> dict[str, str]:
    """Build settings of the stand-in image, and the secrets, as CI passes them."""
    defaults = {
        "VALIDATOR_BASE_IMAGE": LOCAL_BASE,
        "VALIDATOR_ENV_INSTALLER": "pip",
        "VALIDATOR_PIP_OPTIONS": "--no-index --find-links /opt/flock/wheels",
        "VALIDATOR_LOCK": "cpu",  # torch's CPU build, which the wheelhouse holds
    }
    return env_with_test_secrets(**{**defaults, **extra})


def unique_volumes() -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return ["--state-volume", f"fv-test-state-{tag}", "--hf-cache-volume", f"fv-test-hf-{tag}"]


def run_py_command(repo: Path, *args: str) -> list[str]:
    return [sys.executable, str(repo / "run.py"), *args]

"""`python run.py doctor`'s NVIDIA Container Toolkit row: the version of each part the host has,
against 1.17.8, the release that fixes its container escapes (CVE-2024-0132, CVE-2025-23359,
CVE-2025-23266), with the upgrade to run. Before, the doctor saw the runtime, not its version.

No GPU and no toolkit exist on this machine: each test puts stand-in executables on PATH that
print what the real parts print for `--version` (nvidia-ctk, nvidia-container-cli, the runtime
Docker names), an old version, a fixed one, garbage, or none at all. They stand in for what
cannot exist here; the doctor runs them as it runs the real ones."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from launcher.commands.doctor import doctor as host_doctor
from launcher.doctor.toolkit import NAME, parse_version, toolkit_row
from validator.spec import REPO_ROOT, load_spec

pytestmark = pytest.mark.integration  # the doctor runs the stand-ins as child processes

NOWHERE = "unix:///nonexistent/docker.sock"
COMMIT = "commit: 6eda4d76c8c5f8fc174e4abca83e513fb4dd63b0"


def ctk(version: str) -> str:
    return f"NVIDIA Container Toolkit CLI version {version}\n{COMMIT}\n"


def cli(version: str) -> str:
    return (
        f"cli-version: {version}\nlib-version: {version}\nbuild date: 2025-05-30T13:47+00:00\n"
        "build revision: 6eda4d76\nbuild platform: x86_64\n"
    )


def runtime(version: str) -> str:
    return (
        f"NVIDIA Container Runtime version {version}\n{COMMIT}\nspec: 1.2.1\n\n"
        "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e94\nspec: 1.0.2-dev\n"
    )


def stand_in(folder, name: str, output: str, code: int = 0) -> str:
    """An executable `name` in `folder` that prints `output` (a stand-in for the real part)."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def host_rows(bin_dir) -> dict[str, tuple[str, str]]:
    env = {"DOCKER_HOST": NOWHERE, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = CliRunner().invoke(host_doctor, ["--timeout", "20"], env=env)
    assert "Traceback" not in result.output, result.output
    rows = {}
    for line in result.output.splitlines()[1:-1]:
        check, _, rest = line.partition("  ")
        found, _, text = rest.strip().partition("  ")
        rows[check.strip()] = (found.strip(), text.strip())
    return rows


@pytest.mark.parametrize(
    ("parts", "result", "said"),
    [
        (
            {"nvidia-ctk": ctk("1.17.3"), "nvidia-container-cli": cli("1.17.3")},
            "failed",
            "nvidia-ctk --version: 1.17.3, nvidia-container-cli --version: 1.17.3: before 1.17.8, "
            "open to container escapes (CVE-2024-0132, CVE-2025-23359, CVE-2025-23266) -> sudo "
            "apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit (yum: "
            "sudo yum update nvidia-container-toolkit), then sudo systemctl restart docker",
        ),
        (
            # One part left behind by a partial upgrade: the oldest decides.
            {"nvidia-ctk": ctk("1.17.8"), "nvidia-container-cli": cli("1.16.2")},
            "failed",
            "nvidia-container-cli --version: 1.16.2: before 1.17.8",
        ),
        (
            {"nvidia-ctk": ctk("1.17.8"), "nvidia-container-cli": cli("1.17.8")},
            "ok",
            "nvidia-ctk --version: 1.17.8, nvidia-container-cli --version: 1.17.8: has the "
            "container escape fixes of 1.17.8",
        ),
        ({"nvidia-ctk": ctk("1.18.0")}, "ok", "nvidia-ctk --version: 1.18.0: has the"),
        ({"nvidia-ctk": ctk("1.17.8-rc.1")}, "failed", "1.17.8 (a pre-release): before 1.17.8"),
        (
            {"nvidia-ctk": "Segmentation fault\n"},
            "warning",
            "version unreadable: `nvidia-ctk --version` said 'Segmentation fault' -> check it is "
            "1.17.8 or newer",
        ),
        (
            {},
            "warning",
            "no nvidia-container-runtime, nvidia-ctk or nvidia-container-cli on PATH: its "
            "version is unknown",
        ),
    ],
    ids=["old", "one-part-old", "fixed", "newer", "pre-release", "garbage", "missing"],
)
def test_the_doctor_holds_the_toolkit_to_its_escape_fixes(tmp_path, parts, result, said):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, output in parts.items():
        stand_in(bin_dir, name, output, 139 if "Segmentation" in output else 0)
    found, text = host_rows(bin_dir)[NAME]
    assert found == result and said in text, (found, text)


def test_the_runtime_docker_names_is_read_and_a_cpu_module_only_warned(tmp_path, monkeypatch):
    # `docker info` names the runtime's path; older libnvidia-container printed `version:`.
    path = stand_in(tmp_path / "opt", "nvidia-container-runtime", runtime("1.17.2"))
    stand_in(tmp_path / "bin", "nvidia-container-cli", "version: 1.0.7\nbuild date: 2020\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    gpu = toolkit_row(load_spec(REPO_ROOT / "modules" / "lora"), path)
    cpu = toolkit_row(load_spec(REPO_ROOT / "modules" / "rl"), path)
    assert gpu.result == "failed"
    assert gpu.detail.startswith(f"{path} --version: 1.17.2, nvidia-container-cli --version: 1.0.7")
    assert cpu.result == "warning" and cpu.detail.endswith("rl's containers do not use it")


def test_versions_as_each_part_prints_them():
    assert parse_version(runtime("1.17.8")) == (1, 17, 8, 1)
    assert parse_version("NVIDIA Container Runtime Hook version 1.14.6\ncommit: x") == (1, 14, 6, 1)
    assert parse_version(cli("1.17.8")) == (1, 17, 8, 1)
    assert parse_version("cli-version: 1.17.8-1\n") == (1, 17, 8, 1)  # a package revision
    # runc's own version lines in the runtime's output are not the toolkit's.
    assert parse_version("runc version 1.1.12\nspec: 1.0.2-dev\n") is None
    assert parse_version("") is None

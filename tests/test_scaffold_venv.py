"""SLOW (a minute or two: it builds a venv from PyPI). A scaffolded module with a pip dependency
of its own, not in the dev venv, runs its tests in a venv of its own, the way `make install` and
`make test` do it, in a copy of the repository: and that touches nothing outside the module's
own places and the files derived from its spec."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from validator.spec import REPO_ROOT

NAME = "roman_score"
# A tiny pure-Python package (one module, no dependency) that the dev venv does not have.
DEPENDENCY, PIN = "roman", "roman==5.2"
DEV_VENV = REPO_ROOT / ".venv"


def run(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=repo, capture_output=True, text=True, timeout=timeout, check=False
    )


def git(repo: Path, *args: str) -> str:
    done = run(repo, "git", "-c", "user.name=test", "-c", "user.email=test@localhost", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def copy_of_the_repo(dest: Path) -> Path:
    """The working tree's files git knows (tracked, or new and not ignored), committed in a
    repository of their own: its `git status` then shows what the scaffold and the venv wrote."""
    names = run(REPO_ROOT, "git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    for name in filter(None, names.stdout.split("\0")):
        if (REPO_ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, dest / name)
    git(dest, "init", "--quiet")
    git(dest, "add", ".")
    git(dest, "commit", "--quiet", "-m", "copy")
    return dest


def changed_paths(repo: Path) -> set[str]:
    status = git(repo, "status", "--porcelain", "--untracked-files=all", "-z")
    return {entry[3:] for entry in status.split("\0") if entry}


@pytest.mark.integration
def test_a_module_with_its_own_dependency_is_tested_in_its_own_venv(tmp_path):
    assert importlib.util.find_spec(DEPENDENCY) is None, f"{DEPENDENCY} is in the dev venv"
    repo = copy_of_the_repo(tmp_path / "repo")

    made = run(repo, sys.executable, "-m", "devkit.scaffold", NAME, "--pip", PIN, "--own-venv")
    assert made.returncode == 0, made.stderr
    assert f"make install && .venv-{NAME}/bin/python -m pytest tests/{NAME}" in made.stdout
    # The module uses its dependency, and a test of its own says so.
    init = repo / "modules" / NAME / "__init__.py"
    init.write_text(
        init.read_text().replace("\nfrom validator.kit", "\nimport roman\n\nfrom validator.kit", 1)
    )
    (repo / "tests" / NAME / "test_dependency.py").write_text(
        "import roman\n\n\ndef test_its_dependency_is_installed():\n"
        '    assert roman.toRoman(2024) == "MMXXIV"\n'
    )
    assert (repo / f"requirements-{NAME}.txt").read_text().splitlines()[-1] == PIN
    listing = run(repo, "make", "--no-print-directory", "-s", "list-modules").stdout
    assert NAME in listing.splitlines()[1].split()[2:], listing  # "own venv: ... NAME ..."

    # In the dev venv its tests cannot import the dependency: what the own venv is for.
    dev = run(repo, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{NAME}")
    assert dev.returncode != 0 and f"No module named '{DEPENDENCY}'" in dev.stdout, dev.stdout

    # `make install`'s rule for a module's venv; the dev venv is this checkout's, left as is.
    venv = run(
        repo,
        "make",
        "--no-print-directory",
        f"VENV={DEV_VENV}",
        "-o",
        f"{DEV_VENV}/.installed",
        f".venv-{NAME}/.installed",
        timeout=900,
    )
    assert venv.returncode == 0, venv.stdout[-3000:] + venv.stderr[-3000:]
    python = repo / f".venv-{NAME}" / "bin" / "python"
    tests = run(
        repo,
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"tests/{NAME}",
        timeout=300,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert "7 passed" in tests.stdout

    # What changed: the module's own places, and the files derived from the specs, which are
    # what their generators say (each --check passes).
    changed = changed_paths(repo)
    own = {p for p in changed if p.startswith((f"modules/{NAME}/", f"tests/{NAME}/"))}
    assert {f"modules/{NAME}/__init__.py", f"modules/{NAME}/module.yaml"} <= own
    assert {f"modules/{NAME}/environment.yml", f"tests/{NAME}/test_{NAME}_module.py"} <= own
    derived = {f"requirements-{NAME}.txt", "compose.yaml", "compose.cpu.yaml"}
    assert changed - own - derived - {f"configs/{NAME}.json"} <= {
        p for p in changed if p.startswith("deploy/kubernetes/")
    }, sorted(changed)
    assert {f"configs/{NAME}.json", f"requirements-{NAME}.txt", "compose.yaml"} <= changed
    for check in (["-m", "devkit.requirements"], ["run.py", "compose"], ["run.py", "kubernetes"]):
        done = run(repo, sys.executable, *check, "--check")
        assert done.returncode == 0, (check, done.stderr)

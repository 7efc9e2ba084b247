"""`python -m devkit.requirements` (`make requirements`): writes `requirements-<name>.txt` for
every module from the `pip:` section of its `environment.yml`, so that the host tests run the
stack the module's image runs (versions are part of the scoring protocol) without a second
list to keep equal by hand. `--check` exits 1 when a file is stale (a test runs it).

Where those tests run is the spec's `test_venv`: `shared`, the dev venv (.venv), which the
Makefile installs every shared module's file into; `own`, `.venv-<name>`, for a stack that
conflicts with the dev venv's (the Makefile reads the same field).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from validator.errors import ConfigError
from validator.spec import REPO_ROOT, ModuleSpec, find_modules

# The first line of every generated file: how the generator tells its own files from the
# hand-written ones (requirements.txt, -host, -dev) when it removes those of a module gone.
MARK = "# Written by `make requirements` (python -m devkit.requirements) from"


def requirements_file(repo: Path, name: str) -> Path:
    return repo / f"requirements-{name}.txt"


def pip_requirements(environment: Path) -> list[str]:
    """The `pip:` entries of a conda environment file, in order (docker/pip_requirements.py
    reads the same section inside the image build)."""
    where = f"{environment.parent.name}/{environment.name}"
    try:
        document = yaml.safe_load(environment.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"modules/{where}: cannot be read: {exc}") from None
    dependencies = document.get("dependencies", []) if isinstance(document, dict) else None
    if not isinstance(dependencies, list):
        raise ConfigError(f"modules/{where}: `dependencies` must be a list")
    found: list[str] = []
    for dependency in dependencies:
        if isinstance(dependency, dict):
            pip = dependency.get("pip") or []
            if not isinstance(pip, list) or not all(isinstance(p, str) for p in pip):
                raise ConfigError(f"modules/{where}: `pip:` must be a list of requirements")
            found += pip
    return found


def render(repo: Path, spec: ModuleSpec) -> str:
    environment = repo / "modules" / spec.name / spec.environment
    header = (
        f"{MARK} modules/{spec.name}/{spec.environment}:\n"
        "# edit its `pip:` section, not this file. The module's host tests run on it.\n"
    )
    return header + "".join(f"{line}\n" for line in pip_requirements(environment))


def expected(repo: Path) -> dict[Path, str | None]:
    """Each generated file -> its content; None for a generated file whose module is gone."""
    files: dict[Path, str | None] = {
        requirements_file(repo, name): render(repo, spec)
        for name, spec in find_modules(repo).items()
    }
    for path in sorted(repo.glob("requirements-*.txt")):
        if path not in files and path.read_text(encoding="utf-8").startswith(MARK):
            files[path] = None
    return files


def stale(repo: Path) -> list[Path]:
    def current(path: Path) -> str | None:
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return [path for path, text in expected(repo).items() if current(path) != text]


def write(repo: Path) -> list[Path]:
    """Writes the stale files only: an unchanged one keeps its mtime, so that make does not
    rebuild a venv for nothing."""
    changed = stale(repo)
    files = expected(repo)
    for path in changed:
        text = files[path]
        if text is None:
            path.unlink()
        else:
            path.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.requirements",
        description="Write requirements-<name>.txt from each module's environment.yml.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        changed = stale(args.repo) if args.check else write(args.repo)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(path.name for path in changed)
    if args.check:
        if changed:
            print(
                f"error: {names} not what the environment files say: run `make requirements`",
                file=sys.stderr,
            )
            return 1
        return 0
    if changed:
        print(f"wrote {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m devkit.scaffold NAME` (or `make new-module NAME=...`): a complete, working module
written from the templates beside this file. A dev tool: no module image carries it.

Right after it, with no edit: `python -m validator NAME --check modules/NAME/example_input.json`
prints metrics, `pytest tests/NAME` passes (in .venv-NAME after `make install` for a module
with `--own-venv`), `python run.py NAME --build-only` builds its image and `docker compose
config` lists `validator-NAME`: what derives from the specs (requirements-NAME.txt, the Compose
files, deploy/kubernetes/ where the repo has it) is rewritten, and its image's hash locks are
written (uv resolves them from the package index, or offline from UV_FIND_LINKS with UV_OFFLINE).
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from devkit.lock import all_locks, default_find_links
from devkit.lock import write as write_locks
from devkit.requirements import write as write_requirements
from launcher.deploy.compose import write_compose
from launcher.deploy.kubernetes import OUTPUT_DIR as KUBERNETES_DIR
from launcher.deploy.kubernetes import write_kubernetes
from validator.errors import ConfigError
from validator.spec import COMMANDS, REPO_ROOT

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Template -> where it goes, relative to the repo; {name} is the module's name.
FILES = {
    "__init__.py.j2": "modules/{name}/__init__.py",
    "module.yaml.j2": "modules/{name}/module.yaml",
    "environment.yml.j2": "modules/{name}/environment.yml",
    "example_input.json.j2": "modules/{name}/example_input.json",
    "config.json.j2": "configs/{name}.json",
    # tests/<name>/: where the Makefile runs a module's tests (in .venv-<name> for its own venv).
    "test_module.py.j2": "tests/{name}/test_{name}_module.py",
}


class ScaffoldError(Exception):
    """A name the scaffolder refuses; nothing has been written."""


@dataclass(frozen=True)
class Scaffold:
    name: str
    files: list[Path]


def check_name(name: str, repo: Path) -> None:
    if not name.isidentifier() or not name.isascii():
        raise ScaffoldError(f"{name!r} is not a valid module name: use a Python identifier")
    if name != name.lower():
        raise ScaffoldError(f"{name!r}: module names are lower case, e.g. {name.lower()!r}")
    if keyword.iskeyword(name) or name.startswith("_"):
        raise ScaffoldError(f"{name!r} cannot be a module name (a Python keyword or private)")
    if name in COMMANDS:
        raise ScaffoldError(f"{name!r} is a command (python run.py {name}): give another name")
    if (repo / "modules" / name).exists():
        raise ScaffoldError(f"module {name!r} exists already (modules/{name}/)")
    taken = [p for p in _targets(name, repo) if p.exists()]
    if (repo / "tests" / name).exists():
        taken.append(repo / "tests" / name)
    taken += [p for p in (repo / "tests").rglob(f"test_{name}_module.py") if p not in taken]
    if taken:
        listing = ", ".join(str(p.relative_to(repo)) for p in taken)
        raise ScaffoldError(f"module {name!r}: {listing} exists already")


def _targets(name: str, repo: Path) -> list[Path]:
    return [repo / target.format(name=name) for target in FILES.values()]


# A name with extras and version specifiers (no markers, options or URLs): written into
# environment.yml as a plain YAML scalar, so nothing YAML reads otherwise is let through.
REQUIREMENT = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?([<>=!~]=?[A-Za-z0-9.*+!,<>=~-]+)?"
)


def check_requirement(requirement: str) -> str:
    if not REQUIREMENT.fullmatch(requirement.strip()):
        raise ScaffoldError(
            f"{requirement!r} is not a pip requirement such as roman==5.2 (add markers or URLs "
            "to environment.yml by hand)"
        )
    return requirement.strip()


def scaffold(
    name: str,
    repo: Path = REPO_ROOT,
    summary: str | None = None,
    pip: tuple[str, ...] = (),
    own_venv: bool = False,
) -> Scaffold:
    """Writes module `name` into `repo` (with `pip` requirements in its environment, its tests
    in a venv of their own if `own_venv`) and rewrites what derives from the specs; raises
    ScaffoldError (before writing anything) for a name that is taken or not valid."""
    check_name(name, repo)
    requirements = [check_requirement(r) for r in pip]
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        undefined=StrictUndefined,  # a template asking for a value we do not pass fails loudly
        keep_trailing_newline=True,
        autoescape=False,  # Python, YAML and JSON, not HTML
    )
    values = {
        "name": name,
        "class_prefix": "".join(part.capitalize() for part in name.split("_")),
        "summary": summary or f"the {name} validation module",
        "pip": requirements,
        "test_venv": "own" if own_venv else "shared",
    }
    written = []
    for template, target in FILES.items():
        path = repo / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(environment.get_template(template).render(values), encoding="utf-8")
        written.append(path)
    written += write_requirements(repo)
    try:  # its image installs its hash locks: resolved by uv, from the index
        written += write_locks(all_locks(repo, name), default_find_links())
    except (ConfigError, OSError) as exc:  # no uv or index here; a repo without the runtime's
        print(f"warning: {exc}; `make lock` writes its locks", file=sys.stderr)
    write_compose(repo, check=False, hosts=None, gpus_output=None)
    # A module author's scratch repo has no deploy/kubernetes: none is started there.
    if (repo / KUBERNETES_DIR).is_dir():
        write_kubernetes(repo, check=False)
    return Scaffold(name, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.scaffold", description="Write a new, working module."
    )
    parser.add_argument("name", help="the module's name: a lower-case Python identifier")
    parser.add_argument("--summary", help="one line on what it validates")
    parser.add_argument(
        "--pip",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="a pip requirement of the module, e.g. roman==5.2 (repeatable): its environment.yml "
        "and requirements-NAME.txt",
    )
    parser.add_argument(
        "--own-venv",
        action="store_true",
        help="its tests run in a venv of their own, .venv-NAME (a stack that conflicts with the "
        "dev venv's); `make install` builds it",
    )
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        result = scaffold(args.name, args.repo, args.summary, tuple(args.pip), args.own_venv)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in result.files:
        print(f"wrote {path.relative_to(args.repo)}")
    name = result.name
    tests = (
        f"  make install && .venv-{name}/bin/python -m pytest tests/{name}\n"
        if args.own_venv
        else f"  make install && python -m pytest tests/{name}\n"
    )
    print(
        "\nnext:\n"
        f"  python -m validator {name} --check modules/{name}/example_input.json\n"
        f"{tests}"
        f"  python run.py {name} --build-only\n"
        f"  docker compose up validator-{name}"
    )
    return 0

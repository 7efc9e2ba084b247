"""`python -m validator new-module NAME` (or `make new-module NAME=...`): a complete, working
module written from the templates beside this file.

Right after it, with no edit: `python -m validator NAME --check modules/NAME/example_input.json`
prints metrics, `pytest tests/modules/test_NAME_module.py` passes, `python run.py NAME
--build-only` builds its image and `docker compose config` lists `validator-NAME` (compose.yaml
is rewritten from the specs).
"""

from __future__ import annotations

import argparse
import keyword
import sys
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from launcher.compose import main as write_compose

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "templates"
# Template -> where it goes, relative to the repo; {name} is the module's name.
FILES = {
    "__init__.py.j2": "modules/{name}/__init__.py",
    "module.yaml.j2": "modules/{name}/module.yaml",
    "environment.yml.j2": "modules/{name}/environment.yml",
    "example_input.json.j2": "modules/{name}/example_input.json",
    "config.json.j2": "configs/{name}.json",
    "test_module.py.j2": "tests/modules/test_{name}_module.py",
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
    if (repo / "modules" / name).exists():
        raise ScaffoldError(f"module {name!r} exists already (modules/{name}/)")
    taken = [p for p in _targets(name, repo) if p.exists()]
    taken += [p for p in (repo / "tests").rglob(f"test_{name}_module.py") if p not in taken]
    if taken:
        listing = ", ".join(str(p.relative_to(repo)) for p in taken)
        raise ScaffoldError(f"module {name!r}: {listing} exists already")


def _targets(name: str, repo: Path) -> list[Path]:
    return [repo / target.format(name=name) for target in FILES.values()]


def scaffold(name: str, repo: Path = REPO_ROOT, summary: str | None = None) -> Scaffold:
    """Writes module `name` into `repo` and rewrites its Compose files; raises ScaffoldError
    (before writing anything) for a name that is taken or not valid."""
    check_name(name, repo)
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
    }
    written = []
    for template, target in FILES.items():
        path = repo / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(environment.get_template(template).render(values), encoding="utf-8")
        written.append(path)
    write_compose(["--repo", str(repo)])
    return Scaffold(name, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validator new-module", description="Write a new, working module."
    )
    parser.add_argument("name", help="the module's name: a lower-case Python identifier")
    parser.add_argument("--summary", help="one line on what it validates")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        result = scaffold(args.name, args.repo, args.summary)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in result.files:
        print(f"wrote {path.relative_to(args.repo)}")
    name = result.name
    print(
        "\nnext:\n"
        f"  python -m validator {name} --check modules/{name}/example_input.json\n"
        f"  python -m pytest tests/modules/test_{name}_module.py\n"
        f"  python run.py {name} --build-only\n"
        f"  docker compose up validator-{name}"
    )
    return 0

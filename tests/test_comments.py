"""Comments say why, never when: the product's code names no issue, and a module's docstring is a
few lines (what needs more is in docs/internals.md). Read from the files, as text and `ast`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from devkit.validator_cli import REPO_ROOT

PRODUCT = sorted(
    path
    for place in ("validator", "launcher", "modules")
    for path in (REPO_ROOT / place).rglob("*.py")
    if "__pycache__" not in path.parts
) + [REPO_ROOT / "run.py"]
MAX_DOCSTRING_LINES = 20
ISSUE = re.compile(r"[Ii]ssue [0-9]+")
# Files other work was changing while these rules came in: their history and long docstrings
# go when that work lands. Each still breaks its rule, or the test says to drop it here.
PENDING: set[str] = set()


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def docstring_lines(path: Path) -> int:
    """The source lines of `path`'s module docstring, its quotes included (0 without one)."""
    body = ast.parse(path.read_text()).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def breaking() -> dict[str, list[str]]:
    """Each product file that names an issue or has a long docstring, with what it breaks."""
    found: dict[str, list[str]] = {}
    for path in PRODUCT:
        issues = [f"line {n}: {m[0]}" for n, line in enumerate(path.read_text().splitlines(), 1)
                  for m in ISSUE.finditer(line)]  # fmt: skip
        lines = docstring_lines(path)
        long = [f"docstring of {lines} lines"] if lines > MAX_DOCSTRING_LINES else []
        if issues or long:
            found[rel(path)] = issues + long
    return found


def test_no_product_comment_names_an_issue_and_docstrings_are_a_few_lines():
    found = breaking()
    assert {name: why for name, why in found.items() if name not in PENDING} == {}
    assert sorted(PENDING - found.keys()) == [], "these keep the rules now: drop them from PENDING"


def test_no_tooling_comment_names_an_issue():
    # Tests, benches and tooling are code too: what they guard says why, the history is in git.
    tooling = [
        path
        for place in ("tests", "bench", "devkit", "scripts", ".github", ".ci")
        for path in (REPO_ROOT / place).rglob("*")
        if path.is_file() and path.suffix in {".py", ".sh", ".yml", ".yaml", ""}
        and "__pycache__" not in path.parts and path != Path(__file__).resolve()
    ] + [REPO_ROOT / "Makefile", REPO_ROOT / "compose.yaml"]  # fmt: skip
    found = {
        rel(path): n
        for path in tooling
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ISSUE.search(line)
    }
    assert found == {}

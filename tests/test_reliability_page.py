"""docs/reliability.md is a claim a line, each naming the test that holds it: every pytest id
there names a test that exists, so that a renamed or deleted test cannot leave a claim behind."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reliability.md"
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`$")


def defined_tests(path: Path) -> set[str]:
    """The test functions defined in a test file, at its top level or in its classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        body = node.body if isinstance(node, ast.ClassDef) else [node]
        names |= {
            item.name
            for item in body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and item.name.startswith("test_")
        }
    return names


def claims() -> list[str]:
    return [line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("- ")]


def test_every_claim_ends_with_the_id_of_its_test():
    lines = claims()
    assert len(lines) >= 40
    without = [line for line in lines if not TEST_ID.search(line)]
    assert without == [], "a claim with no `tests/...py::test_name` at its end"


def test_every_test_a_claim_names_exists():
    missing = []
    for line in claims():
        path, name = TEST_ID.search(line).groups()
        if not (REPO / path).is_file() or name not in defined_tests(REPO / path):
            missing.append(f"{path}::{name}")
    assert missing == []

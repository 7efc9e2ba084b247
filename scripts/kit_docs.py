"""The lists in docs/module-api.md that the code holds: the kit's names, grouped as its stub
groups them (validator/kit/__init__.pyi), and the earlier spellings that still work, each with
the release that removes it (validator/_moved.py). `python -m scripts.kit_docs` rewrites them
between their markers; tests/test_kit.py fails when the page is not what this writes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from validator import _moved

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGE = REPO_ROOT / "docs" / "module-api.md"
STUB = REPO_ROOT / "validator" / "kit" / "__init__.pyi"
SECTION = re.compile(
    r"(<!-- (?P<name>[a-z-]+): written by .*? -->\n)(.*?)(<!-- /(?P=name) -->)", re.S
)


def stub_groups(stub: Path = STUB) -> list[tuple[str, list[str]]]:
    """(title, names) for each group of the stub: the one-line comment above its imports."""
    text = stub.read_text(encoding="utf-8")
    tree = ast.parse(text)
    after = tree.body[0].end_lineno or 0  # the docstring; the comments above it are not titles
    titles = [
        (number, line[2:].strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if number > after and line.startswith("# ")
    ]
    groups: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            title = [t for number, t in titles if number < node.lineno][-1]
            groups.setdefault(title, []).extend(a.asname or a.name for a in node.names)
    return list(groups.items())


def kit_names() -> str:
    rows = ["| for | names |", "|---|---|"]
    for title, names in stub_groups():
        rows.append(f"| {title} | {', '.join(f'`{name}`' for name in names)} |")
    return "\n".join(rows) + "\n"


def aliases() -> str:
    rows = ["| earlier | instead | removed in |", "|---|---|---|"]
    for alias in _moved.ALIASES:
        note = f" ({alias.note})" if alias.note else ""
        rows.append(f"| `{alias.old}` | `{alias.new}`{note} | {alias.removed_in} |")
    return "\n".join(rows) + "\n"


WRITERS = {"kit-names": kit_names, "aliases": aliases}


def rewritten(page: str) -> str:
    """`page` with each marked section as the code gives it."""
    return SECTION.sub(lambda m: m[1] + "\n" + WRITERS[m["name"]]() + "\n" + m[4], page)


def main() -> int:
    page = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(rewritten(page), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs pages checked for what Python-Markdown, the site's renderer, gets wrong without a word
(`mkdocs build --strict` counts broken links, not these), run by `make lint`:

- a list that renders as part of a paragraph: Python-Markdown starts a list only after a blank
  line (GitHub's CommonMark does not need one, so the page looks right there);
- a list item indented 1 to 3 spaces: Python-Markdown nests a list only under 4 spaces, so it
  becomes an item of the list above (a bullet among numbers, the numbering shifted);
- a paragraph, fence or table indented 1 to 3 spaces after a blank line: Python-Markdown ends
  the list there (an item's next paragraph needs 4 spaces), and a numbered list restarts;
- an escaped pipe in inline code: Python-Markdown splits no table cell inside a code span, so
  `a\\|b` shows its backslash;
- a page of more than 600 words (fenced code aside) with no `##` subheading: a wall of text
  with nothing in the site's table of contents.

The first and the fourth are found in what Python-Markdown renders, with mkdocs.yml's
extensions; the others in the source, fenced code excluded.

    python -m scripts.docs_lint [FILE ...]    # default: docs/*.md and README.md

prints `path:line: what` for each finding and exits 1 if there is one. It needs Python-Markdown,
pymdown-extensions and PyYAML only (what mkdocs-material brings: `.venv-docs`).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as etree
from dataclasses import dataclass
from pathlib import Path

import markdown
import yaml
from markdown.treeprocessors import Treeprocessor

REPO_ROOT = Path(__file__).resolve().parents[1]
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+\S")
SHALLOW_ITEM = re.compile(r"^ {1,3}(?:[-*+]|\d+\.)\s+\S")
SHALLOW_BLOCK = re.compile(r"^ {1,3}\S")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
LONG_PAGE_WORDS = 600


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 1-based; 0 when the text was not found in the source
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def site_extensions(config: Path = REPO_ROOT / "mkdocs.yml") -> tuple[list[str], dict]:
    """mkdocs.yml's markdown_extensions, as Python-Markdown takes them."""
    names: list[str] = []
    configs: dict = {}
    for entry in yaml.safe_load(config.read_text(encoding="utf-8"))["markdown_extensions"]:
        name, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        names.append(name)
        if options:
            configs[name] = options
    return names, configs


class _Collect(Treeprocessor):
    """Before the inline patterns (priority above 20) a paragraph's text is still its source;
    after them, a code span is a <code> element."""

    def __init__(self, md: markdown.Markdown, sink: list[tuple[str, str]], raw: bool) -> None:
        super().__init__(md)
        self.sink, self.raw = sink, raw

    def run(self, root: etree.Element) -> None:
        self._walk(root, in_pre=False)

    def _walk(self, element: etree.Element, in_pre: bool) -> None:
        if self.raw and element.tag == "p" and element.text:
            self.sink.append(("p", element.text))
        if not self.raw and element.tag == "code" and not in_pre and element.text:
            self.sink.append(("code", element.text))
        for child in element:
            self._walk(child, in_pre or element.tag == "pre")


def rendered_blocks(text: str, extensions: tuple[list[str], dict]) -> list[tuple[str, str]]:
    """("p", a paragraph's source) and ("code", a code span's text), in page order per kind."""
    names, configs = extensions
    md = markdown.Markdown(extensions=names, extension_configs=configs)
    found: list[tuple[str, str]] = []
    md.treeprocessors.register(_Collect(md, found, raw=True), "docs_lint_raw", 25)
    md.treeprocessors.register(_Collect(md, found, raw=False), "docs_lint_code", 15)
    md.convert(text)
    return found


def _line_of(lines: list[str], block: list[str]) -> int:
    """The source line where these consecutive lines (indent aside) start."""
    wanted = [line.strip() for line in block]
    for start in range(len(lines) - len(wanted) + 1):
        if all(lines[start + k].strip() == w for k, w in enumerate(wanted)):
            return start + 1
    return 0


def check_rendered(path: str, text: str, extensions: tuple[list[str], dict]) -> list[Finding]:
    lines = text.splitlines()
    findings = []
    for kind, content in rendered_blocks(text, extensions):
        block = content.split("\n")
        if kind == "p":
            for k, line in enumerate(block[1:], start=1):
                if LIST_ITEM.match(line):
                    start = _line_of(lines, block)
                    findings.append(
                        Finding(
                            path,
                            start + k if start else 0,
                            "a list with no blank line before it renders as part of the "
                            "paragraph above: add a blank line",
                        )
                    )
                    break
        elif "\\|" in content:
            first = block[0]
            line = next((n for n, s in enumerate(lines, 1) if first in s), 0)
            findings.append(
                Finding(path, line, f"`{first}` shows its backslash: write | unescaped in code")
            )
    return findings


def check_source(path: str, text: str) -> list[Finding]:
    findings = []
    fence: str | None = None
    previous = ""
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            closing = opened.group(1) if opened else ""
            if closing[:1] == fence[:1] and len(closing) >= len(fence) and not line.strip(" `~"):
                fence = None
            previous = line
            continue
        if SHALLOW_ITEM.match(line):
            findings.append(
                Finding(
                    path,
                    number,
                    "a list item indented 1-3 spaces is not nested: it joins the list "
                    "above; indent a nested list 4 spaces",
                )
            )
        elif not previous.strip() and SHALLOW_BLOCK.match(line):
            findings.append(
                Finding(
                    path,
                    number,
                    "indented 1-3 spaces after a blank line, this leaves the list above "
                    "(a numbered one restarts): indent it 4 spaces to keep it in the item",
                )
            )
        if opened:
            fence = opened.group(1)
        previous = line
    return findings


def check_headings(path: str, text: str) -> list[Finding]:
    words, fence, subheading = 0, False, False
    for line in text.splitlines():
        if FENCE.match(line):
            fence = not fence
        elif not fence:
            words += len(line.split())
            subheading = subheading or line.startswith("## ")
    if words > LONG_PAGE_WORDS and not subheading:
        return [Finding(path, 1, f"{words} words and no ## subheading: give its parts headings")]
    return []


def lint(paths: list[Path], root: Path = REPO_ROOT) -> list[Finding]:
    extensions = site_extensions()
    findings: list[Finding] = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        found = check_source(shown, text) + check_rendered(shown, text, extensions)
        found += check_headings(shown, text)
        findings += sorted(found, key=lambda f: f.line)
    return findings


def default_pages(root: Path = REPO_ROOT) -> list[Path]:
    return [*sorted((root / "docs").glob("*.md")), root / "README.md"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a).resolve() for a in args] or default_pages()
    findings = lint(paths)
    for finding in findings:
        print(finding)
    if findings:
        print(f"docs lint: {len(findings)} finding(s) in {len(paths)} page(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

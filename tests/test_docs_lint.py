"""The docs lint (scripts/docs_lint.py, in `make lint`): what Python-Markdown renders wrong
without a warning, found on small pages whose rendering was looked at, and none left on the
site's pages and the README."""

from __future__ import annotations

from pathlib import Path

from scripts.docs_lint import default_pages, lint, main, site_extensions


def findings(tmp_path: Path, text: str) -> list[tuple[int, str]]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return [(f.line, f.what.split(":")[0]) for f in lint([page], root=tmp_path)]


RUN_ON = "a list with no blank line before it renders as part of the paragraph above"
SHALLOW = "a list item indented 1-3 spaces is not nested"
LEAVES = (
    "indented 1-3 spaces after a blank line, this leaves the list above (a numbered one restarts)"
)


def test_a_list_right_under_a_paragraph_is_found_at_its_first_item(tmp_path):
    assert findings(tmp_path, "# Title\n\nRunning validators:\n- one\n- two\n") == [(4, RUN_ON)]
    assert findings(tmp_path, "Steps:\n1. one\n2. two\n") == [(2, RUN_ON)]
    assert findings(tmp_path, "Running validators:\n\n- one\n- two\n") == []
    # After a heading Python-Markdown starts the list: nothing to say.
    assert findings(tmp_path, "## Running validators\n- one\n") == []


def test_a_list_nested_four_spaces_under_an_item_needs_no_blank_line(tmp_path):
    assert findings(tmp_path, "1. The tools:\n    - one\n    - two\n2. next\n") == []


def test_a_list_item_indented_less_than_four_spaces_is_not_nested(tmp_path):
    # Python-Markdown makes `- a` the second item of the numbered list.
    assert findings(tmp_path, "1. The config has:\n\n   - a\n   - b\n") == [
        (3, SHALLOW),
        (4, SHALLOW),
    ]


def test_a_paragraph_indented_less_than_four_spaces_leaves_the_list(tmp_path):
    text = "1. one\n\n   more about one\n2. two\n"
    assert findings(tmp_path, text) == [(3, LEAVES), (4, RUN_ON)]
    fence = "1. run:\n\n   ```sh\n   make\n   ```\n\n2. two\n"
    assert findings(tmp_path, fence) == [(3, LEAVES)]
    assert findings(tmp_path, "1. run:\n\n    ```sh\n    make\n    ```\n\n2. two\n") == []


def test_fenced_code_is_not_markdown(tmp_path):
    text = "Text:\n\n```\nIntro:\n- a\n   - b\n\n  c `x\\|y`\n```\n\n~~~~\nx:\n- y\n~~~~\n"
    assert findings(tmp_path, text) == []


def test_an_escaped_pipe_in_code_shows_its_backslash(tmp_path):
    table = "| option | what |\n|---|---|\n| `--gpus all\\|none` | GPUs |\n"
    assert findings(tmp_path, table) == [(3, "`--gpus all\\|none` shows its backslash")]
    # Python-Markdown's tables split no cell inside a code span: the plain pipe is right.
    assert findings(tmp_path, table.replace("\\|", "|")) == []
    assert findings(tmp_path, "Say `a\\|b` here.\n") == [(1, "`a\\|b` shows its backslash")]


def test_a_long_page_needs_subheadings(tmp_path):
    prose = "word " * 301
    wall = f"# Title\n\n{prose}\n\n{prose}\n"
    assert findings(tmp_path, wall) == [(1, "604 words and no ## subheading")]
    assert findings(tmp_path, wall.replace("\n\nword", "\n\n## Part\n\nword", 1)) == []
    # Code is not prose: a page of long examples needs no headings for them.
    assert findings(tmp_path, f"# Title\n\n{prose}\n\n```\n{prose}\n```\n") == []


def test_it_renders_with_the_sites_extensions():
    names, _ = site_extensions()
    assert "pymdownx.superfences" in names and "tables" in names


def test_the_sites_pages_and_the_readme_render_their_lists(capsys):
    pages = default_pages()
    assert len(pages) > 20 and pages[-1].name == "README.md"
    assert main([]) == 0, capsys.readouterr().out

"""The repository is self-contained: nothing in it reads a path outside it.

Data the code, tests and bench need lives in the repo (`devkit/data/`), and comments cite
the repo's own docs (`docs/`). Two checks keep it so:
- a scan of every file git knows (tracked, or new and not ignored) for references to a folder
  beside the checkout, to this machine's absolute paths, or to an outside spec;
- a copy of those files, alone in a fresh directory (no `shared` folder beside it), runs
  the template tests and the validator loop demo, with an audit hook in every Python process
  that records any file opened in the original checkout or in a `shared` folder beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Written in pieces, so that this file does not match its own patterns.
_SHARED = "shared"
_SPEC = "SPEC"
FORBIDDEN = {
    "a folder beside the checkout": re.compile(r"\.\./" + _SHARED + r"\b"),
    "a path built to a folder beside the checkout": re.compile(r"/\s*[\"']" + _SHARED + r"[\"']"),
    "the outside reference folder": re.compile(_SHARED + "/reference"),
    "an outside spec": re.compile(_SPEC + r"(\.md| §)"),
    "an absolute path of this machine": re.compile(r"(?<![\w.~-])/" + "work" + "/"),
}

# Imported at start-up by every Python process of the clone run (it is on their PYTHONPATH):
# records each file opened or listed under a forbidden root to $SELF_CONTAINED_AUDIT_LOG.
SITECUSTOMIZE = r"""
import os
import sys

_LOG = os.environ.get("SELF_CONTAINED_AUDIT_LOG")
_FORBIDDEN = [p for p in os.environ.get("SELF_CONTAINED_FORBIDDEN", "").split(os.pathsep) if p]
_ALLOWED = [os.path.realpath(sys.prefix) + os.sep]  # the interpreter's own environment
_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.chdir", "shutil.copyfile"})


def _under(path, roots):
    return any(path == root.rstrip(os.sep) or path.startswith(root) for root in roots)


def _hook(event, args):
    if event not in _EVENTS or not args or not _LOG:
        return
    path = args[0]
    if path is None or isinstance(path, int):
        return
    try:
        path = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if _under(path, _FORBIDDEN) and not _under(path, _ALLOWED):
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {event} {path}\n")


if _LOG:
    sys.addaudithook(_hook)
"""


def repo_files() -> list[str]:
    """Every file git tracks or would add (not ignored) that exists in the working tree."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        # Passing silently would hide a reference outside the repository: say why it cannot run.
        pytest.fail(f"these checks list the repository's files with git, which failed: {exc}")
    names = sorted({name.decode() for name in listed.split(b"\0") if name})
    return [name for name in names if (REPO_ROOT / name).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_no_file_refers_outside_the_repo():
    problems = []
    for name in repo_files():
        text = _text(REPO_ROOT / name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for what, pattern in FORBIDDEN.items():
                if not pattern.search(line):
                    continue
                problems.append(f"{name}:{number}: {what}: {line.strip()[:120]}")
    assert not problems, "references outside the repository:\n" + "\n".join(problems)


def test_the_patterns_catch_what_they_are_for():
    # The scan passing proves nothing if its patterns match nothing.
    samples = [
        "bench --data ../" + _SHARED + "/data/sample.jsonl",
        'DATA = Path(__file__).parents[3] / "' + _SHARED + '" / "reference"',
        "see " + _SPEC + ".md",
        "(" + _SPEC + " §3)",
        'DATA_DIR = Path("/' + "work" + '/anything")',
    ]
    for sample in samples:
        assert any(p.search(sample) for p in FORBIDDEN.values()), sample
    for innocent in ['"/tmp/' + "work" + '/adapter.safetensors"', "a shared base", "spec = {}"]:
        assert not any(p.search(innocent) for p in FORBIDDEN.values()), innocent


def test_a_copy_alone_in_a_directory_runs(tmp_path):
    """A copy with no `shared` folder beside it: the template tests (which train the tests'
    tokenizer on the sample sets and read the template table) and the validator loop demo
    (simulator, CLI, fixture module) pass, and no process opens a file outside the copy."""
    parent = tmp_path / "x"
    clone = parent / "repo"
    for name in repo_files():
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    assert not (parent / _SHARED).exists()
    # On every process's PYTHONPATH: demo_loop.py gives the validator devkit/fixtures.
    (clone / "devkit" / "fixtures" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    audit_log = tmp_path / "audit.log"
    forbidden = [REPO_ROOT, REPO_ROOT.parent / _SHARED, parent / _SHARED]
    env = {
        **os.environ,
        "PYTHONPATH": str(clone / "devkit" / "fixtures"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "SELF_CONTAINED_AUDIT_LOG": str(audit_log),
        "SELF_CONTAINED_FORBIDDEN": os.pathsep.join(
            os.path.realpath(p) + os.sep for p in forbidden
        ),
    }
    env.pop("PYTEST_ADDOPTS", None)
    # The hook must see a read of the original checkout, or its silence below proves nothing.
    probe = f"open({str(REPO_ROOT / 'pyproject.toml')!r}).close()"
    subprocess.run([sys.executable, "-c", probe], cwd=clone, env=env, check=True, timeout=60)
    assert "pyproject.toml" in audit_log.read_text()
    audit_log.unlink()
    runs = [
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/lora/test_lora_templates.py"],
        [sys.executable, "-m", "scripts.demo_loop"],
    ]  # fmt: skip
    for command in runs:
        done = subprocess.run(
            command, cwd=clone, env=env, capture_output=True, text=True, timeout=300
        )
        output = (done.stdout + done.stderr)[-4000:]
        assert done.returncode == 0, (
            f"{' '.join(command[1:])} in the copy: rc {done.returncode}\n{output}"
        )
    # The demo's summary says why the failed one failed.
    assert "(broken/mallory-adapter): failed   <- rejected: ValueError: cannot load" in done.stdout
    opened = audit_log.read_text() if audit_log.exists() else ""
    assert not opened, "files opened outside the copy:\n" + opened[:4000]


CITATION = re.compile(r"(docs/[\w-]+\.md|README\.md)((?:,? (?:and )?\(?\"[^\"]+\")*)")


def _headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line[:2] == "##"}


def test_citations_of_the_docs_resolve():
    """A citation of a docs page or of the README, with the headings it names in double quotes
    after it, names a page and headings that exist."""
    pages = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]
    headings = {str(page.relative_to(REPO_ROOT)): _headings(page) for page in pages}
    problems = []
    for name in repo_files():
        text = _text(REPO_ROOT / name)
        if text is None or name.startswith("devkit/data/"):
            continue
        # A citation may run over a line break, in a comment or a docstring.
        joined = re.sub(r"\s*\n\s*(?:# ?)?", " ", text)
        for match in CITATION.finditer(joined):
            page, cited = match.group(1), re.findall(r"\"([^\"]+)\"", match.group(2))
            if page not in headings:
                problems.append(f"{name}: {page} does not exist")
            problems += [
                f"{name}: {page} has no heading {heading!r}"
                for heading in cited
                if page in headings and heading not in headings[page]
            ]
    assert not problems, "\n".join(problems)

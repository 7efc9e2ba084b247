"""A bounded child may write only in its own folder (Landlock: tests/test_child_landlock.py),
so its temporary files go there, on the served path too: transformers 5's AutoTokenizer, which
the server reads when it preloads transformers, settles tempfile's folder (/tmp) in the server,
and the child must look again (TMPDIR is its folder)."""

from __future__ import annotations

import json
from pathlib import Path

from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

# The child: where a temporary file goes, or why it cannot make one.
TEMPORARY = """
import json, tempfile
try:
    with tempfile.NamedTemporaryFile() as handle:
        seen = handle.name
except OSError as exc:
    seen = type(exc).__name__
json.dump(seen, open("seen.json", "w"))
"""


def test_a_served_childs_temporary_files_go_in_its_folder(tmp_path):
    child, work = tmp_path / "child.py", tmp_path / "work"
    child.write_text(TEMPORARY)
    result = run_child(child, [], cwd=work, limits=ChildLimits(120), preload=("transformers",))
    assert result.outcome is ChildOutcome.OK, result
    assert Path(json.loads((work / "seen.json").read_text())).parent == work.resolve()

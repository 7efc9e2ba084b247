"""A bounded child's bounds against the validator's own hard limits (validator/sandbox/
child_bounds.py, child_limits.py): a child cannot raise a hard limit it inherits, so a bound
above one is the host's problem, never a submission's. Through `python -m validator` (the
`cli` fixture, the fixture module's `child_memory_bytes`) and its doctor (rl's default
`inference_memory_bytes`, 8 GiB), each run under a lowered hard RLIMIT_AS, as `ulimit -v` sets
it, and without capabilities (as in the module image: root's CAP_SYS_RESOURCE would let a child
raise it).

- At start, before any lookup: exit 3 and one line naming the bound, the limit and what to set.
- A bound that passes that check but not with the child's interpreter on top: the child's
  set-up says so before the script runs, and the validator stops (exit 3) with the assignment
  kept, never submitted as failed (the old code failed the submission at once).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import REPO_ROOT
from tests.helpers.children import drop_capabilities

GIB = 1024**3
# The validator's hard address-space limit in these runs: room for itself and the kit's own
# children (SUBMISSION_LIMITS, 2 GiB), not for a bound of 4 GiB.
HARD_AS = 3 * GIB


def under_hard_as(limit: int):
    """A `preexec_fn`: the validator under a hard RLIMIT_AS of `limit` (`ulimit -v`), and no
    capability when the test runs as root."""

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if os.geteuid() == 0:
            drop_capabilities()

    return lower


def test_a_bound_above_the_hard_limit_stops_the_start_with_one_line(tmp_path, cli):
    cli.config({"child_memory_bytes": 4 * GIB, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["child/a"])]}, tmp_path) as sim:
        result = cli.run(
            cli.args(sim.api_url, "1", "--max-assignments", "1"), preexec_fn=under_hard_as(HARD_AS)
        )
        assert sim.lookups() == []  # refused before any assignment is asked for
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        "operator action needed: module fixture's child_memory_bytes: a bounded child needs an "
        f"address space of {4 * GIB} bytes on top of its interpreter's, more than this "
        f"process's hard RLIMIT_AS of {HARD_AS} bytes leaves, and a child cannot raise it: "
        "raise that hard limit where the validator starts (`ulimit -Hv` shows it; in a "
        "container, the Docker daemon's own (its unit's LimitAS=): --ulimit has no address "
        "space) or lower child_memory_bytes in configs/fixture.json"
    ) in last, last


def test_a_child_that_cannot_take_its_limit_stops_the_validator_and_fails_no_one(tmp_path, cli):
    # The bound fits under the hard limit, the child's interpreter on top of it does not.
    cli.config({"child_memory_bytes": HARD_AS - 1024**2, "marker_dir": str(tmp_path)})
    with Simulator({"tasks": [task(1, ["child/a"])]}, tmp_path) as sim:
        result = cli.run(
            cli.args(sim.api_url, "1", "--max-assignments", "1"), preexec_fn=under_hard_as(HARD_AS)
        )
        assert len(sim.lookups()) == 1
        assert sim.submissions() == []  # the honest submission is not failed
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        "assignment 1 kept for a retry after you fix this: a bounded child could not take " in last
    )
    assert f"is above the hard limit of {HARD_AS} it inherited" in last
    assert "no submission is at fault, the assignment is kept" in last


# A validator under a hard RLIMIT_AS of its argv[1]: a child on each path asking for all of it.
VALIDATOR = """
import json, resource, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from validator.kit import ChildLimits, OperatorError, run_child
from validator.sandbox import child_server
hard = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
script = Path({work!r}) / "nothing.py"
script.write_text("open('ran', 'w').write('the script ran')")
said = {{}}
for path in ("served", "fresh"):
    if path == "fresh":
        child_server.server_for = lambda *_args, **_kwargs: None
    try:
        result = run_child(script, [], cwd=Path({work!r}) / path,
                           limits=ChildLimits(60, memory_bytes=hard - 1024**2))
        said[path] = result.describe()
    except OperatorError as exc:
        said[path] = [type(exc).__name__, str(exc)]
    said[path + " ran"] = (Path({work!r}) / path / "ran").exists()
print(json.dumps(said))
"""


def test_on_both_paths_the_childs_refusal_is_the_operators(tmp_path):
    validator = tmp_path / "validator.py"
    validator.write_text(VALIDATOR.format(root=str(REPO_ROOT), work=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, str(validator), str(HARD_AS)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=drop_capabilities if os.geteuid() == 0 else None,  # noqa: PLW1509
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    for path in ("served", "fresh"):
        kind, text = said[path]
        assert kind == "ChildBoundUnfit", said
        assert text.startswith("a bounded child could not take its limits: RLIMIT_AS of "), text
        assert said[f"{path} ran"] is False  # refused before the script's first line


def test_the_doctor_names_rls_default_bound_under_an_8_gib_hard_limit(tmp_path, cli):
    result = cli.run(
        ["doctor", "rl", "--config-dir", str(tmp_path / "configs"), "--only", "module setup",
         "--json"],
        preexec_fn=under_hard_as(8 * GIB),
    )  # fmt: skip
    (row,) = json.loads(result.stdout)
    assert (row["check"], row["result"]) == ("module setup", "failed"), row
    assert row["detail"].startswith(
        "module rl's inference_memory_bytes: a bounded child needs an address space of "
        f"{8 * GIB} bytes on top of its interpreter's, more than this process's hard RLIMIT_AS "
        f"of {8 * GIB} bytes leaves"
    ), row
    assert row["detail"].endswith(
        "or lower inference_memory_bytes in configs/rl.json (or the task's config)"
    )

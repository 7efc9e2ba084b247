"""A task is scored only by its module: each task id's `task_type` in the Fed Ledger's task list
against the type each module's spec declares (validator/ledger/task_types.py). A task of another
module's type stops the start (exit 3, one line naming the task, its type and the command for
it) before any lookup, and fails the doctor's row; a type no module declares is a warning. The
attack: `python run.py rl --task_ids 56`, task 56 a lora (`training`) task, took its assignment
and submitted an honest lora adapter as failed; the doctor said "Fed Ledger ok"."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from devkit.simulator.process import Simulator, task
from devkit.validator_cli import loop_args, run_validator, validator_env, write_config
from validator.doctor.command import main as inner_doctor
from validator.ledger.answers import Task
from validator.ledger.task_types import judge_task_types
from validator.spec import REPO_ROOT, ModuleSpec, find_modules, load_spec

FIXTURE_ROOT = REPO_ROOT / "devkit" / "fixtures"
MODULES = find_modules(REPO_ROOT, FIXTURE_ROOT)
LIST = ("GET", "/api/v1/tasks/list")
REFUSED_56 = (
    "task 56 has type 'training', the lora module's, not rl's: validate it with "
    "python run.py lora --task_ids 56; leave it out of rl's --task_ids"
)


def judged(module: str, listed: dict[str, str | None], ids: list[str] | None = None):
    tasks = [Task(id=task_id, task_type=kind) for task_id, kind in listed.items()]
    return judge_task_types(tasks, ids or list(listed), MODULES[module], MODULES)


def test_each_module_declares_its_type_or_says_it_is_not_yet_known():
    assert MODULES["lora"].task_type == "training"
    for module, names in (("rl", {"rl", "reinforcement_learning"}),
                          ("llm_judge", {"llm_judge", "llm_evaluation"})):  # fmt: skip
        unknown = MODULES[module].task_type
        assert unknown is not None and not isinstance(unknown, str) and unknown.unknown
        assert MODULES[module].task_type_names() == names
    assert "training" in MODULES["fixture"].task_type_names()  # the simulator's default


def test_a_task_of_another_modules_type_is_refused_in_one_line_naming_its_command():
    assert judged("rl", {"56": "training"}).refusal() == REFUSED_56
    # A name the network's code gives a module whose type is not yet known counts as its own.
    refused = judged("lora", {"7": "reinforcement_learning", "8": "llm_evaluation", "9": "rl"})
    assert refused.refusal() == (
        "tasks 7, 9 have types 'reinforcement_learning', 'rl', the rl module's, not lora's: "
        "validate them with python run.py rl --task_ids 7,9; task 8 has type 'llm_evaluation', "
        "the llm_judge module's, not lora's: validate it with python run.py llm_judge "
        "--task_ids 8; leave them out of lora's --task_ids"
    )


def test_own_types_fit_and_a_type_nobody_declares_is_a_warning():
    fits = judged("rl", {"1": "rl", "2": "reinforcement_learning"})
    assert (fits.fit, fits.warnings, fits.refusal()) == (("1", "2"), (), None)
    odd = judged("lora", {"3": "training", "4": "x" * 300, "5": None}, ["3", "4", "5", "6"])
    assert odd.fit == ("3",) and odd.unlisted == ("6",) and odd.refusal() is None
    undeclared, untyped = odd.warnings
    assert "which no module declares (lora's tasks are 'training')" in undeclared
    assert len(undeclared) < 300 and "looked up all the same" in undeclared
    assert untyped == "task 5 is listed without a type: not checked"
    # A module whose spec declares nothing: a type some module declares is still refused.
    bare = ModuleSpec(name="bare")
    verdict = judge_task_types([Task(id="1", task_type="training")], ["1"], bare, MODULES)
    assert verdict.refusal() is not None and "python run.py lora --task_ids 1" in verdict.refusal()


@pytest.mark.parametrize(
    "task_type",
    ["", "a b", "x" * 65, "-lead"],
)
def test_a_spec_task_type_is_a_type_the_list_could_hold(tmp_path, task_type):
    folder = tmp_path / "modules" / "odd"
    folder.mkdir(parents=True)
    (folder / "module.yaml").write_text(f"name: odd\ntask_type: {task_type!r}\n")
    with pytest.raises(Exception, match="task_type"):
        load_spec(folder)


def test_rl_on_a_lora_task_stops_before_any_lookup_and_the_doctor_says_so(tmp_path):
    env = validator_env(tmp_path)
    del env["HF_TOKEN"]  # rl declares no secret
    write_config(tmp_path, "rl", {})
    with Simulator({"tasks": [task(56, ["alice/honest-adapter"])]}, tmp_path) as sim:
        result = run_validator(loop_args("rl", sim.api_url, "56", "--max-assignments", "1"), env)
        asked = [(r["method"], r["path"]) for r in sim.state()["requests"]]
        doctor = CliRunner().invoke(
            inner_doctor, ["rl", "--task_ids", "56"], env={**env, "FLOCK_API_URL": sim.api_url}
        )
        assert sim.submissions() == []
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(REFUSED_56), result.stderr
    assert asked == [LIST]  # never a lookup, never a result
    rows = {line.split("  ")[0]: line for line in doctor.output.splitlines()}
    assert "failed" in rows["task types"] and REFUSED_56 in rows["task types"], doctor.output
    assert doctor.exit_code == 1


def test_no_task_is_looked_up_before_the_list_gave_its_type(tmp_path):
    # The list answers 503 to the first call's two tries (VALIDATOR_API_RETRIES=1): before, the
    # validator warned and looked the task up unchecked.
    faults = [{"endpoint": "list", "kind": "status", "status": 503, "count": 2}]
    data = {"tasks": [task(7, ["ok/a"])]}
    with Simulator(data, tmp_path, faults=faults) as sim:
        args = loop_args("fixture", sim.api_url, "7", "--max-assignments", "1")
        result = run_validator(args, validator_env(tmp_path))
        asked = [(r["method"], r["path"], r["status"]) for r in sim.state()["requests"]]
    assert result.returncode == 0, result.stderr
    first_lookup = next(i for i, r in enumerate(asked) if "request-validation" in r[1])
    assert (*LIST, 200) in asked[:first_lookup], asked
    # The list the check read is the lookups' too: a start asks for it once it answers.
    assert [r for r in asked if r[:2] == LIST] == [(*LIST, 503), (*LIST, 503), (*LIST, 200)]
    assert "no task is looked up before its type is checked" in result.stderr

"""Chat templates render in a bounded child process (modules/llm_judge/templating.py): an honest
template gives exactly apply_chat_template's text, tokenized, and hostile templates
(three nested range(100000) loops, a string doubled 31 times) and a tokenizer whose regex
backtracks end in SubmissionRejected at a limit, with the validator's process free to stop at
once."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from devkit import DATA_DIR
from devkit.tiny_chat_models import build_chat_base
from devkit.validator_cli import REPO_ROOT
from modules.llm_judge.conversation import read_prompts
from modules.llm_judge.generation import tokenize
from modules.llm_judge.inspection import inspect_model
from modules.llm_judge.templating import TemplateLimits, encode_prompts
from tests.helpers.children import gone, record_in, stop_again_until_it_ends, wait_until
from validator.errors import JournalAction, SubmissionRejected, Verdict, outcome_of
from validator.sandbox import child_server

# Three nested loops; the body writes nothing, so that CPU time is what runs out
# (with an "x" there, the output list reaches the memory limit first: also a rejection).
LOOPS = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
    "{% set n = a + b + c %}{% endfor %}{% endfor %}{% endfor %}"
)
DOUBLED = (
    "{% set s = namespace(v='ab') %}{% for i in range(31) %}{% set s.v = s.v ~ s.v %}"
    "{% endfor %}{{ s.v }}"
)
RAISES_ON_SECOND = (
    "{% if messages[-1].content == 'boom' %}{{ raise_exception('no boom here') }}{% endif %}"
    "<|im_start|>user\n{{ messages[-1].content }}<|im_end|>\n"
)
LIMITS = TemplateLimits(
    cpu_seconds=5, memory_bytes=1024**3, wall_seconds=240, max_output_bytes=64 * 1024**2
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
HI = [([{"role": "user", "content": "hi"}], None)]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_chat_base(tmp_path_factory.mktemp("template") / "base")


def with_template(base: Path, folder: Path, template: str) -> Path:
    shutil.copytree(base, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def ids_of(folder: Path, items, work: Path, limits: TemplateLimits = LIMITS) -> list[list[int]]:
    encoded = encode_prompts(folder, items, submitted=True, limits=limits, work=work)
    return [row.tolist() for row in encoded.ids]


def test_an_honest_template_renders_exactly_apply_chat_templates_text(base, tmp_path):
    prompts = read_prompts(DATA_DIR / "chat_sample.jsonl")
    items = [(p.messages, p.tools) for p in prompts] + [(prompts[0].messages, TOOLS)]
    ids = ids_of(base, items, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    expected = [
        tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )  # fmt: skip
        for messages, tools in items
    ]
    assert ids == tokenize(tokenizer, expected)
    assert "get_weather" in expected[-1] and expected[0].endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("template", "limit"),
    [(LOOPS, "CPU time limit (5 s)"), (DOUBLED, f"memory limit ({1024**3} bytes)")],
    ids=["nested-loops", "doubled-string"],
)
def test_a_hostile_template_is_rejected_at_its_limit(base, tmp_path, template, limit):
    folder = with_template(base, tmp_path / "model", template)
    with pytest.raises(SubmissionRejected, match=r"the chat template exceeded its") as refused:
        encode_prompts(folder, HI, submitted=True, limits=LIMITS, work=tmp_path / "work")
    assert limit in str(refused.value) and "while rendering the prompts" in str(refused.value)


@pytest.mark.parametrize("submitted", [True, False], ids=["full-model", "lora-base"])
def test_a_template_over_a_limit_fails_the_assignment_whoevers_it_is(base, tmp_path, submitted):
    """A LoRA's template is its base's, a full model's the submission's: the same failure gets
    the one verdict, REJECTED (failed at once, naming the limit), as docs/llm-judge-scoring.md
    says of both. A plain ValueError for the base's read as "not the submission's", but
    validator/errors.py gives every ValueError that verdict; the network raises its
    LLMJudgeException for both alike (it exits, no result: nothing to follow)."""
    folder = with_template(base, tmp_path / "model", LOOPS)
    with pytest.raises(SubmissionRejected, match="exceeded its CPU time limit") as refused:
        encode_prompts(folder, HI, submitted=submitted, limits=LIMITS, work=tmp_path / "work")
    outcome = outcome_of(refused.value)
    assert (outcome.verdict, outcome.journal, outcome.exit_code) == (
        Verdict.REJECTED,
        JournalAction.FAIL,
        None,
    )


def test_the_cpu_limit_grows_with_the_sets_size(base, tmp_path):
    """A template that costs ~0.15 s of CPU per prompt over 40 prompts (~6 s in all; the child,
    forked from the pre-imported server, spends nothing else): past a 2 s limit with no
    allowance per prompt, within it with 1 s per prompt (the set's size alone must not reject
    an honest template; the bound still holds per prompt)."""
    costly = (
        "{% for a in range(2000) %}{% for b in range(1000) %}{% set n = a * b %}{% endfor %}"
        "{% endfor %}"
        "<|im_start|>user\n{{ messages[-1].content }}<|im_end|>\n"
    )
    folder = with_template(base, tmp_path / "model", costly)
    items = [([{"role": "user", "content": f"question {n}"}], None) for n in range(40)]
    flat = TemplateLimits(2, 1024**3, 240, 64 * 1024**2)
    with pytest.raises(SubmissionRejected, match=r"CPU time limit \(2 s\)"):
        encode_prompts(folder, items, submitted=True, limits=flat, work=tmp_path / "flat")
    grown = TemplateLimits(2, 1024**3, 240, 64 * 1024**2, seconds_per_item=1.0)
    assert grown.for_items(40).cpu_seconds == 42 and grown.for_items(40).wall_seconds == 320
    encoded = encode_prompts(folder, items, submitted=True, limits=grown, work=tmp_path / "grown")
    assert len(encoded.ids) == 40


def test_a_template_that_raises_names_the_line_and_the_error(base, tmp_path):
    folder = with_template(base, tmp_path / "model", RAISES_ON_SECOND)
    items = [([{"role": "user", "content": c}], None) for c in ("fine", "boom", "fine")]
    with pytest.raises(SubmissionRejected) as refused:
        encode_prompts(folder, items, submitted=True, limits=LIMITS, work=tmp_path / "work")
    message = str(refused.value)
    assert "the chat template fails on validation set prompt 2" in message
    assert "no boom here" in message
    assert "\n" not in message


def test_texts_past_the_output_limit_are_refused(base, tmp_path):
    folder = with_template(base, tmp_path / "model", "{{ 'x' * 2000000 }}")
    limits = TemplateLimits(5, 1024**3, 240, max_output_bytes=3_000_000)
    with pytest.raises(SubmissionRejected, match="exceed 3000000 bytes .* prompt 2"):
        encode_prompts(folder, HI * 3, submitted=True, limits=limits, work=tmp_path / "work")


PARENT = """
import signal, sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
from modules.llm_judge.templating import TemplateLimits, encode_prompts
from validator.entrypoint import _install_signal_handlers
from validator.errors import JournalAction, SubmissionRejected, Verdict, outcome_of
from validator.sandbox import child_server
from validator.runner import Interrupted

_install_signal_handlers(threading.Event())  # the validator's own: a second signal interrupts
limits = TemplateLimits({cpu}, 1024**3, 600, 64 * 1024**2)
items = [([{{"role": "user", "content": "hi"}}], None)]
try:
    encode_prompts(Path({model!r}), items, submitted=True, limits=limits, work=Path({work!r}))
except SubmissionRejected as exc:
    print("rejected:", exc, flush=True)
except Interrupted:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the test's later signals
    print("interrupted", flush=True)
    sys.exit(130)
"""


# A tokenizer.json normalizer whose regex backtracks (14.5 s on 2.9 kB in process, with
# SIGTERM not handled until it returns), and a template that repeats what makes it backtrack.
BACKTRACKS = {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "b"}
REPEATS_TRIGGER = "{{ '" + "a" * 28 + "c' * 20000 }}"


def with_backtracking_tokenizer(base: Path, folder: Path) -> Path:
    with_template(base, folder, REPEATS_TRIGGER)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, "normalizer": BACKTRACKS}))
    return folder


def start_render(
    base: Path, tmp_path: Path, cpu: float, tokenizer: bool = False
) -> tuple[subprocess.Popen, dict]:
    if tokenizer:
        model = with_backtracking_tokenizer(base, tmp_path / "model")
    else:
        model = with_template(base, tmp_path / "model", LOOPS)
    work = tmp_path / "work"
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(REPO_ROOT), cpu=cpu, model=str(model), work=str(work)))
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    record = record_in(work, timeout=120)
    if tokenizer:  # signals while the tokenizer runs, not while the child starts
        phase = work / "tokenizer-encode-phase"
        assert wait_until(lambda: phase.is_file() and phase.read_text() == "tokenize", 120)
    return process, record


@pytest.mark.parametrize(
    ("tokenizer", "who"),
    [(False, "the chat template"), (True, "the tokenizer")],
    ids=["template", "tokenizer"],
)
def test_one_stop_signal_in_a_hostile_render_ends_it_at_its_limit(base, tmp_path, tokenizer, who):
    process, record = start_render(base, tmp_path, cpu=5, tokenizer=tokenizer)
    process.send_signal(signal.SIGTERM)  # the validator's first: finish the current step
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0 and f"rejected: {who} exceeded its CPU" in output, output
    assert gone(record)


@pytest.mark.parametrize("tokenizer", [False, True], ids=["template", "tokenizer"])
def test_a_second_stop_signal_ends_a_hostile_render_now_and_leaves_no_child(
    base, tmp_path, tokenizer
):
    process, record = start_render(base, tmp_path, cpu=600, tokenizer=tokenizer)
    process.send_signal(signal.SIGTERM)
    assert not wait_until(lambda: process.poll() is not None, timeout=1)  # the first: go on
    stop_again_until_it_ends(process)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in output, output
    assert gone(record)


def test_a_killed_validator_takes_the_renderer_along(base, tmp_path):
    process, record = start_render(base, tmp_path, cpu=600)
    process.kill()
    process.wait(timeout=60)
    assert gone(record)


def test_empty_tools_reach_the_template_as_an_empty_list_not_none(base, tmp_path):
    # The network hands the template [] for a line's empty tools ("", "[]", [], {}): a template
    # that asks `tools is not none` (some full models' do) renders its tools branch for them.
    folder = with_template(
        base, tmp_path / "model", "{% if tools is not none %}T{{ tools | length }}{% endif %}|"
    )
    items = [(HI[0][0], []), (HI[0][0], None)]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert ids_of(folder, items, tmp_path / "work") == tokenize(tokenizer, ["T0|", "|"])


def test_the_renderer_and_the_model_inspector_share_one_pre_imported_server(base, tmp_path):
    # A server per environment and preloads: the renderer once had its own (~290 MB more).
    child_server.shutdown()  # what earlier tests in this process started
    ids_of(base, HI, tmp_path / "render")
    inspect_model(base, tmp_path / "inspect")
    with_transformers = [key for key in child_server._servers if "transformers" in key[0]]
    assert len(with_transformers) == 1, with_transformers

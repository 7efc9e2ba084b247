"""The llm_judge module end to end in its stack: a tiny Qwen3.5-architecture base and adapter
served by the local Hub through huggingface_hub 1.5, a validation set over HTTP, and the local
OpenAI-compatible judge reached through the real openai client."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from devkit import DATA_DIR
from devkit.judge_prompts import write_judge_source
from devkit.judge_server import LocalJudge
from devkit.tiny_chat_models import build_chat_adapter, build_chat_base, build_chat_multimodal
from devkit.tiny_repos import files_of
from devkit.validator_cli import run_validator, validator_env, write_config
from modules.llm_judge import LlmJudgeConfig, LlmJudgeModule
from modules.llm_judge.loading import read_model
from modules.llm_judge.schemas import EvalArgs, LlmJudgeInput
from tests.helpers.assignment_log import check_assignment_lines, run_assignments
from tests.helpers.served_hub import served_hub
from tests.llm_judge.test_submission import sharded
from validator.errors import OperatorError, SubmissionRejected, Verdict, classify
from validator.kit import fetch_base_model
from validator.scoring import score

BASE = "Qwen/Qwen3.5-0.8B"
KEY = "sk-judge-TEST-1234567890"
CHAT = (DATA_DIR / "chat_sample.jsonl").read_bytes()

JUDGES = ["judge-a", "judge-b-low"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llm-judge")
    write_judge_source(tmp / "judge-source")  # synthetic judge texts: nothing reaches GitHub
    base = build_chat_base(tmp / "base")
    adapter = build_chat_adapter(base, tmp / "adapter", BASE, seed=1)
    with served_hub(tmp) as hub, LocalJudge(["judge-a", "judge-b"], KEY) as judge:
        hub.add_repo(BASE, files_of(base))
        hub.add_repo("alice/lora", files_of(adapter))
        hub.add_repo("flock/sets", {"chat.jsonl": CHAT, "broken.jsonl": b"{oops\n"})
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OPENAI_BASE_URL", judge.endpoint)
            patch.setenv("OPENAI_API_KEY", KEY)
            yield hub, judge, base, tmp


def module(world, **config) -> LlmJudgeModule:
    settings = {"supported_base_models": [BASE], "max_new_tokens": 8, **config}
    settings.setdefault("prompt_source", str(world[3] / "judge-source"))
    return LlmJudgeModule(LlmJudgeConfig(**settings))


def scored(
    world, repo="alice/lora", eval_args=None, max_params=10**9, set_name="chat.jsonl", **config
):
    hub, *_ = world
    raw = {
        "hg_repo_id": repo,
        "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/{set_name}",
        "base_model": "qwen1.5",
        "context_length": 512,
        "max_params": max_params,
        "eval_args": eval_args or {"eval_require": 2, "eval_model_list": JUDGES},
    }
    judged = module(world, **config)
    try:
        return score(judged, raw)
    finally:
        judged.cleanup()


def expected_score(judge, since: int) -> float:
    grades = [
        judge.grade_of(r["answer"], r["reasoning_effort"])
        for r in judge.requests[since:]
        if r["status"] == 200
    ]
    return sum(s * c for s, c in grades) / len(grades) / 10


def test_the_score_is_the_mean_graded_quality_of_the_generated_answers(world, caplog):
    _, judge, _, _ = world
    since = len(judge.requests)
    with caplog.at_level(logging.INFO):
        metrics = scored(world)
    calls = judge.requests[since:]
    assert len(calls) == 10 * 2 * 2  # 10 prompts x 2 judge models x eval_require 2
    # judge-b-low is called as judge-b with a low reasoning effort, as the network calls it.
    assert {(c["model"], c["reasoning_effort"]) for c in calls} == {
        ("judge-a", None),
        ("judge-b", "low"),
    }
    # The rubric (the synthetic source's rubric 1) as the user message, then the judge
    # system message; the transcript opens with the line's system block.
    system = calls[0]["messages"][1]
    assert system["role"] == "system" and all(c["messages"][1] == system for c in calls)
    assert all("System: " in c["messages"][0]["content"] for c in calls)
    assert metrics["score"] == pytest.approx(expected_score(judge, since))
    assert "alice/lora (LoRA on Qwen/Qwen3.5-0.8B) at commit" in caplog.text
    assert KEY not in caplog.text


def test_a_rescore_generates_the_same_answers(world):
    _, judge, _, _ = world
    since = len(judge.requests)
    first = scored(world, eval_args={"eval_require": 1, "eval_model_list": ["judge-a"]})
    middle = len(judge.requests)
    again = scored(world, eval_args={"eval_require": 1, "eval_model_list": ["judge-a"]})
    answers = sorted(r["answer"] for r in judge.requests[since:middle])
    assert answers == sorted(r["answer"] for r in judge.requests[middle:])
    assert first == again


def test_over_max_params_and_unloadable_models_score_minus_999_unjudged(world, caplog):
    hub, judge, base, _ = world
    hub.add_repo("bob/full", files_of(base))
    files = {**files_of(base), "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}
    hub.add_repo("carol/broken", files)
    hub.add_repo("mallory/pickle", {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80"})
    since = len(judge.requests)
    assert scored(world, repo="bob/full", max_params=10) == {"score": -999.0}
    # A LoRA's count is its merged model's, known once loaded: the same bound, the same -999.
    assert scored(world, repo="alice/lora", max_params=10) == {"score": -999.0}
    # A bound no model meets, as the network reads it (third comparison): -999, not refused.
    assert scored(world, repo="bob/full", max_params=0) == {"score": -999.0}
    assert scored(world, repo="carol/broken") == {"score": -999.0}
    # Submissions that cannot be fetched as we load them: -999 as the network gives a model it
    # cannot load, not a failure.
    assert scored(world, repo="mallory/pickle") == {"score": -999.0}
    assert scored(world, repo="nobody/no-such-repo") == {"score": -999.0}
    # The network loads the model before it reads the set: -999 even where the set is broken.
    assert scored(world, repo="carol/broken", set_name="broken.jsonl") == {"score": -999.0}
    assert len(judge.requests) == since  # nothing was generated, nothing judged
    # Each -999 says why, as the network's penalty of its kind (Scope.penalty; outside a run,
    # a log line).
    kinds = [r.getMessage().split(")")[0] for r in caplog.records if "penalty (" in r.getMessage()]
    # (max_params 0: a full model's buffers are over it before it is built: it cannot load.)
    assert kinds == ["penalty (over_max_params"] * 2 + ["penalty (cannot_load"] * 5
    with pytest.raises(ValueError, match="validation set line 1"):  # a model that loads
        scored(world, set_name="broken.jsonl")


def with_files(base, changes: dict) -> dict[str, bytes]:
    """The base's files as a full model's (paths, or bytes where changed: a dict is merged
    into the JSON file)."""
    files = files_of(base)
    for name, change in changes.items():
        if isinstance(change, dict):
            change = json.dumps({**json.loads(files[name].read_text()), **change})
        files[name] = change.encode()
    return files


def test_a_full_models_tokenizer_runs_bounded_and_its_generation_config_cannot_crash_it(world):
    hub, judge, base, _ = world
    # Three hostile parts: a normalizer whose regex backtracks (minutes on these 58 kB of prompt,
    # in the validator's process), a decoder that blows every character of an answer up to a
    # kB, and return_dict_in_generate in the generation config (generate returns a ModelOutput).
    backtracks = {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "b"}
    blow_up = {"type": "Replace", "pattern": {"Regex": "[\\s\\S]"}, "content": "x" * 1000}
    byte_level = json.loads((base / "tokenizer.json").read_text())["decoder"]
    decoder = {"type": "Sequence", "decoders": [byte_level, blow_up]}
    hub.add_repo("mallory/regex", with_files(base, {
        "tokenizer.json": {"normalizer": backtracks},
        "chat_template.jinja": "{{ '" + "a" * 28 + "c' * 2000 }}",
    }))  # fmt: skip
    hub.add_repo("mallory/decoder", with_files(base, {"tokenizer.json": {"decoder": decoder}}))
    hub.add_repo("carol/no-tokenizer", with_files(base, {"tokenizer.json": "{not json"}))
    asks = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    hub.add_repo("bob/outputs", with_files(base, {"generation_config.json": asks}))
    since = len(judge.requests)
    with pytest.raises(SubmissionRejected, match="the tokenizer exceeded its CPU time limit"):
        scored(world, repo="mallory/regex", template_cpu_seconds=5)
    with pytest.raises(SubmissionRejected, match="the decoded answers exceed 100000 bytes"):
        scored(world, repo="mallory/decoder", template_max_output_bytes=100_000)
    assert len(judge.requests) == since  # neither was judged
    assert scored(world, repo="carol/no-tokenizer") == {"score": -999.0}  # the network's load
    assert 0 < scored(world, repo="bob/outputs")["score"] <= 1


def test_a_judge_that_goes_away_keeps_the_assignment(world):
    _, judge, _, _ = world
    judged = module(world, judge_retries=1)
    judge.fail_next(1000, status=503)
    raw = {"hg_repo_id": "alice/lora", "base_model": "qwen1.5", "context_length": 512,
           "validation_set_url": f"{world[0].endpoint}/flock/sets/resolve/main/chat.jsonl",
           "max_params": 10**9}  # fmt: skip
    try:
        with pytest.raises(OperatorError, match=judge.endpoint):
            score(judged, raw)
    finally:
        judge.fail_next(0)
        judged.cleanup()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("model.safetensors", f"base model {BASE} cannot be read"),
        ("tokenizer.json", "the tokenizer does not load: .*the base model's"),
    ],
)
def test_a_base_that_cannot_be_read_keeps_the_assignment_never_minus_999(world, name, message):
    # A LoRA's base is the operator's: if its files in the HF cache cannot be read (a child that
    # made them unreadable; as root ignores modes, here its weights' blob is a folder: EISDIR)
    # or load (its tokenizer overwritten), the honest submission scored -999, or failed. Now an
    # operator error: kept, exit 3.
    blob = (fetch_base_model(BASE) / name).resolve()
    kept = blob.read_bytes()
    blob.unlink()
    if name.endswith(".safetensors"):
        blob.mkdir()
    else:
        blob.write_bytes(b"\0 not a tokenizer")
    try:
        with pytest.raises(OperatorError, match=message) as err:
            scored(world)
        assert classify(err.value) is Verdict.OPERATOR
    finally:
        if blob.is_dir():
            blob.rmdir()
        blob.write_bytes(kept)


def test_check_as_a_subprocess_prints_the_score_and_no_secret(world, tmp_path):
    hub, judge, _, tmp = world
    request = tmp_path / "input.json"
    request.write_text(json.dumps({
        "hg_repo_id": "alice/lora", "base_model": "qwen1.5", "context_length": 512,
        "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
        "max_params": 10**9, "eval_args": {"eval_require": 1},
    }))  # fmt: skip
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "llm_judge.json").write_text(
        json.dumps(
            {
                "supported_base_models": [BASE],
                "max_new_tokens": 8,
                "prompt_source": str(tmp / "judge-source"),
            }
        )  # fmt: skip
    )
    env = validator_env(
        tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"),
        OPENAI_BASE_URL=judge.endpoint, OPENAI_API_KEY=KEY,
    )  # fmt: skip
    result = run_validator(["llm_judge", "--debug", "--check", str(request)], env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < metrics["score"] <= 1
    assert KEY not in result.stdout + result.stderr


def test_a_wrong_judge_key_stops_the_validator_with_exit_3(world, tmp_path):
    hub, judge, _, tmp = world
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "llm_judge.json").write_text(
        json.dumps({"supported_base_models": [BASE], "prompt_source": str(tmp / "judge-source")})
    )
    env = validator_env(
        tmp_path, OPENAI_BASE_URL=judge.endpoint, OPENAI_API_KEY="sk-wrong-0000000000"
    )
    request = tmp_path / "input.json"
    request.write_text(json.dumps({"hg_repo_id": "x/y", "base_model": "q", "context_length": 8,
                                   "validation_set_url": "v", "max_params": 1}))  # fmt: skip
    result = run_validator(["llm_judge", "--check", str(request)], env, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert judge.endpoint in result.stderr
    assert "sk-wrong-0000000000" not in result.stderr


def test_a_full_models_files_cannot_read_outside_its_folder_or_ask_for_unbounded_work(world):
    """A tokenizer config naming a file elsewhere on the machine
    (transformers opens it in place of the repo's), a 20-byte config that makes transformers
    build millions of labels, config values of the wrong type, and generation configs asking
    for many beams or banned sequences: -999 as submissions that do not load, nothing judged."""
    hub, judge, base, tmp = world
    outside = tmp / "elsewhere" / "tokenizer.json"  # a file the submission names, not its own
    outside.parent.mkdir(exist_ok=True)
    outside.write_bytes((base / "tokenizer.json").read_bytes())
    named = with_files(base, {"tokenizer_config.json": {"tokenizer_file": str(outside)}})
    del named["tokenizer.json"]
    relative = with_files(base, {"tokenizer_config.json": {"vocab_file": "../../etc/passwd"}})
    bad_words = {"bad_words_ids": [[n, n + 1] for n in range(33)]}
    hostile = {
        "mallory/outside": named,
        "mallory/relative": relative,
        "mallory/labels": with_files(base, {"config.json": {"num_labels": 3_000_000}}),
        "mallory/layers": with_files(base, {"config.json": {"num_hidden_layers": 30_000_000}}),
        "mallory/rope": with_files(base, {"config.json": {"rope_parameters": 5}}),
        "mallory/beams": with_files(base, {"generation_config.json": {"num_beams": 9}}),
        "mallory/bad-words": with_files(base, {"generation_config.json": bad_words}),
    }
    for repo, files in hostile.items():
        hub.add_repo(repo, files)
    # Within the bounds, as the network generates: 8 beams, 32 banned sequences, and a
    # generation config that is not JSON (transformers falls back to the model's defaults).
    hub.add_repo("bob/beams", with_files(base, {"generation_config.json": {"num_beams": 2}}))
    bounded = {"bad_words_ids": [[n, n + 1] for n in range(32)]}
    hub.add_repo("bob/bad-words", with_files(base, {"generation_config.json": bounded}))
    hub.add_repo("bob/no-json", with_files(base, {"generation_config.json": "{oops"}))
    since = len(judge.requests)
    for repo in hostile:
        assert scored(world, repo=repo) == {"score": -999.0}, repo
    assert len(judge.requests) == since
    for repo in ("bob/beams", "bob/bad-words", "bob/no-json"):
        assert 0 < scored(world, repo=repo)["score"] <= 1, repo


def test_a_full_model_in_qwen35s_own_format_is_counted_and_scored_as_the_network_loads_it(world):
    """Third comparison with the network: a full model saved as Qwen3.5's checkpoints are (a
    text and a vision model, MTP weights) is loaded by the network as the causal LM of its
    text part, counted as that (58,060 here, while its files hold more), and scored; so is a
    config without `architectures` (the class comes from `model_type`)."""
    hub, judge, base, tmp = world
    multimodal = build_chat_multimodal(base, tmp / "multimodal")
    hub.add_repo("bob/multimodal", files_of(multimodal))
    hub.add_repo("bob/no-architectures", with_files(base, {"config.json": {"architectures": []}}))
    text_model = sum(p.numel() for p in read_model(base, torch.float32).parameters())
    with safe_open(multimodal / "model.safetensors", "pt") as weights:
        in_files = sum(math.prod(weights.get_slice(n).get_shape()) for n in weights.keys())
    assert in_files > text_model  # the count the network compares is the text model's
    since = len(judge.requests)
    assert 0 < scored(world, repo="bob/multimodal", max_params=text_model)["score"] <= 1
    assert 0 < scored(world, repo="bob/no-architectures")["score"] <= 1
    assert len(judge.requests) > since
    assert scored(world, repo="bob/multimodal", max_params=text_model - 1) == {"score": -999.0}


def test_the_input_takes_what_the_network_takes():
    """context_length is never used there (prompts are not shortened), so any integer
    passes; revision and eval_args have defaults (the network raises without them:
    docs/llm-judge-scoring.md)."""
    data = LlmJudgeInput.model_validate({
        "hg_repo_id": "alice/lora", "validation_set_url": "https://example.org/set.jsonl",
        "base_model": "qwen1.5", "context_length": 0, "max_params": -1,
    })  # fmt: skip
    assert (data.context_length, data.max_params, data.revision) == (0, -1, "main")
    assert data.eval_args == EvalArgs()


def test_a_safetensors_index_is_read_in_the_child_and_nothing_outlives_the_assignment(
    world, tmp_path
):
    """huggingface_hub's metadata reader would fetch the safetensors index into the shared
    HF cache and parse it in the validator's process (a 300 MB index: 1.7 GB there, 314 MB
    left in the cache). It is downloaded into the assignment's folder and read in the
    child: an index that takes more than the re-read bound to read is -999 (an honest one
    is read and counted: over max_params here, so as not to generate), and neither leaves a
    file in the HF cache or in the work folder."""
    from huggingface_hub import constants

    hub, judge, base, tmp = world
    files = sharded(base)
    weight_map = json.loads(files["model.safetensors.index.json"])["weight_map"]
    hub.add_repo("bob/sharded", files)
    # About 16 MB of names (about 75 MB to read): each one a dict entry to build.
    shard = next(iter(weight_map.values()))
    padding = {f"model.padding.{n:07d}.weight": shard for n in range(250_000)}
    huge = json.dumps({"weight_map": {**weight_map, **padding}}).encode()
    hub.add_repo("mallory/index", {**files, "model.safetensors.index.json": huge})
    work = tmp_path / "work"
    # The test's HF cache, and the library's default (which it read when imported): the files
    # of these repos there, before and after (the latter is shared with other runs).
    caches = {Path(os.environ["HF_HUB_CACHE"]), Path(constants.HF_HUB_CACHE)}

    def cached() -> set[Path]:
        folders = ("models--bob--sharded", "models--mallory--index")
        return {p for c in caches for f in folders for p in (c / f).rglob("*") if p.is_file()}

    before = cached()
    since = len(judge.requests)
    assert scored(world, "bob/sharded", max_params=1, work_dir=str(work)) == {"score": -999.0}
    assert scored(world, "mallory/index", work_dir=str(work)) == {"score": -999.0}
    assert len(judge.requests) == since
    assert cached() == before
    assert [p for p in work.rglob("*") if p.is_file()] == []


def test_an_assignment_is_a_few_short_lines_at_info(world, tmp_path):
    """Through the loop: at most 6 lines an assignment (the first starts the module),
    none over 300 characters; a pickle-only adapter's -999 is said to be the network's penalty,
    with why."""
    hub, judge, _, tmp = world
    hub.add_repo("mallory/pickle", {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80"})
    config = {"supported_base_models": [BASE], "max_new_tokens": 8}
    write_config(tmp_path, "llm_judge", {**config, "prompt_source": str(tmp / "judge-source")})
    env = validator_env(
        tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"),
        OPENAI_BASE_URL=judge.endpoint, OPENAI_API_KEY=KEY,
    )  # fmt: skip
    data = {
        "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
        "base_model": "qwen1.5", "context_length": 512, "max_params": 10**9,
        "eval_args": {"eval_require": 1, "eval_model_list": ["judge-a"]},
    }  # fmt: skip
    outcomes, log = run_assignments(
        tmp_path, "llm_judge", ["alice/lora", "mallory/pickle"], env, **data
    )
    assert outcomes == {"alice/lora": "completed", "mallory/pickle": "completed"}
    first, pickle = check_assignment_lines(log, 2)
    assert "starting module llm_judge with config " in first[1]
    assert re.search(r"submitted as completed: score 0?\.\d+ \(commit ", first[-1])
    assert "score -999, the network's penalty (cannot_load): the submission cannot be" in pickle[-1]

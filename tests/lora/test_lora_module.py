"""The lora module end to end, in process: real downloads from a loopback hub, tiny models built
here, scores checked against a deliberately plain implementation written in this file."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import modules.lora.dataset as lora_dataset
from devkit import DATA_DIR
from devkit.hf_hub import LocalHub
from devkit.tiny_repos import KINDS, build_adapter, build_base, files_of
from devkit.validator_cli import REPO_ROOT, run_validator, validator_env, write_config
from modules.lora import LoraConfig, LoraInput, LoraModule, packing
from modules.lora.base_models import quantization_config
from modules.lora.dataset import encode_set, load_tokenizer, read_jsonl
from modules.lora.templates import get_template
from tests.helpers.assignment_log import check_assignment_lines, run_assignments
from tests.helpers.served_hub import served_hub
from validator.errors import ConfigError

DATA = DATA_DIR
CHAT, CALLS = DATA / "chat_sample.jsonl", DATA / "function_calling_sample.jsonl"


class World:
    """A loopback hub serving one tiny base per kind and three adapters on each."""

    def __init__(self, tmp: Path, hub: LocalHub) -> None:
        self.tmp, self.hub = tmp, hub
        self.bases: dict[str, Path] = {}
        self.adapters: dict[str, Path] = {}
        for kind, (_, _, base_name, _) in KINDS.items():
            base = build_base(tmp, kind)
            self.bases[kind] = base
            hub.add_repo(base_name, files_of(base))
            for seed in (1, 2, 3):
                repo = f"alice/{kind}-adapter-{seed}"
                folder = build_adapter(base, tmp / repo.replace("/", "_"), seed, base_name)
                self.adapters[repo] = folder
                hub.add_repo(repo, files_of(folder))

    def add(self, repo: str, files: dict[str, bytes | Path]) -> None:
        self.hub.add_repo(repo, files)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-world")
    with served_hub(tmp) as hub:
        yield World(tmp, hub)


def module(**overrides) -> LoraModule:
    bases = [name for _, _, name, _ in KINDS.values()]
    return LoraModule(LoraConfig(supported_base_models=bases, **overrides))


def inputs(repo: str, kind: str = "qwen", data: Path = CHAT, context: int = 512) -> LoraInput:
    return LoraInput(
        hg_repo_id=repo,
        base_model=KINDS[kind][3],
        validation_set_url=str(data),
        context_length=context,
        max_params=10**9,
    )


def plain_scores(base_dir: Path, adapter_dir: Path, kind: str, data: Path, context: int):
    """The reference, plainly: merged weights, one example at a time, float64 throughout."""
    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload().eval()
    tokenizer = load_tokenizer(base_dir, KINDS[kind][2])
    encoded = encode_set(read_jsonl(data), get_template(KINDS[kind][3]), tokenizer, context)
    losses = []
    with torch.no_grad():
        for example in encoded.examples:
            ids = torch.tensor([example.input_ids])
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            nll = [
                -logp[t, example.input_ids[t + 1]].item()
                for t in range(len(example.input_ids) - 1)
                if example.target_mask[t + 1]
            ]
            losses.append(sum(nll) / len(nll) if nll else math.nan)
    eval_loss = sum(losses) / len(losses)
    bits = eval_loss * encoded.total_target_tokens / math.log(2)
    return eval_loss, bits / encoded.total_bytes


@pytest.mark.parametrize(
    ("kind", "data"), [("qwen", CHAT), ("qwen", CALLS), ("llama", CHAT), ("gemma", CALLS)]
)
def test_scores_match_the_plain_implementation(world, kind, data, tmp_path):
    repo = f"alice/{kind}-adapter-1"
    # Long enough that every conversation keeps a target (function calls start at ~1240 tokens).
    context = 384 if data == CHAT else 1280
    if data == CALLS:
        # Its first 16 conversations: the plain implementation scores one example at a time
        # in float64, and all 299 take 50 s on qwen for the same claim.
        cut = tmp_path / data.name
        cut.write_text("".join(data.read_text().splitlines(keepends=True)[:16]))
        data = cut
    want_loss, want_bpc = plain_scores(world.bases[kind], world.adapters[repo], kind, data, context)
    scorer = module(token_budget=4096)
    try:
        got = scorer.validate(inputs(repo, kind, data, context))
    finally:
        scorer.cleanup()
    assert got.eval_loss == pytest.approx(want_loss, rel=1e-5)
    assert got.bpc == pytest.approx(want_bpc, rel=1e-5)
    assert got.loss == got.bpc
    assert got.gpu_type == "cpu"


@pytest.mark.parametrize(
    ("kind", "data", "lines"),
    [("qwen", CHAT, 0), ("llama", CHAT, 0), ("qwen", CALLS, 16), ("gemma", CALLS, 16)],
)
def test_packed_scores_match_padded_and_the_plain_implementation(
    world, kind, data, lines, tmp_path, monkeypatch
):
    """Packed rows (the CUDA default, forced on here) through the whole module: the bpc is the
    padded path's and the plain implementation's. The function-calling set is cut to its first
    `lines` lines: eager FlexAttention on a CPU materialises every row's scores, and its
    conversations of ~1240 tokens make each row long (packing itself is covered there too)."""
    if lines:
        cut = tmp_path / data.name
        cut.write_text("".join(data.read_text().splitlines(keepends=True)[:lines]))
        data = cut
    repo = f"alice/{kind}-adapter-2"
    context = 384 if data.name == CHAT.name else 1280
    want_loss, want_bpc = plain_scores(world.bases[kind], world.adapters[repo], kind, data, context)
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    got = {}
    for mode in ("off", "on"):
        # A budget of two function-calling conversations per row, or all five chat ones.
        scorer = module(token_budget=2600, packing=mode)
        try:
            got[mode] = scorer.validate(inputs(repo, kind, data, context))
        finally:
            scorer.cleanup()
    assert health.succeeded and not health.failures  # the "on" run really scored packed rows
    assert got["on"].bpc == pytest.approx(got["off"].bpc, rel=1e-6)
    nats = {mode: metrics.nll_token_nats_total for mode, metrics in got.items()}
    assert nats["on"] == pytest.approx(nats["off"], rel=1e-6)
    for metrics in got.values():
        assert metrics.eval_loss == pytest.approx(want_loss, rel=1e-5)
        assert metrics.bpc == pytest.approx(want_bpc, rel=1e-5)


@pytest.mark.parametrize("per_batch", [1, 3, 16])
def test_eval_loss_does_not_depend_on_the_batch_size(world, per_batch):
    scorer = module(max_batch_size=per_batch, token_budget=10**6)
    reference = module(max_batch_size=1, token_budget=10**6)
    a = scorer.validate(inputs("alice/qwen-adapter-2", context=1024))
    b = reference.validate(inputs("alice/qwen-adapter-2", context=1024))
    assert math.isfinite(a.eval_loss)
    assert a.eval_loss == pytest.approx(b.eval_loss, rel=1e-6)


def test_base_is_loaded_once_and_unchanged_after_three_adapters(world):
    scorer = module()
    before = {
        k: v.clone() for k, v in scorer.bases.get(KINDS["qwen"][2]).model.state_dict().items()
    }
    scores = [scorer.validate(inputs(f"alice/qwen-adapter-{seed}")).loss for seed in (1, 2, 3)]
    after = scorer.bases.get(KINDS["qwen"][2]).model.state_dict()
    assert scorer.bases.loads == 1
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(set(scores)) == 3  # the adapters really changed the scores
    again = scorer.validate(inputs("alice/qwen-adapter-1")).loss
    # fp32 on CPU may round differently between runs (threaded reductions); the bitwise
    # state_dict comparison above is the exact proof.
    assert again == pytest.approx(scores[0], rel=1e-6)


def test_scores_above_max_params_are_999(world):
    scorer = module()
    low = inputs("alice/qwen-adapter-1").model_copy(update={"max_params": 10})
    metrics = scorer.validate(low)
    assert (metrics.loss, metrics.bpc) == (999.0, 999.0)


def adapter_files(world, seed: int = 1) -> dict[str, Path]:
    return files_of(world.adapters[f"alice/qwen-adapter-{seed}"])


def with_config(world, repo: str, **changes) -> None:
    files = adapter_files(world)
    config = json.loads(files["adapter_config.json"].read_text())
    config.update(changes)
    world.add(repo, {**files, "adapter_config.json": json.dumps(config).encode()})


def test_pickle_only_adapter_is_failed(world):
    files = adapter_files(world)
    world.add(
        "mallory/pickle",
        {
            "adapter_config.json": files["adapter_config.json"],
            "adapter_model.bin": b"\x80\x04pickle",
        },
    )
    with pytest.raises(ValueError, match="(?i)pickle|safetensors"):
        module().validate(inputs("mallory/pickle"))


def test_custom_code_is_never_downloaded_and_the_adapter_is_scored(world, caplog):
    world.add("mallory/code", {**adapter_files(world), "modeling_evil.py": b"import os\n"})
    caplog.set_level("DEBUG")  # what was not downloaded is --debug's
    metrics = module().validate(inputs("mallory/code"))
    assert math.isfinite(metrics.loss)
    assert "modeling_evil.py" in caplog.text
    assert not any("modeling_evil.py" in path for _, path, _ in world.hub.requests if _ == "GET")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base_model_name_or_path": "evil/base"}, "not in the supported base-model list"),
        ({"base_model_name_or_path": None}, "no base_model_name_or_path"),
        ({"peft_type": "IA3"}, "not a LoRA adapter"),
        ({"r": "four"}, "malformed adapter_config.json"),
        ({"future_switch": True}, "not supported by this validator's peft"),
    ],
)
def test_bad_adapter_configs_are_failed(world, changes, message):
    repo = f"mallory/config-{abs(hash(json.dumps(changes))) % 10**6}"
    with_config(world, repo, **changes)
    with pytest.raises(ValueError, match=message):
        module().validate(inputs(repo))


def test_unknown_empty_keys_from_newer_peft_are_ignored(world):
    with_config(world, "bob/newer-peft", future_option=None, other_future_flag=False)
    assert math.isfinite(module().validate(inputs("bob/newer-peft")).loss)


def test_full_model_is_failed_with_lora_only(world):
    world.add("mallory/full", files_of(world.bases["qwen"]))
    with pytest.raises(ValueError, match="lora_only"):
        module().validate(inputs("mallory/full"))


def test_oversized_adapter_is_failed(world):
    with pytest.raises(ValueError, match="(?i)too large|exceeds|over"):
        module(max_adapter_file_bytes=1000).validate(inputs("alice/qwen-adapter-1"))


def test_malformed_and_empty_validation_sets_are_failed(world, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(CHAT.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2"):
        module().validate(inputs("alice/qwen-adapter-1", data=bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        module().validate(inputs("alice/qwen-adapter-1", data=empty))


def test_no_target_tokens_after_truncation_gives_999(world):
    # Two tokens of context leave no assistant token to score in any conversation.
    metrics = module().validate(inputs("alice/qwen-adapter-1", context=2))
    assert metrics.loss == 999.0


def test_nan_weights_give_999(world, tmp_path):
    files = adapter_files(world)
    tensors = load_file(files["adapter_model.safetensors"])
    tensors = {k: torch.full_like(v, math.nan) for k, v in tensors.items()}
    poisoned = tmp_path / "adapter_model.safetensors"
    save_file(tensors, poisoned)
    world.add(
        "mallory/nan",
        {
            "adapter_config.json": files["adapter_config.json"],
            "adapter_model.safetensors": poisoned,
        },
    )
    assert module().validate(inputs("mallory/nan")).loss == 999.0


def test_cleanup_removes_the_downloaded_submission(world):
    scorer = module()
    scorer.validate(inputs("alice/qwen-adapter-1"))
    work = scorer._work.current
    assert work is not None and any(work.rglob("adapter_model.safetensors"))
    scorer.cleanup()
    assert not work.exists()


def test_check_command_scores_like_the_module(world, tmp_path):
    config = json.loads((REPO_ROOT / "configs" / "lora.json").read_text())
    config["supported_base_models"] = [name for _, _, name, _ in KINDS.values()]
    write_config(tmp_path, "lora", config)
    request = tmp_path / "input.json"
    request.write_text(inputs("alice/qwen-adapter-3").model_dump_json())
    env = validator_env(
        tmp_path, HF_ENDPOINT=world.hub.endpoint, HF_HOME=str(world.tmp / "hf-home")
    )
    result = run_validator(["lora", "--check", str(request)], env, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    expected = module().validate(inputs("alice/qwen-adapter-3"))
    assert printed["loss"] == pytest.approx(expected.loss, rel=1e-6)  # another process
    assert printed["gpu_type"] == "cpu"
    assert re.search(r"INFO validator.scope: commit: [0-9a-f]{40}\n", result.stderr)  # the revision


def test_unmerged_scoring_agrees_and_leaves_the_base_clean(world):
    merged, unmerged = module(), module(merge_adapter=False)
    base = unmerged.bases.get(KINDS["qwen"][2]).model
    before = {k: v.clone() for k, v in base.state_dict().items()}
    for seed in (1, 2):
        want = merged.validate(inputs(f"alice/qwen-adapter-{seed}")).eval_loss
        got = unmerged.validate(inputs(f"alice/qwen-adapter-{seed}")).eval_loss
        assert got == pytest.approx(want, rel=1e-5)
    after = base.state_dict()
    assert after.keys() == before.keys()  # no LoRA layer left behind
    assert all(torch.equal(before[k], after[k]) for k in before)


# LoraModule() starts its host-memory child (modules/lora/host_memory.py).
@pytest.mark.integration
def test_quantization_needs_a_gpu():
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        module(quantization="4bit")


def test_quantization_configs():
    assert quantization_config("none", torch.bfloat16) is None
    assert quantization_config("8bit", torch.bfloat16).load_in_8bit
    four = quantization_config("4bit", torch.float16)
    assert four.load_in_4bit and four.bnb_4bit_compute_dtype == torch.float16


def test_a_shared_validation_set_is_encoded_once(world, tmp_path, monkeypatch):
    calls = []
    real = lora_dataset.encode_set
    monkeypatch.setattr(lora_dataset, "encode_set", lambda *a: calls.append(1) or real(*a))
    scorer = module()
    first = scorer.validate(inputs("alice/qwen-adapter-1"))
    copy = tmp_path / "same-content.jsonl"  # another URL, same bytes: still one encoding
    copy.write_bytes(CHAT.read_bytes())
    second = scorer.validate(inputs("alice/qwen-adapter-2", data=copy))
    assert len(calls) == 1
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(CHAT.read_text().splitlines()[:5]) + "\n")
    third = scorer.validate(inputs("alice/qwen-adapter-2", data=changed))
    assert len(calls) == 2
    assert first.loss != second.loss  # another adapter
    # (the sample's 10 conversations are 5 repeated, so the bpc of the first 5 is the same)
    assert third.nll_token_nats_total != second.nll_token_nats_total


def test_an_assignment_is_a_few_short_lines_at_info(world, tmp_path):
    """Through the loop: at most 6 lines an assignment (the first one starts the module and
    loads the base), none over 300 characters (no config of 1,515 characters, no metrics in 16
    digits, no library warning passed through); a rejected adapter's line says why."""
    repo = "alice/qwen-adapter-1"
    world.add("flock/sets", {"chat.jsonl": CHAT})
    files = adapter_files(world)
    del files["adapter_model.safetensors"]
    world.add("mallory/pickle-log", {**files, "adapter_model.bin": b"\x80\x04"})
    bases = [name for _, _, name, _ in KINDS.values()]
    write_config(tmp_path, "lora", {"supported_base_models": bases})
    env = validator_env(tmp_path, HF_ENDPOINT=world.hub.endpoint, HF_HOME=str(tmp_path / "hf"))
    data = inputs(repo).model_dump(exclude={"hg_repo_id", "revision"})
    data["validation_set_url"] = f"{world.hub.endpoint}/flock/sets/resolve/main/chat.jsonl"
    outcomes, log = run_assignments(tmp_path, "lora", [repo, "mallory/pickle-log"], env, **data)
    assert outcomes == {repo: "completed", "mallory/pickle-log": "failed"}
    first, rejected = check_assignment_lines(log, 2)
    assert "starting module lora with config " in first[1] and len(first) <= 6
    assert re.search(r"submitted as completed: loss \d\.\d{4}, bpc", first[-1])
    assert " WARNING " not in "".join(first)  # the CPU warnings said in our words, as INFO
    assert "failed (rejected): SubmissionRejected: " in rejected[-1] and len(rejected) == 2

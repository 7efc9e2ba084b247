"""A hostile adapter between honest ones, in one process: the honest scores must not move, and
after every submission the warm base must be bit for bit a fresh load of the base."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from devkit import DATA_DIR
from devkit.hf_hub import LocalHub
from devkit.tiny_repos import KINDS, build_adapter, build_base, files_of
from modules.lora import LoraConfig, LoraInput, LoraModule
from modules.lora.adapters import AdapterRejected
from modules.lora.forward import example_losses
from modules.lora.metrics import eval_loss
from tests.helpers.served_hub import served_hub
from validator.errors import SubmissionRejected, Verdict, classify
from validator.kit import adapter_patterns
from validator.sandbox.child_process import ChildLimits

CHAT = DATA_DIR / "chat_sample.jsonl"
PREFIX = "base_model.model."
Tensors = dict[str, torch.Tensor]


class World:
    """A loopback hub with a qwen base (tied embedding) and a llama base (own lm_head), one
    honest adapter for each, and whatever hostile repos the tests add."""

    def __init__(self, tmp: Path, hub: LocalHub) -> None:
        self.tmp, self.hub = tmp, hub
        self.bases: dict[str, Path] = {}
        self.honest: dict[str, Path] = {}
        for kind in ("qwen", "llama"):
            _, _, base_name, _ = KINDS[kind]
            self.bases[kind] = build_base(tmp, kind)
            hub.add_repo(base_name, files_of(self.bases[kind]))
            folder = build_adapter(self.bases[kind], tmp / f"honest-{kind}", 1, base_name)
            self.honest[kind] = folder
            hub.add_repo(f"alice/{kind}", files_of(folder))

    def add_hostile(self, repo: str, kind: str, tensors: Tensors, **config_changes) -> Path:
        folder = self.tmp / repo.replace("/", "_")
        folder.mkdir()
        config = json.loads((self.honest[kind] / "adapter_config.json").read_text())
        config.update(config_changes)
        (folder / "adapter_config.json").write_text(json.dumps(config))
        save_file(tensors, folder / "adapter_model.safetensors")
        self.hub.add_repo(repo, files_of(folder))
        return folder

    def fresh_base(self, kind: str) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(self.bases[kind], torch_dtype=torch.float32)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-hostile")
    with served_hub(tmp) as hub:
        yield World(tmp, hub)


def module() -> LoraModule:
    bases = [KINDS[kind][2] for kind in ("qwen", "llama")]
    return LoraModule(LoraConfig(supported_base_models=bases, token_budget=4096))


def inputs(repo: str, kind: str) -> LoraInput:
    return LoraInput(
        hg_repo_id=repo,
        base_model=KINDS[kind][3],
        validation_set_url=str(CHAT),
        context_length=512,
        max_params=10**9,
    )


def honest_tensors(world: World, kind: str) -> Tensors:
    return load_file(world.honest[kind] / "adapter_model.safetensors")


def noise_like(tensor: torch.Tensor, seed: int = 7) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tensor.shape, generator=generator)


def with_base_tensor(name: str, make: Callable[[torch.Tensor], torch.Tensor]):
    """Honest LoRA tensors plus one tensor named like the base weight `name`."""

    def build(world: World, kind: str) -> tuple[Tensors, dict]:
        original = world.fresh_base(kind).state_dict()[name.replace(".base_layer", "")]
        return {**honest_tensors(world, kind), PREFIX + name: make(original)}, {}

    return build


def lora_converted(convert: Callable[[torch.Tensor], torch.Tensor]):
    def build(world: World, kind: str) -> tuple[Tensors, dict]:
        return {k: convert(v) for k, v in honest_tensors(world, kind).items()}, {}

    return build


def magnitudes(world: World, kind: str) -> Tensors:
    """A DoRA magnitude vector for every LoRA-adapted projection."""
    tensors = honest_tensors(world, kind)
    return {
        key.replace("lora_B.weight", "lora_magnitude_vector"): 1.5 + tensor[:, 0].abs()
        for key, tensor in tensors.items()
        if key.endswith("lora_B.weight")
    }


def dora_vectors_only(world: World, kind: str) -> tuple[Tensors, dict]:
    return {**honest_tensors(world, kind), **magnitudes(world, kind)}, {}


def dora(world: World, kind: str) -> tuple[Tensors, dict]:
    return {**honest_tensors(world, kind), **magnitudes(world, kind)}, {"use_dora": True}


def modules_to_save(world: World, kind: str) -> tuple[Tensors, dict]:
    head = world.fresh_base(kind).state_dict()["lm_head.weight"]
    tensors = {**honest_tensors(world, kind), PREFIX + "lm_head.weight": noise_like(head)}
    return tensors, {"modules_to_save": ["lm_head"]}


def no_tensors(_world: World, _kind: str) -> tuple[Tensors, dict]:
    return {}, {}


def one_poisoned(value: float):
    def build(world: World, kind: str) -> tuple[Tensors, dict]:
        tensors = honest_tensors(world, kind)
        first = sorted(tensors)[0]
        tensors[first] = torch.full_like(tensors[first], value)
        return tensors, {}

    return build


def shape_mismatch(world: World, kind: str) -> tuple[Tensors, dict]:
    tensors = honest_tensors(world, kind)
    first = sorted(tensors)[0]
    tensors[first] = torch.zeros(tensors[first].shape[0] + 3, tensors[first].shape[1])
    return tensors, {}


CASES = {
    "final norm": ("qwen", with_base_tensor("model.norm.weight", lambda w: w * 3)),
    "embedding (tied to lm_head)": (
        "qwen",
        with_base_tensor("model.embed_tokens.weight", noise_like),
    ),
    "lm_head": ("llama", with_base_tensor("lm_head.weight", noise_like)),
    "layer norm": (
        "llama",
        with_base_tensor("model.layers.1.input_layernorm.weight", torch.zeros_like),
    ),
    "a projection's base weight": (
        "qwen",
        with_base_tensor("model.layers.0.self_attn.q_proj.base_layer.weight", noise_like),
    ),
    "a NaN base weight": (
        "llama",
        with_base_tensor("model.norm.weight", lambda w: torch.full_like(w, math.nan)),
    ),
    "modules_to_save": ("llama", modules_to_save),
    "DoRA magnitude vectors, DoRA off": ("qwen", dora_vectors_only),
    "DoRA magnitude vectors, DoRA on": ("qwen", dora),
    "no tensors at all": ("qwen", no_tensors),
    "int8 tensors": ("qwen", lora_converted(lambda t: (t * 40).to(torch.int8))),
    "bool tensors": ("llama", lora_converted(lambda t: t > 0)),
    "float64 tensors": ("qwen", lora_converted(lambda t: t.double())),
    "a NaN LoRA tensor": ("qwen", one_poisoned(math.nan)),
    "an inf LoRA tensor": ("llama", one_poisoned(math.inf)),
    "a shape mismatch": ("qwen", shape_mismatch),
}


def slug(case: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")


def score_or_refusal(scorer: LoraModule, data: LoraInput) -> float | str:
    try:
        return scorer.validate(data).eval_loss
    except AdapterRejected as exc:
        return f"rejected: {exc}"
    finally:
        scorer.cleanup()


def assert_base_is_a_fresh_load(world: World, scorer: LoraModule, kind: str) -> None:
    warm = scorer.bases.get(KINDS[kind][2]).model.state_dict()
    fresh = world.fresh_base(kind).state_dict()
    assert warm.keys() == fresh.keys()
    changed = [name for name in fresh if not torch.equal(warm[name], fresh[name])]
    assert changed == []


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_adapter_never_moves_the_next_honest_score(world, case):
    kind, build = CASES[case]
    tensors, config_changes = build(world, kind)
    hostile = f"mallory/{slug(case)}"
    world.add_hostile(hostile, kind, tensors, **config_changes)
    honest = inputs(f"alice/{kind}", kind)
    want = score_or_refusal(module(), honest)  # a process that never met the hostile adapter

    scorer = module()
    # First as the process's first submission (nothing of the base copied out yet), then after
    # an honest one (the copies exist).
    for _ in range(2):
        score_or_refusal(scorer, inputs(hostile, kind))
        assert_base_is_a_fresh_load(world, scorer, kind)
        assert score_or_refusal(scorer, honest) == want


def reference_eval_loss(world: World, kind: str, adapter_dir: Path) -> float:
    """What the reference computes for the same files: a freshly loaded base, the adapter
    loaded and merged by peft from the folder as the trainer uploaded it."""
    model = PeftModel.from_pretrained(world.fresh_base(kind), str(adapter_dir))
    model = model.merge_and_unload().eval()
    scorer = module()
    data = inputs(f"alice/{kind}", kind)
    base = scorer.bases.get(KINDS[kind][2])
    encoded = scorer._encoded.get(CHAT, data.base_model, base.key, base.extra, 512)
    losses = example_losses(
        model,
        encoded.examples,
        token_budget=4096,
        max_batch_size=1,
        pad_token_id=base.extra.pad_token_id,
    )
    return eval_loss(losses)


@pytest.mark.parametrize("case", ["final norm", "a projection's base weight", "lm_head"])
def test_the_hostile_score_is_what_the_reference_computes(world, case):
    kind, build = CASES[case]
    tensors, config_changes = build(world, kind)
    repo = f"mallory/reference-{slug(case)}"
    folder = world.add_hostile(repo, kind, tensors, **config_changes)
    want = reference_eval_loss(world, kind, folder)
    honest = reference_eval_loss(world, kind, world.honest[kind])
    assert want != pytest.approx(honest, rel=1e-3)  # the extra tensor really counts
    got = score_or_refusal(module(), inputs(repo, kind))
    assert got == pytest.approx(want, rel=1e-6)


def test_a_deeply_nested_adapter_config_is_failed_with_the_reason(world):
    # Read in the bounded child (test_lora_boundary.py): no cap on its size or depth protects
    # this process any more; what the child cannot read is the submission's failure.
    honest = world.honest["qwen"]
    config = json.loads((honest / "adapter_config.json").read_text())
    deep = json.dumps(config)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    world.hub.add_repo(
        "mallory/deep-config",
        {
            "adapter_config.json": deep.encode(),
            "adapter_model.safetensors": honest / "adapter_model.safetensors",
        },
    )
    with pytest.raises(AdapterRejected, match="adapter_config.json nests too deep to read"):
        module().validate(inputs("mallory/deep-config", "qwen"))


def test_a_deeply_nested_validation_line_is_failed_with_the_reason(world, tmp_path):
    line = json.loads(CHAT.read_text().splitlines()[0])
    line["extra"] = "PLACEHOLDER"
    nested = json.dumps(line).replace('"PLACEHOLDER"', "[" * 5000 + "]" * 5000)
    data = tmp_path / "deep.jsonl"
    data.write_text(CHAT.read_text() + nested + "\n")
    request = inputs("alice/qwen", "qwen").model_copy(update={"validation_set_url": str(data)})
    with pytest.raises(ValueError, match="line 11: nests deeper than 64 levels"):
        module().validate(request)


def test_an_unknown_template_key_fails_before_any_download(world):
    before = len(world.hub.requests)
    request = inputs("alice/qwen", "qwen").model_copy(update={"base_model": "qwen-9000"})
    with pytest.raises(ValueError, match="'qwen-9000' is not a chat-template key"):
        module().validate(request)
    assert len(world.hub.requests) == before


@pytest.mark.parametrize("case", ["a shape mismatch", "not safetensors", "a truncated file"])
def test_an_adapter_that_does_not_load_is_rejected_at_once(world, case):
    # What peft or safetensors raise while loading the adapter (a RuntimeError, a
    # SafetensorError) is the submission's fault: failed at once, never rescored as a bug.
    repo = f"mallory/load-{slug(case)}"
    if case == "a shape mismatch":
        tensors, changes = shape_mismatch(world, "qwen")
        world.add_hostile(repo, "qwen", tensors, **changes)
    else:
        honest = world.honest["qwen"]
        weights = (honest / "adapter_model.safetensors").read_bytes()
        broken = b"\x00" * 64 if case == "not safetensors" else weights[: len(weights) // 2]
        world.hub.add_repo(
            repo,
            {
                "adapter_config.json": honest / "adapter_config.json",
                "adapter_model.safetensors": broken,
            },
        )
    reason = "the adapter does not fit its base model|adapter_model.safetensors does not parse"
    with pytest.raises(SubmissionRejected, match=reason) as e:
        module().validate(inputs(repo, "qwen"))
    assert classify(e.value) is Verdict.REJECTED


def test_a_backtracking_module_pattern_is_failed_by_the_child_not_run_by_peft(world, monkeypatch):
    # An attack: peft matches target_modules (a string: one regex) against every module
    # name in the validator's process; this one takes minutes per name there. The kit runs the
    # same matches in a bounded child first (a 2 s CPU limit here, to keep the test short).
    monkeypatch.setattr(
        adapter_patterns,
        "PATTERN_LIMITS",
        ChildLimits(wall_seconds=60, cpu_seconds=2, memory_bytes=2**30, file_bytes=2**20),
    )
    world.add_hostile(
        "mallory/backtracking", "qwen", honest_tensors(world, "qwen"),
        target_modules="(?:.|.|.|.)*Z|.*_proj",
    )  # fmt: skip
    scorer = module()
    with pytest.raises(SubmissionRejected, match="module patterns: reading it exceeded its CPU"):
        scorer.validate(inputs("mallory/backtracking", "qwen"))
    scorer.cleanup()
    honest_pattern = r".*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    world.add_hostile(
        "alice/pattern", "qwen", honest_tensors(world, "qwen"), target_modules=honest_pattern
    )
    assert isinstance(score_or_refusal(module(), inputs("alice/pattern", "qwen")), float)

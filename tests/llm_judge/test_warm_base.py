"""The llm_judge module's warm base: kept across the assignments of one base, each adapter merged
into it bit for bit as into a fresh load, and restored; a hostile adapter, a merge that fails
part way or a base changed during an assignment makes it reload, and never moves the next honest
score."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer, LoraModel
from safetensors.torch import load_file, save_file

import modules.llm_judge as llm_judge
from devkit.tiny_chat_models import build_chat_adapter, build_chat_base
from devkit.tiny_repos import files_of
from modules.llm_judge import loading
from modules.llm_judge.inspection import inspect_adapter
from modules.llm_judge.loading import load, read_model
from modules.llm_judge.submission import Submission
from tests.llm_judge.test_llm_judge_module import BASE, JUDGES, module, world  # noqa: F401
from validator.kit import WarmBase
from validator.scoring import score

PREFIX = "base_model.model."


def raw_input(world, repo: str) -> dict:  # noqa: F811 - the fixture's value, not the fixture
    hub = world[0]
    return {
        "hg_repo_id": repo,
        "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
        "base_model": "qwen1.5",
        "context_length": 512,
        "max_params": 10**9,
        "eval_args": {"eval_require": 1, "eval_model_list": JUDGES[:1]},
    }


class Scored:
    """One assignment's score and the answers the judge received for it."""

    def __init__(self, world, judged, repo: str) -> None:  # noqa: F811
        judge = world[1]
        since = len(judge.requests)
        self.score = score(judged, raw_input(world, repo))["score"]
        self.answers = sorted(r["answer"] for r in judge.requests[since:])


@pytest.fixture(scope="module")
def cold(world):  # noqa: F811
    """repo -> the score of a process that never scored anything before (once per repo: each
    assignment renders its templates in a child and generates, seconds on this machine)."""
    scores: dict[str, Scored] = {}

    def of(repo: str) -> Scored:
        if repo not in scores:
            scores[repo] = Scored(world, module(world), repo)
        return scores[repo]

    return of


@pytest.fixture(scope="module")
def adapters(world):  # noqa: F811
    """Two honest adapters and hostile ones on the served base; repo -> folder."""
    hub, _, base, tmp = world
    folders = {}
    for repo, seed in [("alice/warm-1", 11), ("alice/warm-2", 12)]:
        folders[repo] = build_chat_adapter(base, tmp / repo.replace("/", "_"), BASE, seed=seed)
        hub.add_repo(repo, files_of(folders[repo]))
    honest = load_file(folders["alice/warm-1"] / "adapter_model.safetensors")
    fresh = read_model(base, torch.float32).state_dict()
    hostile = {
        # peft loads a tensor whose name fits a weight of the wrapped model: these rewrite base
        # weights, two that no restore puts back and one that the merge touches.
        "mallory/mlp": {  # a projection no adapter here adapts: no restore puts it back
            PREFIX + "model.layers.1.mlp.up_proj.weight": torch.randn_like(
                fresh["model.layers.1.mlp.up_proj.weight"]
            )
        },
        "mallory/embedding": {
            PREFIX + "model.embed_tokens.weight": torch.randn_like(
                fresh["model.embed_tokens.weight"]
            )
        },
        "mallory/projection": {
            PREFIX + "model.layers.1.self_attn.q_proj.base_layer.weight": torch.randn_like(
                fresh["model.layers.1.self_attn.q_proj.weight"]
            )
        },
    }
    for repo, extra in hostile.items():
        folder = tmp / repo.replace("/", "_")
        folder.mkdir()
        (folder / "adapter_config.json").write_bytes(
            (folders["alice/warm-1"] / "adapter_config.json").read_bytes()
        )
        save_file({**honest, **extra}, folder / "adapter_model.safetensors")
        hub.add_repo(repo, files_of(folder))
        folders[repo] = folder
    return folders


def fresh_merge(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    """What the network scores: the base read from disk, the adapter merged by peft."""
    model = read_model(base, torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    assert [name for name in want if not torch.equal(got[name], want[name])] == []


def test_each_merge_into_the_warm_base_is_bit_identical_to_a_fresh_load_and_merge(
    world,  # noqa: F811
    adapters,
):
    base = world[2]
    warm = WarmBase(lambda source: read_model(source, torch.float32))
    order = ["alice/warm-1", "alice/warm-2", "mallory/mlp", "alice/warm-1", "alice/warm-2"]
    for repo in order:
        held = warm.get(base)
        merged = warm.apply(partial(PeftModel.from_pretrained, model_id=str(adapters[repo])))
        assert merged is held.model  # merged in place, not a copy
        assert_bit_identical(merged.state_dict(), fresh_merge(base, adapters[repo]))
        warm.release(repo)
    # The hostile adapter's weight was caught after it: one reload, for the assignment after it.
    assert warm.loads == 2
    assert_bit_identical(
        warm.get(base).model.state_dict(), read_model(base, torch.float32).state_dict()
    )


def test_the_base_stays_warm_across_assignments_and_scores_as_a_cold_process(
    world,  # noqa: F811
    adapters,
    cold,
):
    want = [cold("alice/warm-1"), cold("alice/warm-2")]
    judged = module(world)
    got = [Scored(world, judged, "alice/warm-1")]
    model = judged.warm.held.model
    got.append(Scored(world, judged, "alice/warm-2"))
    assert judged.warm.loads == 1 and judged.warm.held.model is model
    assert [(s.score, s.answers) for s in got] == [(s.score, s.answers) for s in want]
    assert want[0].answers != want[1].answers  # two adapters that really differ


def assert_the_base_is_a_fresh_load(judged, base: Path) -> None:
    if judged.warm.held is not None:
        fresh = read_model(base, torch.float32).state_dict()
        assert_bit_identical(judged.warm.held.model.state_dict(), fresh)


# The reads of the base from disk over hostile, honest, hostile, honest: a weight no restore
# puts back is caught after each hostile assignment; the merged projection's weight is put back
# from the pristine copies, except on the process's first assignment, when those copies were
# taken from what the file wrote (and the fingerprint catches it).
# (mallory/mlp, like the embedding, is met in the first test.)
HOSTILE = {"mallory/embedding": 3, "mallory/projection": 2}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_adapter_between_two_honest_ones_never_moves_the_honest_score(
    world,  # noqa: F811
    adapters,
    cold,
    hostile,
):
    want, alone = cold("alice/warm-1"), cold(hostile)
    assert alone.answers != want.answers  # the extra tensor really counts
    judged = module(world)
    # First as the process's first submission (nothing copied out yet), then after an honest one.
    for _ in range(2):
        got = Scored(world, judged, hostile)
        # The hostile submission scores what a process that met nothing else scores for it.
        assert (got.score, got.answers) == (alone.score, alone.answers)
        assert_the_base_is_a_fresh_load(judged, world[2])
        honest = Scored(world, judged, "alice/warm-1")
        assert (honest.score, honest.answers) == (want.score, want.answers)
    assert judged.warm.loads == HOSTILE[hostile]


def test_a_merge_that_fails_part_way_scores_minus_999_and_reloads_the_base(
    world,  # noqa: F811
    adapters,
    cold,
    monkeypatch,
):
    want = cold("alice/warm-1")
    judged = module(world)
    Scored(world, judged, "alice/warm-1")

    def half_merge(self, *args, **kwargs):
        # What a fault part way through leaves: one projection merged, the LoRA layers in place.
        next(m for m in self.modules() if isinstance(m, LoraLayer)).merge()
        raise RuntimeError("merge interrupted")

    with monkeypatch.context() as patch:
        patch.setattr(LoraModel, "merge_and_unload", half_merge)
        assert Scored(world, judged, "alice/warm-2").score == -999.0  # as today: cannot load
    assert judged.warm.held is None
    again = Scored(world, judged, "alice/warm-1")
    assert judged.warm.loads == 2
    assert (again.score, again.answers) == (want.score, want.answers)


def test_a_base_changed_during_an_assignment_is_reloaded_before_the_next(
    world,  # noqa: F811
    adapters,
    cold,
    monkeypatch,
):
    want = cold("alice/warm-2")
    judged = module(world)
    generate = llm_judge.generate

    def generate_then_change_the_base(model, *args, **kwargs):
        answers = generate(model, *args, **kwargs)
        with torch.no_grad():  # a weight no merge touches, so no restore puts it back
            model.get_submodule("model.norm").weight.add_(1.0)
        return answers

    with monkeypatch.context() as patch:
        patch.setattr(llm_judge, "generate", generate_then_change_the_base)
        Scored(world, judged, "alice/warm-1")
    assert judged.warm.held is None and judged.warm.loads == 1
    after = Scored(world, judged, "alice/warm-2")
    assert judged.warm.loads == 2
    assert (after.score, after.answers) == (want.score, want.answers)


def test_a_full_model_is_never_kept_and_drops_the_warm_base(world, adapters):  # noqa: F811
    hub, _, base, _ = world
    hub.add_repo("bob/full-warm", files_of(base))
    judged = module(world)
    Scored(world, judged, "alice/warm-1")
    assert judged.warm.held is not None
    full = Scored(world, judged, "bob/full-warm")
    assert 0 < full.score <= 1 and judged.warm.held is None
    Scored(world, judged, "alice/warm-1")
    assert judged.warm.loads == 2


def test_another_base_replaces_the_warm_one(tmp_path):
    bases = [build_chat_base(tmp_path / "a", seed=0), build_chat_base(tmp_path / "b", seed=1)]
    warm = WarmBase(lambda source: read_model(source, torch.float32))
    first = warm.get(bases[0])
    assert warm.get(bases[0]) is first and warm.loads == 1
    second = warm.get(bases[1])
    assert second.key == bases[1] and warm.loads == 2 and warm.held is second


def test_the_earlier_names_warn_and_are_the_kit_s():
    from modules.llm_judge import loading
    from validator import kit

    sys.modules.pop("modules.llm_judge.warm_base", None)
    with pytest.warns(FutureWarning, match="llm_judge.warm_base has moved to validator.kit"):
        import modules.llm_judge.warm_base as earlier
    assert earlier.WarmBase is kit.WarmBase
    with pytest.warns(FutureWarning, match="pick_device has moved to .*loading.device_and_dtype"):
        assert loading.pick_device is loading.device_and_dtype
    device, dtype = loading.device_and_dtype()
    assert device == kit.pick_device()
    assert dtype == (torch.bfloat16 if device == "cuda" else torch.float32)


def adapter_submission(folder: Path) -> Submission:
    """An adapter folder as fetch_submission hands it over (read by the module's child)."""
    facts = inspect_adapter(folder, "adapter_model.safetensors", folder.parent / "inspect")
    return Submission(folder, "0" * 40, BASE, None, facts.ranks(), tuple(facts.weights.listing))


def test_a_gpu_host_keeps_the_base_warm_on_its_device(world, adapters, monkeypatch):  # noqa: F811
    """A GPU host's path with the device as a parameter: the base is read once onto the
    device, merged there bit for bit as a fresh load and merge, and a hostile adapter still
    makes it reload. (Before, a GPU host dropped the warm base and read it every time.) The
    CUDA device itself cannot run here: the device is the CPU, the host says it has a GPU."""
    base = world[2]
    monkeypatch.setattr(loading, "device_and_dtype", lambda: ("cuda", torch.float32))
    monkeypatch.setattr(loading, "fetch_base_model", lambda repo: base)
    placed: list[str] = []

    def read_onto(source: Path, dtype: torch.dtype, device: str = "cpu"):
        placed.append(device)
        return read_model(source, dtype, device)

    warm = WarmBase(partial(read_onto, dtype=torch.float32, device="cpu"))
    order = ["alice/warm-1", "mallory/mlp", "alice/warm-2", "alice/warm-1"]
    for repo in order:
        loaded = load(adapter_submission(adapters[repo]), warm, repo, device="cpu")
        assert loaded.model is warm.held.model  # merged into the kept base, not a fresh read
        assert_bit_identical(loaded.model.state_dict(), fresh_merge(base, adapters[repo]))
        warm.release(repo)
    # Read once, and once more after the hostile adapter wrote a base weight.
    assert warm.loads == 2 and placed == ["cpu", "cpu"]

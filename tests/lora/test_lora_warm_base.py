"""The kit's WarmBase on tiny models, without a module around it: the one warm base lora and
llm_judge share. Every base it gives is bit for bit the base as loaded; what a failed restore
means is the module's choice (strict); the least recently used base goes first; the names it
replaced keep importing, with a warning."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from devkit.tiny_models import build_model, make_lora
from validator import kit
from validator.errors import BaseNotRestored
from validator.kit import WarmBase


def load(seed: int) -> torch.nn.Module:
    return build_model("qwen2", seed=seed)


def attach(adapter: Path):
    return partial(PeftModel.from_pretrained, model_id=str(adapter))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("adapter")
    make_lora(load(0), seed=5, r=2).save_pretrained(folder, save_embedding_layers=False)
    return folder


def as_loaded(model: torch.nn.Module, seed: int = 0) -> bool:
    got, want = model.state_dict(), load(seed).state_dict()
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("merge", [True, False])
def test_each_adapter_is_undone_and_the_base_kept(adapter, merge):
    warm = WarmBase(load)
    base = warm.get(0).model
    with warm.applied(attach(adapter), user="alice", merge=merge) as model:
        assert (model is base) is merge  # merged in place, or the peft model around it
        assert isinstance(model, PeftModel) is not merge
        assert not as_loaded(base)  # merged weights, or the LoRA layers beside them
    assert warm.get(0).model is base and warm.loads == 1 and as_loaded(base)
    assert not hasattr(base, "peft_config")  # the next adapter is not taken for a second one
    warm.release("alice", reload=True)  # an adapter that replaced whole modules
    assert warm.held is None and as_loaded(warm.get(0).model) and warm.loads == 2


@pytest.mark.parametrize("strict", [True, False])
def test_a_restore_that_fails_drops_the_base_and_is_raised_only_when_strict(
    adapter, strict, caplog
):
    warm = WarmBase(load, strict=strict)
    held = warm.get(0)
    warm.apply(attach(adapter))

    def lost(*args):  # what a device fault while copying back raises
        raise BaseNotRestored("the base weights could not be restored after the adapter: lost")

    held.pristine.restore = lost
    with caplog.at_level(logging.WARNING, logger="validator.kit.warm_base"):
        if strict:  # lora: a device fault, the process restarts and rescores
            with pytest.raises(BaseNotRestored, match="lost"):
                warm.release("alice")
        else:  # llm_judge: the answers stand; only the base goes
            warm.release("alice")
    assert ("after alice: the base weights could not" in caplog.text) is not strict
    assert warm.held is None
    assert as_loaded(warm.get(0).model) and warm.loads == 2


def test_an_adapter_left_on_is_undone_before_the_base_is_given_again(adapter):
    warm = WarmBase(load)
    base = warm.get(0).model
    warm.apply(attach(adapter))  # and no release: a caller's bug
    assert not as_loaded(base)
    assert warm.get(0).model is base and as_loaded(base) and warm.loads == 1


def test_the_least_recently_used_base_goes_first():
    warm = WarmBase(load, capacity=2)
    first = warm.get(0)
    second = warm.get(1)
    assert warm.get(0) is first and warm.loads == 2
    warm.get(2)  # over capacity: 1 is the least recently used
    assert warm.get(0) is first and warm.loads == 3
    assert warm.get(1) is not second and warm.loads == 4
    warm.drop()  # before a full model: nothing is kept beside it
    assert warm.held is None and warm.get(0) is not first


def test_lora_s_earlier_pick_device_warns_and_is_the_kit_s():
    import modules.lora.base_models as base_models

    with pytest.warns(FutureWarning, match="moved to validator.kit.pick_device"):
        moved = base_models.pick_device
    assert moved is kit.pick_device
    assert moved() == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(AttributeError, match="replaced by validator.kit.WarmBase"):
        _ = base_models.BaseModelCache

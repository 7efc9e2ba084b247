"""The warm base's fingerprint: any changed bit, of any tensor dtype or size, and any change of
structure (tensors, ties, modules, hooks) is seen; an untouched model matches."""

from __future__ import annotations

import pytest
import torch

from devkit.tiny_models import build_model
from validator.kit import fingerprint
from validator.kit.fingerprint import BLOCK, KEYS, BaseFingerprint, _Weights, digest, host_digests


def flip_one_bit(tensor: torch.Tensor, index: int) -> None:
    flat = tensor.data.reshape(-1)
    words = flat.view(torch.uint8) if flat.element_size() == 1 else flat.view(torch.int16)
    words[index] ^= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
@pytest.mark.parametrize("numel", [1, 3, BLOCK - 1, BLOCK + 5])
def test_one_flipped_bit_anywhere_changes_the_digest(dtype, numel):
    weights = _Weights()
    tensor = (torch.arange(numel) % 251).to(dtype)
    before = digest(tensor, weights)
    words = numel * tensor.element_size() // (1 if tensor.element_size() == 1 else 2)
    for index in {0, words // 2, words - 1}:
        changed = tensor.clone()
        flip_one_bit(changed, index)
        assert not torch.equal(digest(changed, weights), before), (dtype, numel, index)
    assert torch.equal(digest(tensor.clone(), weights), before)


def test_bool_and_empty_tensors_have_digests():
    weights = _Weights()
    flags = torch.tensor([True, False, True])
    assert not torch.equal(digest(flags, weights), digest(~flags, weights))
    assert digest(torch.empty(0), weights).shape == (0, KEYS)


def test_the_weights_are_secret_per_process_object():
    # Two fingerprints of one tensor use different random weights: a submitter cannot
    # precompute a collision from the source code.
    tensor = torch.arange(100, dtype=torch.float32)
    assert not torch.equal(digest(tensor, _Weights()), digest(tensor, _Weights()))


def test_an_untouched_model_matches_and_a_changed_one_is_named():
    model = build_model("llama", seed=3)
    fingerprint = BaseFingerprint.of(model)
    assert fingerprint.differences(model) == []
    with torch.no_grad():
        model.model.norm.weight[5] += 1e-6
        model.model.layers[1].mlp.up_proj.weight.data[0, 0] *= -1
    assert fingerprint.differences(model) == [
        "model.layers.1.mlp.up_proj.weight",
        "model.norm.weight",
    ]


def test_structure_changes_are_seen():
    model = build_model("qwen2", seed=4)  # tied embedding and lm_head
    fingerprint = BaseFingerprint.of(model)
    structure = ["the module structure (tensors, ties, modules or hooks)"]

    handle = model.model.layers[0].register_forward_hook(lambda *args: None)
    assert fingerprint.differences(model) == structure
    handle.remove()
    assert fingerprint.differences(model) == []

    tied = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(tied.detach().clone())  # same values, untied
    assert fingerprint.differences(model) == structure
    model.lm_head.weight = tied
    assert fingerprint.differences(model) == []

    original = model.model.layers[0].mlp.act_fn
    model.model.layers[0].mlp.act_fn = torch.nn.Identity()  # no tensors, another function
    assert fingerprint.differences(model) == structure
    model.model.layers[0].mlp.act_fn = original
    assert fingerprint.differences(model) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_host_tensors_are_hashed_in_pieces_and_any_flipped_bit_is_seen(dtype, monkeypatch):
    # On the CPU the fingerprint is a keyed BLAKE3 per piece of PIECE_BYTES (small here, so a
    # tensor spans several pieces and the last one is short).
    monkeypatch.setattr(fingerprint, "PIECE_BYTES", 48)
    weights = _Weights()
    tensor = (torch.arange(100) % 3).to(dtype)
    nbytes = 100 * tensor.element_size()
    (before,) = host_digests([("t", tensor)], weights).values()
    assert before.shape == (32 * -(-nbytes // 48),)
    for index in (0, nbytes // 2, nbytes - 1):
        changed = tensor.clone()
        changed.view(torch.uint8)[index] ^= 1
        assert not torch.equal(host_digests([("t", changed)], weights)["t"], before)
    assert torch.equal(host_digests([("t", tensor.clone())], weights)["t"], before)
    # Keyed per process object, as the GPU's weights are.
    assert not torch.equal(host_digests([("t", tensor)], _Weights())["t"], before)
    assert host_digests([("e", torch.empty(0))], weights)["e"].shape == (32,)


def test_a_model_on_the_cpu_is_fingerprinted_with_host_digests():
    model = build_model("llama", seed=3)
    found = BaseFingerprint.of(model)
    assert all(value.dtype == torch.uint8 for value in found.digests.values())
    assert set(found.digests) == {name for name, _ in model.named_parameters()} | {
        name for name, _ in model.named_buffers()
    }

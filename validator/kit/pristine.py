"""Copies of a warm base's weights as loaded, so that a merged adapter can be undone bit for bit
(the lora and llm_judge modules keep their bases warm across assignments).

A weight is copied out the first time any adapter touches it and kept for as long as its base
stays loaded, so later assignments only copy back: on a 7B base with every projection adapted
that is 12 GiB a merge no longer moves out of the GPU per assignment. On a GPU the copy stays
on the device while that leaves `DEVICE_HEADROOM` of its memory free (copying back is then a
device-to-device copy); otherwise it goes to pinned host memory, which copies back at full
PCIe speed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

from validator.errors import BaseNotRestored

log = logging.getLogger(__name__)

# Share of the GPU's memory left free after the copies, for scoring's activations and logits.
DEVICE_HEADROOM = 0.4

# (module name, attribute): a weight or bias of one module of the base.
Key = tuple[str, str]


def keep_on_device(nbytes: int, free: int, total: int, headroom: float = DEVICE_HEADROOM) -> bool:
    """Whether a copy of `nbytes` fits on the device and still leaves `headroom` of it free."""
    return free - nbytes >= headroom * total


class PristineWeights:
    """The weights of one base as loaded, for the modules adapters have touched so far."""

    def __init__(self) -> None:
        self._copies: dict[Key, torch.Tensor] = {}
        self._pin = True  # until pinning fails once
        self.copies_taken = 0  # tensors copied out so far (logs and tests)

    def keep(self, tensors: Iterable[tuple[Key, torch.Tensor]]) -> None:
        """Copies out the tensors not kept yet. They must be as loaded, which holds while every
        merge is restored (a base that failed to restore is dropped, with this store)."""
        for key, tensor in tensors:
            if key not in self._copies:
                self._copies[key] = self._copy_out(tensor.detach())
                self.copies_taken += 1

    @torch.no_grad()
    def restore(self, model: torch.nn.Module, keys: Iterable[Key]) -> None:
        try:
            for name, attribute in keys:
                original = self._copies[(name, attribute)]
                getattr(model.get_submodule(name), attribute).copy_(original, non_blocking=True)
        except Exception as exc:
            raise BaseNotRestored(
                f"the base weights could not be restored after the adapter: {exc}"
            ) from exc

    def _copy_out(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cuda":
            return tensor.clone()
        free, total = torch.cuda.mem_get_info(tensor.device)
        if keep_on_device(tensor.numel() * tensor.element_size(), free, total):
            return tensor.clone()
        host = None
        if self._pin:
            try:
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            except RuntimeError as exc:  # page-locked memory can be capped (ulimit -l)
                log.warning("no pinned host memory (%s); restoring from pageable memory", exc)
                self._pin = False
        if host is None:
            host = torch.empty(tensor.shape, dtype=tensor.dtype)
        host.copy_(tensor)
        return host

    def held_bytes(self) -> dict[str, int]:
        """Bytes of the copies by where they are: "cuda", "cpu" (pinned or not)."""
        held: dict[str, int] = {}
        for copy in self._copies.values():
            place = copy.device.type
            held[place] = held.get(place, 0) + copy.numel() * copy.element_size()
        return held


def merge_targets(peft_model: PeftModel) -> Iterator[tuple[Key, torch.Tensor]]:
    """The tensors a merge rewrites: weight and bias of each layer holding a LoRA."""
    for name, module in peft_model.base_model.model.named_modules():
        if isinstance(module, LoraLayer):
            layer = module.get_base_layer()
            yield (name, "weight"), _tensor(layer, "weight")
            if getattr(layer, "bias", None) is not None:
                yield (name, "bias"), _tensor(layer, "bias")


def _tensor(layer: torch.nn.Module, name: str) -> torch.Tensor:
    """A base layer's weight or bias: a tensor, or a layer that no merge rewrites."""
    value = getattr(layer, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(layer).__name__}.{name} is not a tensor")
    return value


def forget_peft(model: torch.nn.Module) -> None:
    """Removes what peft leaves on an unloaded model: the next adapter would be taken for a
    second one on the same model."""
    if hasattr(model, "peft_config"):
        del model.peft_config

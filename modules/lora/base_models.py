"""Base models kept warm across assignments: loaded once per (repo, dtype, device)."""

from __future__ import annotations

import gc
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from validator.kit import BaseFingerprint, PristineWeights, base_intact

log = logging.getLogger(__name__)


@dataclass
class LoadedBase:
    repo_id: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    parameter_count: int
    # Taken at load time: after each assignment the model must still match it
    # (validator/kit/fingerprint.py).
    fingerprint: BaseFingerprint
    # Dropped with the base: the copies are only valid for the weights they were taken from.
    pristine: PristineWeights = field(default_factory=PristineWeights)


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def quantization_config(quantization: str, dtype: torch.dtype) -> BitsAndBytesConfig | None:
    """bitsandbytes loading for small GPUs; scores then differ from other validators'."""
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    return None


def gpu_type(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


class BaseModelCache:
    """At most `capacity` bases in memory; the least recently used one is dropped first."""

    def __init__(
        self,
        fetch: Callable[[str], Path],
        load_tokenizer: Callable[[Path, str], PreTrainedTokenizerBase],
        device: str,
        dtype: torch.dtype,
        capacity: int = 1,
        quantization: str = "none",
    ) -> None:
        self._fetch = fetch
        self._load_tokenizer = load_tokenizer
        self.device = device
        self.dtype = dtype
        self.capacity = capacity
        self.quantization = quantization
        self._loaded: OrderedDict[str, LoadedBase] = OrderedDict()
        self.loads = 0  # how many times a base was read from disk (tests and logs)

    def get(self, repo_id: str) -> LoadedBase:
        if repo_id in self._loaded:
            self._loaded.move_to_end(repo_id)
            return self._loaded[repo_id]
        while len(self._loaded) >= self.capacity:
            self._drop(next(iter(self._loaded)))
        base = self._load(repo_id)
        self._loaded[repo_id] = base
        return base

    def release(self, base: LoadedBase, user: str, reload: bool = False) -> None:
        """Ends an assignment's use of `base` (`user` names the submission in the log). The
        base stays warm only while it is bit for bit the base as loaded; otherwise it is
        dropped, and the next assignment loads it afresh."""
        if reload or not base_intact(base.fingerprint, base.model, user):
            self.invalidate(base.repo_id)

    def invalidate(self, repo_id: str) -> None:
        if repo_id in self._loaded:
            log.info("dropping base model %s; it is reloaded when next needed", repo_id)
            self._drop(repo_id)

    def _drop(self, repo_id: str) -> None:
        del self._loaded[repo_id]
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def _load(self, repo_id: str) -> LoadedBase:
        path = self._fetch(repo_id)
        log.info("loading base model %s (%s on %s)", repo_id, self.dtype, self.device)
        quantized = quantization_config(self.quantization, self.dtype)
        placement = {"quantization_config": quantized, "device_map": {"": self.device}}
        model = AutoModelForCausalLM.from_pretrained(
            path,
            torch_dtype=self.dtype,
            trust_remote_code=False,
            use_safetensors=True,
            use_cache=False,
            **(placement if quantized else {}),
        )
        if not quantized:  # a bitsandbytes model is placed by device_map and cannot be moved
            model.to(self.device)
        model.eval()
        self.loads += 1
        return LoadedBase(
            repo_id=repo_id,
            model=model,
            tokenizer=self._load_tokenizer(path, repo_id),
            parameter_count=sum(p.numel() for p in model.parameters()),
            fingerprint=BaseFingerprint.of(model),
        )

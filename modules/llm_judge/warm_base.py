"""One base model kept loaded across the assignments of the LoRA submissions on it.

The network reads the base from disk and merges each adapter into it (peft's
`merge_and_unload`) for every assignment. Here the base stays loaded between assignments: each
adapter is merged into it by the same peft call, in the same dtype, and the weights the merge
rewrote are copied back afterwards from copies taken as loaded (`PristineWeights`), so every
assignment meets, bit for bit, the base a fresh load gives, and its merged weights are those of
a fresh load and merge. A fingerprint of every parameter and buffer, taken at load time
(`BaseFingerprint`), is checked after each assignment: a submission that left the base
different in any bit or in its structure (an adapter file that names a base weight, a merge
that failed part way) makes it drop, and the next assignment reads it from disk again.

One base at a time: a submission on another base (or on a newer snapshot of the same one)
replaces it. A full model is never kept.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from validator.kit import (
    BaseFingerprint,
    BaseNotRestored,
    PristineWeights,
    base_intact,
    forget_peft,
    merge_targets,
)

log = logging.getLogger(__name__)


@dataclass
class HeldBase:
    source: Path  # the base's snapshot folder: a new commit of the base is another base
    model: Any  # its tokenizer is never loaded here: it runs in a child (templating.py)
    # Taken at load time: after each assignment the model must still match it.
    fingerprint: BaseFingerprint
    # Dropped with the base: the copies are only valid for the weights they were taken from.
    pristine: PristineWeights = field(default_factory=PristineWeights)


class WarmBase:
    """The base of the last LoRA submission, loaded by `read(folder)` -> model."""

    def __init__(self, read: Callable[[Path], Any]) -> None:
        self._read = read
        self._held: HeldBase | None = None
        # The weights the current assignment's merge rewrote, to copy back on release.
        self._touched: dict[tuple[str, str], torch.Tensor] = {}
        self.loads = 0  # how many times a base was read from disk (tests, logs, the bench)

    @property
    def held(self) -> HeldBase | None:
        return self._held

    def get(self, source: Path) -> HeldBase:
        """The base at `source`, read from disk unless it is the one held."""
        if self._held is not None and self._held.source == source:
            log.info("base model %s is warm", source)
            return self._held
        self.drop()
        model = self._read(source)
        self.loads += 1
        self._held = HeldBase(source, model, BaseFingerprint.of(model))
        return self._held

    def merge(self, adapter_dir: Path) -> Any:
        """The held base with the adapter at `adapter_dir` merged in, as peft merges it into a
        fresh load. Call `release` afterwards, whether this returned or raised."""
        held = self._held
        if held is None:
            raise RuntimeError("no base is held: get() it first")
        peft_model = PeftModel.from_pretrained(held.model, str(adapter_dir))
        self._touched = dict(merge_targets(peft_model))
        # Copied out on first touch, while the base is as loaded (every earlier merge was
        # restored and checked); a file that wrote into a base weight above is copied as it
        # wrote it, and then caught by the fingerprint, which drops this store with the base.
        held.pristine.keep(self._touched.items())
        return peft_model.merge_and_unload()

    def release(self, user: str) -> None:
        """Ends an assignment's use of the base (`user` names the submission in the log): the
        merged weights are copied back, and the base stays only if it is then bit for bit the
        base as loaded."""
        held, touched = self._held, self._touched
        self._touched = {}
        if held is None:
            return
        try:
            held.pristine.restore(held.model, touched)
        except BaseNotRestored as exc:
            log.warning("after %s: %s; the base is reloaded", user, exc)
            self.drop()
            return
        forget_peft(held.model)
        if not base_intact(held.fingerprint, held.model, user):
            self.drop()

    def drop(self) -> None:
        if self._held is None:
            return
        log.info("dropping base model %s; it is read again when next needed", self._held.source)
        self._held = None
        self._touched = {}
        gc.collect()

"""One base model kept loaded across assignments, for every module that scores adapters on a base
(lora, llm_judge): the one mechanism that applies a submission's adapter to it, undoes it, and
proves the base is again the one loaded before the next submission meets it.

The network reads the base from disk for every assignment and merges the adapter into it
(peft's `merge_and_unload`). A warm base is read once: each adapter is put on it as the module
puts it (its `attach`), merged by the same peft call in the same dtype, or left attached beside
the weights; afterwards the weights a merge rewrote are copied back from copies taken as loaded
(`PristineWeights`), or the attached layers removed, and every parameter and buffer is checked
against a fingerprint taken at load time (`BaseFingerprint`). A base that differs in any bit or
in its structure (an adapter file that names a base weight, a merge that failed part way, a
module that changed it) is dropped, and the next assignment reads it from disk again. So every
assignment meets, bit for bit, the base a fresh load gives, and scores as on a fresh load.

What the modules keep as their own: how a base is read (`load`), how an adapter is put on it
(`attach`: peft's call with the module's config, and what its failure means), whether it is
merged, and `strict`, what a merge or a restore that fails means (below).
"""

from __future__ import annotations

import gc
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from validator.errors import BaseNotRestored, OperatorError, Verdict, classify, describe
from validator.kit.fingerprint import BaseFingerprint, base_intact
from validator.kit.pristine import PristineWeights, forget_peft, merge_targets

log = logging.getLogger(__name__)

# How a module puts a submission's adapter on a base model: returns the peft model wrapping it
# (peft.PeftModel.from_pretrained with the module's arguments); raises what its failure means.
Attach = Callable[[torch.nn.Module], Any]


def pick_device() -> str:
    """Where a module runs its models: `cuda` when torch sees a GPU, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextmanager
def reading_base(name: str) -> Iterator[None]:
    """Around reading the operator's base model `name` (from its snapshot in the HF cache):
    what stops it is this host's fault, never the submission's. An error that would fail the
    assignment or count against it (a file of the base that cannot be read, a ValueError from
    its config or tokenizer) is raised as OperatorError: the assignment is kept, the operator
    told (exit 3). Device, transient and operator faults are raised as they are."""
    try:
        yield
    except Exception as exc:
        if classify(exc) not in (Verdict.REJECTED, Verdict.UNEXPECTED):
            raise
        raise OperatorError(
            f"base model {name} cannot be read ({describe(exc)}); check its files in the HF "
            "cache (delete its snapshot to download it again)"
        ) from exc


@dataclass
class HeldBase:
    key: Hashable  # what `load` read it from: a repo id (lora), a snapshot folder (llm_judge)
    model: Any
    # Taken at load time: after each assignment the model must still match it.
    fingerprint: BaseFingerprint
    parameter_count: int
    extra: Any = None  # what `load` returned beside the model (lora: the base's tokenizer)
    # Dropped with the base: the copies are only valid for the weights they were taken from.
    pristine: PristineWeights = field(default_factory=PristineWeights)


@contextmanager
def adapter_applied(
    base: torch.nn.Module,
    attach: Attach,
    *,
    merge: bool = True,
    pristine: PristineWeights | None = None,
    strict: bool = False,
) -> Iterator[Any]:
    """`base` with an adapter put on by `attach`, and `base` as it was again on exit.

    merge=True is the network's arithmetic: the adapter is merged into the weights, which are
    copied back from `pristine` on exit (pass the base's own store, so that each weight is
    copied out once per base rather than once per adapter). merge=False keeps the adapter's
    layers beside the weights and removes them on exit (quantized weights need this; scores
    then differ from a merge by rounding only).
    What `attach` raises is raised as it is. A copy-out or merge that fails is raised as it is,
    or, with `strict`, as BaseNotRestored (a device fault); a restore that fails is
    BaseNotRestored. Whatever the outcome, the base may hold what the adapter file wrote: a
    warm base is checked afterwards (`WarmBase.release`).
    """
    peft_model = attach(base)
    if not merge:
        try:
            yield peft_model
        finally:
            forget_peft(peft_model.unload())
        return
    pristine = pristine if pristine is not None else PristineWeights()
    touched = dict(merge_targets(peft_model))
    try:
        # Copied out on first touch, while the base is as loaded (every earlier merge was
        # restored and checked); a file that wrote into a base weight above is copied as it
        # wrote it, and then caught by the fingerprint, which drops this store with the base.
        pristine.keep(touched.items())
        merged = peft_model.merge_and_unload()
    except Exception as exc:  # out of memory, mostly: this host's fault, not the submission's
        if strict:
            raise BaseNotRestored(f"the adapter could not be merged: {exc}") from exc
        raise
    try:
        yield merged
    finally:
        pristine.restore(merged, touched)
        forget_peft(merged)


class WarmBase:
    """At most `capacity` bases kept loaded (the least recently used is dropped first), each
    read by `load(key)`, which returns its model, or `(model, extra)` to keep `extra` with it.

    Per assignment: `get(key)` the base, `apply(attach)` the adapter (or neither), then
    `release(user)` whatever happened, or all three as `with warm.applied(...)`. With `strict`
    (lora), a merge or a restore that fails is raised as BaseNotRestored, a device fault: the
    process restarts and the assignment is rescored. Without (llm_judge), a merge's error is
    raised as it is, for the module to judge, and a restore that fails only drops the base.
    Either way the base is dropped; `drop()` evicts every base (before a full model, which is
    never kept beside one)."""

    def __init__(
        self, load: Callable[[Any], Any], *, capacity: int = 1, strict: bool = False
    ) -> None:
        self._load = load
        self.capacity = capacity
        self.strict = strict
        self._bases: OrderedDict[Hashable, HeldBase] = OrderedDict()
        self._current: HeldBase | None = None
        self._undo: ExitStack | None = None  # the adapter on the current base
        self.loads = 0  # how many times a base was read from disk (tests, logs, the bench)

    @property
    def held(self) -> HeldBase | None:
        """The base of the last `get`, while it is loaded."""
        return self._current

    def get(self, key: Hashable) -> HeldBase:
        """The base for `key`, read from disk unless it is held."""
        if self._undo is not None:  # an adapter left on by a caller that did not release it
            self.release("an earlier assignment")
        held = self._bases.get(key)
        if held is not None:
            log.info("base model %s is warm", key)
            self._bases.move_to_end(key)
        else:
            while len(self._bases) >= self.capacity:  # before the read: one base in memory
                self._drop(next(iter(self._bases)))
            loaded = self._load(key)
            model, extra = loaded if isinstance(loaded, tuple) else (loaded, None)
            self.loads += 1
            count = sum(p.numel() for p in model.parameters())
            held = HeldBase(key, model, BaseFingerprint.of(model), count, extra)
            self._bases[key] = held
        self._current = held
        return held

    def apply(self, attach: Attach, *, merge: bool = True) -> Any:
        """The current base with the adapter `attach` puts on it, merged (the base's own model)
        or attached (the peft model). Call `release` afterwards, whether this returned or
        raised."""
        held = self._current
        if held is None:
            raise RuntimeError("no base is held: get() it first")
        if self._undo is not None:
            raise RuntimeError("an adapter is on the base already: release() it first")
        undo = ExitStack()
        applied = adapter_applied(
            held.model, attach, merge=merge, pristine=held.pristine, strict=self.strict
        )
        model = undo.enter_context(applied)
        self._undo = undo
        return model

    def release(self, user: str, *, reload: bool = False) -> None:
        """Ends an assignment's use of the current base (`user` names the submission in the
        log): the adapter is undone, and the base stays only if it is then bit for bit the base
        as loaded (and not `reload`: an adapter that replaced whole modules)."""
        held, undo = self._current, self._undo
        self._undo = None
        if held is None:
            return
        try:
            if undo is not None:
                undo.close()
        except BaseNotRestored as exc:
            self._drop(held.key)
            if self.strict:
                raise
            log.warning("after %s: %s; the base is reloaded", user, exc)
            return
        except BaseException:
            self._drop(held.key)
            raise
        forget_peft(held.model)
        if reload or not base_intact(held.fingerprint, held.model, user):
            self._drop(held.key)

    @contextmanager
    def applied(
        self, attach: Attach, *, user: str, merge: bool = True, reload: bool = False
    ) -> Iterator[Any]:
        """`apply` for the block, then `release`, whatever the block did."""
        try:
            yield self.apply(attach, merge=merge)
        finally:
            self.release(user, reload=reload)

    def drop(self) -> None:
        """Evicts every base."""
        for key in list(self._bases):
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        log.info("dropping base model %s; it is read again when next needed", key)
        held = self._bases.pop(key, None)
        if held is not None and held is self._current:
            self._current, self._undo = None, None
        del held
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

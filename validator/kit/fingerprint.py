"""Proof that a warm base is still the base as loaded, whatever a submission's files held: every
parameter and buffer is checked after each assignment against a fingerprint taken at load time
(a keyed linear hash on a GPU, keyed BLAKE3 in host memory), and a base that differs in any
bit, or in its module structure, is dropped. Why both, and their bounds: docs/internals.md,
"The warm base's fingerprint".
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import blake3
import torch

log = logging.getLogger(__name__)

BLOCK = 2**12  # words per digest
STEP_BLOCKS = 4096  # blocks digested at once: 128 MiB of float64 words at most
KEYS = 3
WEIGHT_BITS = 20
PIECE_BYTES = 16 << 20  # a host tensor is hashed in pieces of this size, on every thread


@dataclass(frozen=True)
class Structure:
    """What a digest cannot see: which tensors exist, their layout, which are tied together,
    and the modules and hooks that run them."""

    tensors: tuple[tuple[str, tuple[int, ...], torch.dtype, str], ...]
    tied: tuple[tuple[str, ...], ...]
    modules: tuple[tuple[str, str, int], ...]


class _Weights:
    """The secret weights of this process, one copy per device."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(secrets.randbits(63))
        draw = torch.randint(0, 2**WEIGHT_BITS, (BLOCK, KEYS), generator=generator)
        self._cpu = draw.to(torch.float64)
        self._by_device: dict[torch.device, torch.Tensor] = {}
        self.secret = secrets.token_bytes(32)  # the host digests' key

    def on(self, device: torch.device) -> torch.Tensor:
        if device not in self._by_device:
            self._by_device[device] = self._cpu.to(device)
        return self._by_device[device]


@dataclass(frozen=True)
class BaseFingerprint:
    structure: Structure
    digests: dict[str, torch.Tensor]
    weights: _Weights

    @classmethod
    def of(cls, model: torch.nn.Module) -> BaseFingerprint:
        weights = _Weights()
        return cls(structure_of(model), model_digests(model, weights), weights)

    def differences(self, model: torch.nn.Module, most: int = 5) -> list[str]:
        """Names of up to `most` tensors that differ from the fingerprint; empty when the model
        is bit for bit the one fingerprinted."""
        if structure_of(model) != self.structure:
            return ["the module structure (tensors, ties, modules or hooks)"]
        now = model_digests(model, self.weights)
        changed = [
            name for name, value in now.items() if not torch.equal(value, self.digests[name])
        ]
        return changed[:most]


def base_intact(fingerprint: BaseFingerprint, model: torch.nn.Module, user: str) -> bool:
    """Whether `model` is still bit for bit the base `fingerprint` was taken of, after an
    assignment's use (`user` names the submission in the log); a base that is not, or cannot be
    checked, is to be dropped and reloaded before the next submission."""
    try:
        changed = fingerprint.differences(model)
    except Exception as exc:  # noqa: BLE001 - a base we cannot check is a base we reload
        log.warning("could not check the base model after %s (%s)", user, exc)
        return False
    if changed:
        log.warning(
            "%s changed the base model beyond its LoRA layers (%s); the base is reloaded "
            "before the next submission",
            user,
            ", ".join(changed),
        )
    return not changed


def _tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    # Tied tensors are listed once (their ties are part of the structure).
    yield from model.named_parameters()
    yield from model.named_buffers()


def model_digests(model: torch.nn.Module, weights: _Weights) -> dict[str, torch.Tensor]:
    """Every parameter's and buffer's digest, by name: BLAKE3 pieces for a tensor in host
    memory, the linear hash on an accelerator (the module docstring)."""
    named = list(_tensors(model))
    scratch = _Scratch()
    found = {
        name: scratch.digest(tensor, weights)
        for name, tensor in named
        if tensor.device.type != "cpu"
    }
    host = [(name, tensor) for name, tensor in named if tensor.device.type == "cpu"]
    found.update(host_digests(host, weights))
    return {name: found[name] for name, _ in named}  # in the model's order


def host_digests(
    named: list[tuple[str, torch.Tensor]], weights: _Weights
) -> dict[str, torch.Tensor]:
    """Keyed BLAKE3 of host tensors' bytes, a digest per piece of PIECE_BYTES, as uint8
    tensors; the pieces of all tensors are hashed on the CPU's threads at once."""
    jobs = [(name, piece) for name, tensor in named for piece in _pieces(tensor)]

    def hashed(job: tuple[str, memoryview]) -> bytes:
        return blake3.blake3(job[1], key=weights.secret).digest()

    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        hashes = list(pool.map(hashed, jobs))
    joined: dict[str, bytearray] = {name: bytearray() for name, _ in named}
    for (name, _), value in zip(jobs, hashes, strict=True):
        joined[name] += value
    return {name: torch.frombuffer(value, dtype=torch.uint8) for name, value in joined.items()}


def _pieces(tensor: torch.Tensor) -> list[memoryview]:
    flat = tensor.detach().reshape(-1)
    raw = flat.view(torch.uint8).numpy().data
    return [raw[start : start + PIECE_BYTES] for start in range(0, len(raw), PIECE_BYTES)] or [raw]


def structure_of(model: torch.nn.Module) -> Structure:
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    tensors = tuple(
        (name, tuple(t.shape), t.dtype, str(t.device)) for name, t in sorted(named, key=_first)
    )
    groups: dict[int, list[str]] = {}
    for name, tensor in named:
        groups.setdefault(id(tensor), []).append(name)
    tied = tuple(sorted(tuple(sorted(names)) for names in groups.values() if len(names) > 1))
    modules = tuple(
        (name, type(module).__qualname__, _hook_count(module))
        for name, module in model.named_modules(remove_duplicate=False)
    )
    return Structure(tensors, tied, modules)


def _first(item: tuple[str, torch.Tensor]) -> str:
    return item[0]


def _hook_count(module: torch.nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as one flat vector of small integers (a view where possible)."""
    flat = tensor.detach().reshape(-1)
    if flat.element_size() == 1:
        return flat.view(torch.uint8)
    return flat.view(torch.int16)


@torch.no_grad()
def digest(
    tensor: torch.Tensor, weights: _Weights, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact digests of the tensor's bytes (blocks x KEYS), on the tensor's device. `scratch`:
    a float64 buffer on that device to convert the words into, reused across tensors (a fresh
    128 MiB buffer per step costs a CPU its page faults again every time: most of a check)."""
    words = _words(tensor)
    keys = weights.on(words.device)
    parts = []
    step = STEP_BLOCKS * BLOCK
    for start in range(0, words.numel(), step):
        chunk = words[start : start + step]
        size = chunk.numel()
        padded = size + (-size % BLOCK)
        if scratch is None or scratch.numel() < padded:
            scratch = torch.empty(min(step, padded), dtype=torch.float64, device=words.device)
        converted = scratch[:padded]
        converted[:size].copy_(chunk)
        converted[size:].zero_()
        parts.append(converted.view(-1, BLOCK) @ keys)
    if not parts:
        return torch.zeros((0, KEYS), dtype=torch.float64, device=words.device)
    return torch.cat(parts)


class _Scratch:
    """One float64 conversion buffer per device for a whole model's digests."""

    def __init__(self) -> None:
        self._by_device: dict[torch.device, torch.Tensor] = {}

    def digest(self, tensor: torch.Tensor, weights: _Weights) -> torch.Tensor:
        device = tensor.device
        size = min(STEP_BLOCKS * BLOCK, tensor.numel() * tensor.element_size() // 2 + BLOCK)
        buffer = self._by_device.get(device)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(-(-size // BLOCK) * BLOCK, dtype=torch.float64, device=device)
            self._by_device[device] = buffer
        return digest(tensor, weights, buffer)

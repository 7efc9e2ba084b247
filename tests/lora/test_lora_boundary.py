# ruff: noqa: F811  (the module-scoped `world` fixture, imported, is every test's argument)
"""The trust boundary for lora (docs/lora-scoring.md, "Reading the adapter"): the validator's
process never parses adapter_config.json or the safetensors header. One bounded child per
submission reads both; a file that costs that parser more than the child's limits is the
submission's failure, with one log line, and nothing of the submission outlives its assignment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from modules.lora.adapters import AdapterRejected
from tests.lora.test_lora_hostile import World, honest_tensors, inputs, module, world  # noqa: F401
from validator.errors import SubmissionRejected
from validator.kit import (
    SUBMISSION_LIMITS,
    MovedPathWarning,
    check_lora_against_base,
    inspect_in_child,
)

MIB = 1024**2
SUBMISSION_FILES = ("adapter_config.json", "adapter_model.safetensors")
_reads: list[str] | None = None  # while a test listens: the files this process opened to read


def _audit(event: str, args: tuple) -> None:
    if _reads is None or event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
        return
    mode, flags = args[1], args[2]
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else flags & 3 == 0
    if reading:
        _reads.append(os.fsdecode(args[0]))


@contextmanager
def files_read_by_this_process() -> Iterator[list[str]]:
    """The paths this process opens for reading from Python meanwhile (an audit hook: it stays
    installed, and does nothing outside this block)."""
    global _reads
    if not getattr(sys, "_lora_boundary_hook", False):
        sys.addaudithook(_audit)
        sys._lora_boundary_hook = True  # type: ignore[attr-defined]
    _reads = []
    try:
        yield _reads
    finally:
        _reads = None


@pytest.fixture
def small_limits(monkeypatch):
    """The kit's limits (SUBMISSION_LIMITS, inspect_in_child's default) with 32 MiB of memory,
    so that a hostile file meets them in a second."""
    small = dataclasses.replace(SUBMISSION_LIMITS, memory_bytes=32 * MIB)
    monkeypatch.setitem(inspect_in_child.__kwdefaults__, "limits", small)
    return small


def add_files(world: World, repo: str, config: bytes, weights: bytes | Path) -> None:
    world.hub.add_repo(repo, {"adapter_config.json": config, "adapter_model.safetensors": weights})


def header_only(header: dict) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text


def rejection(repo: str, caplog) -> tuple[str, list[str]]:
    with pytest.raises(AdapterRejected) as refused:
        module().validate(inputs(repo, "qwen"))
    lines = [r.getMessage() for r in caplog.records if "bounded child" in r.getMessage()]
    return str(refused.value), lines


def test_the_validators_process_never_parses_the_adapters_files(world, monkeypatch):
    in_process = []
    monkeypatch.setattr(  # where the check read the header before (safetensors' reader)
        "validator.kit.adapter_bounds.safe_open",
        lambda *args, **kwargs: in_process.append(args) or pytest.fail("safe_open in process"),
        raising=False,
    )
    scorer = module()
    with files_read_by_this_process() as reads:
        metrics = scorer.validate(inputs("alice/qwen", "qwen"))
    assert math.isfinite(metrics.loss)
    work = scorer._work.current
    assert work is not None and (work / "adapter" / "adapter_config.json").is_file()
    # peft reads the weights (safetensors' own reader, not Python's open) after the check.
    submission = [path for path in reads if Path(path).is_relative_to(work)]
    assert [path for path in submission if Path(path).name in SUBMISSION_FILES] == []
    assert in_process == []
    scorer.cleanup()
    assert not work.exists()
    hf_home = Path(os.environ["HF_HOME"])  # the shared cache: the bases, never a submission
    assert [p for p in hf_home.rglob("*") if "alice" in str(p) or p.name in SUBMISSION_FILES] == []


def test_a_config_that_costs_the_parser_its_memory_meets_the_childs_limit(
    world,
    small_limits,
    caplog,
):
    config = json.loads((world.honest["qwen"] / "adapter_config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": [' + "[]," * 1_500_000 + "[]]}"  # 4.5 MB, 100 MB
    add_files(world, "mallory/costly-config", text.encode(), honest_weights(world))
    reason, lines = rejection("mallory/costly-config", caplog)
    assert reason.startswith("submission mallory/costly-config@")
    assert reason.endswith(
        f": reading it exceeded its memory limit ({small_limits.memory_bytes} bytes)"
    )
    assert len(lines) == 1


def test_a_safetensors_header_that_costs_the_parser_its_memory_meets_the_childs_limit(
    world,
    small_limits,
    caplog,
    tmp_path,
):
    # The honest tensors plus 100,000 empty ones: 5.5 MB of header, over 60 MB parsed.
    honest = honest_weights(world).read_bytes()
    length = int.from_bytes(honest[:8], "little")
    header = json.loads(honest[8 : 8 + length])
    end = max(info["data_offsets"][1] for key, info in header.items() if key != "__metadata__")
    for i in range(100_000):
        header[f"t{i}"] = {"dtype": "F32", "shape": [0], "data_offsets": [end, end]}
    text = json.dumps(header).encode()
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(len(text).to_bytes(8, "little") + text + honest[8 + length :])
    config = (world.honest["qwen"] / "adapter_config.json").read_bytes()
    add_files(world, "mallory/costly-header", config, weights)
    reason, lines = rejection("mallory/costly-header", caplog)
    assert reason.endswith(
        f": reading it exceeded its memory limit ({small_limits.memory_bytes} bytes)"
    )
    assert len(lines) == 1


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (b"\x00" * 4, "shorter than its header size"),
        ((10**9).to_bytes(8, "little") + b"{}", "a header of 1000000000 bytes"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00[]", "its header is not a JSON object"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}" + b"tail", "its tensors end at 0 in 4"),
        (
            header_only({"t": {"dtype": [1], "shape": [], "data_offsets": [0, 0]}}),
            "has dtype \\[1\\]",
        ),
    ],
    ids=["short", "huge-header", "list", "trailing-bytes", "dtype-list"],
)
def test_a_header_safetensors_would_refuse_is_refused_by_the_child(world, weights, message):
    repo = f"mallory/header-{abs(hash(weights)) % 10**6}"
    add_files(world, repo, (world.honest["qwen"] / "adapter_config.json").read_bytes(), weights)
    with pytest.raises(
        AdapterRejected, match=f"adapter_model.safetensors does not parse: (.* )?{message}"
    ):
        module().validate(inputs(repo, "qwen"))


def test_an_adapter_larger_than_its_base_can_use_is_refused(world, tmp_path):
    base = world.fresh_base("qwen")
    parameters = sum(p.numel() for p in base.parameters())
    tensors = {**honest_tensors(world, "qwen"), "junk": torch.zeros(3 * parameters + 1)}
    weights = tmp_path / "adapter_model.safetensors"
    save_file(tensors, weights)
    config = (world.honest["qwen"] / "adapter_config.json").read_bytes()
    add_files(world, "mallory/bulky", config, weights)
    with pytest.raises(AdapterRejected, match=r"over the \d+ \(3 per parameter\) .* can use"):
        module().validate(inputs("mallory/bulky", "qwen"))


def honest_weights(world: World) -> Path:
    return world.honest["qwen"] / "adapter_model.safetensors"


def test_the_former_signature_still_checks_with_a_warning(world):
    # llm_judge passed the weights' path: still the same check, read in this process.
    base = world.fresh_base("qwen")
    with (
        pytest.warns(MovedPathWarning, match="not in a bounded child"),
        pytest.raises(SubmissionRejected, match=r"r = 1000000: not a LoRA rank"),
    ):
        check_lora_against_base({"r": 10**6}, base, "qwen", honest_weights(world))

"""The lora benchmark's harness, kept working without timing anything: its CPU mode end to end
on a few short conversations (ours against the Trainer-based baseline), and its GPU mode's
comparison on a CPU with a tiny shape, since GPUs are lent only now and then."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

from modules.lora import packing
from modules.lora.adapters import applied_adapter, plan_adapter

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> dict[str, ModuleType]:
    return {
        name: importlib.import_module(f"bench.{name}")
        for name in ("lora_gpu", "lora_shapes", "lora_adapter_cost", "lora_model_work")
    }


@pytest.fixture(scope="module")
def tiny(bench: dict[str, ModuleType]):
    return bench["lora_shapes"].Shape("tiny-qwen2", 640, 64, 128, 2, 4, 2, tied=True)


def test_gpu_mode_runs_on_a_cpu_and_agrees_with_the_hf_loss(
    bench: dict[str, ModuleType], tiny, capsys: pytest.CaptureFixture
) -> None:
    gpu, shapes = bench["lora_gpu"], bench["lora_shapes"]
    examples = gpu.synthetic_examples(6, 256, vocab=tiny.vocab, seed=3)
    model = gpu.build_model(tiny, torch.float32, torch.device("cpu"))
    assert sum(p.numel() for p in model.parameters()) == shapes.total_params(tiny)
    batching = gpu.Batching(token_budget=600, max_batch_size=4)
    # What GPU mode runs per model, all of it, on the CPU.
    cpu = torch.device("cpu")
    result = gpu.measure_shape(tiny, torch.float32, cpu, examples, batching, 4, None)
    # ours (batched, target rows only) against HF's labels loss, one example at a time
    assert result.ours.losses == pytest.approx(result.baseline.losses, rel=1e-5)
    assert result.loss_rel_diff < 1e-5
    assert result.tokens == sum(len(e.input_ids) for e in examples)
    targets = sum(sum(e.target_mask[1:]) for e in examples)
    assert 0 < targets < result.tokens
    assert result.ours_flops < result.baseline_flops
    assert result.ours.peak_allocated is None  # no CUDA: no allocator figures
    # The module's default on a CPU is padded batches; the other path, packed rows, is timed
    # too and must score the same (on CUDA the two swap: packed is the default there).
    assert (result.ours_path, result.other_path) == ("padded", "packed")
    assert result.other.losses == pytest.approx(result.baseline.losses, rel=1e-5)
    out = capsys.readouterr().out
    assert "ratio baseline/ours" in out
    assert "ours: the module's default path, padded; other: packed" in out
    assert "padded is " in out and "x the speed of packed" in out
    other_agreement = re.search(r"ours packed \(same regime\) vs the same: .* rel diff (\S+);", out)
    assert other_agreement is not None, out
    assert float(other_agreement.group(1)) < 1e-5
    assert "restored bit for bit: yes" in out
    assert "per assignment (scoring plus model work)" in out
    # fp32 on a CPU: the reference's Trainer runs without mixed precision, and agrees closely.
    agreement = re.search(r"mixed precision no, batch 1\): .* rel diff (\S+)", out)
    assert agreement is not None, out
    assert float(agreement.group(1)) < 1e-5


def test_adapter_cycle_restores_the_base_and_matches_the_reference_reload(
    bench: dict[str, ModuleType], tiny, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    gpu, cost = bench["lora_gpu"], bench["lora_adapter_cost"]
    torch.manual_seed(0)
    model = gpu.build_model(tiny, torch.float32, torch.device("cpu"))
    model.save_pretrained(tmp_path / "base")
    rank = 4
    adapter = cost.write_random_adapter(model, tmp_path / "adapter", rank, "Qwen/tiny")
    examples = gpu.synthetic_examples(2, 128, vocab=tiny.vocab, seed=5)
    batching = gpu.Batching(token_budget=600, max_batch_size=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain = gpu.ours_losses(model, examples, batching)
    # The adapter written by the bench must load through the module's path and be merged as
    # written: W + (alpha / r) * B @ A, with alpha = 2r. Checked on the weights, because the
    # loss change of a small random adapter on a random model is too small to threshold.
    config = json.loads((adapter / "adapter_config.json").read_text())
    plan = plan_adapter(config, ["Qwen/tiny"])
    factors = load_file(str(adapter / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    delta = (config["lora_alpha"] / rank) * factors[key.format("B")] @ factors[key.format("A")]
    with applied_adapter(model, adapter, plan, merge=True) as merged:
        adapted = gpu.ours_losses(merged, examples, batching)
        ours_merged = {k: v.clone() for k, v in merged.state_dict().items()}
    base_q = before["model.layers.0.self_attn.q_proj.weight"]
    assert delta.abs().max() > 1e-5
    q_key = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(ours_merged[q_key] - base_q, delta, rtol=1e-3, atol=1e-6)
    assert plain != adapted
    # The baseline's reload merges the same adapter into the same weights, bit for bit.
    reloaded, seconds = cost.reference_reload(
        tmp_path / "base", adapter, torch.float32, torch.device("cpu")
    )
    assert seconds > 0
    assert reloaded.state_dict().keys() == ours_merged.keys()
    assert all(torch.equal(v, ours_merged[k]) for k, v in reloaded.state_dict().items())
    cycle = cost.time_adapter_cycle(model, adapter, "Qwen/tiny", later=2)
    assert cycle.restored_exactly
    assert cycle.held == {"cpu": cycle.touched_bytes}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    kv = tiny.kv_heads * tiny.head_dim
    per_layer = 2 * tiny.hidden**2 + 2 * tiny.hidden * kv + 3 * tiny.hidden * tiny.intermediate
    per_layer += tiny.hidden + 2 * kv  # Qwen2's q, k and v biases
    assert cycle.touched_bytes == tiny.layers * per_layer * 4  # fp32
    cost.print_adapter_cycle(cycle, 4)
    cost.print_per_assignment(1.0, 2.0, cycle, 3.0)
    out = capsys.readouterr().out
    assert "restored bit for bit: yes" in out
    ratio = 5.0 / (1.0 + cycle.later_seconds)
    assert f"ratio {ratio:.2f}x" in out


def _comparison(gpu: ModuleType, shape, ours_s: float, reserved: float):
    run = gpu.Run(ours_s, [2.0], peak_allocated=int(reserved), peak_reserved=int(reserved))
    baseline = gpu.Run(10.0, [2.0], None, None)
    return gpu.Comparison(shape, 1000, run, baseline, ours_flops=4e14, baseline_flops=5e14)


def test_target_verdicts(bench: dict[str, ModuleType]) -> None:
    gpu, shapes = bench["lora_gpu"], bench["lora_shapes"]
    seven = shapes.GPU_SHAPES["7b"]
    # 4e14 FLOP in 1 s is 400 TFLOP/s: 40.4% of 989; ratio 10 / 1 = 10x; 20 GiB.
    good = gpu.target_verdicts({"7b": _comparison(gpu, seven, 1.0, 20 * gpu.GIB)}, "bf16", 989.0)
    assert [line.split()[-1] for line in good] == ["PASS", "PASS", "PASS"]
    bad = gpu.target_verdicts({"7b": _comparison(gpu, seven, 2.5, 23.5 * gpu.GIB)}, "bf16", 989.0)
    assert [line.split()[-1] for line in bad] == ["FAIL", "FAIL", "FAIL"]
    fp16 = gpu.target_verdicts({"7b": _comparison(gpu, seven, 1.0, 0)}, "fp16", 989.0)
    assert "not checked" in fp16[0]
    assert "not checked" in gpu.target_verdicts({}, "bf16", 989.0)[0]


def test_dry_run_counts_the_real_shapes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.lora_bench", "--dry-run", "--device", "cuda"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parameter arithmetic matches the meta models" in done.stdout
    for name in ("Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B"):
        assert name in done.stdout


def test_cpu_mode_agrees_with_the_trainer_baseline() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.lora_bench",
            "--examples",
            "3",
            "--adapters",
            "2",
            "--context-length",
            "192",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("1 ", "2 "))]
    assert [row[-1] for row in rows] == ["PASS", "PASS"], done.stdout
    assert "ratio baseline/ours" in done.stdout
    assert "bpc agreement within 0.0001 relative: PASS" in done.stdout


# measure() runs each side in a child (bench/lora_model_work.py). One dtype: the sides run the
# same code in either (40-50 s each on a busy CI machine); each dtype's model is checked below.
@pytest.mark.integration
def test_model_work_bench_runs_both_sides_on_a_small_shape(
    bench: dict[str, ModuleType], tiny, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    work = bench["lora_model_work"]
    ours, reference = work.measure(tiny, "fp16", 2, tmp_path)
    assert ours > 0 and reference > 0
    out = capsys.readouterr().out
    assert f"{tiny.name} fp16" in out
    assert "restored bit for bit: yes" in out
    assert "freed memory kept for reuse: yes" in out  # the module's CPU setting, on glibc
    assert f"ratio {reference / ours:.1f}x" in out


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
def test_the_model_work_bench_builds_random_weights_in_each_dtype(
    bench: dict[str, ModuleType], tiny, dtype_name
) -> None:
    work = bench["lora_model_work"]
    model = work.random_model(tiny, work.DTYPES[dtype_name])
    assert {p.dtype for p in model.parameters()} == {work.DTYPES[dtype_name]}
    # Random weights, not the uninitialised memory that no_init_weights leaves.
    weight = model.get_decoder().layers[0].mlp.up_proj.weight.detach()
    assert 0.01 < float(weight.float().std()) < 0.03


def test_the_report_names_a_packing_fallback(bench: dict[str, ModuleType], tiny, monkeypatch):
    gpu = bench["lora_gpu"]
    model = gpu.build_model(tiny, torch.float32, torch.device("cpu"))
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    assert gpu.path_taken(model, "auto") == "padded"  # a CPU's default
    assert gpu.path_taken(model, "on") == "packed"
    health.give_up(packing.health_key(model, model.device, None), RuntimeError("no kernel"))
    assert gpu.path_taken(model, "on") == "padded (packing fell back: RuntimeError: no kernel)"

"""Ours: the lora module's own scoring path, without HTTP, with its base model kept warm."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from bench.lora_common import BASE_NAME, TEMPLATE, Batching
from bench.lora_measure import Assignment, MemoryMark, Phases
from modules.lora.adapters import applied_adapter, plan_adapter
from modules.lora.base_models import read_base
from modules.lora.dataset import EncodedSetCache
from modules.lora.forward import distinct_scored, example_losses
from modules.lora.metrics import eval_loss, score_metrics
from modules.lora.records import EncodedExample
from validator.kit import WarmBase


def distinct(examples: list[EncodedExample]) -> list[EncodedExample]:
    """What ours runs: the examples with a predicted target, less repeats of earlier ones."""
    indices, _ = distinct_scored(examples)
    return [examples[i] for i in indices]


class OursSide:
    """Assignments as `LoraModule.validate` runs them, from the downloaded files on: a warm
    `WarmBase` (the kit's), the encoding cached per validation-set content, then `applied_adapter`,
    `example_losses`, the base's check (`WarmBase.release`), `eval_loss`,
    `score_metrics`."""

    def __init__(self, base_dir: Path, data: Path, context_length: int, batching: Batching):
        transformers.logging.set_verbosity_error()
        self.mark = MemoryMark()
        self.data = data
        self.context_length = context_length
        self.batching = batching
        self.base_dir = base_dir
        read = partial(read_base, fetch=lambda repo_id: base_dir, device="cpu", dtype=torch.float32)
        self.cache = WarmBase(read, strict=True)
        self.known = EncodedSetCache()

    def assignment(self, adapter_dir: Path) -> tuple[Assignment, list[EncodedExample]]:
        phases = Phases()
        with phases.phase("plan + load base"):
            raw = json.loads((adapter_dir / "adapter_config.json").read_text())
            plan = plan_adapter(raw, [BASE_NAME])
            base = self.cache.get(plan.base_model)
        with phases.phase("encode"):
            encoded = self.known.get(self.data, TEMPLATE, base.key, base.extra, self.context_length)
        apply_started = time.perf_counter()
        with applied_adapter(base.model, adapter_dir, plan, True, base.pristine) as model:
            phases.seconds["apply + restore adapter"] = time.perf_counter() - apply_started
            with phases.phase("forward + loss"):
                losses = example_losses(
                    model,
                    encoded.examples,
                    token_budget=self.batching.token_budget,
                    max_batch_size=self.batching.max_batch_size,
                    pad_token_id=base.extra.pad_token_id,
                )
            restore_started = time.perf_counter()
        phases.seconds["apply + restore adapter"] += time.perf_counter() - restore_started
        with phases.phase("check base"):
            self.cache.release(adapter_dir.name, reload=plan.needs_base_reload)
        loss = eval_loss(losses)
        metrics = score_metrics(loss, encoded.total_target_tokens, encoded.total_bytes)
        return Assignment(adapter_dir.name, phases, loss, metrics["bpc"]), encoded.examples

    def base_loads(self) -> int:
        return self.cache.loads

    def memory(self) -> tuple[int, int, bool]:
        return self.mark.read()

    def body_floor(self, examples: list[EncodedExample]) -> float:
        """The transformer body alone at batch size 1, no lm_head, over the distinct sequences:
        work ours must do, so it bounds what any change to batching or logits can gain."""
        model = AutoModelForCausalLM.from_pretrained(self.base_dir, torch_dtype=torch.float32)
        decoder = model.eval().get_decoder()
        started = time.perf_counter()
        with torch.inference_mode():
            for example in distinct(examples):
                ids = torch.tensor([example.input_ids])
                decoder(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        return time.perf_counter() - started

"""The reference's way of scoring, plainly: reload, merge, Trainer.evaluate at batch size 1."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch
import transformers
from accelerate.state import AcceleratorState
from accelerate.utils import extract_model_from_parallel
from peft import PeftModel
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PrinterCallback,
    Trainer,
    TrainingArguments,
)

from bench.lora_common import BASE_NAME, TEMPLATE
from bench.lora_measure import Assignment, MemoryMark, Phases
from modules.lora.dataset import encode_set, load_tokenizer, read_jsonl
from modules.lora.metrics import score_metrics
from modules.lora.records import EncodedExample
from modules.lora.templates import get_template

# --- baseline: the reference's way, written plainly ---------------------------------------------


def sft_collate(batch: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pads a batch; labels are the ids at target positions and -100 elsewhere."""
    width = max(len(item["input_ids"]) for item in batch)

    def padded(key: str, value: int) -> torch.Tensor:
        rows = [item[key] + [value] * (width - len(item[key])) for item in batch]
        return torch.tensor(rows, dtype=torch.long)

    input_ids = padded("input_ids", pad_token_id)
    target_mask = padded("target_mask", 0)
    labels = torch.where(target_mask == 1, input_ids, torch.full_like(input_ids, -100))
    return {"input_ids": input_ids, "attention_mask": padded("attention_mask", 0), "labels": labels}


def trainer_eval_loss(
    model: PreTrainedModel,
    examples: list[EncodedExample],
    pad_token_id: int,
    work: Path,
    mixed_precision: str = "no",
) -> float:
    """`Trainer.evaluate()`'s eval_loss; `mixed_precision` "fp16" is the network's GPU config
    (`fp16: true`), "bf16" the same regime in bfloat16 (which a CPU can run)."""
    rows = [
        {
            "input_ids": list(e.input_ids),
            "attention_mask": [1] * len(e.input_ids),
            "target_mask": list(e.target_mask),
        }
        for e in examples
    ]
    args = TrainingArguments(
        output_dir=str(work),
        per_device_eval_batch_size=1,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,
        disable_tqdm=True,
        fp16=mixed_precision == "fp16",
        bf16=mixed_precision == "bf16",
    )
    trainer = Trainer(
        model=model,
        args=args,
        eval_dataset=rows,
        data_collator=lambda batch: sft_collate(batch, pad_token_id),
    )
    trainer.remove_callback(PrinterCallback)  # it prints every metrics dict
    try:
        return float(trainer.evaluate()["eval_loss"])
    finally:
        # accelerate wrapped the model's forward in its autocast, TrainingArguments left its
        # mixed precision in the environment and accelerate in a process-wide state: the model,
        # and the next Trainer in this process, would inherit them.
        extract_model_from_parallel(model, keep_fp32_wrapper=False)
        os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
        AcceleratorState._reset_state(reset_partial_state=True)


class BaselineSide:
    """Assignments as the reference runs them: everything loaded again from disk each time."""

    def __init__(self, base_dir: Path, data: Path, context_length: int, work: Path) -> None:
        transformers.logging.set_verbosity_error()
        self.mark = MemoryMark()
        self.base_dir = base_dir
        self.data = data
        self.context_length = context_length
        self.work = work

    def assignment(self, adapter_dir: Path) -> tuple[Assignment, list[EncodedExample]]:
        phases = Phases()
        with phases.phase("encode"):
            tokenizer = load_tokenizer(self.base_dir, BASE_NAME)
            lines = read_jsonl(self.data)
            encoded = encode_set(lines, get_template(TEMPLATE), tokenizer, self.context_length)
        with phases.phase("plan + load base"):
            model = AutoModelForCausalLM.from_pretrained(
                self.base_dir, torch_dtype=torch.float32, use_cache=False
            )
        with phases.phase("apply + restore adapter"):
            model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
        with phases.phase("forward + loss"):
            loss = trainer_eval_loss(model, encoded.examples, tokenizer.pad_token_id, self.work)
        del model
        gc.collect()
        metrics = score_metrics(loss, encoded.total_target_tokens, encoded.total_bytes)
        return Assignment(adapter_dir.name, phases, loss, metrics["bpc"]), encoded.examples

    def memory(self) -> tuple[int, int, bool]:
        return self.mark.read()

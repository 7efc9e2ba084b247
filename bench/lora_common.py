"""Settings shared by the lora benchmark's parts."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import peft
import torch
import transformers

from modules.lora import LoraConfig
from modules.lora.forward import default_max_batch_size

BASE_NAME = "Qwen/Qwen2.5-0.5B"  # what the adapters name as their base; served from disk
TEMPLATE = "qwen1.5"
TOLERANCE = 1e-4  # relative bpc difference allowed between ours and the baseline, fp32
MIB = 1024**2
GIB = 1024**3
DEFAULTS = LoraConfig.model_fields


@dataclass(frozen=True)
class Batching:
    """The module's batching settings (LoraConfig's token_budget and max_batch_size)."""

    token_budget: int = DEFAULTS["token_budget"].default
    max_batch_size: int = DEFAULTS["max_batch_size"].default or default_max_batch_size("cpu")

    def __str__(self) -> str:
        return f"token_budget {self.token_budget}, max_batch_size {self.max_batch_size}"


def print_versions(device: str) -> None:
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, peft {peft.__version__}; "
        f"device {device}, {os.cpu_count()} CPU cores"
    )


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work, so that a timer around it measures the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""The lora module: scores a submitted LoRA adapter by validation loss in bits per character,
as the network's reference does (SPEC §5), treating the submission as hostile (SPEC §6)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field

from modules.lora.adapters import AdapterRejected, applied_adapter, plan_adapter
from modules.lora.base_models import (
    BaseModelCache,
    LoadedBase,
    gpu_type,
    pick_device,
    pick_dtype,
)
from modules.lora.dataset import EncodedSet, EncodedSetCache, load_tokenizer
from modules.lora.hub import (
    DownloadLimits,
    SubmissionRejected,
    fetch_adapter,
    fetch_base_model,
)
from modules.lora.loss import (
    check_token_byte_ratio,
    default_max_batch_size,
    eval_loss,
    example_losses,
    high_loss_metrics,
    score_metrics,
)
from modules.lora.templates import get_template
from modules.lora.validation_set import fetch_validation_set
from validator.base import BaseConfig, BaseInputData, BaseMetrics, BaseValidationModule
from validator.exceptions import ConfigError

log = logging.getLogger(__name__)
GIB = 1024**3


class LoraConfig(BaseConfig):
    # Required, so that the list an operator validates against is the one in configs/lora.json.
    supported_base_models: list[str] = Field(min_length=1)
    lora_only: bool = True
    fp16: bool = False  # on GPU: fp16 when true, bf16 otherwise; always fp32 on CPU
    # bitsandbytes loading for small GPUs: the scores then differ from other validators'.
    quantization: Literal["none", "8bit", "4bit"] = "none"
    merge_adapter: bool = True  # the reference merges; false (forced when quantized) does not
    token_budget: int = Field(16384, gt=0)  # padded tokens per forward batch
    # Conversations per forward; unset: 64 on GPU, 1 on CPU, where padded batches need an
    # explicit attention mask that takes CPU attention off its fast causal kernel.
    max_batch_size: int | None = Field(None, gt=0)
    max_adapter_file_bytes: int = Field(2 * GIB, gt=0)
    max_adapter_total_bytes: int = Field(4 * GIB, gt=0)
    max_validation_set_bytes: int = Field(1 * GIB, gt=0)
    cached_base_models: int = Field(1, gt=0)
    work_dir: str | None = None  # where submissions are downloaded; the system temp dir if unset


class LoraInput(BaseInputData):
    hg_repo_id: str
    revision: str = "main"
    base_model: str  # a chat-template key, e.g. qwen1.5
    validation_set_url: str
    context_length: int = Field(gt=0)
    max_params: int = Field(gt=0)


class LoraMetrics(BaseMetrics):
    loss: float
    bpc: float
    bppl: float
    nll_token_nats_total: float
    nll_token_bits_total: float
    eval_loss: float
    gpu_type: str


class LoraModule(BaseValidationModule):
    config_schema = LoraConfig
    input_data_schema = LoraInput
    metrics_schema = LoraMetrics
    task_type = "training"

    def __init__(self, config: LoraConfig) -> None:
        super().__init__(config)
        if not config.lora_only:
            raise ConfigError("lora_only=false (scoring full models) is not supported yet")
        self.device = pick_device()
        if config.quantization != "none":
            if self.device == "cpu":
                raise ConfigError(f"quantization {config.quantization!r} needs a CUDA GPU")
            log.warning(
                "%s quantization is on: scores will differ from other validators",
                config.quantization,
            )
        self.merge = config.merge_adapter and config.quantization == "none"
        self.max_batch_size = config.max_batch_size or default_max_batch_size(self.device)
        self.bases = BaseModelCache(
            fetch=fetch_base_model,
            load_tokenizer=load_tokenizer,
            device=self.device,
            dtype=pick_dtype(self.device, config.fp16),
            capacity=config.cached_base_models,
            quantization=config.quantization,
        )
        self.limits = DownloadLimits(
            max_file_bytes=config.max_adapter_file_bytes,
            max_total_bytes=config.max_adapter_total_bytes,
            max_validation_set_bytes=config.max_validation_set_bytes,
        )
        self._work: Path | None = None
        self._encoded = EncodedSetCache()

    def validate(self, data: LoraInput) -> LoraMetrics:
        get_template(data.base_model)  # an unknown key fails before anything is downloaded
        self._work = Path(tempfile.mkdtemp(prefix="lora-", dir=self.config.work_dir))
        submission = fetch_adapter(
            data.hg_repo_id, data.revision, self._work / "adapter", self.limits
        )
        log.info(
            "scoring %s at commit %s (revision %s)",
            data.hg_repo_id,
            submission.commit,
            data.revision,
        )
        if submission.ignored_files:
            log.info("not downloaded (not needed): %s", ", ".join(submission.ignored_files))
        if not submission.is_lora:
            raise SubmissionRejected(
                f"{data.hg_repo_id} has no adapter_config.json: a full model, and lora_only is set"
            )
        plan = plan_adapter(submission.adapter_config, self.config.supported_base_models)
        if plan.dropped_keys:
            log.info("ignored empty adapter_config keys: %s", ", ".join(plan.dropped_keys))
        base = self.bases.get(plan.base_model)
        if base.parameter_count > data.max_params:
            log.warning(
                "%s has %d parameters, over max_params %d: loss 999",
                plan.base_model,
                base.parameter_count,
                data.max_params,
            )
            return LoraMetrics(**high_loss_metrics(), gpu_type=gpu_type(self.device))
        encoded = self._encode(data, base)
        try:
            with applied_adapter(
                base.model, submission.path, plan, self.merge, base.pristine
            ) as model:
                losses = example_losses(
                    model,
                    encoded.examples,
                    token_budget=self.config.token_budget,
                    max_batch_size=self.max_batch_size,
                    pad_token_id=base.tokenizer.pad_token_id,
                )
        finally:
            # Whatever happened (a score, a refusal, a fault), the next submission must meet
            # the base as loaded.
            self.bases.release(base, data.hg_repo_id, reload=plan.needs_base_reload)
        return self._metrics(eval_loss(losses), encoded.total_target_tokens, encoded.total_bytes)

    def _encode(self, data: LoraInput, base: LoadedBase) -> EncodedSet:
        path = fetch_validation_set(
            data.validation_set_url,
            self._work / "validation.jsonl",
            self.limits.max_validation_set_bytes,
        )
        encoded = self._encoded.get(
            path, data.base_model, base.repo_id, base.tokenizer, data.context_length
        )
        log.info("validation set: %d examples", len(encoded.examples))
        check_token_byte_ratio(encoded.total_target_tokens, encoded.total_bytes)
        return encoded

    def _metrics(self, loss: float, target_tokens: int, total_bytes: int) -> LoraMetrics:
        values = score_metrics(loss, target_tokens, total_bytes)
        return LoraMetrics(**values, gpu_type=gpu_type(self.device))

    def cleanup(self) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None


MODULE = LoraModule
__all__ = ["MODULE", "AdapterRejected", "LoraConfig", "LoraInput", "LoraMetrics"]

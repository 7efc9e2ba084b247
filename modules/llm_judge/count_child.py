"""The child process that counts the parameters a full model's config describes
(modules/llm_judge/param_count.py): a standalone script (torch and transformers only, nothing of
the validator), started by validator/kit/child_process.py under CPU, memory and wall-clock limits.

`python -I count_child.py REQUEST.json`: builds the model of `config_dir`'s config.json (never
with remote code) on the meta device, where a parameter has a shape and no storage, and writes
{"count": n} (tied parameters counted once, as `model.parameters()` gives them) to the result
file; a config that transformers cannot build, {"error": "..."}.
"""

from __future__ import annotations

import json
import resource
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.auto_factory import _get_model_class


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(count(request["config_dir"]), handle)


def count(config_dir: str) -> dict:
    try:
        config = _as_loaded(AutoConfig.from_pretrained(config_dir, trust_remote_code=False))
        # The meta device: every tensor is a shape without storage, however large it claims
        # to be; only the module objects themselves take memory (the limits bound them).
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        return {"count": sum(p.numel() for p in model.parameters())}
    except MemoryError:
        raise  # past the memory limit: the set-up reports it as such
    except Exception as exc:  # noqa: BLE001 - a config can make the model's code raise anything
        if _memory_spent():
            # An allocation failed inside C code that does not turn it into MemoryError (torch's
            # module set-up answers "SystemError: ... returned NULL without setting an
            # exception"): the limit was met, and the set-up must report it as such.
            raise MemoryError(str(exc)) from exc
        text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
        return {"error": text if len(text) <= 300 else text[:300] + "..."}


def _as_loaded(config):
    """The config of the model `AutoModelForCausalLM.from_pretrained` builds: for a composite
    config (Qwen3.5's own checkpoints hold a text and a vision model) whose causal LM takes
    only the text part, that part, as from_pretrained picks it (from_config does not)."""
    mapping = AutoModelForCausalLM._model_mapping
    if type(config) in mapping:
        model_class = _get_model_class(config, mapping)
        if model_class.config_class == config.sub_configs.get("text_config", None):
            return config.get_text_config()
    return config


def _memory_spent(share: float = 0.9) -> bool:
    """Whether this process's peak address space came within `share` of its RLIMIT_AS."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return False
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024 >= share * limit
    return False


if __name__ == "__main__":
    main(sys.argv[1])

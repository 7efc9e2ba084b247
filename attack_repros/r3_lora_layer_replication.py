"""F3: `layer_replication` passes the bounded child and plan_adapter (it only sets
needs_base_reload); peft then deep-copies a base layer per entry in the validator's process.
The child's 8 MB answer fits ~1M entries `[0,2]`: CPU and memory in the parent grow linearly with
a list the config names (a real 0.5B base copies ~60 MB per layer per entry).

Run: .venv/bin/python attack_repros/r3_lora_layer_replication.py
"""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from devkit.tiny_models import build_model, make_lora
    from modules.lora.adapter_shapes import check_against_base
    from modules.lora.adapters import applied_adapter, plan_adapter
    from modules.lora.reading import read_adapter

    tmp = Path(tempfile.mkdtemp())
    base = build_model("qwen2")
    adapter = tmp / "adapter"
    make_lora(base, seed=0).save_pretrained(str(adapter))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "tiny/base"
    layers = base.config.num_hidden_layers
    for n in (100, 400):
        cfg["layer_replication"] = [[0, layers]] * n
        (adapter / "adapter_config.json").write_text(json.dumps(cfg))
        files = read_adapter(adapter, tmp / f"reading{n}", "evil")  # the real bounded child
        plan = plan_adapter(files.config, ["tiny/base"], files.dropped_keys)
        check_against_base(plan, base, files.tensors)
        t = time.process_time()
        try:
            with applied_adapter(build_model("qwen2"), adapter, plan, merge=False) as model:
                count = len(model.base_model.model.model.layers)
        except Exception as exc:  # noqa: BLE001
            count = f"raised {type(exc).__name__}: {str(exc)[:120]}"
        print(
            f"{n} entries ({len(json.dumps(cfg))} bytes of config): {count} layers built, "
            f"{time.process_time() - t:.1f} s CPU in the parent"
        )
    print(f"child answer bound 8 MB ~ {8 * 1024**2 // len(json.dumps([0, layers]) + ', ')} entries")


if __name__ == "__main__":
    main()

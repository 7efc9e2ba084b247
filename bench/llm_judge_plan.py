"""`make bench-llm-judge-plan`: the validator's own CPU while it fetches an llm_judge full model,
an honest one (one `model.safetensors`, or a few shards and their index) against a
hostile one whose index names 1,000 tiny shards (each a real safetensors file holding one junk
tensor: a model the network loads, downloading every shard), and one that names as many as the
module takes (MAX_SHARDS). Runs in the llm_judge stack.

The local hub (devkit/hf_hub.py) serves from a process of its own, so that the figure is the
fetching process's alone (`resource.getrusage(RUSAGE_SELF)`, user + system, around
`fetch_submission`; the bounded children's CPU is not the validator's process's and is left
out). Printed per case: the verdict, the files the hub served, and the CPU seconds (median of
`--runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from devkit.tiny_chat_models import build_chat_base
from devkit.tiny_repos import files_of
from modules.llm_judge.submission import MAX_SHARDS, fetch_submission
from validator.errors import SubmissionRejected

BASE = "Qwen/Qwen3.5-0.8B"
# The hub's process: the repos are folders named in its request, served until stdin closes.
HUB = """
import json, sys
from pathlib import Path
from devkit.hf_hub import LocalHub
from devkit.tiny_repos import files_of
from modules.llm_judge.submission import MAX_SHARDS, fetch_submission
from validator.errors import SubmissionRejected
repos = json.loads(sys.argv[2])
with LocalHub(Path(sys.argv[1])) as hub:
    for repo, folder in repos.items():
        hub.add_repo(repo, files_of(Path(folder)))
    print(hub.endpoint, flush=True)
    sys.stdin.read()
    print(json.dumps(hub.bodies_served()), flush=True)
"""


def sharded(base: Path, dest: Path, junk_shards: int, real_shards: int = 1) -> Path:
    """`base`'s files with its weights split over `real_shards` shards, and `junk_shards` more
    shards of one 4-byte tensor each that the index names too (the model ignores them)."""
    dest.mkdir(parents=True)
    for name, path in files_of(base).items():
        if name != "model.safetensors":
            (dest / name).write_bytes(path.read_bytes())
    total = real_shards + junk_shards
    weight_map = {}
    with safe_open(base / "model.safetensors", "pt") as weights:
        keys = list(weights.keys())
        tensors = {key: weights.get_tensor(key) for key in keys}
    for n in range(real_shards):
        shard = f"model-{n + 1:05d}-of-{total:05d}.safetensors"
        part = {key: tensors[key] for key in keys[n::real_shards]}
        save_file(part, str(dest / shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    for n in range(real_shards, total):
        shard = f"model-{n + 1:05d}-of-{total:05d}.safetensors"
        save_file({f"junk.{n}": torch.zeros(1)}, str(dest / shard), metadata={"format": "pt"})
        weight_map[f"junk.{n}"] = shard
    index = {"metadata": {}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    return dest


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fetch_cpu(repo: str, work: Path) -> tuple[float, str]:
    before = cpu_seconds()
    try:
        fetch_submission(repo, "main", work, [BASE], 10**9, 10**10, 10**9)
        verdict = "fetched"
    except SubmissionRejected as exc:
        verdict = f"rejected: {str(exc)[-90:]}"
    return cpu_seconds() - before, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000, help="junk shards of the hostile one")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = build_chat_base(tmp / "base")
        repos = {
            "bob/honest": str(base),
            "bob/sharded": str(sharded(base, tmp / "sharded", 0, real_shards=4)),
            "mallory/shards": str(sharded(base, tmp / "hostile", args.shards)),
            # The most shards an index may name (MAX_SHARDS): the most this plan can cost.
            "mallory/at-the-cap": str(sharded(base, tmp / "at-the-cap", MAX_SHARDS - 1)),
        }
        hub = subprocess.Popen(
            [sys.executable, "-c", HUB, str(tmp / "hub"), json.dumps(repos)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        os.environ["HF_ENDPOINT"] = hub.stdout.readline().strip()
        os.environ["HF_HOME"] = str(tmp / "hf-home")
        os.environ.pop("HF_TOKEN", None)
        fetch_cpu("bob/honest", tmp / "warm-up")  # imports, the child server
        rows = []
        for repo in repos:
            runs = [fetch_cpu(repo, tmp / "work" / repo / str(n)) for n in range(args.runs)]
            rows.append((repo, statistics.median(cpu for cpu, _ in runs), runs[0][1]))
        hub.stdin.close()
        served = json.loads(hub.stdout.readline())
        hub.wait()
    shards = sum(1 for name in served if name.startswith("model-"))
    print(f"{args.shards} junk shards; {args.runs} runs per case; the hub served {len(served)} "
          f"file bodies in all, {shards} of them shards")  # fmt: skip
    print("| submission | the validator's CPU (s) | verdict |\n|---|---|---|")
    for repo, cpu, verdict in rows:
        print(f"| {repo} | {cpu:.2f} | {verdict} |")


if __name__ == "__main__":
    main()

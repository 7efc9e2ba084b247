#!/usr/bin/env bash
# The llm_judge module's GPU checks and bench on a lent GPU machine (no network), from the
# repository root there, after `make gpu-kit` here and with bench/gpu-kit-llm_judge carried:
#   1. bench.llm_judge_fla_check: the module picks flash-linear-attention's kernels on this GPU
#      and its greedy answers equal the torch fallback's; any difference fails this script.
#   2. bench.llm_judge_assignment per shape (SHAPES, default "0.8b 2b"): a whole assignment,
#      ours against the network's way, generated tokens per second, the 10x target.
# Reports go to $OUT (bench/gpu-out when unset). Options after the script name go to the
# assignment bench (e.g. --prompts 32 --new-tokens 128 --network-prompts 2).
# With the session's run tool: run(command="bash bench/gpu_session_llm_judge.sh",
#                                  carry=["bench/gpu-kit-llm_judge"])
set -euo pipefail

kit=${KIT:-bench/gpu-kit-llm_judge}
out=${OUT:-bench/gpu-out}
if ! compgen -G "$kit/fla_core-*.whl" >/dev/null; then
    echo "error: no fla-core wheel in $kit; run 'make gpu-kit' first and carry $kit" >&2
    exit 2
fi
mkdir -p "$out"

# A venv over the machine's packages (its CUDA torch and Triton stay), the pinned stack in it.
# Not PYTHONPATH: the module renders chat templates in a child started with `python -I`, which
# ignores it; the venv's own site-packages reach the child. --without-pip: no ensurepip needed.
venv=$(mktemp -d)/venv
python3 -m venv --system-site-packages --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install --quiet --no-deps --no-index --target "$site" "$kit"/*.whl
py="$venv/bin/python"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$py" -c 'import importlib, torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("torch", "triton", "transformers", "peft", "fla"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(name, "does not import:", type(exc).__name__, exc)'
} 2>&1 | tee "$out/llm_judge-env.txt"

"$py" -u -m bench.llm_judge_fla_check --device cuda 2>&1 | tee "$out/llm_judge-fla-check.txt"

for shape in ${SHAPES:-0.8b 2b}; do
    "$py" -u -m bench.llm_judge_assignment --device cuda --shape "$shape" --prompts 64 \
        --new-tokens 256 --network-prompts 4 "$@" 2>&1 | tee "$out/llm_judge-$shape.txt"
done

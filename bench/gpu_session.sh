#!/usr/bin/env bash
# The lora bench's GPU mode on a lent GPU machine, from the repository root there, after
# `make gpu-kit` here and with bench/gpu-kit carried along. Writes its reports to $OUT
# (bench/gpu-out when unset). Usage: bash bench/gpu_session.sh [extra lora_bench.py options]
# Run from the repository root: the bench runs as `python3 -m bench.lora_bench`, which finds
# the repository's packages there without an install.
set -euo pipefail

kit=bench/gpu-kit
out=${OUT:-bench/gpu-out}
if ! compgen -G "$kit/*.whl" >/dev/null; then
    echo "error: no wheels in $kit; run 'make gpu-kit' first and carry $kit" >&2
    exit 2
fi
mkdir -p "$out"

# The pinned stack goes in front of the machine's own packages; its torch (CUDA) stays.
site=$(mktemp -d)
python3 -m pip install --quiet --no-deps --no-index --target "$site" "$kit"/*.whl
export PYTHONPATH="$site" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda",
        torch.version.cuda, "available", torch.cuda.is_available(), "transformers",
        transformers.__version__, "peft", peft.__version__)'
    # Packed scoring compiles FlexAttention with Triton: record what this machine has.
    python3 -c 'import torch.nn.attention.flex_attention, triton; print("flex_attention: yes,",
        "triton", triton.__version__)' || echo "flex_attention or triton: missing"
} 2>&1 | tee "$out/gpu-env.txt"

python3 -u -m bench.lora_bench --dry-run --device cuda "$@" 2>&1 | tee "$out/gpu-dry-run.txt"
# DTYPES=fp16 for a second call when one 10-minute call cannot hold both passes.
for dtype in ${DTYPES:-bf16 fp16}; do
    python3 -u -m bench.lora_bench --device cuda --dtype "$dtype" "$@" 2>&1 \
        | tee "$out/gpu-$dtype.txt"
done

#!/usr/bin/env bash
# One GPU session, lora and llm_judge, sized to a lent machine's lease: every step runs under a
# time cap taken from one deadline (DEADLINE_S, 540 s: 9 minutes, inside one 10-minute command)
# and writes its report to $OUT as it goes (bench/gpu-out when unset), so a run cut short still
# returns what it measured; $OUT/session.txt lists each step with its exit status and seconds.
# Steps, most wanted first:
#   lora-fp16        GPU mode, the network's regime, on the 7B shape: packed (compiled, bucketed,
#                    checked) beside padded, both against the per-example forward, the adapter
#                    cycle, the Trainer's agreement, the reference's reload
#   llm_judge-warm   the warm base kept on the card against the network's reload (bit-identity
#                    of every merge, the fingerprint check's share), 0.8b shape
#   llm_judge-fla    flash-linear-attention picked, greedy answers equal to the torch fallback's
#   llm_judge-0.8b   a whole llm_judge assignment, ours against the network's way
#   lora-bf16        GPU mode in the bf16 option, when time is left
# On the machine, from the repository root, after `make gpu-kit` here, with both kits carried:
#   run(command="bash bench/gpu_session.sh", carry=["bench/gpu-kit", "bench/gpu-kit-llm_judge"])
# PARTS="lora" or "llm_judge" runs one part; options after the script name go to lora_bench.py.
# `bash bench/gpu_session.sh --rehearse`: the same steps on this CPU at tiny shapes with the
# repository's venvs and no kits (CI runs it: tests/test_gpu_session.py); steps that need CUDA
# say so in their report.
set -uo pipefail

rehearse=0
if [[ "${1:-}" == "--rehearse" ]]; then
    rehearse=1
    shift
fi
out=${OUT:-bench/gpu-out}
parts=${PARTS:-lora llm_judge}
mkdir -p "$out"
start=$SECONDS
failed=0
deadline=$((start + ${DEADLINE_S:-540}))
: >"$out/session.txt"

# step NAME CAP COMMAND...: runs COMMAND for at most CAP seconds and what is left before the
# deadline (less a margin for the steps' own exit), teeing its output to $OUT/NAME.txt.
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((deadline - SECONDS - 10))
    ((cap > left)) && cap=$left
    if ((cap < 20)); then
        echo "$name: skipped, $((deadline - SECONDS)) s left of the session's budget" \
            | tee "$out/$name.txt" >>"$out/session.txt"
        return 0
    fi
    local began=$SECONDS rc
    echo "== $name (at most $cap s)"
    timeout --signal=INT --kill-after=15 "$cap" "$@" 2>&1 | tee "$out/$name.txt"
    rc=${PIPESTATUS[0]}
    local note=""
    ((rc == 124 || rc == 130 || rc == 137)) && note=" (cut at its cap)"
    ((rc != 0)) && failed=$((failed + 1))
    echo "$name: exit $rc in $((SECONDS - began)) s$note" | tee -a "$out/session.txt"
}

lora=0 judge=0 lora_py="" judge_py=""
[[ " $parts " == *" lora "* ]] && lora=1
[[ " $parts " == *" llm_judge "* ]] && judge=1
if ((rehearse)); then
    ((lora)) && lora_py=${LORA_PY:-.venv/bin/python}
    ((judge)) && judge_py=${LLM_JUDGE_PY:-.venv-llm_judge/bin/python}
    device=cpu
else
    # The pinned stacks in venvs over the machine's packages (its CUDA torch and Triton stay).
    # Not PYTHONPATH: llm_judge renders chat templates in a child started with `python -I`.
    stack() {  # stack KIT: a venv's python with KIT's wheels installed
        local venv site
        venv=$(mktemp -d)/venv
        python3 -m venv --system-site-packages --without-pip "$venv"
        site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        python3 -m pip install --quiet --no-deps --no-index --target "$site" "$1"/*.whl >&2
        echo "$venv/bin/python"
    }
    for kit in bench/gpu-kit bench/gpu-kit-llm_judge; do
        part=lora
        [[ $kit == *llm_judge ]] && part=llm_judge
        if [[ " $parts " == *" $part "* ]] && ! compgen -G "$kit/*.whl" >/dev/null; then
            echo "error: no wheels in $kit; run 'make gpu-kit' first and carry $kit" >&2
            exit 2
        fi
    done
    ((lora)) && lora_py=$(stack bench/gpu-kit)
    ((judge)) && judge_py=$(stack bench/gpu-kit-llm_judge)
    device=cuda
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
        || echo "no nvidia-smi: ${device}"
    for py in $lora_py $judge_py; do
        "$py" -c 'import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())
for name in ("triton", "transformers", "peft", "fla"):
    try:
        print(" ", name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(" ", name, "does not import:", type(exc).__name__, str(exc)[:120])'
    done
} 2>&1 | tee "$out/env.txt"
echo "env: $(date -u +%FT%TZ), budget ${DEADLINE_S:-540} s" >>"$out/session.txt"


if ((rehearse)); then
    ((lora)) && step lora-fp32 180 "$lora_py" -m bench.lora_bench --rehearse "$@"
    ((judge)) && step llm_judge-warm 120 "$judge_py" -m bench.llm_judge_warm_base \
        --shape tiny --assignments 2 --device cpu --decode-steps 2
    ((judge)) && echo "llm_judge-fla, llm_judge-0.8b: not rehearsed (CUDA only; a minute of" \
        "CPU for the assignment bench, which its own tests run)" | tee -a "$out/session.txt"
else
    ((lora)) && step lora-dry-run 30 "$lora_py" -m bench.lora_bench --dry-run --device cuda
    ((lora)) && step lora-fp16 240 "$lora_py" -m bench.lora_bench --device cuda --dtype fp16 \
        --models 7b --gpu-examples 96 "$@"
    ((judge)) && step llm_judge-warm 90 "$judge_py" -m bench.llm_judge_warm_base \
        --shape 0.8b --assignments 3 --device cuda --decode-steps 16
    ((judge)) && step llm_judge-fla 60 "$judge_py" -m bench.llm_judge_fla_check --device cuda
    ((judge)) && step llm_judge-0.8b 120 "$judge_py" -m bench.llm_judge_assignment \
        --device cuda --shape 0.8b --prompts 32 --new-tokens 128 --network-prompts 2
    ((lora)) && step lora-bf16 240 "$lora_py" -m bench.lora_bench --device cuda --dtype bf16 \
        --models 7b --gpu-examples 96 "$@"
fi
echo "session: $((SECONDS - start)) s of ${DEADLINE_S:-540}, $failed steps failed" \
    | tee -a "$out/session.txt"
((failed == 0))

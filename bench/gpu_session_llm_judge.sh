#!/usr/bin/env bash
# The llm_judge part of bench/gpu_session.sh alone (its warm base on the card, the fla check,
# an assignment at the 0.8b shape), under the same deadline and reports in $OUT:
#   run(command="bash bench/gpu_session_llm_judge.sh", carry=["bench/gpu-kit-llm_judge"])
PARTS=llm_judge exec bash "$(dirname "$0")/gpu_session.sh" "$@"

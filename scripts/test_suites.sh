#!/usr/bin/env bash
# `make test`'s run: the core suite in the dev venv and each own-venv stack's suite (tests/<name>
# in .venv-<name>) side by side, as they share nothing (each Docker test names its containers,
# volumes and images at random), so that two cores finish both in about the time of the longer.
# Each suite prints its 25 slowest tests. A stack's output comes after the core suite's, whole.
# TEST_SERIAL=1 runs them one after the other instead (a one-core machine).
# usage: scripts/test_suites.sh PYTHON STACK...
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
shift
stacks=("$@")
ignores=()
for m in "${stacks[@]}"; do ignores+=("--ignore=tests/$m"); done
# Tests that compare the loop's pace with and without a load of their own: run alone once both
# suites are done, as a suite running beside them is load they did not make (the status flood
# failed at 64% of the quiet rate beside the llm_judge suite, at 97% alone).
alone=(tests/faults/test_status_flood.py)
for t in "${alone[@]}"; do ignores+=("--ignore=$t"); done
options=(-q --durations=25 -p no:cacheprovider)
# Each suite over TEST_WORKERS worker processes (pytest-xdist; tests/conftest.py keeps a file's
# tests together and the Docker tests in one worker): many tests wait on a child, a server or
# the engine, and the two cores sat half idle with one process per suite.
workers=(-n "${TEST_WORKERS:-2}" --dist loadgroup)

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A pids
run_stack() {
    ".venv-$1/bin/python" -m pytest "${options[@]}" "${workers[@]}" "tests/$1" >"$logs/$1.log" 2>&1
}
if [ "${TEST_SERIAL:-0}" != 1 ]; then
    for m in "${stacks[@]}"; do
        run_stack "$m" &
        pids[$m]=$!
    done
fi

failed=()
"$py" -m pytest "${options[@]}" "${workers[@]}" "${ignores[@]}" || failed+=(core)
for m in "${stacks[@]}"; do
    if [ -n "${pids[$m]:-}" ]; then
        wait "${pids[$m]}"
    else
        run_stack "$m"
    fi
    status=$?
    echo "== tests/$m in .venv-$m"
    cat "$logs/$m.log"
    [ "$status" = 0 ] || failed+=("tests/$m")
done
echo "== alone: ${alone[*]}"
"$py" -m pytest "${options[@]}" "${alone[@]}" || failed+=(alone)
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi

#!/usr/bin/env bash
# `make test`'s run: the core suite in the dev venv, its Docker tests, and each own-venv stack's
# suite (tests/<name> in .venv-<name>) side by side, as they share nothing (each Docker test
# names its containers, volumes and images at random), so that two cores finish them all in
# about the time of the longest.
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
# Docker trials whose test module goes by a name of its own (tests/faults/test_moves.py): apart
# from the other Docker tests' images and containers, so they run in a process of their own
# beside them; the engine waits on containers more than on the cores.
apart=(tests/faults/test_moves.py)
options=(-q --durations=25 -p no:cacheprovider)
# Each suite over TEST_WORKERS worker processes (pytest-xdist, a file's tests in one worker so
# that its module fixtures are built once): many tests wait on a child, a server or the engine
# (with two workers a suite, the two cores were a quarter idle).
# The core suite's Docker tests run in a process of their own, one after another, beside it:
# they share the engine's images and count its containers.
workers=(-n "${TEST_WORKERS:-3}" --dist loadfile)

# One thread each for the math libraries, as the suites run side by side on few cores: an
# OpenMP thread spins while it waits for the others, and three lora test runs side by side took
# 101 s with two threads each, 40 s with one.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A pids
run_part() {
    case $1 in
    docker) "$py" -m pytest "${options[@]}" -m docker "${ignores[@]}" "${apart[@]/#/--ignore=}" ;;
    apart) "$py" -m pytest "${options[@]}" -m docker "${apart[@]}" ;;
    *) ".venv-$1/bin/python" -m pytest "${options[@]}" "${workers[@]}" "tests/$1" ;;
    esac >"$logs/$1.log" 2>&1
}
parts=(docker apart "${stacks[@]}")
if [ "${TEST_SERIAL:-0}" != 1 ]; then
    for m in "${parts[@]}"; do
        run_part "$m" &
        pids[$m]=$!
    done
fi

failed=()
"$py" -m pytest "${options[@]}" "${workers[@]}" -m "not docker" "${ignores[@]}" || failed+=(core)
for m in "${parts[@]}"; do
    if [ -n "${pids[$m]:-}" ]; then
        wait "${pids[$m]}"
    else
        run_part "$m"
    fi
    status=$?
    case $m in
    docker) echo "== the core suite's Docker tests" ;;
    apart) echo "== Docker trials apart: ${apart[*]}" ;;
    *) echo "== tests/$m in .venv-$m" ;;
    esac
    cat "$logs/$m.log"
    [ "$status" = 0 ] || failed+=("$m")
done
echo "== alone: ${alone[*]}"
"$py" -m pytest "${options[@]}" "${alone[@]}" || failed+=(alone)
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi

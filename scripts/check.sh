#!/usr/bin/env bash
# `make test`'s checks and suite, in a venv: scripts/check.sh VENV TESTS STOPWATCH_FILES
#
# mypy runs beside the parallel test stage at the lowest priority (nice 19): it takes only the CPU the
# two test workers leave idle while they wait on subprocesses (about 12% of that stage), so its
# 18 s no longer add to the wall time. Measured on the 2-core machine: the parallel stage took as long
# with it as without, and mypy was done 75 s into it. The stopwatch stage starts only after mypy has
# finished, so nothing runs beside those timings.
set -uo pipefail
venv=$1 tests=$2 stopwatch=$3

# numpy's OpenBLAS starts a worker thread per extra core when numpy is imported (torch imports it),
# and an idle worker spins about 0.1 s of CPU before it sleeps. The suite starts some 150 Python
# processes and none calls numpy's BLAS: on two cores that spin was CPU taken from the tests.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

"$venv/bin/ruff" check src tests benchmarks || exit 1
"$venv/bin/lint-imports" || exit 1

log=$(mktemp)
nice -n 19 "$venv/bin/mypy" src/lmprof >"$log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null; rm -f "$log"' EXIT

# shellcheck disable=SC2086
"$venv/bin/python" -m pytest -n 2 --dist worksteal -m "not stopwatch" $tests
tests_rc=$?
wait "$mypy_pid"
mypy_rc=$?
cat "$log"
if [ "$tests_rc" -ne 0 ] || [ "$mypy_rc" -ne 0 ]; then
    exit 1
fi
# shellcheck disable=SC2086
"$venv/bin/python" -m pytest -p no:xdist -m stopwatch $stopwatch

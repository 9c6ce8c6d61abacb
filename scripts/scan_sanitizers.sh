#!/usr/bin/env bash
# Builds the C trace reader (src/lmprof/trace/kineto/_scan.c) with AddressSanitizer and UBSan in a scratch
# copy of src/ and runs its tests (real traces, mutated and damaged event lists) against that build.
# Run after changing _scan.c: `bash scripts/scan_sanitizers.sh` (needs gcc; not part of make test).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r src "$tmp/src"
rm -f "$tmp"/src/lmprof/trace/kineto/_scan*.so
ext=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
inc=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
gcc -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -shared -fPIC -I"$inc" \
    src/lmprof/trace/kineto/_scan.c -o "$tmp/src/lmprof/trace/kineto/_scan$ext"
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
PYTHONPATH="$tmp/src" $PY -m pytest -q -n 0 -p no:cacheprovider tests/test_trace_scan.py

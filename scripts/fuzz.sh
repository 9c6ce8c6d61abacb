#!/usr/bin/env bash
# Coverage-guided fuzzing of the C trace reader (src/lmprof/trace/kineto/_scan.c) with atheris, the reader
# built with AddressSanitizer + UBSan in a scratch copy of src/. Bounded: FUZZ_SECONDS (default 60).
# Usage: bash scripts/fuzz.sh  (needs gcc; installs the `fuzz` extra, atheris, when missing).
# Findings (crash-*, timeout-*) are written to fuzz-out/; exit code non-zero on a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SECONDS_MAX=${FUZZ_SECONDS:-60}
$PY -c "import atheris" 2>/dev/null || .venv/bin/uv pip install --python "$PY" -q "atheris>=2.3,<4"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r src "$tmp/src"
rm -f "$tmp"/src/lmprof/trace/kineto/_scan*.so
ext=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
inc=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
# Coverage guidance inside the C code needs clang's -fsanitize=fuzzer-no-link. With gcc only, the
# reader is still built with ASan + UBSan and fuzzed, but libFuzzer sees no coverage (it says so):
# a random mutation fuzzer under the sanitizers, not a coverage-guided one.
if command -v clang >/dev/null; then
    CC=clang; FLAGS="-fsanitize=address,undefined,fuzzer-no-link"
    ASAN_LIB=$(clang -print-file-name=libclang_rt.asan-x86_64.so); UBSAN_LIB=""
else
    echo "fuzz.sh: no clang, so no coverage guidance in the C reader (install clang for it)" >&2
    CC=gcc; FLAGS="-fsanitize=address,undefined"
    ASAN_LIB=$(gcc -print-file-name=libasan.so); UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
fi
$CC -O1 -g $FLAGS -fno-omit-frame-pointer -shared -fPIC -I"$inc" \
    src/lmprof/trace/kineto/_scan.c -o "$tmp/src/lmprof/trace/kineto/_scan$ext"
mkdir -p fuzz-out "$tmp/corpus"
# Seeds: the event list of a small real trace.
$PY -c "import gzip,json,sys; d=json.load(gzip.open('tests/data/traces/cpu_only_tiny.json.gz')); \
sys.stdout.buffer.write(json.dumps(d['traceEvents'][:50]).encode())" > "$tmp/corpus/seed.json"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" \
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
PYTHONPATH="$tmp/src:tests" $PY -c "import lmprof.trace.kineto.scan as s; assert s.NATIVE, 'ASan build not loaded'"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" \
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
PYTHONPATH="$tmp/src:tests" $PY tests/fuzz_scan_target.py -max_total_time="$SECONDS_MAX" \
    -artifact_prefix=fuzz-out/ -max_len=65536 "$tmp/corpus"

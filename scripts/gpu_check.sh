#!/usr/bin/env bash
# The CUDA validation of issue 51 in one command: set lmprof up on the machine's own Python, then run
# scripts/gpu_check.py (every step, summary, bundle; its --help and docs/gpu-validation.md say what).
#
#   bash scripts/gpu_check.sh [gpu_check.py options: --device cpu, --budget S, --out DIR, --only a,b, ...]
#
# Which Python: GPU_CHECK_PYTHON when set; else .venv/bin/python when it imports lmprof (a developer's
# checkout); else python3 (the GPU machine's image: a CUDA torch, no package registry). The first and
# the last get the wheels of .whl/ (GPU_CHECK_WHEELS names another folder; scripts/gpu_wheels.sh
# fetches them beforehand where the registry is reachable, and the device call carries .whl) and lmprof
# itself, built from this tree (its C reader compiled where a compiler is), installed with pip --target
# into a folder of their own put first on PYTHONPATH: the image's own packages stay as they are.
# The set-up's time counts against the budget: GPU_CHECK_STARTED is the clock --budget runs from, and
# GPU_CHECK_SETUP_* record the set-up in the summary.
set -uo pipefail
export GPU_CHECK_STARTED="${GPU_CHECK_STARTED:-$(date +%s.%N)}"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 2

site="${GPU_CHECK_SITE:-/tmp/lmprof-gpu-site-$$}"  # its own: two checks at once do not share one
pip_quiet=(-q --disable-pip-version-check --no-cache-dir --no-compile)

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    py=$GPU_CHECK_PYTHON method=target
elif [ -x .venv/bin/python ] && .venv/bin/python -c "import lmprof.cli.main" 2>/dev/null; then
    py=.venv/bin/python method=venv
else
    py=python3 method=target
fi
export GPU_CHECK_SETUP_PYTHON="$py ($("$py" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
export GPU_CHECK_SETUP_METHOD=$method

if [ "$method" = target ]; then
    echo "gpu_check.sh: installing into $site for $GPU_CHECK_SETUP_PYTHON"
    rm -rf "$site" && mkdir -p "$site"
    shopt -s nullglob
    wheels=("${GPU_CHECK_WHEELS:-.whl}"/*.whl)
    shopt -u nullglob
    export GPU_CHECK_SETUP_WHEELS=${#wheels[@]}
    if [ ${#wheels[@]} -gt 0 ]; then
        "$py" -m pip install "${pip_quiet[@]}" --no-index --no-deps --upgrade --target "$site" "${wheels[@]}" \
            || export GPU_CHECK_SETUP_WHEELS="${#wheels[@]}, install FAILED"
    else
        echo "gpu_check.sh: no .whl/*.whl (scripts/gpu_wheels.sh fetches them; carry .whl): the image's packages must do"
    fi
    # lmprof itself, built from this tree without build isolation (no registry): the image's setuptools.
    # Its own folder, then merged: a second --target install into $site would replace $site/bin whole.
    pkg="$site.lmprof"
    rm -rf "$pkg"
    if "$py" -m pip install "${pip_quiet[@]}" --no-index --no-deps --no-build-isolation --target "$pkg" . \
            >"$site.build.log" 2>&1; then
        cp -a "$pkg"/. "$site"/ && rm -rf "$pkg"
        export GPU_CHECK_SETUP_BUILD=ok
    else
        export GPU_CHECK_SETUP_BUILD="FAILED ($site.build.log): $(tail -n 3 "$site.build.log" | tr '\n' ' ' | cut -c1-300)"
        export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the pure-Python reader still runs from the tree
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"
fi
if err=$("$py" -c "import lmprof.cli.main" 2>&1); then
    export GPU_CHECK_SETUP_IMPORT=ok
else
    export GPU_CHECK_SETUP_IMPORT="FAILED: $(echo "$err" | tail -n 1 | cut -c1-300)"
fi
GPU_CHECK_SETUP_SECONDS=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $GPU_CHECK_STARTED}")
export GPU_CHECK_SETUP_SECONDS
echo "gpu_check.sh: set-up ($method) took ${GPU_CHECK_SETUP_SECONDS} s; lmprof import: $GPU_CHECK_SETUP_IMPORT"
exec "$py" scripts/gpu_check.py --python "$py" "$@"

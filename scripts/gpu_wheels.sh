#!/usr/bin/env bash
# Fetch, on a machine that reaches the package registry, the wheels that the GPU machine's image lacks
# (it reaches none), at the versions of requirements/run.lock, for its Python (3.12) on x86-64 Linux.
#
#   bash scripts/gpu_wheels.sh [DEST]        # DEST defaults to .whl (git-ignored through .git/info/exclude)
#   PYVER=3.11 bash scripts/gpu_wheels.sh /tmp/w   # another Python, e.g. to rehearse the set-up here
#
# Then the device call carries them: command "bash scripts/gpu_check.sh", carry [".whl"]; gpu_check.sh
# installs them (pip --target, no index). About 19 MB, under the 64 MiB the device tool carries.
#
# Which: the image has torch (CUDA), numpy, pandas, matplotlib, pyyaml, jinja2, filelock, nvidia-ml-py,
# huggingface-hub, tokenizers, safetensors and regex; it has no pydantic, orjson or msgspec, and its
# transformers is older than lmprof's floor (5.20). typer and rich come at the locked versions so the
# CLI behaves as tested; the rest are what those need (pydantic's and rich's own dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
pyver=${PYVER:-3.12}
pkgs=(pydantic pydantic-core annotated-types typing-inspection typing-extensions orjson msgspec
      typer rich markdown-it-py mdurl pygments shellingham annotated-doc transformers)

pins=()
for name in "${pkgs[@]}"; do
    pin=$(grep -E "^${name}==" requirements/run.lock | head -n 1 | cut -d' ' -f1)
    if [ -z "$pin" ]; then
        echo "gpu_wheels.sh: $name is not in requirements/run.lock" >&2
        exit 2
    fi
    pins+=("$pin")
done

mkdir -p "$dest"
rm -f "$dest"/*.whl  # one version of each: two would stop the whole install there
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dest" "${pins[@]}"

if [ "$dest" = .whl ]; then
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
fi
echo "gpu_wheels.sh: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest (Python $pyver)"

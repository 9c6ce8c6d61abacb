#!/usr/bin/env bash
# Re-resolve requirements/*.lock from pyproject.toml's ranges: the newest versions each range allows,
# exact and hashed. Usage: scripts/lock.sh UV [extra uv pip compile flags, e.g. --upgrade-package X].
# LOCK_DIR (default requirements) is where the locks are written: scripts/test_versions.sh writes a
# throw-away set elsewhere.
#
# torch itself is left out of the locks (TORCH_SPEC picks the build), but its own dependencies are
# in them. They are resolved against torch's CPU wheel when one lies in LMPROF_TORCH_FIND_LINKS
# (default: pip's find-links, where this project's machines keep it), so the locks hold no CUDA
# packages; without one, against PyPI's torch with the CUDA packages left out.
set -euo pipefail
UV=${1:?usage: scripts/lock.sh UV [flags]}; shift
cd "$(dirname "$0")/.."
out=${LOCK_DIR:-requirements}
TORCH_VERSION=$(sed -n 's/^TORCH_SPEC ?= torch==//p' Makefile)
links=${LMPROF_TORCH_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}
args=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header --quiet
      --no-emit-package torch "$@")
tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
if [ -n "$links" ] && ls "$links"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1; then
    echo "torch==$TORCH_VERSION+cpu" >"$tmp"
    args+=(--find-links "$links" -c "$tmp")
else
    echo "torch==$TORCH_VERSION" >"$tmp"
    args+=(-c "$tmp")
    for p in triton cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cccl nvidia-cuda-cupti \
             nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand \
             nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink \
             nvidia-nvshmem-cu13 nvidia-nvtx; do args+=(--no-emit-package "$p"); done
fi
"$UV" pip compile pyproject.toml requirements/build.in "${args[@]}" --extra hf -o "$out/run.lock"
"$UV" pip compile pyproject.toml requirements/build.in "${args[@]}" --extra dev --extra hf --extra parquet \
    -o "$out/dev.lock"
# From stdin, so the lock names no temporary file (it would change on every run). pip stays at the
# version Python 3.11's ensurepip brings (the Makefile makes the venv without it): the one torch's
# install has always been tested with.
printf 'uv==%s\npip==23.2.1\n' "$("$UV" --version | awk '{print $2}')" |
    "$UV" pip compile - --generate-hashes --no-header --quiet -o "$out/uv.lock"
echo "locks written: $out/{run,dev,uv}.lock"

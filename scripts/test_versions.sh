#!/usr/bin/env bash
# Maintainers' drift check: the suite against the newest (latest) or the oldest (oldest) versions that
# pyproject.toml's ranges allow, each in its own venv (.venv-latest / .venv-oldest), never the locked one.
#
#   latest: every dependency at the newest release its range allows (torch: LATEST_TORCH_SPEC, default
#           the newest torch pip finds within the range), then the whole `make test` sequence.
#   oldest: the locked set with transformers and torch at their floors (OLDEST_TORCH_SPEC,
#           OLDEST_TRANSFORMERS), then the Hugging Face-facing tests.
# Record the versions it printed in docs/dependencies.md when it is green.
set -euo pipefail
mode=${1:?usage: scripts/test_versions.sh latest|oldest}
cd "$(dirname "$0")/.."
venv=.venv-$mode
py=$venv/bin/python
uv=$venv/bin/uv
python3 -m venv "$venv"
"$py" -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements/uv.lock
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
torch_range=$(sed -n 's/^ *"\(torch[^"]*\)",$/\1/p' pyproject.toml | head -1)
case $mode in
latest)
    LOCK_DIR=$tmp bash scripts/lock.sh "$uv" --upgrade
    "$uv" pip install --python "$py" --quiet --require-hashes --no-deps -r "$tmp/dev.lock"
    "$py" -m pip install -q --disable-pip-version-check "${LATEST_TORCH_SPEC:-$torch_range}"
    tests=tests ;;
oldest)
    "$uv" pip install --python "$py" --quiet --require-hashes --no-deps -r requirements/dev.lock
    "$uv" pip install --python "$py" --quiet "transformers==${OLDEST_TRANSFORMERS:-$(sed -n 's/.*"transformers>=\([0-9.]*\).*/\1/p' pyproject.toml | head -1)}"
    "$py" -m pip install -q --disable-pip-version-check "${OLDEST_TORCH_SPEC:-torch==$(sed -n 's/.*"torch>=\([0-9.]*\).*/\1/p' pyproject.toml | head -1)}"
    tests="tests/test_hf_cache.py tests/test_models.py tests/test_infer.py tests/test_hooks_families.py tests/test_usercode.py" ;;
*) echo "usage: scripts/test_versions.sh latest|oldest" >&2; exit 2 ;;
esac
"$uv" pip install --python "$py" --quiet --no-deps --no-build-isolation -e .
echo "versions under test ($mode):"
"$uv" pip freeze --python "$py" | grep -iE '^(torch|transformers|mypy|ruff|pandas|numpy|pydantic|typer|rich|matplotlib|msgspec|pyarrow|accelerate)=='
if [ "$mode" = latest ]; then  # type-checking against old torch/transformers stubs says nothing about users
    "$venv/bin/ruff" check src tests benchmarks
    "$venv/bin/lint-imports"
    "$venv/bin/mypy" src/lmprof
fi
# shellcheck disable=SC2086
"$py" -m pytest -n 2 -m "not stopwatch" $tests
# shellcheck disable=SC2086
"$py" -m pytest -p no:xdist -m stopwatch $tests

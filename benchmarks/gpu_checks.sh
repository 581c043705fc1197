#!/usr/bin/env bash
# On the GPU machine: the GPU test suite and the cache/build timings, logs under $OUT.
# Usage (repository root, lark/python-constraint2 wheels in .whl/): bash benchmarks/gpu_checks.sh [pytest args]
set -uo pipefail
OUT=${OUT:-/tmp/rnncc-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export MAX_JOBS=${MAX_JOBS:-16} RNNCC_CACHE_DIR=${RNNCC_CACHE_DIR:-/tmp/rnncc-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/machine.txt"
python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider --maxfail=20 "$@" 2>&1 | tee "$OUT/gpu_tests.log"
rc=${PIPESTATUS[0]}
python3 benchmarks/cache_load.py --json "$OUT/cache_load.json" 2>&1 | tee "$OUT/cache_load.log"
exit $rc

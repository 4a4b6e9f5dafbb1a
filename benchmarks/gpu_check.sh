#!/usr/bin/env bash
# The CUDA checks for a lent GPU machine (see benchmarks/gpu_check.py): losslessness on CUDA, the
# static step captured as CUDA graphs (greedy equality with the eager step for draft-model, EAGLE-3 and
# Medusa chains and trees, syncs per step, host work
# per step, the default pair's step time eager vs captured at c 1/4/16),
# host syncs per step, the overhead benchmark and the EAGLE-3 training throughput on bf16 models
# of the default pair's shapes.
# The machine's own python3 holds torch with CUDA; transformers >= 5.24 (which the engine
# needs) travels as a wheel in .whl/ when the image has an older one:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl transformers==5.24.0
# then run this with `.whl` carried. About 5 minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec $PY benchmarks/gpu_check.py "$@"

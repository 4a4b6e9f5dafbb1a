#!/usr/bin/env bash
# The project's own perf-regression gate (about 30 s on a laptop CPU; see docs/ci.md).
#
# Builds the tiny seeded fixture models (target + draft, bit-identical every time), runs
# `specbench run` on them in float32 on the CPU with the committed greedy/fixed-seed prompt
# set, and compares the run against the baseline committed in benchmarks/perf_gate/baseline/:
#
#   specbench compare benchmarks/perf_gate/baseline CURRENT --gate deterministic
#
# A shared CPU is too noisy to gate on time, so only what repeats exactly is gated (acceptance
# rate, mean acceptance length, greedy outputs token for token, failed samples); TTFT, TPOT,
# E2E and tok/s are reported beside them. Exit codes are compare's: 0 pass, 1 regression,
# 2 not comparable (also when the fixture models are not the ones the baseline was made from).
#
#   benchmarks/perf_gate/run.sh                       # gate; extra args go to compare, e.g.
#   benchmarks/perf_gate/run.sh -o gate.xml -o gate.md
#   benchmarks/perf_gate/run.sh --update-baseline     # after an intended change: new baseline
#
# Environment: PYTHON (default .venv/bin/python), SPECBENCH (default "$PYTHON -m specbench"),
# PERF_GATE_DIR (scratch space, default runs/perf-gate: git-ignored; keep it relative and
# fixed, the model paths are recorded in the runs and compared).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-.venv/bin/python}
SPECBENCH=${SPECBENCH:-"$PY -m specbench"}
HERE=benchmarks/perf_gate
WORK=${PERF_GATE_DIR:-runs/perf-gate}
# Tiny matrices gain nothing from threads; one thread also fixes the summation order.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

update=0
compare_args=()
for arg in "$@"; do
  if [[ $arg == --update-baseline ]]; then update=1; else compare_args+=("$arg"); fi
done

start=$SECONDS
rm -rf "$WORK/models" "$WORK"/[0-9]*   # the fixture models and the previous gate runs
mkdir -p "$WORK"
if (( update )); then
  $PY "$HERE/make_models.py" "$WORK/models" --write-hashes "$HERE/models.sha256"
else
  $PY "$HERE/make_models.py" "$WORK/models" --verify "$HERE/models.sha256"
fi

run_dir="$WORK/$(date -u +%Y%m%d-%H%M%S)"
log="$run_dir.log"
if ! $SPECBENCH run --target "$WORK/models/target" --draft "$WORK/models/draft" \
    --method draft_model -k 2,4 --workload "$HERE/prompts.jsonl" \
    --dtype float32 --device cpu --warmup 1 --seed 0 --out "$run_dir" >"$log" 2>&1; then
  cat "$log" >&2
  echo "perf gate: specbench run failed (log above)" >&2
  exit 2
fi

if (( update )); then
  rm -rf "$HERE/baseline"
  mkdir -p "$HERE/baseline"
  cp "$run_dir/samples.parquet" "$run_dir/run.json" "$HERE/baseline/"
  chmod 644 "$HERE/baseline/"*
  echo "perf gate: new baseline in $HERE/baseline from $run_dir ($((SECONDS - start)) s); commit it with $HERE/models.sha256"
  exit 0
fi

status=0
$SPECBENCH compare "$HERE/baseline" "$run_dir" --gate deterministic ${compare_args[@]+"${compare_args[@]}"} || status=$?
echo "perf gate: exit $status in $((SECONDS - start)) s (run: $run_dir)"
exit $status

#!/usr/bin/env bash
# The concurrency cliff on the default pair (Qwen2.5-Coder 1.5B target, 0.5B draft, bf16 on a
# CPU with avx512_bf16): concurrency 1, 4, 16 x k in {0 (baseline), 2, 4}, all in one
# `specbench run`, so every ratio is measured side by side on the same prompts and seeds.
# The run prints, per concurrency, total tokens/s and each k's speedup over k=0, then one line
# per k saying where speculation stops paying. Extra arguments go to `specbench run`.
#
#   benchmarks/concurrency_cliff.sh                     # 16 HumanEval prompts x 32 tokens
#   benchmarks/concurrency_cliff.sh --workload real     # the mixed real set instead
set -euo pipefail
cd "$(dirname "$0")/.."
SPECBENCH=${SPECBENCH:-.venv/bin/specbench}
exec $SPECBENCH run --method draft_model -k 2,4 --concurrency 1,4,16 \
    --workload humaneval --num-prompts 16 --max-new-tokens 32 --warmup 1 \
    --out "runs/cliff-$(date -u +%Y%m%d-%H%M%S)" "$@"

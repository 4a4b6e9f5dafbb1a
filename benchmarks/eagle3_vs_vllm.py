"""Compare one EAGLE-3 head's acceptance through vLLM and through the embedded engine, from two
`specbench run` directories over the same prompts (greedy, --ignore-eos): the embedded run and
an `--backend openai` run against a vLLM server started with `--speculative-config
'{"method": "eagle3", ...}' --per-request-spec-decode-metrics detailed`
(benchmarks/eagle3_vs_vllm.sh does both).

Under greedy decoding, two engines with the same target and head draft the same tokens at a
step whose context is the same, so wherever the two outputs agree token for token each
verification step accepts the same number of drafts. Compared per request, step by step, up
to the first output divergence and before the last steps (vLLM always drafts k and counts
drafts past max_tokens, the embedded engine caps its last drafts at the remaining budget);
per-position acceptance (steps whose i-th draft was accepted / steps) is printed side by side
over all steps.

    python benchmarks/eagle3_vs_vllm.py ENGINE_RUN VLLM_RUN [--k K] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def _rows(run: Path) -> pd.DataFrame:
    path = run / "samples.parquet"
    if not path.is_file():
        raise SystemExit(f"eagle3_vs_vllm: {run} has no samples.parquet (not a specbench run directory)")
    df = pd.read_parquet(path)
    df = df[df["method"] == "eagle3"]
    if df.empty:
        raise SystemExit(f"eagle3_vs_vllm: {run} has no eagle3 rows (run it with --method eagle3)")
    if df["error"].notna().any():
        raise SystemExit(f"eagle3_vs_vllm: {run} has failed requests: {df['error'].dropna().tolist()[:3]}")
    return df.drop_duplicates("prompt_id", keep="last").set_index("prompt_id")


def per_position(steps: list[list[int]], k: int) -> list[float]:
    """acceptance[i] = steps whose i-th draft was accepted / steps."""
    flat = [a for s in steps for a in s]
    return [sum(a > i for a in flat) / len(flat) if flat else float("nan") for i in range(k)]


def compare(engine_run: Path, vllm_run: Path, k: int) -> dict:
    eng, vll = _rows(engine_run), _rows(vllm_run)
    common = sorted(set(eng.index) & set(vll.index))
    if not common:
        raise SystemExit("eagle3_vs_vllm: the two runs share no prompt ids")
    requests, compared, mismatched = [], 0, 0
    for pid in common:
        out_e, out_v = ([int(t) for t in df.loc[pid, "output_token_ids"]] for df in (eng, vll))
        acc_e, acc_v = ([int(a) for a in df.loc[pid, "accepted_per_step"]] for df in (eng, vll))
        agree = next((i for i, (a, b) in enumerate(zip(out_e, out_v)) if a != b), min(len(out_e), len(out_v)))
        # steps both engines took entirely inside the agreeing prefix, before the budget's end
        # (where the embedded engine drafts fewer than k); each emits accepted + 1 tokens
        pos, same, first_diff = 1, 0, None  # the prefill emits the first token
        for i, (a, b) in enumerate(zip(acc_e, acc_v)):
            if pos + k + 1 > min(agree, len(out_e)):
                break
            if a != b and first_diff is None:
                first_diff = i
            if first_diff is None:
                same += 1
            pos += a + 1
        compared += same if first_diff is None else first_diff + 1
        mismatched += first_diff is not None
        requests.append({"prompt_id": pid, "outputs_agree_to": agree, "output_tokens": len(out_e),
                         "steps_compared": same if first_diff is None else first_diff + 1,
                         "first_step_difference": first_diff, "engine_accepted": acc_e, "vllm_accepted": acc_v})
    steps_e = [r["engine_accepted"] for r in requests]
    steps_v = [r["vllm_accepted"] for r in requests]
    return {"k": k, "requests": requests, "steps_compared": compared, "requests_with_a_step_difference": mismatched,
            "identical_outputs": sum(r["outputs_agree_to"] == r["output_tokens"] for r in requests),
            "per_position_engine": per_position(steps_e, k), "per_position_vllm": per_position(steps_v, k),
            "acceptance_rate_engine": _rate(steps_e, k), "acceptance_rate_vllm": _rate(steps_v, k)}


def _rate(steps: list[list[int]], k: int) -> float:
    n = sum(len(s) for s in steps)
    return sum(map(sum, steps)) / (k * n) if n else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine_run", type=Path)
    ap.add_argument("vllm_run", type=Path)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens of both runs")
    ap.add_argument("--json", type=Path, default=None, help="write the comparison here")
    args = ap.parse_args(argv)
    if args.k < 1:
        raise SystemExit(f"eagle3_vs_vllm: --k must be a positive integer, got {args.k}")
    res = compare(args.engine_run, args.vllm_run, args.k)
    print(f"{'position':>8} {'engine':>8} {'vLLM':>8}")
    for i, (a, b) in enumerate(zip(res["per_position_engine"], res["per_position_vllm"])):
        print(f"{i:>8} {a:>8.3f} {b:>8.3f}")
    print(f"acceptance rate: engine {res['acceptance_rate_engine']:.3f}, vLLM {res['acceptance_rate_vllm']:.3f}")
    print(f"outputs identical for {res['identical_outputs']}/{len(res['requests'])} requests; "
          f"{res['steps_compared']} steps compared inside agreeing outputs, "
          f"{res['requests_with_a_step_difference']} request(s) with a step that accepted differently")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 1 if res["requests_with_a_step_difference"] else 0


if __name__ == "__main__":
    sys.exit(main())

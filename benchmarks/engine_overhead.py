"""Engine overhead: how close one engine step is to the bare forward passes it is made of.

For each concurrency c and k, the engine decodes 2c HumanEval prompts (greedy, ignore EOS,
fixed length) and we take its mean step time over the steps where all c rows were in the
batch. Beside it, in the same process and on the same (prepacked) models, the bare passes of
the same shapes are timed with transformers' own forward and cache at the same context
length: one target pass over c rows x (k+1) tokens plus k draft passes over c rows x 1 token.
Printed: both times, their ratio, and the engine step split into draft / verify / the rest
(scheduling, emission, bookkeeping). Bare passes are timed before and after each engine run
and averaged, so drift between them shows as the spread of the two.

    python benchmarks/engine_overhead.py                       # c 1,4,16 x k 0,2,4
    python benchmarks/engine_overhead.py --concurrency 1,4 -k 0,4 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.loading import check_same_tokenizer, load_model
from specbench.workload import build_requests, load_workload
from specbench.engine import scheduler


def bare_pass(model, rows: int, context: int, width: int, reps: int) -> float:
    """Median seconds of one forward over rows x width new tokens after `context` cached ones."""
    vocab = min(1000, model.get_input_embeddings().num_embeddings)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.randint(0, vocab, (rows, context)), cache=cache,
              logits_to_keep=torch.tensor([context - 1]))
        times = []
        for _ in range(reps + 1):
            ids = torch.randint(0, vocab, (rows, width))
            t = time.perf_counter()
            model(input_ids=ids, cache=cache)
            times.append(time.perf_counter() - t)
            cache.crop(-width)
        return statistics.median(times[1:])


def bare_step(target, draft, c: int, k: int, t_ctx: int, d_ctx: int, reps: int) -> float:
    total = bare_pass(target, c, t_ctx, k + 1, reps)
    if k:
        total += k * bare_pass(draft, c, d_ctx, 1, reps)
    return total


def measure_point(engine: Engine, pairs: list, c: int, k: int, reps: int) -> dict | None:
    """Engine step vs bare passes at concurrency c and k (draft model; k = 0: baseline)."""
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft="d") if k else SpeculativeConfig()
    reqs = pairs[: 2 * c]
    scheduler.run(engine, reqs[:c], spec, concurrency=c)  # warm this point's shapes
    results, stats = scheduler.run(engine, reqs, spec, concurrency=c)
    full = stats.by_batch_size.get(c)
    if not full:
        return None
    n, step_s, draft_s, verify_s = full.steps, full.step_s, full.draft_s, full.verify_s
    t_ctx = int(statistics.mean(s.context_tokens for r in results for s in r.steps if s.batch_size == c))
    before = bare_step(engine.target, engine.draft, c, k, t_ctx, t_ctx, reps)
    again = scheduler.run(engine, reqs, spec, concurrency=c)[1].by_batch_size[c]
    after = bare_step(engine.target, engine.draft, c, k, t_ctx, t_ctx, reps)
    n, step_s = n + again.steps, step_s + again.step_s
    draft_s, verify_s = draft_s + again.draft_s, verify_s + again.verify_s
    return {"c": c, "k": k, "steps": n, "context": t_ctx, "step_s": step_s / n, "draft_s": draft_s / n,
            "verify_s": verify_s / n, "bare_s": (before + after) / 2,
            "bare_spread": abs(before - after) / ((before + after) / 2)}


def overhead_table(max_new_tokens: int) -> Table:
    table = Table(title=f"engine step vs bare passes ({max_new_tokens} tokens per request, greedy)")
    for col in ("c", "k", "full steps", "context", "engine step ms", "bare passes ms", "ratio",
                "draft ms", "verify ms", "rest ms", "bare spread"):
        table.add_column(col, justify="right")
    return table


def add_row(table: Table, p: dict) -> None:
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    table.add_row(str(p["c"]), str(p["k"]), str(p["steps"]), str(p["context"]), ms(p["step_s"]), ms(p["bare_s"]),
                  f"{p['step_s'] / p['bare_s']:.3f}", ms(p["draft_s"]), ms(p["verify_s"]),
                  ms(p["step_s"] - p["draft_s"] - p["verify_s"]), f"{p['bare_spread']:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("-k", default="0,2,4")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--onednn", default="auto", choices=["off", "auto"], help="the eager step's CPU kernels")
    ap.add_argument("--reps", type=int, default=3, help="bare passes per measurement (median)")
    args = ap.parse_args()
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    ks = [int(x) for x in args.k.split(",")]

    console = Console(width=150)
    cfg = EngineConfig(device=args.device, dtype=args.dtype)
    target, draft = load_model(args.target, cfg), load_model(args.draft, cfg)
    check_same_tokenizer(target, draft)
    engine = Engine(target.model, draft.model, eos_token_ids=target.eos_token_ids,
                    max_context=target.max_context, pack=args.onednn == "auto")
    console.print(f"{target.name} + {draft.name} on {target.device} ({str(target.dtype).replace('torch.', '')}, "
                  f"{torch.get_num_threads()} threads, linears prepacked: {engine.packed})")
    wl = load_workload(args.workload, num_prompts=2 * max(concurrencies), seed=0)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    requests, _ = build_requests(wl, target.tokenizer, sp, max_context=target.max_context,
                                 overrides={"max_new_tokens": args.max_new_tokens, "temperature": 0.0})
    pairs = [(list(r.prompt_ids), r.sampling) for r in requests]

    table = overhead_table(args.max_new_tokens)
    scheduler.run(engine, pairs[:2], SpeculativeConfig(method="draft_model", num_speculative_tokens=max(ks), draft="d"))
    for c in concurrencies:
        for k in ks:
            point = measure_point(engine, pairs, c, k, args.reps)
            if point is None:
                console.print(f"c={c} k={k}: the batch never held {c} rows; skipped")
                continue
            add_row(table, point)
            console.print(f"c={c} k={k}: engine {point['step_s'] * 1e3:.1f} ms vs bare {point['bare_s'] * 1e3:.1f} ms "
                          f"({point['step_s'] / point['bare_s']:.3f}x)")
    console.print(table)
    console.print("ratio = engine step / (target pass over c x (k+1) tokens + k draft passes over c x 1), "
                  "both on the same prepacked models; goal <= 1.10")


if __name__ == "__main__":
    main()

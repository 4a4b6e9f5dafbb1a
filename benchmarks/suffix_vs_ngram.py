"""Suffix decoding against n-gram lookup (and the baseline) on a repetitive workload, interleaved.

The workload asks every prompt of a set again in each of --rounds rounds (an agent or a user
repeating requests; later answers repeat earlier ones). Request i of the sequence runs under
every configuration before request i + 1 starts, the order of the configurations rotating
(ABC, BCA, CAB, ...), so a drifting machine hits all alike; suffix decoding's global tree
lives on in its engine across the requests, as in a server. Printed per request index: the
acceptance rate of suffix and ngram, and each one's TPOT relative to the baseline measured
beside it; then per round the means. Greedy outputs are checked against the baseline's.

    python benchmarks/suffix_vs_ngram.py --workload workloads/regression.jsonl --rounds 3 -k 4
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.loading import load_model
from specbench.workload import build_requests, load_workload
from specbench.engine import scheduler

print = functools.partial(print, flush=True)  # noqa: A001 - rows show as they are measured, also into a file


def tpot(g) -> float:
    n = len(g.output_ids)
    return (g.token_times[-1] - g.token_times[0]) / (n - 1) if n > 1 else float("nan")


def rate(g) -> float:
    d = sum(s.drafted for s in g.steps)
    return sum(s.accepted for s in g.steps) / d if d else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--workload", default="workloads/regression.jsonl")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", type=Path, default=None, help="write the per-request figures here")
    args = ap.parse_args()

    tgt = load_model(args.target, EngineConfig(dtype=args.dtype))
    wl = load_workload(args.workload, num_prompts=args.num_prompts, seed=0)
    base = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    reqs, _ = build_requests(wl, tgt.tokenizer, base, max_context=tgt.max_context, truncate=True,
                             overrides={"temperature": 0.0, "max_new_tokens": args.max_new_tokens})
    engine = Engine(tgt.model, eos_token_ids=tgt.eos_token_ids, max_context=tgt.max_context)
    specs = {"baseline": SpeculativeConfig(),
             "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=args.k),
             "suffix": SpeculativeConfig(method="suffix", num_speculative_tokens=args.k)}
    names = list(specs)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    warm = reqs[0].prompt_ids[-16:]
    for name in ("baseline", "ngram"):  # warm shapes (not suffix: its tree would see the warm-up)
        scheduler.run(engine, [(warm, sp.with_(max_new_tokens=8))], specs[name])
    sequence = [r for _ in range(args.rounds) for r in reqs]
    rows = []
    print(f"target {tgt.name} ({str(tgt.dtype).replace('torch.', '')}), {torch.get_num_threads()} threads; "
          f"{len(reqs)} prompts x {args.rounds} rounds, {args.max_new_tokens} tokens, k={args.k}")
    print(f"{'i':>3} {'round':>5}  {'acc ngram':>9} {'acc suffix':>10}  {'ngram/base':>10} {'suffix/base':>11}  match")
    t0 = time.perf_counter()
    for i, r in enumerate(sequence):
        order = names[i % 3:] + names[: i % 3]
        got = {}
        for name in order:
            [g], _ = scheduler.run(engine, [(r.prompt_ids, sp)], specs[name])
            got[name] = g
        match = all(got[n].output_ids == got["baseline"].output_ids for n in names)
        row = {"index": i, "round": i // len(reqs), "prompt": r.id, "order": order, "match": match,
               **{f"acc_{n}": rate(got[n]) for n in ("ngram", "suffix")},
               **{f"tpot_{n}_s": tpot(got[n]) for n in names}}
        rows.append(row)
        print(f"{i:>3} {row['round']:>5}  {row['acc_ngram']:>9.2f} {row['acc_suffix']:>10.2f}  "
              f"{row['tpot_ngram_s'] / row['tpot_baseline_s']:>10.2f} {row['tpot_suffix_s'] / row['tpot_baseline_s']:>11.2f}"
              f"  {'yes' if match else 'NO'}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    print("per round: mean acceptance ngram / suffix, median TPOT ratio to baseline ngram / suffix")
    for rd in range(args.rounds):
        part = [x for x in rows if x["round"] == rd]
        acc = [statistics.mean(x[f"acc_{n}"] for x in part if x[f"acc_{n}"] == x[f"acc_{n}"]) for n in ("ngram", "suffix")]
        ratio = [statistics.median(x[f"tpot_{n}_s"] / x["tpot_baseline_s"] for x in part) for n in ("ngram", "suffix")]
        print(f"  round {rd}: acceptance {acc[0]:.3f} / {acc[1]:.3f}; TPOT ratio {ratio[0]:.3f} / {ratio[1]:.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

"""Greedy outputs of the engine's fast forward path against transformers' own generate().

The same model is loaded twice: once left as loaded, decoded by transformers' `generate()`
(its own layers, cache, attention and masks: nothing of the engine's), and once converted for
the engine's fast path (`--onednn auto`: prepacked linears, fused decoder layers where the
architecture is fused, the slot cache and its attention). Both decode the same prompts
greedily (baseline, no speculation, no logits processors). Printed per
prompt: the token match rate and, at the first divergence, the logit gap between the token
each path chose as the unconverted model scores them in one full forward over the prefix
(a near-tie flipped by a different summation or rounding order shows as a gap near zero,
either sign: negative when that full forward itself prefers the fast path's token; a wrong
kernel as a large positive one). Summary: the mean match rate and how many outputs are identical.

    python benchmarks/fast_path_match.py --dtype float32            # the issue's >= 0.99 check
    python benchmarks/fast_path_match.py --dtype bfloat16 --num-prompts 16
"""

from __future__ import annotations

import argparse
import statistics

import torch
from rich.console import Console
from rich.table import Table
from transformers import GenerationConfig

from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine.engine import Engine
from specbench.metrics import match_fields
from specbench.models.loading import load_model
from specbench.workload import build_requests, load_workload


def logit_gap(model, prompt: list[int], output: list[int], at: int, other: int) -> float:
    """Under `model`: logit of output[at] minus logit of `other` after prompt + output[:at]."""
    ids = torch.tensor([prompt + output[:at]])
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    return float(logits[output[at]] - logits[other])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--workload", default="real")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    console = Console(width=140)
    cfg = EngineConfig(device="cpu", dtype=args.dtype)
    plain, fast = load_model(args.model, cfg), load_model(args.model, cfg)
    engine = Engine(fast.model, pack=None)
    console.print(f"{args.model} ({args.dtype}): reference transformers' generate() on the model as loaded; "
                  f"engine: {engine.forward_path}")
    # generate() fills whatever its config leaves unset from the model's own generation config
    # (a checkpoint's repetition penalty, its end-of-sequence ids): blank that first, so the
    # reference is plain greedy decoding for exactly --max-new-tokens, as the engine runs here.
    plain.model.generation_config = GenerationConfig()
    greedy = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=0)
    wl = load_workload(args.workload, num_prompts=args.num_prompts, seed=0)
    requests, _ = build_requests(wl, plain.tokenizer, SamplingParams(max_new_tokens=args.max_new_tokens),
                                 max_context=plain.max_context,
                                 overrides={"max_new_tokens": args.max_new_tokens, "temperature": 0.0,
                                            "ignore_eos": True})
    table = Table(title=f"greedy, {args.max_new_tokens} tokens, the engine's fast path vs transformers' generate()")
    for col in ("prompt", "input tokens", "match rate", "first divergence", "logit gap there"):
        table.add_column(col, justify="right")
    rates = []
    for r in requests:
        prompt = list(r.prompt_ids)
        with torch.inference_mode():
            want = plain.model.generate(torch.tensor([prompt]), generation_config=greedy)[0, len(prompt):].tolist()
        got = engine.generate(prompt, r.sampling, SpeculativeConfig()).output_ids
        rate, first = match_fields(got, want)
        rates.append(rate)
        gap = "-"
        if 0 <= first < min(len(got), len(want)):
            gap = f"{logit_gap(plain.model, prompt, want, first, got[first]):.4f}"
        table.add_row(r.id, str(len(prompt)), f"{rate:.3f}", str(first), gap)
    console.print(table)
    console.print(f"mean match rate {statistics.mean(rates):.4f}; identical outputs "
                  f"{sum(x == 1.0 for x in rates)}/{len(rates)} ({args.dtype}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()

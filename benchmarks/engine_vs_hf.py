"""Engine benchmark: specbench's embedded engine against transformers' generate() on the same
models and prompts, in one process, variants interleaved prompt by prompt so machine drift
hits every variant alike.

Variants (batch 1, greedy):
  bare      a bare forward-pass loop (DynamicCache + argmax) on the engine's (prepacked)
            weights: the floor for our baseline
  ours      embedded engine, method none
  hf        transformers generate(), plain
  ours-dm   embedded engine, draft model (k, confidence threshold as given)
  hf-dm     transformers assisted generation (assistant_model=, its defaults unless --hf-k)
  ours-ng   embedded engine, n-gram prompt lookup
  hf-ng     transformers prompt lookup (prompt_lookup_num_tokens=)

transformers runs on its own copy of the models, as loaded (the way its users run it); the
engine converts its copy for its fast path (prepacked linears on CPU). `--hf-packed` gives
transformers prepacked weights too, which separates the engine's gain from the kernels'.

Prints tokens/s per variant, the ratios the engine goals are stated in, mean tokens per
target forward pass, and each variant's token match rate / first divergence against hf plain.

    python benchmarks/engine_vs_hf.py                      # 8 HumanEval prompts x 128 tokens
    python benchmarks/engine_vs_hf.py --num-prompts 2 --max-new-tokens 32   # quick look
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from specbench.backends.embedded import EmbeddedBackend
from specbench.backends.hf import HFBackend
from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine.model import pack_linears
from specbench.metrics import match_fields
from specbench.models.loading import check_same_tokenizer, load_model
from specbench.workload import build_requests, load_workload


def bare_loop(model, prompt_ids, n_tokens: int) -> float:
    """Seconds for a prefill plus n_tokens-1 single-token forward steps, argmax, no extras."""
    with torch.inference_mode():
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([prompt_ids], device=model.device)
        # Last position by index (see specbench/engine/kv.py: the default slice is slow on CPU bf16).
        last = torch.tensor([len(prompt_ids) - 1], device=model.device)
        logits = model(input_ids=ids, cache=cache, logits_to_keep=last).logits
        tok = logits[0, -1].argmax()
        for _ in range(n_tokens - 1):
            logits = model(input_ids=tok.view(1, 1), cache=cache).logits
            tok = logits[0, -1].argmax()
        int(tok)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--k", type=int, default=16, help="our draft-model k (drafting stops early below --threshold)")
    ap.add_argument("--threshold", type=float, default=0.4, help="our draft confidence threshold")
    ap.add_argument("--ngram-k", type=int, default=10, help="k for both n-gram variants")
    ap.add_argument("--hf-k", type=int, default=None,
                    help="transformers' num_assistant_tokens (default: its own default, 20, confidence 0.4)")
    ap.add_argument("--variants", default="bare,ours,hf,ours-dm,hf-dm,ours-ng,hf-ng")
    ap.add_argument("--hf-packed", action="store_true", help="prepack transformers' copy as well")
    args = ap.parse_args()

    console = Console()
    cfg = EngineConfig(device=args.device, dtype=args.dtype)
    t0 = time.perf_counter()
    target, draft = load_model(args.target, cfg), load_model(args.draft, cfg)
    check_same_tokenizer(target, draft)
    hf_target, hf_draft = load_model(args.target, cfg), load_model(args.draft, cfg)  # transformers' own copy
    if args.hf_packed:
        pack_linears(hf_target.model)
        pack_linears(hf_draft.model)
    console.print(f"loaded {target.name} + {draft.name} twice in {time.perf_counter() - t0:.1f} s "
                  f"({target.device}, {str(target.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads)")

    wl = load_workload(args.workload, num_prompts=args.num_prompts, seed=0)
    requests, _ = build_requests(wl, target.tokenizer, SamplingParams(max_new_tokens=args.max_new_tokens),
                                 max_context=target.max_context,
                                 overrides={"max_new_tokens": args.max_new_tokens, "temperature": 0.0})
    ours, hf = EmbeddedBackend(target, draft), HFBackend(hf_target, hf_draft)
    console.print(f"engine: linears prepacked {ours.engine.packed}; transformers: "
                  f"{'prepacked' if args.hf_packed else 'as loaded'}")
    none = SpeculativeConfig()
    dm = SpeculativeConfig(method="draft_model", num_speculative_tokens=args.k, draft=args.draft,
                           draft_confidence_threshold=args.threshold)
    ng = SpeculativeConfig(method="ngram", num_speculative_tokens=args.ngram_k)
    hf_dm_k = args.hf_k or 20
    hf_dm = SpeculativeConfig(method="draft_model", num_speculative_tokens=hf_dm_k, draft=args.draft,
                              draft_confidence_threshold=0.4 if args.hf_k is None else args.threshold)
    runs = {"ours": (ours, none), "hf": (hf, none), "ours-dm": (ours, dm), "hf-dm": (hf, hf_dm),
            "ours-ng": (ours, ng), "hf-ng": (hf, ng)}
    variants = [v.strip() for v in args.variants.split(",")]

    # Warm-up: one short request per variant (allocator, kernels, lazy inits).
    warm = requests[0]
    short = type(warm)(**{**warm.__dict__, "sampling": warm.sampling.with_(max_new_tokens=8)})
    for v in variants:
        if v == "bare":
            bare_loop(target.model, list(warm.prompt_ids), 8)
        else:
            be, spec = runs[v]
            be.generate(short, spec, arrival_time=time.perf_counter())

    secs = {v: 0.0 for v in variants}
    toks = {v: 0 for v in variants}
    passes = {v: 0 for v in variants}
    outputs: dict[str, dict[str, list[int]]] = {v: {} for v in variants}
    for i, req in enumerate(requests):
        # Alternate the order prompt by prompt, so no variant always runs first or last.
        order = variants if i % 2 == 0 else variants[::-1]
        for v in order:
            if v == "bare":
                # The floor for our baseline: as many plain steps as the baseline emits.
                n = req.sampling.max_new_tokens if "ours" not in outputs or req.id not in outputs["ours"] \
                    else len(outputs["ours"][req.id])
                secs["bare"] += bare_loop(target.model, list(req.prompt_ids), n)
                toks["bare"] += n
                passes["bare"] += n
                continue
            be, spec = runs[v]
            t = time.perf_counter()
            res = be.generate(req, spec, arrival_time=t)
            secs[v] += res.token_times[-1] - t
            toks[v] += len(res.output_ids)
            passes[v] += res.target_forward_passes
            outputs[v][req.id] = res.output_ids
        console.print(f"prompt {i + 1}/{len(requests)} ({len(req.prompt_ids)} tokens): " + ", ".join(
            f"{v} {toks[v] / secs[v]:.2f}" for v in variants if secs[v]) + " tok/s (running)")

    tps = {v: toks[v] / secs[v] for v in variants if secs[v]}
    table = Table(title=f"{len(requests)} {args.workload} prompts x {args.max_new_tokens} new tokens, greedy, batch 1")
    for col in ("variant", "tok/s", "tokens", "tokens / target pass", "match vs hf", "first divergence"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    for v in variants:
        if v not in tps:
            continue
        rates, firsts = [], []
        if v != "bare" and "hf" in outputs:
            for rid, out in outputs[v].items():
                rate, first = match_fields(out, outputs["hf"][rid])
                rates.append(rate)
                firsts.append(first)
        match = f"{sum(rates) / len(rates):.3f}" if rates else "-"
        div = ",".join(str(f) for f in firsts if f >= 0) or ("none" if rates else "-")
        table.add_row(v, f"{tps[v]:.2f}", str(toks[v]), f"{toks[v] / passes[v]:.2f}", match, div)
    console.print(table)

    def ratio(a: str, b: str, goal: str) -> None:
        if a in tps and b in tps:
            console.print(f"{a} / {b}: {tps[a] / tps[b]:.3f}x   ({goal})")

    ratio("ours", "bare", "goal: >= 0.95")
    ratio("ours", "hf", "plain loops")
    ratio("ours-dm", "hf-dm", "goal: >= 1.25")
    ratio("ours-ng", "hf-ng", "goal: >= 1.25")
    ratio("ours-dm", "ours", "draft-model speedup over our baseline")
    ratio("ours-ng", "ours", "n-gram speedup over our baseline")
    ratio("hf-dm", "hf", "transformers' assisted speedup")
    ratio("hf-ng", "hf", "transformers' prompt-lookup speedup")


if __name__ == "__main__":
    main()

"""Tokens per target pass of draft trees against the best chain at the same verify width.

For each (topk, num_draft_tokens) tree and each chain k (verify width k + 1), the engine
decodes the same greedy requests (ignore EOS, fixed length) at concurrency 1 and 4, once
each: every figure printed is a count, not a time, so no order of the configurations can
favour one of them. Printed per concurrency:
tokens per target pass (output tokens / target passes, prefill included, as the records'
`tokens_per_target_pass`), mean acceptance length (1 + accepted / drafting steps) and the
tree's gain over the best chain whose verify width is at most the tree's. A pass's
width is what the concurrency cliff charges: at batch 1 a few extra verified tokens are
nearly free (memory-bound), at higher batch they cost compute (docs/engine.md).

    python benchmarks/tree_grid.py                          # the default pair, HumanEval prompts
    python benchmarks/tree_grid.py --tiny                   # random tiny pair (no download)
    python benchmarks/tree_grid.py --target T --draft D --max-new-tokens 32 --prompts 8
    python benchmarks/tree_grid.py --workload real --depth 15 --trees 2:8,4:8,4:16 --chains 3,7,15

--depth is every tree's depth (num_steps): with it at the deepest chain's k, a tree of n nodes
may grow as deep as the chain of the same width, so the two compare at equal reach; with a
smaller depth a confident drafter's chain outreaches the tree.

`--tiny` builds a random 4-layer Qwen2 target and a draft that is the target with noise
added to its weights (acceptance then measures how often the top choices of two nearby
random models agree: a synthetic drafter, not a real pair's figure).
"""

from __future__ import annotations

import argparse
import random

import torch
from rich.console import Console
from rich.table import Table

from specbench.config import DEFAULT_DRAFT, DEFAULT_TARGET, EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine import scheduler


def tiny_pair(noise: float, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.3)
    target = Qwen2ForCausalLM(cfg).eval()
    draft = Qwen2ForCausalLM(cfg).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    rng = random.Random(seed)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(16, 48))] for _ in range(16)]
    return target, draft, prompts


def real_pair(target: str, draft: str, n: int, workload: str = "humaneval"):
    from specbench.models.loading import check_same_tokenizer, load_model
    from specbench.workload import build_requests, load_workload

    cfg = EngineConfig(device="cpu", dtype="auto")
    t, d = load_model(target, cfg), load_model(draft, cfg)
    check_same_tokenizer(t, d)
    reqs, _ = build_requests(load_workload(workload, num_prompts=n), t.tokenizer, SamplingParams())
    return t.model, d.model, [list(r.prompt_ids) for r in reqs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--tiny", action="store_true", help="random tiny pair instead of --target/--draft")
    ap.add_argument("--noise", type=float, default=0.6, help="--tiny: the draft's weight noise")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--workload", default="humaneval", help="prompt set of the real pair (a seeded sample)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--depth", type=int, default=5, help="tree depth (num_steps)")
    ap.add_argument("--trees", default="2:4,2:8,4:8,4:16,8:16", help="topk:num_draft_tokens,...")
    ap.add_argument("--chains", default="1,3,5,7,15", help="chain k values (verify widths k + 1)")
    args = ap.parse_args()
    if args.tiny:
        target, draft, prompts = tiny_pair(args.noise)
        prompts = prompts[: args.prompts]
        label = f"tiny random Qwen2 pair (draft noise {args.noise}), float32"
    else:
        target, draft, prompts = real_pair(args.target, args.draft, args.prompts, args.workload)
        label = f"{args.target} + {args.draft}, {next(target.parameters()).dtype}, {args.workload!r} prompts"
    engine = Engine(target, draft)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    specs = [SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=k)
             for k in map(int, args.chains.split(","))]
    for t in args.trees.split(","):
        topk, n = map(int, t.split(":"))
        specs.append(SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=args.depth,
                                       topk=topk, num_draft_tokens=n))
    console = Console(width=120)
    console.print(f"[bold]{label}[/]; {len(prompts)} prompts x {args.max_new_tokens} tokens, greedy; "
                  f"CPU threads {torch.get_num_threads()}")
    for c in map(int, args.concurrency.split(",")):
        totals = {s.short: [0, 0, 0, 0] for s in specs}  # output tokens, passes, accepted, drafting steps
        for spec in specs:
            results, _ = scheduler.run(engine, [(p, sp) for p in prompts], spec, concurrency=c)
            acc = totals[spec.short]
            for g in results:
                acc[0] += len(g.output_ids)
                acc[1] += g.target_forward_passes
                acc[2] += sum(s.accepted for s in g.steps)
                acc[3] += sum(1 for s in g.steps if s.drafted)
        table = Table(title=f"concurrency {c}")
        for col in ("configuration", "verify width", "tokens / target pass", "mean acceptance length",
                    "vs best chain <= width"):
            table.add_column(col, justify="right")
        tpp = {s.short: totals[s.short][0] / totals[s.short][1] for s in specs}
        for s in specs:
            out, passes, accepted, steps = totals[s.short]
            chains = [tpp[x.short] for x in specs if not x.is_tree and x.verify_width <= s.verify_width]
            gain = f"{tpp[s.short] / max(chains):.2f}x" if s.is_tree and chains else ""
            table.add_row(s.short, str(s.verify_width), f"{tpp[s.short]:.2f}",
                          f"{1 + accepted / max(steps, 1):.2f}", gain)
        console.print(table)


if __name__ == "__main__":
    main()

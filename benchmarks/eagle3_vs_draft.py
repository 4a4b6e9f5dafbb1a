"""An EAGLE-3 head (or Medusa heads) against a draft model, side by side in one run: the
baseline, draft_model-kK and eagle3-kK (medusa-kK with --medusa; with --topk, each of the two
also as an EAGLE-2 tree of depth K) on the same prompts, one process, one backend holding the
target, the draft model and the head, one run directory (the records `specbench run` writes,
so `specbench report` and `specbench compare` read it as any run).

Prints the run's summary table (acceptance, TPOT, speedups vs the paired baseline), each
method's paired TPOT speedup with its 95% interval (whether it pays), and what
drafting costs per step for each method. The configurations run interleaved (ABBA blocks), as
`specbench run` runs them. With --pause-while PATH it waits to start while PATH exists.

    python benchmarks/eagle3_vs_draft.py                 # the catalog's head of the default target
    python benchmarks/eagle3_vs_draft.py --head /work/heads/qwen2.5-coder-1.5b-eagle3
    python benchmarks/eagle3_vs_draft.py --head DIR -k 3 --num-prompts 6 --max-new-tokens 64 --out runs/e3-vs-dm
    python benchmarks/eagle3_vs_draft.py --medusa /work/heads/qwen2.5-coder-1.5b-medusa -k 3
    ... --medusa DIR -k 3 --medusa-tree DIR/sparse_tree.json   # and the heads' sparse tree
    ... --head DIR -k 3 --topk 4 --num-draft-tokens 8          # and both drafters as trees
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from specbench import analysis
from specbench.backends.embedded import EmbeddedBackend
from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig, default_draft
from specbench.errors import ConfigError
from specbench.models.eagle3 import describe, load_head
from specbench.models.loading import check_same_tokenizer, load_model
from specbench.records import RunMetadata, RunWriter, default_run_dir, make_run_id, read_run
from specbench.runner import plan, run_plan
from specbench.workload import build_requests, load_workload

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    heads = ap.add_mutually_exclusive_group()
    heads.add_argument("--head", help="EAGLE-3 head directory or catalog head (default: the catalog's head of the "
                                      "default target, with that target)")
    heads.add_argument("--medusa", help="Medusa heads directory (vLLM or FasterDecoding layout)")
    ap.add_argument("--medusa-tree", type=Path, default=None, metavar="JSON",
                    help="with --medusa, also a static tree: train_medusa.py's sparse_tree.json (or a JSON "
                         "list of paths), its own configuration beside the chain")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    ap.add_argument("--topk", type=int, default=1,
                    help="also run draft_model and eagle3 as EAGLE-2 trees of depth k and this topk (SGLang's knobs)")
    ap.add_argument("--num-draft-tokens", type=int, default=None,
                    help="the trees' tokens verified per step, root included (default 1 + k * topk)")
    ap.add_argument("--workload", default="real")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1", help="comma list, e.g. 1,4")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--pause-while", type=Path, default=None, metavar="PATH",
                    help="wait to start while PATH exists; off by default")
    args = ap.parse_args()

    console = Console(stderr=True)
    cfg = EngineConfig(device=args.device, dtype=args.dtype)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    k = args.num_speculative_tokens
    method, head_dir = ("medusa", args.medusa) if args.medusa else ("eagle3", args.head)
    if head_dir is None:
        head_dir = default_draft(args.target, "eagle3", None)
        if head_dir is None:
            sys.exit(f"--head: the catalog has no EAGLE-3 head for {args.target}; pass a head directory")
    specs = [SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft=args.draft),
             SpeculativeConfig(method=method, num_speculative_tokens=k, draft=head_dir)]
    if args.topk != 1 or args.num_draft_tokens is not None:
        # the same tree shape for both drafters, beside their chains: each method's best shape
        # on this machine, and the tree's gain for each, in one interleaved run
        if args.medusa:
            sys.exit("--topk/--num-draft-tokens: for Medusa give its static tree with --medusa-tree")
        try:
            specs += [replace(s, topk=args.topk, num_draft_tokens=args.num_draft_tokens) for s in specs]
        except ConfigError as exc:
            sys.exit(str(exc))
    if args.medusa_tree is not None:
        if not args.medusa:
            sys.exit("--medusa-tree needs --medusa")
        import json

        try:
            raw = json.loads(args.medusa_tree.read_text())
        except (OSError, ValueError) as exc:
            sys.exit(f"--medusa-tree {args.medusa_tree}: not readable JSON ({exc})")
        paths = raw.get("speculative_token_tree") if isinstance(raw, dict) else raw
        if not isinstance(paths, list) or not all(isinstance(p, list) for p in paths):
            sys.exit(f"--medusa-tree {args.medusa_tree}: expected a list of paths (or sparse_tree.json)")
        try:
            tree = tuple(tuple(p) for p in paths)
            specs.append(SpeculativeConfig(method="medusa", draft=head_dir, token_tree=tree)
                         .with_k(max(map(len, tree), default=0)))
        except ConfigError as exc:
            sys.exit(f"--medusa-tree {args.medusa_tree}: {exc}")
    configs = plan(specs, concurrencies)
    wl = load_workload(args.workload, num_prompts=args.num_prompts, seed=args.seed)
    run_id = make_run_id(f"{method}-vs-draft_model-k{k}")
    run_dir = args.out or default_run_dir(run_id)
    run_cfg = {"target": args.target, "draft": args.draft, "head": head_dir, "method": f"draft_model,{method}",
               "num_speculative_tokens": [k], "workload": wl.name, "workload_kind": wl.kind,
               "num_prompts": len(wl.prompts), "sampling": {"max_new_tokens": args.max_new_tokens},
               "seed": args.seed, "concurrency": concurrencies, "warmup": args.warmup, "device": args.device,
               "dtype": args.dtype, "backend": "embedded", "baseline": True,
               "configurations": [c.config_id for c in configs]}
    metadata = RunMetadata.collect(run_dir.name if args.out else run_id, run_cfg)
    writer = RunWriter(run_dir, metadata)

    t0 = time.perf_counter()
    tgt = load_model(args.target, cfg)
    drf = load_model(args.draft, cfg)
    check_same_tokenizer(tgt, drf)
    if method == "medusa":
        from specbench.models.medusa import describe as describe_medusa, load_heads

        head = load_heads(head_dir, tgt.model, target_name=tgt.name)
        metadata.config["medusa_heads"] = describe_medusa(head)
    else:
        head = load_head(head_dir, tgt.model, target_name=tgt.name)
        metadata.config["eagle3_head"] = describe(head)  # before the engine packs its linears
    be = EmbeddedBackend(tgt, drf, head=head)
    metadata.device = be.device_name
    metadata.config["dtype_resolved"] = str(tgt.dtype).replace("torch.", "")
    console.print(f"models ready in {time.perf_counter() - t0:.1f} s on {be.device_name} "
                  f"({metadata.config['dtype_resolved']}); head "
                  f"{metadata.config.get('eagle3_head') or metadata.config.get('medusa_heads')}")
    base = SamplingParams(seed=args.seed, max_new_tokens=args.max_new_tokens)
    requests, _ = build_requests(wl, tgt.tokenizer, base, max_context=tgt.max_context,
                                 overrides={"max_new_tokens": args.max_new_tokens})
    lock = args.pause_while  # someone is timing a benchmark on this machine: wait for it
    if lock is not None and lock.exists():
        console.print(f"[yellow]{lock} exists: waiting[/]")
        while lock.exists():
            time.sleep(20)
    # Interleaved (ABBA blocks over the configurations at each concurrency), so a drift of the
    # machine hits the baseline, the draft model and the head alike.
    stats = run_plan(be, requests, configs, run_id=metadata.run_id, writer=writer, warmup=args.warmup,
                     seed=args.seed)
    for cid, info in stats.items():
        console.print(f"{cid}: draft {info['draft_s']:.2f} s, verify {info['verify_s']:.2f} s "
                      f"over {info['steps']} steps")
    writer.close(complete=True)

    df, _ = read_run(run_dir)
    summary = analysis.summarize(df)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    out.print(analysis.rich_summary_table(summary, analysis.speedups(summary)))
    for line in analysis.where_speculation_pays(analysis.speedup_verdicts(df)):  # the paired 95% intervals
        out.print(line)
    stats = metadata.config.get("configuration_stats", {})
    for cid, info in stats.items():
        if info.get("steps"):
            out.print(f"{cid}: draft {1000 * info['draft_s'] / info['steps']:.1f} ms/step, "
                      f"verify {1000 * info['verify_s'] / info['steps']:.1f} ms/step")
    out.print(f"records: {run_dir}  (CPU threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()

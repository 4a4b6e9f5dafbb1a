"""Train Medusa-1 heads for a target from the prompts specbench ships (the target frozen).

Resumable phases under OUT/work/ (rerun the same command to continue where it stopped):

  responses  the target's own greedy answers to the training prompts (the embedded engine,
             batched), appended to responses.jsonl as they finish: Medusa-1 with
             self-distillation learns what the target itself says
  hidden     one target forward per prompt + answer: the last hidden state (after the final
             norm, what the heads read) at every position, kept in bfloat16 (hidden.pt)
  train      specbench.models.medusa_train: head i at position t learns the target's token at
             t + 2 + i (cross-entropy, weight 0.8^i) on the answers; the residual blocks train,
             the LM head is the target's own, shared by all heads and frozen, restricted to a
             draft vocabulary of the --draft-vocab most frequent answer tokens (vLLM's
             `original_lm_head` + `token_map`), which keeps a CPU step cheap; checkpoint.pt
             every --save-every steps, within --budget-min of training
  held out   per head, top-1 accuracy on the answers to the prompts a default
             `specbench run --num-prompts N --seed S` measures (never trained on), and the
             chain acceptance it implies at each draft position (all heads before it right)
  tree       Medusa's sparse tree for these heads (`specbench.models.medusa_tree`): from the
             held-out top-8 accuracy of each head, the --tree-nodes nodes of highest expected
             acceptance, written as a `speculative_token_tree` to OUT/sparse_tree.json

The heads are written to OUT in vLLM's layout (config.json + model.safetensors), with what
training cost and the held-out figures in OUT/work/training.json. The sparse tree runs as

    specbench run --speculative-config '{"method": "medusa", "model": "OUT",
        "speculative_token_tree": <OUT/sparse_tree.json's "speculative_token_tree">}'

    python benchmarks/train_medusa.py --out /work/heads/qwen2.5-coder-1.5b-medusa --budget-min 20
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specbench.atomic import atomic_write
from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.loading import load_model
from specbench.models.medusa import save_heads
from specbench.models.medusa_tree import expected_accepted, rank_hits, sparse_tree
from specbench.models.medusa_train import init_heads, last_hidden, medusa_loss, top_tokens
from specbench.workload import build_requests, load_workload
from specbench.engine import scheduler

console = Console(stderr=True)


def progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console)


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda fh: fh.write(json.dumps(obj, indent=2).encode()))


def responses(args, tgt, requests, path: Path) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["id"]] = rec["output_ids"]
    todo = [r for r in requests if r.id not in done]
    if not todo:
        return done
    engine = Engine(tgt.model, eos_token_ids=tgt.eos_token_ids, max_context=tgt.max_context, pack=False)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens)
    t0, tokens = time.perf_counter(), 0
    with progress() as bar, path.open("a") as fh:
        task = bar.add_task(f"answers ({path.stem})", total=len(requests), completed=len(done), info="")
        chunk = 2 * args.concurrency
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]

            def finished(i, g, part=part):
                nonlocal tokens
                done[part[i].id] = g.output_ids
                fh.write(json.dumps({"id": part[i].id, "output_ids": g.output_ids}) + "\n")
                fh.flush()
                tokens += len(g.output_ids)
                bar.update(task, advance=1, info=f"{tokens / (time.perf_counter() - t0):.1f} tok/s")

            scheduler.run(engine, [(r.prompt_ids, sp) for r in part], SpeculativeConfig(), concurrency=args.concurrency,
                       on_finish=finished)
    return done


def hidden_states(tgt, seqs: list[tuple[list[int], int]], path: Path) -> list[dict]:
    """Per sequence: ids, last hidden states (bf16) and where the answer starts."""
    if path.exists():
        return torch.load(path, map_location="cpu", weights_only=True)
    out = []
    with progress() as bar:
        task = bar.add_task("hidden states (target forward)", total=len(seqs), info="")
        for ids, n_prompt in seqs:
            out.append({"ids": torch.tensor(ids), "hidden": last_hidden(tgt.model, ids).to(torch.bfloat16),
                        "start": torch.tensor(n_prompt)})
            bar.update(task, advance=1)
    torch.save(out, path)
    return out


def batch(examples, rng: random.Random, size: int, max_len: int):
    """`size` random windows of up to max_len positions, from the answer region on."""
    picks = [examples[rng.randrange(len(examples))] for _ in range(size)]
    H = picks[0]["hidden"].shape[-1]
    hid = torch.zeros(size, max_len, H)
    ids = torch.zeros(size, max_len, dtype=torch.long)
    valid = torch.zeros(size, max_len, dtype=torch.bool)
    for b, e in enumerate(picks):
        start = max(0, int(e["start"]) - 1)  # the last prompt position predicts into the answer
        T = len(e["ids"])
        lo = rng.randint(start, max(start, T - max_len)) if T - start > max_len else start
        n = min(max_len, T - lo)
        hid[b, :n] = e["hidden"][lo:lo + n].float()
        ids[b, :n] = e["ids"][lo:lo + n]
        valid[b, :n] = True
    return hid, ids, valid


TREE_RANKS = 8  # candidates per head measured for the sparse tree


@torch.no_grad()
def rank_accuracy(heads, examples) -> list[list[float]]:
    """Per head and rank (top TREE_RANKS), how often that candidate was right on `examples`."""
    hits = [[0] * TREE_RANKS for _ in range(heads.num_heads)]
    counts = [0] * heads.num_heads
    for e in examples:
        start = max(0, int(e["start"]) - 1)
        h, c = rank_hits(heads(e["hidden"][start:].float()), e["ids"][start:], TREE_RANKS)
        for d in range(heads.num_heads):
            hits[d] = [a + b for a, b in zip(hits[d], h[d])]
            counts[d] += c[d]
    return [[x / counts[d] if counts[d] else 0.0 for x in hits[d]] for d in range(heads.num_heads)]


@torch.no_grad()
def evaluate(heads, examples) -> tuple[list[float], list[float]]:
    """Per head top-1 accuracy over answer positions, and chain acceptance per draft position
    (heads 0..i all right), on `examples`."""
    K = heads.num_heads
    right, total, chain = [0] * K, [0] * K, [0] * K
    for e in examples:
        start, ids = max(0, int(e["start"]) - 1), e["ids"]
        logits = heads(e["hidden"][start:].float())  # [T', K, V]
        pred = logits.argmax(-1)  # target ids (token_map applied inside)
        T = pred.shape[0]
        ok = torch.zeros(T, K, dtype=torch.bool)
        for i in range(K):
            n = T - (i + 2)
            if n <= 0:
                continue
            ok[:n, i] = pred[:n, i] == ids[start + i + 2:start + i + 2 + n]
            right[i] += int(ok[:n, i].sum())
            total[i] += n
        n_all = T - (K + 1)
        if n_all > 0:
            run = ok[:n_all].long().cumprod(dim=1)
            for i in range(K):
                chain[i] += int(run[:, i].sum())
    acc = [r / t if t else float("nan") for r, t in zip(right, total)]
    n_chain = sum(max(0, len(e["ids"]) - max(0, int(e["start"]) - 1) - (K + 1)) for e in examples)
    return acc, [c / n_chain if n_chain else float("nan") for c in chain]


def train(args, heads, examples, work: Path) -> dict:
    ckpt = work / "checkpoint.pt"
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    state = {"step": 0, "train_s": 0.0, "history": []}
    if ckpt.exists():
        ck = torch.load(ckpt, map_location="cpu", weights_only=False)  # our own checkpoint
        heads.load_state_dict(ck["heads"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        console.print(f"resumed from step {state['step']} ({state['train_s'] / 60:.1f} min trained)")

    def checkpoint() -> None:
        blob = {"heads": heads.state_dict(), "opt": opt.state_dict(), "state": state}
        atomic_write(ckpt, lambda fh: torch.save(blob, fh))

    budget = args.budget_min * 60
    rng = random.Random(args.seed + state["step"])
    heads.train()
    with progress() as bar:
        task = bar.add_task("train (heads; target frozen)", total=int(budget), completed=int(state["train_s"]), info="")
        while state["train_s"] < budget and state["step"] < args.max_steps:
            t = time.perf_counter()
            hid, ids, valid = batch(examples, rng, args.batch_size, args.window)
            loss, accs = medusa_loss(heads, hid, ids, valid)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state["step"] += 1
            state["train_s"] += time.perf_counter() - t
            if state["step"] % 10 == 0:
                state["history"].append({"step": state["step"], "loss": round(loss.item(), 4),
                                         "acc": [round(a, 3) for a in accs]})
            bar.update(task, completed=int(state["train_s"]),
                       info=f"step {state['step']} loss {loss.item():.3f} acc {' '.join(f'{a:.2f}' for a in accs)}")
            if state["step"] % args.save_every == 0:
                checkpoint()
    checkpoint()
    heads.eval()
    return state


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--out", type=Path, required=True, help="heads directory (keep it outside the repository)")
    ap.add_argument("--workload", default="real")
    ap.add_argument("--holdout", type=int, default=6, help="hold out what `specbench run --num-prompts N` measures")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-train-prompts", type=int, default=48)
    ap.add_argument("--max-prompt-tokens", type=int, default=192, help="keep the last this many prompt tokens")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="length of the target's answers")
    ap.add_argument("--concurrency", type=int, default=4, help="rows per batch while generating answers")
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--window", type=int, default=64, help="positions per training sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--budget-min", type=float, default=20.0, help="training minutes")
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tree-nodes", type=int, default=16, help="nodes of the sparse tree written beside the heads")
    args = ap.parse_args(argv)
    for name in ("heads", "layers", "draft_vocab", "tree_nodes", "batch_size", "window", "num_train_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.budget_min > 0:
        sys.exit(f"--budget-min must be > 0, got {args.budget_min}")

    out = args.out.expanduser().resolve()
    repo = Path(__file__).resolve().parents[1]
    if out == repo or repo in out.parents:
        sys.exit(f"--out {out} is inside the repository; heads are large: write them elsewhere (e.g. /work/heads/)")
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    tgt = load_model(args.target, EngineConfig(dtype=args.dtype))
    held = {p.id for p in load_workload(args.workload, num_prompts=args.holdout, seed=args.seed).prompts}
    wl = load_workload(args.workload, seed=args.seed)
    base = SamplingParams(seed=args.seed, max_new_tokens=args.max_new_tokens)
    reqs, _ = build_requests(wl, tgt.tokenizer, base, max_context=tgt.max_context, truncate=True)
    reqs = [replace(r, prompt_ids=tuple(r.prompt_ids[-args.max_prompt_tokens:])) for r in reqs]
    train_reqs = [r for r in reqs if r.id not in held][: args.num_train_prompts]
    held_reqs = [r for r in reqs if r.id in held]
    console.print(f"target {tgt.name} ({str(tgt.dtype).replace('torch.', '')}); {len(train_reqs)} training prompts "
                  f"from {wl.name!r}, {len(held_reqs)} held out")
    write_json(work / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})

    timing = {}
    t = time.perf_counter()
    answers = responses(args, tgt, train_reqs, work / "responses.jsonl")
    held_answers = responses(args, tgt, held_reqs, work / "heldout.jsonl")
    timing["responses_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ex = hidden_states(tgt, [(list(r.prompt_ids) + answers[r.id], len(r.prompt_ids)) for r in train_reqs],
                       work / "hidden.pt")
    held_ex = hidden_states(tgt, [(list(r.prompt_ids) + held_answers[r.id], len(r.prompt_ids)) for r in held_reqs],
                            work / "heldout_hidden.pt")
    timing["hidden_s"] = time.perf_counter() - t

    vocab_path = work / "vocab.json"
    if vocab_path.exists():
        vocab = torch.tensor(json.loads(vocab_path.read_text()), dtype=torch.long)
    else:
        vocab = top_tokens([answers[r.id] for r in train_reqs], int(tgt.vocab_size), args.draft_vocab)
        write_json(vocab_path, vocab.tolist())
    heads = init_heads(tgt.model, args.heads, num_layers=args.layers, vocab=vocab, shared_lm_head=True, seed=args.seed)
    before, before_chain = evaluate(heads, held_ex)
    state = train(args, heads, ex, work)
    acc, chain = evaluate(heads, held_ex)
    train_acc, _ = evaluate(heads, ex[:16])
    save_heads(heads, out, base_model=args.target)
    ranks = rank_accuracy(heads, held_ex)
    tree = sparse_tree(ranks, args.tree_nodes)
    chain_tree = [(0,) * (d + 1) for d in range(args.heads)]  # -k HEADS, one candidate per head
    write_json(out / "sparse_tree.json", {
        "speculative_token_tree": [list(p) for p in tree],
        "expected_accepted_per_step": round(expected_accepted(ranks, tree), 4),
        "held_out_accuracy_per_head_and_rank": [[round(a, 4) for a in row] for row in ranks]})
    info = {
        "target": args.target, "dtype": str(tgt.dtype).replace("torch.", ""), "cpu": _cpu_model(),
        "threads": torch.get_num_threads(), "heads": args.heads, "layers": args.layers,
        "draft_vocab_size": len(vocab), "train_prompts": len(train_reqs), "held_out_prompts": len(held_reqs),
        "answer_tokens": sum(len(a) for a in answers.values()), "steps": state["step"],
        "train_s": round(state["train_s"], 1), **{k: round(v, 1) for k, v in timing.items()},
        "total_wall_s": round(time.perf_counter() - t_start, 1),
        "held_out_accuracy_per_head": [round(a, 4) for a in acc],
        "held_out_chain_acceptance_per_position": [round(a, 4) for a in chain],
        "held_out_accuracy_per_head_untrained": [round(a, 4) for a in before],
        "held_out_chain_acceptance_per_position_untrained": [round(a, 4) for a in before_chain],
        "train_accuracy_per_head": [round(a, 4) for a in train_acc],
        "held_out_accuracy_per_head_and_rank": [[round(a, 4) for a in row] for row in ranks],
        "sparse_tree_nodes": len(tree),
        "sparse_tree_expected_accepted": round(expected_accepted(ranks, tree), 4),
        "chain_expected_accepted": round(expected_accepted(ranks, chain_tree), 4),
        "history": state["history"][-20:],
    }
    write_json(work / "training.json", info)
    console.print(f"heads written to {out}: {state['step']} steps in {state['train_s'] / 60:.1f} min")
    print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=2))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()

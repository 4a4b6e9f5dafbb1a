"""Train a small EAGLE-3 head for a target from the prompts specbench ships.

Four resumable phases, each leaving its results under OUT/work/ (rerun the same command to
continue where it stopped):

  responses  the target's own greedy answers to the first --answer-prompts training prompts
             and to --answer-sharegpt ShareGPT prompts (the embedded engine, --concurrency rows
             per batch), appended to responses.jsonl as they finish; decoding is the expensive
             part on a CPU, so the other prompts train on their text
  features   one target prefill per prompt (+ answer), capturing the head's feature layers (the
             inputs of layers 2, L/2, L-3), the last layer's output and the target's argmax, in
             shards, in an order that only appends: the ShareGPT conversations, the workload's
             prompts, the answered ShareGPT prompts (a shard holding other sequences than its
             place asks for is refused)
  vocab      the draft vocabulary: the target tokens the target predicts most often where the
             loss applies (d2t/t2d)
  train      the training-time test of the public EAGLE-3 recipe (specbench.models.eagle3_train):
             3 unrolled steps, soft cross-entropy to the target's distribution restricted to the
             draft vocabulary at positions whose target argmax it covers, step j weighted 0.8^j;
             checkpoints every --save-every steps

--sharegpt N adds N ShareGPT conversations (user and assistant turns, the target's chat
template, at most --max-seq-tokens tokens each; any whose first turn is a prompt of the
workload is skipped, so nothing measured is trained on): prefill only, no decoding, so the
data grows at the cost of one target forward per sequence. --answer-sharegpt N has the target
answer the first user turns of N more conversations (none trained on as text): the target's own
answers, what a deployed head drafts. --curve K1,K2,... trains one head per K on the first K
training sequences (the same features, the same --budget-min each) and writes
them to OUT/curve-K/: the learning curve (held-out acceptance against training tokens, measured
with `specbench run --method eagle3 --draft OUT/curve-K`).

The training targets are the target's own distributions at every position (--loss-on all), or
only in its answers (--loss-on answers): on prompt text the head still learns what the target
would predict there, from the target's features, which is what drafting needs.

The head (speculators format: config.json + model.safetensors, with what it cost to train in
config.json under specbench_training) is written to OUT at the end. The prompts a default
`specbench run --workload real --num-prompts N --seed S` measures are held out (--holdout N,
--seed S), so acceptance is measured on prompts the head never saw.

--val-sequences N (32) more ShareGPT conversations, never trained on, validate the head every
--eval-every steps: the loss and per-step accuracy (the draft's argmax against the target's)
there, and the acceptance rate they imply for a chain of --ttt-steps tokens. The head written is
the one with the best validation loss (early stopping; --patience N also ends training after N
validations without a better one). --val-answers V holds back the last V of the answered
ShareGPT prompts: early stopping then follows the target's own answers (scored on the answers),
and the conversations are reported beside them. --init-head DIR continues from a head of the same
target, e.g. one trained on conversations, on the answers: its weights, with the draft
vocabulary chosen from this run's data (the tokens both have keep their lm_head rows).
--device cuda runs the target's prefill and the training on
a GPU (the same script and recipe; benchmarks/gpu_check.py times it there).

With --pause-while PATH, while PATH exists (someone is timing a benchmark on this machine) the
script checkpoints, waits and resumes; the paused time does not count against --budget-min.

    python benchmarks/train_eagle3.py --out /work/heads/qwen2.5-coder-1.5b-eagle3
    python benchmarks/train_eagle3.py --out DIR --budget-min 30 --draft-vocab 8192   # resume / longer
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.errors import ConfigError, ModelError
from specbench.engine import Engine
from specbench.engine.model import ModelRunner
from specbench.models.eagle3 import default_aux_layers, save_head
from specbench.models.eagle3.formats import build_head, read_head
from specbench.models.eagle3_train import (evaluate, head_config_for, init_head, loss_region, make_batch,
                                           select_vocabulary, ttt_loss)
from specbench.models.loading import load_model, resolve_device
from specbench.atomic import atomic_write
from specbench.workload import build_requests, load_workload
from specbench.engine import scheduler

QUIET_POLL_S = 20.0  # how often a paused run looks at the lock again
console = Console(stderr=True)


class Clock:
    """Active seconds (quiet-lock pauses excluded) and a pause that waits for the lock.

    The lock is opt-in (`--pause-while PATH`): without it nothing on the machine can stall training.
    """

    def __init__(self, lock: Path | None = None) -> None:
        self.paused_s = 0.0
        self.lock = lock

    def wait_if_quiet(self, before=None) -> bool:
        lock = self.lock
        if lock is None or not lock.exists():
            return False
        if before is not None:
            before()
        console.print(f"[yellow]{lock} exists: paused (checkpointed), waiting for it to go[/]")
        t0 = time.perf_counter()
        while lock.exists():
            time.sleep(QUIET_POLL_S)
        self.paused_s += time.perf_counter() - t0
        console.print(f"resumed after {time.perf_counter() - t0:.0f} s")
        return True


def progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console)


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda fh: fh.write(json.dumps(obj, indent=2).encode()))


class Ask(NamedTuple):
    """A prompt the target answers: the fields `responses` reads of a workload request."""
    id: str
    prompt_ids: tuple[int, ...]


# ---- phase 1: the target's answers ------------------------------------------------------------

def responses(args, tgt, requests, work: Path, clock: Clock) -> dict[str, list[int]]:
    path = work / "responses.jsonl"
    done: dict[str, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["id"]] = rec["output_ids"]
    todo = [r for r in requests if r.id not in done]
    if not todo:
        return done
    console.print(f"generating the target's answers to {len(todo)} prompt(s), {args.max_new_tokens} tokens each")
    engine = Engine(tgt.model, eos_token_ids=tgt.eos_token_ids, max_context=tgt.max_context)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    with progress() as bar, path.open("a") as fh:
        task = bar.add_task("responses (target, greedy)", total=len(requests), completed=len(done), info="")
        tokens = 0
        chunk = 2 * args.concurrency
        for start in range(0, len(todo), chunk):
            clock.wait_if_quiet()
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


def sharegpt_sequences(tokenizer, n: int, max_tokens: int, skip_texts: set[str], *, prompts: int = 0,
                      max_prompt_tokens: int = 192) -> tuple[list[list[int]], list[Ask]]:
    """The first `n` usable ShareGPT conversations as token ids under the chat template, then the
    first user turns of the next `prompts` ones as Asks (prompt ids ending in the generation
    prompt, at most `max_prompt_tokens`) for the target to answer: the two never share a
    conversation."""
    import io

    from specbench.workload.packaged import _open_sharegpt, iter_json_array

    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
    out: list[list[int]] = []
    asks: list[Ask] = []

    def ids_of(msgs, **kw) -> list[int]:
        ids = tokenizer.apply_chat_template(msgs, tokenize=True, **kw)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    with _open_sharegpt() as fb:
        for index, conv in enumerate(iter_json_array(io.TextIOWrapper(fb, encoding="utf-8"))):
            if len(out) >= n and len(asks) >= prompts:
                break
            turns = conv.get("conversations") if isinstance(conv, dict) else None
            if not turns or not all(isinstance(t, dict) and t.get("from") in roles and isinstance(t.get("value"), str)
                                    for t in turns):
                continue
            msgs = [{"role": roles[t["from"]], "content": t["value"]} for t in turns]
            if msgs[0]["role"] != "user" or len(msgs) < 2 or msgs[0]["content"].strip() in skip_texts:
                continue
            if len(out) < n:
                ids = ids_of(msgs)[:max_tokens]
                if len(ids) >= 16:
                    out.append(ids)
            elif msgs[0]["content"].strip():
                prompt = ids_of(msgs[:1], add_generation_prompt=True)[-max_prompt_tokens:]
                asks.append(Ask(f"sharegpt-{index}", tuple(prompt)))
    return out, asks


# ---- phase 3: features ------------------------------------------------------------------------

def features(args, tgt, seqs, aux, work: Path, clock: Clock) -> list[Path]:
    from safetensors.torch import save

    shard_dir = work / "features"
    shard_dir.mkdir(exist_ok=True)
    L = int(tgt.model.config.get_text_config().num_hidden_layers)
    runner = ModelRunner(tgt.model)
    runner.set_capture((*aux, L))  # the head's layers, then the last layer's output (pre-norm)
    width = int(tgt.model.config.get_text_config().hidden_size)
    shards = [seqs[i:i + args.shard_size] for i in range(0, len(seqs), args.shard_size)]
    paths = []
    with progress() as bar:
        task = bar.add_task("features (target prefill)", total=len(seqs), info="")
        for s, shard in enumerate(shards):
            path = shard_dir / f"shard-{s:05d}.safetensors"
            paths.append(path)
            have = _shard_len(path) if path.exists() else 0
            if have == len(shard):
                bar.update(task, advance=len(shard))
                continue
            # A shard short of `len(shard)` was the last one of a run with fewer sequences: it is
            # filled again here, so that sequences appended later keep their places. One that holds
            # other sequences belongs to another command's data and is never overwritten.
            if have and _shard_ids(path, have) != [ids for ids, _ in shard[:have]]:
                sys.exit(f"{path} holds other sequences than this command's (were the data flags changed?): "
                         f"remove {path.parent} or write to a new --out")
            clock.wait_if_quiet()
            out = {}
            for i, (ids, start) in enumerate(shard):
                with torch.inference_mode():
                    logits, f = runner.forward(torch.tensor([ids], device=tgt.device), slice(0, 1),
                                               torch.zeros(1, dtype=torch.long, device=tgt.device),
                                               positions="all", prefill=True)
                    top = logits[0].argmax(-1).to(torch.int32).cpu()
                    del logits
                f = f[0].to(torch.bfloat16).cpu()
                out[f"{i}.top"] = top
                out[f"{i}.features"] = f[:, : len(aux) * width].contiguous()
                out[f"{i}.last"] = f[:, len(aux) * width:].contiguous()
                out[f"{i}.ids"] = torch.tensor(ids, dtype=torch.long)
                out[f"{i}.start"] = torch.tensor([start], dtype=torch.long)
                bar.update(task, advance=1, info=f"{len(ids)} tokens")
            atomic_write(path, lambda fh, out=out: fh.write(save(out)))
    return paths


def _shard_len(path: Path) -> int:
    """How many sequences a feature shard holds (from its header; no tensor is read)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as fh:
        return len({k.split(".")[0] for k in fh.keys()})


def _shard_ids(path: Path, count: int) -> list[list[int]]:
    """The token ids of the `count` sequences in a feature shard, in order (only the ids are read)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as fh:
        return [fh.get_tensor(f"{i}.ids").tolist() for i in range(count)]


def load_examples(paths: list[Path], sequences: list[list[int]] | None = None) -> list[dict[str, torch.Tensor]]:
    """The shards' examples; with `sequences`, each must hold exactly the sequence at its place."""
    from safetensors.torch import load_file

    examples = []
    for path in paths:
        state = load_file(path)
        n = len({k.split(".")[0] for k in state})
        part = [{k: state[f"{i}.{k}"] for k in ("features", "last", "ids", "start", "top")} for i in range(n)]
        if sequences is not None:
            want = sequences[len(examples): len(examples) + n]
            if len(want) != n or any(e["ids"].tolist() != w for e, w in zip(part, want)):
                sys.exit(f"{path} holds other sequences than this command's (were the data flags changed?): "
                         f"remove {path.parent} or write to a new --out")
        examples += part
    return examples


# ---- phase 4: training ------------------------------------------------------------------------

def learning_rate(step: int, lr: float, warmup: int, max_steps: int, decay_from: int | None) -> float:
    """The learning rate of 0-based `step`: a linear warm-up over `warmup` steps, then `lr`; from
    step `decay_from` on (when given) it falls linearly to lr / 10 at `max_steps`. A run continued
    from a checkpoint with a larger --max-steps and --lr-decay-from at the step it stopped anneals
    the head it had, instead of training on at the rate it plateaued at."""
    rate = lr * min(1.0, (step + 1) / warmup)
    if decay_from is not None and step >= decay_from and max_steps > decay_from:
        rate *= 1.0 - 0.9 * min(1.0, (step - decay_from) / (max_steps - decay_from))
    return rate


def train(args, tgt, cfg, vocab, examples, lm_w, work: Path, clock: Clock, tag: str = "",
          val_sets: dict | None = None, init: torch.nn.Module | None = None) -> dict:
    """TTT training until --budget-min or --max-steps (or --patience evaluations without a
    better validation loss). `val_sets` maps a name to the sequences that validate under it
    ("answers": the target's own answers, scored on the answers; "sharegpt": conversations);
    the first set decides early stopping: the head returned is the one with its best loss
    seen (evaluated every --eval-every steps). `init`: the head to start from (--init-head)."""
    dev = lm_w.device
    ckpt_path = work / f"checkpoint{tag}.pt"
    head = init_head(tgt.model, cfg, vocab, seed=args.seed, from_target=args.init_from_target,
                     lm_head_weight=lm_w)
    if init is not None:  # everything but the target's shared embedding; the lm_head by token
        old_vocab, weights = init.draft_ids, init.state_dict()
        rows = {k: v for k, v in weights.items() if k not in ("lm_head.weight", "d2t", "t2d")}
        unexpected = head.load_state_dict(rows, strict=False).unexpected_keys
        if unexpected:
            sys.exit(f"--init-head: weight {unexpected[0]!r} has no place in the head trained here")
        place = {int(t): i for i, t in enumerate(old_vocab.tolist())}
        both = [(j, place[t]) for j, t in enumerate(vocab.tolist()) if t in place]
        if both:
            new, old = (torch.tensor(x) for x in zip(*both))
            with torch.no_grad():
                head.lm_head.weight[new] = weights["lm_head.weight"][old].to(head.lm_head.weight.dtype)
        console.print(f"--init-head: {len(both):,} of the {len(vocab):,} draft tokens keep their lm_head rows; "
                      "the others start from the target's")
    head = head.to(dev).train()
    val_sets = {k: list(v) for k, v in (val_sets or {}).items() if v}
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state = {"step": 0, "train_s": 0.0, "history": [], "validation": [], "best": None, "since_best": 0}
    best_weights = None  # the best head's trainable weights (on the CPU)
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=dev, weights_only=False)  # our own checkpoint
        head.load_state_dict(ck["head"], strict=False)
        opt.load_state_dict(ck["opt"])
        state = {"validation": [], "best": None, "since_best": 0, **ck["state"]}
        best_weights = ck.get("best_weights")
        console.print(f"resumed from step {state['step']} ({state['train_s'] / 60:.1f} min trained)")

    def checkpoint() -> None:
        atomic_write(ckpt_path, lambda fh: torch.save({"head": head.state_dict(), "opt": opt.state_dict(),
                                                       "state": state, "best_weights": best_weights}, fh))

    def trainable() -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in head.named_parameters() if v.requires_grad}

    tcfg = tgt.model.config.get_text_config()
    norm_w, eps = tgt.model.get_decoder().norm.weight.float(), float(tcfg.rms_norm_eps)

    def norm(h: torch.Tensor) -> torch.Tensor:  # the target's final RMSNorm, in float32
        return norm_w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    w_draft = lm_w[vocab.to(dev)].float()
    vocab_mask = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    vocab_mask[vocab] = True
    budget_s = args.budget_min * 60
    ema = None

    def validate() -> None:
        nonlocal best_weights
        by_set = {name: evaluate(head, ex, vocab_mask, norm, w_draft, batch_size=args.batch_size,
                                 steps=args.ttt_steps, bf16=args.bf16,
                                 loss_on="answers" if name == "answers" else "all")
                  for name, ex in val_sets.items()}
        name, v = next(iter(by_set.items()))
        record = {"step": state["step"], "train_s": round(state["train_s"], 1), "set": name, **v}
        if len(by_set) > 1:
            record["by_set"] = by_set
        state["validation"].append(record)
        if state["best"] is None or v["loss"] < state["best"]["loss"]:
            state["best"] = {"step": state["step"], "set": name, **v}
            state["since_best"] = 0
            best_weights = trainable()
        else:
            state["since_best"] += 1
        console.print(f"validation at step {state['step']}: " + "; ".join(
            f"{n} loss {r['loss']:.3f}, accuracy/step {' '.join(f'{a:.3f}' for a in r['acc'])}"
            for n, r in by_set.items()) + f" (best on {name}: step {state['best']['step']})")

    def patience_left() -> bool:
        return not (args.patience and val_sets and state["since_best"] >= args.patience)

    with progress() as bar:
        task = bar.add_task("train (TTT)", total=args.max_steps, completed=state["step"], info="")
        while state["step"] < args.max_steps and state["train_s"] < budget_s and patience_left():
            clock.wait_if_quiet(before=checkpoint)
            t0 = time.perf_counter()
            rng = random.Random(args.seed * 1_000_003 + state["step"])
            batch = make_batch(rng.sample(examples, min(args.batch_size, len(examples))), vocab_mask, norm, w_draft,
                               args.loss_on)
            for g in opt.param_groups:
                g["lr"] = learning_rate(state["step"], args.lr, args.warmup_steps, args.max_steps,
                                        args.lr_decay_from)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss, st = ttt_loss(head, *batch, steps=args.ttt_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            state["step"] += 1
            state["train_s"] += time.perf_counter() - t0
            acc = [round(a, 3) for a in st.accuracy]
            ema = acc if ema is None else [0.9 * e + 0.1 * a for e, a in zip(ema, acc)]
            if state["step"] % 10 == 0 or state["step"] == 1:
                state["history"].append({"step": state["step"], "loss": round(st.loss, 4), "acc": acc,
                                         "train_s": round(state["train_s"], 1)})
            info = (f"loss {st.loss:.3f} acc/step {' '.join(f'{a:.2f}' for a in ema)} "
                    f"{state['train_s'] / 60:.1f}/{args.budget_min:g} min")
            bar.update(task, advance=1, info=info)
            if not console.is_terminal and state["step"] % 10 == 0:  # a log file: one line now and then
                console.print(f"step {state['step']}: {info}")
            if val_sets and state["step"] % args.eval_every == 0:
                validate()
            if state["step"] % args.save_every == 0:
                checkpoint()
    if val_sets and (not state["validation"] or state["validation"][-1]["step"] != state["step"]):
        validate()
    checkpoint()
    state["final_acc_ema"] = [round(a, 3) for a in (ema or [])]
    if best_weights is not None:  # early stopping: the best validated head, not the last
        head.load_state_dict({k: v.to(dev) for k, v in best_weights.items()}, strict=False)
    return {"head": head.eval().requires_grad_(False).cpu(), "state": state}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--out", type=Path, required=True, help="head directory (keep it outside the repository)")
    ap.add_argument("--workload", default="real")
    ap.add_argument("--holdout", type=int, default=6, help="hold out what `specbench run --num-prompts N` measures")
    ap.add_argument("--seed", type=int, default=0, help="the run seed whose sample is held out; also training's")
    ap.add_argument("--num-train-prompts", type=int, default=240)
    ap.add_argument("--answer-prompts", type=int, default=32,
                    help="training prompts that get the target's own greedy answer (decoding is slow on a CPU)")
    ap.add_argument("--answer-sharegpt", type=int, default=0, metavar="N",
                    help="also train on the target's own answers to the first user turns of N more ShareGPT "
                         "conversations (after those of --sharegpt and --val-sequences)")
    ap.add_argument("--val-answers", type=int, default=0, metavar="N",
                    help="the last N of the --answer-sharegpt answers validate instead of training: early "
                         "stopping then follows the target's own answers")
    ap.add_argument("--init-head", type=Path, default=None, metavar="DIR",
                    help="start from this head's weights (a head of the same target, e.g. one trained on "
                         "conversations, continued on the target's answers); the draft vocabulary is chosen from "
                         "this run's data, and its tokens the head already had keep their lm_head rows")
    ap.add_argument("--loss-on", choices=("all", "answers"), default="all")
    ap.add_argument("--sharegpt", type=int, default=0, help="also train on this many ShareGPT conversations")
    ap.add_argument("--max-seq-tokens", type=int, default=256, help="tokens kept of each ShareGPT conversation")
    ap.add_argument("--val-sequences", type=int, default=32,
                    help="ShareGPT conversations after the training ones, never trained on: the validation set "
                         "(per-step accuracy, early stopping); 0 = none")
    ap.add_argument("--eval-every", type=int, default=50, help="training steps between validations")
    ap.add_argument("--patience", type=int, default=0,
                    help="stop after this many validations without a better loss (0 = train the whole budget)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (target prefill and training)")
    ap.add_argument("--curve", default=None, metavar="K1,K2,...",
                    help="one head per K: trained on the first K sequences, written to OUT/curve-K/")
    ap.add_argument("--max-prompt-tokens", type=int, default=192, help="keep the last this many prompt tokens")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="length of the target's answers")
    ap.add_argument("--concurrency", type=int, default=8, help="rows per batch while generating answers")
    ap.add_argument("--shard-size", type=int, default=16)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--intermediate-size", type=int, default=2048, help="the head's MLP width")
    ap.add_argument("--aux-layers", default=None, help="feature layers, e.g. 2,14,25 (default: 2, L/2, L-3)")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--lr-decay-from", type=int, default=None, metavar="STEP",
                    help="from this step on the learning rate falls linearly to --lr/10 at --max-steps "
                         "(default: constant after the warm-up)")
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--budget-min", type=float, default=30.0, help="training minutes (quiet-lock pauses excluded)")
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 autocast for the head's matmuls (CPUs with avx512_bf16 / AMX)")
    ap.add_argument("--init-from-target", action=argparse.BooleanOptionalAction, default=True,
                    help="start the head's final norm and lm_head from the target's")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--pause-while", type=Path, default=None, metavar="PATH",
                    help="checkpoint and pause while PATH exists (a lock a timed benchmark holds); off by default")
    args = ap.parse_args(argv)

    try:  # checked before anything slow; its top against the sequences once they are known
        curve = sorted({int(k) for k in args.curve.split(",")}) if args.curve else []
    except ValueError:
        sys.exit(f"--curve: expected sequence counts like 50,100,200, got {args.curve!r}")
    if curve and curve[0] < 1:
        sys.exit(f"--curve: each K must be >= 1, got {args.curve}")
    if args.sharegpt < 0 or args.max_seq_tokens < 16:
        sys.exit(f"--sharegpt must be >= 0 and --max-seq-tokens >= 16, got {args.sharegpt} and {args.max_seq_tokens}")
    if args.answer_sharegpt < 0 or not 0 <= args.val_answers <= args.answer_sharegpt:
        sys.exit(f"--answer-sharegpt must be >= 0 and --val-answers in 0..--answer-sharegpt, got "
                 f"{args.answer_sharegpt} and {args.val_answers}")
    if args.val_sequences < 0 or args.eval_every < 1 or args.patience < 0:
        sys.exit(f"--val-sequences and --patience must be >= 0 and --eval-every >= 1, got {args.val_sequences}, "
                 f"{args.patience} and {args.eval_every}")
    if args.lr_decay_from is not None and not 0 <= args.lr_decay_from < args.max_steps:
        sys.exit(f"--lr-decay-from must be in 0..--max-steps-1 ({args.max_steps - 1}), got {args.lr_decay_from}")
    try:
        resolve_device(EngineConfig(device=args.device))
    except ConfigError as e:
        sys.exit(str(e))

    out = args.out.expanduser().resolve()
    repo = Path(__file__).resolve().parents[1]
    if out == repo or repo in out.parents:
        sys.exit(f"--out {out} is inside the repository; heads are large: write them elsewhere (e.g. /work/heads/)")
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.pause_while)
    timing: dict[str, float] = {}
    t_start = time.perf_counter()

    start_head = None
    if args.init_head is not None:  # read before anything slow: a bad head is refused at once
        try:
            start_head = read_head(args.init_head)
        except ModelError as e:
            sys.exit(f"--init-head: {e}")
    try:
        tgt = load_model(args.target, EngineConfig(dtype=args.dtype, device=args.device))
    except ConfigError as e:  # e.g. --device cuda on a machine without CUDA
        sys.exit(str(e))
    # The engine packs the target's linear layers in place (the lm_head's weight goes with it):
    # keep the lm_head weight for the training targets and the head's initial lm_head.
    lm_w = tgt.model.get_output_embeddings().weight.detach()
    L = int(tgt.model.config.get_text_config().num_hidden_layers)
    aux = tuple(int(x) for x in args.aux_layers.split(",")) if args.aux_layers else default_aux_layers(L)
    start = None  # the --init-head head (float32, CPU)
    if start_head is not None:
        hcfg, weights = start_head
        width = int(tgt.model.config.get_text_config().hidden_size)
        got = (hcfg.vocab_size, hcfg.target_hidden_size, tuple(hcfg.aux_layers or default_aux_layers(L)))
        if got != (int(tgt.vocab_size), width, aux):
            sys.exit(f"--init-head {args.init_head}: it reads vocabulary {got[0]:,}, width {got[1]} and layers "
                     f"{list(got[2])} of its target; {args.target} has {int(tgt.vocab_size):,}, {width} and "
                     f"{list(aux)}")
        start = build_head(hcfg, weights, args.init_head)
    held = {p.id for p in load_workload(args.workload, num_prompts=args.holdout, seed=args.seed).prompts}
    wl = load_workload(args.workload, seed=args.seed)
    base = SamplingParams(seed=args.seed, max_new_tokens=args.max_new_tokens)
    reqs, _ = build_requests(wl, tgt.tokenizer, base, max_context=tgt.max_context, truncate=True)
    reqs = [r for r in reqs if r.id not in held][: args.num_train_prompts]
    reqs = [replace(r, prompt_ids=tuple(r.prompt_ids[-args.max_prompt_tokens:])) for r in reqs]
    console.print(f"target {tgt.name} ({str(tgt.dtype).replace('torch.', '')}, {L} layers, features from "
                  f"layers {list(aux)}); {len(reqs)} training prompts from {wl.name!r}, {len(held)} held out")
    write_json(work / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})

    skip = ({p.text.strip() for p in wl.prompts if p.text}
            | {m["content"].strip() for p in wl.prompts for m in (p.messages or ()) if m.get("role") == "user"})
    conv: list[list[int]] = []
    asks: list[Ask] = []
    if args.sharegpt or args.val_sequences or args.answer_sharegpt:
        conv, asks = sharegpt_sequences(tgt.tokenizer, args.sharegpt + args.val_sequences, args.max_seq_tokens, skip,
                                        prompts=args.answer_sharegpt, max_prompt_tokens=args.max_prompt_tokens)
    t = time.perf_counter()
    answers = responses(args, tgt, reqs[: args.answer_prompts] + asks, work, clock)
    timing["responses_s"] = time.perf_counter() - t

    t = time.perf_counter()
    conv, val = conv[: args.sharegpt], conv[args.sharegpt:]
    if conv or val:
        console.print(f"{len(conv)} ShareGPT conversations ({sum(map(len, conv)):,} tokens) added; {len(val)} "
                      f"more ({sum(map(len, val)):,} tokens) validate")
    def with_answer(r) -> tuple[list[int], int]:  # (prompt + the target's answer, where the answer starts)
        return list(r.prompt_ids) + answers.get(r.id, []), len(r.prompt_ids)

    answered = [with_answer(r) for r in asks]
    n_val_ans = min(args.val_answers, len(answered))
    if answered:
        console.print(f"the target's answers to {len(answered)} ShareGPT prompts "
                      f"({sum(len(s) - st for s, st in answered):,} answer tokens): "
                      f"{len(answered) - n_val_ans} train, {n_val_ans} validate")
    # One feature pass, in an order that only ever appends: the ShareGPT conversations (training,
    # then validation), the workload's prompts, the answered ShareGPT prompts. Shards already
    # written stay valid when answers are added; load_examples refuses shards of other sequences.
    order = ([(ids, 0) for ids in conv + val]
             + [with_answer(r) for r in reqs] + answered)
    paths = features(args, tgt, order, aux, work, clock)
    timing["features_s"] = time.perf_counter() - t
    every = load_examples(paths, [ids for ids, _ in order])
    n_conv, n_val, n_req = len(conv), len(val), len(reqs)
    split = n_conv + n_val + n_req + len(answered) - n_val_ans
    examples = every[:n_conv] + every[n_conv + n_val: split]
    seqs = order[:n_conv] + order[n_conv + n_val: split]
    # the target's own answers decide early stopping when some validate: they are what a deployed head drafts
    val_sets = {name: ex for name, ex in (("answers", every[split:]), ("sharegpt", every[n_conv: n_conv + n_val]))
                if ex}
    curve = curve or [len(examples)]
    if not examples or curve[-1] > len(examples):
        sys.exit(f"--curve: each K must be in 1..{len(examples)} (the sequences there are), got {args.curve}")

    def fit(examples, seqs, out, tag):
        """The vocabulary from `examples`, a head trained on them, written to `out`."""
        vocab_path = work / f"vocab{tag}.json"
        targets = [e["top"][loss_region(e, args.loss_on)].tolist() for e in examples]
        if vocab_path.exists():
            vocab = torch.tensor(json.loads(vocab_path.read_text()), dtype=torch.long)
        else:
            vocab = select_vocabulary(targets, args.draft_vocab, int(tgt.vocab_size))
            write_json(vocab_path, vocab.tolist())
        flat = torch.tensor([t for seq in targets for t in seq])
        covered = torch.isin(flat, vocab).float().mean().item() if flat.numel() else 0.0
        answer_tokens = [t for r in [*reqs, *asks[: len(asks) - n_val_ans]] for t in answers.get(r.id, [])]
        console.print(f"draft vocabulary: {len(vocab):,} tokens cover {covered:.1%} of the target's choices at the "
                      f"{flat.numel():,} training positions")

        cfg = head_config_for(tgt.model, draft_vocab_size=len(vocab), intermediate_size=args.intermediate_size,
                              aux_layers=aux, verifier=args.target)
        if start is not None:  # its layer's shape; the vocabulary this data chooses
            cfg = replace(start.config, draft_vocab_size=len(vocab), aux_layers=aux, verifier=args.target)
        t = time.perf_counter()
        result = train(args, tgt, cfg, vocab, examples, lm_w, work, clock, tag, val_sets, init=start)
        times = dict(timing, train_wall_s=time.perf_counter() - t)
        head, state = result["head"], result["state"]
        total_tokens = sum(len(s) for s, _ in seqs)
        info = {
            "target": args.target, "dtype": str(tgt.dtype).replace("torch.", ""),
            "cpu": _cpu_model(), "threads": torch.get_num_threads(),
            "prompts": len(reqs), "answered_prompts": sum(1 for r in reqs if r.id in answers),
            "sequences": len(seqs), "sharegpt": args.sharegpt,
            "workload": wl.name, "held_out": sorted(held), "loss_on": args.loss_on,
            "answer_tokens": len(answer_tokens), "sequence_tokens": total_tokens, "training_positions": int(flat.numel()),
            "draft_vocab_size": len(vocab), "draft_vocab_coverage": round(covered, 4),
            "steps": state["step"], "batch_size": args.batch_size, "ttt_steps": args.ttt_steps,
            "train_active_s": round(state["train_s"], 1), "quiet_paused_s": round(clock.paused_s, 1),
            **{k: round(v, 1) for k, v in times.items()}, "total_wall_s": round(time.perf_counter() - t_start, 1),
            "final_train_accuracy_per_step": state.get("final_acc_ema"), "history": state["history"][-20:],
            "init_from_target": args.init_from_target, "lr": args.lr,
            "device": _device_name(tgt.device), "init_head": str(args.init_head) if args.init_head else None,
            "answered_sharegpt": len(answered) - n_val_ans,
            "validation_sequences": {k: len(v) for k, v in val_sets.items()},
            "validation_tokens": {k: sum(int(e["ids"].numel()) for e in v) for k, v in val_sets.items()},
            "validation_best": state.get("best"), "validation": state.get("validation", [])[-20:],
        }
        save_head(head, out, fmt="speculators", verifier=args.target, speculative_tokens=args.ttt_steps,
                  extra={"specbench_training": info})
        write_json(work / f"training{tag}.json", info)
        console.print(f"head written to {out}: {state['step']} steps in {state['train_s'] / 60:.1f} min "
                      f"(total {info['total_wall_s'] / 60:.1f} min, paused {clock.paused_s / 60:.1f} min)")
        print(json.dumps({k: v for k, v in info.items() if k not in ("history", "held_out")}, indent=2))

    for k in curve:
        fit(examples[:k], seqs[:k], out if not args.curve else out / f"curve-{k}", "" if not args.curve else f"-{k}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


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

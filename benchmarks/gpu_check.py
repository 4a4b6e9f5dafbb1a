"""The CUDA checks, for a lent GPU machine (run through benchmarks/gpu_check.sh).

Everything runs on random-weight models built here (the GPU machine reaches no package index
or hub), so it needs only torch and transformers:

1. losslessness on CUDA: greedy speculative outputs equal the baseline token for token for
   draft_model and ngram at concurrency 1, 4 and 8 (tiny float32 models), and a sampled
   request gives the same tokens alone and in a batch;
2. host syncs: a CUDA sync-debug pass counts the device-to-host synchronizations of one
   speculative step (goal: a couple per step);
3. the overhead benchmark (benchmarks/engine_overhead.py's measurement) on bf16 random models
   with the default pair's shapes (Qwen2.5-Coder 1.5B target, 0.5B draft);
4. the static step captured as CUDA graphs (`--capture cudagraph`; `static` op by op on the
   CPU): greedy outputs equal the eager step's, a sampled request the same alone and in a batch,
   host syncs per step (goal: 1), host work per step with compute removed
   (benchmarks/host_overhead.py, eager against captured), and per-step time of the default
   pair's shapes, eager against captured, at concurrency 1, 4 and 16;
5. EAGLE-3 training throughput for the default target's shapes, with benchmarks/train_eagle3.py's
   pieces: one target prefill capturing the head's features (a sequence of --train-tokens), and
   one training-time-test step (forward, backward, AdamW) of its default head at batch 4 and 16.
   The weights are random, so no head worth keeping comes out: this is what a GPU run of
   `train_eagle3.py --device cuda` costs per token, to size the data a learning curve asks for.

    python benchmarks/gpu_check.py                   # needs CUDA
    python benchmarks/gpu_check.py --device cpu --quick   # the same logic on the CPU
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import add_row, measure_point, overhead_table  # noqa: E402
import host_overhead  # noqa: E402

from specbench.config import SamplingParams, SpeculativeConfig  # noqa: E402
from specbench.engine import Engine  # noqa: E402
from specbench.engine import scheduler  # noqa: E402
from specbench.engine.model import ModelRunner  # noqa: E402
from specbench.models.eagle3 import default_aux_layers  # noqa: E402
from specbench.models.eagle3_train import head_config_for, init_head, ttt_loss  # noqa: E402

SHAPES = {  # the default pair's architecture (config.json of the catalog models)
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False),
}


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0, init: float = 0.2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, initializer_range=init,
                      rope_theta=1e6, attn_implementation="sdpa")
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval().requires_grad_(False)


def perturbed(model: Qwen2ForCausalLM, noise: float) -> Qwen2ForCausalLM:
    copy = Qwen2ForCausalLM(model.config).to(next(model.parameters()).device).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp_min(1e-3))
    return copy.requires_grad_(False)


PROMPTS = [[(7 * i + j) % 290 + 3 for j in range(5 + 4 * i)] for i in range(8)]  # ragged, for the tiny models
GREEDY = [(p, SamplingParams(max_new_tokens=24 + i)) for i, p in enumerate(PROMPTS)]
SAMPLED = [(p, SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=i)) for i, p in enumerate(PROMPTS)]


def batch_independent(engine: Engine, label: str, console: Console) -> bool:
    """Sampled requests give the same tokens alone and in a batch of 8 (per-request seeds)."""
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d")
    alone = [scheduler.run(engine, [r], spec)[0][0].output_ids for r in SAMPLED]
    together = [g.output_ids for g in scheduler.run(engine, SAMPLED, spec, concurrency=8)[0]]
    console.print(f"{label}sampled: alone == in a batch of 8: {alone == together}")
    return alone == together


def check_lossless(device: str, console: Console) -> bool:
    target = random_model("tiny", device, torch.float32)
    engine = Engine(target, perturbed(target, 0.05))
    reqs = GREEDY
    base = [engine.generate(p, sp, SpeculativeConfig()).output_ids for p, sp in reqs]
    ok = True
    for spec in (SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d"),
                 SpeculativeConfig(method="ngram", num_speculative_tokens=3)):
        for c in (1, 4, 8):
            got = [g.output_ids for g in scheduler.run(engine, reqs, spec, concurrency=c)[0]]
            same = got == base
            ok &= same
            console.print(f"greedy {spec.short} c={c}: {'equal to the baseline' if same else 'DIFFERS'}")
    return batch_independent(engine, "", console) and ok


def captured_mode(device: str) -> str:
    return "cudagraph" if device == "cuda" else "static"


def check_captured(device: str, console: Console) -> bool:
    """The static step (captured on CUDA) decodes what the eager step decodes."""
    target = random_model("tiny", device, torch.float32)
    draft = perturbed(target, 0.05)
    eager, captured = Engine(target, draft, pack=False), Engine(target, draft, static=captured_mode(device))
    reqs = GREEDY
    ok = True
    for spec in (SpeculativeConfig(), SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d"),
                 SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d", topk=2,
                                   num_draft_tokens=7)):  # a dynamic tree: its shape is data on the device
        for c in (1, 4, 8):
            a = [(g.output_ids, [s.accepted for s in g.steps]) for g in scheduler.run(eager, reqs, spec, concurrency=c)[0]]
            b = [(g.output_ids, [s.accepted for s in g.steps])
                 for g in scheduler.run(captured, reqs, spec, concurrency=c)[0]]
            ok &= a == b
            console.print(f"{captured_mode(device)} greedy {spec.short} c={c}: "
                          f"{'equal to the eager step' if a == b else 'DIFFERS'}")
    # the heads' chains and trees (random heads: the steps' records, drafted and accepted, compared)
    tree = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    for method, head in (("eagle3", host_overhead.random_head(target, target.config.vocab_size, 2)),
                         ("medusa", host_overhead.random_medusa(target, 3, 3))):
        pair = (Engine(target, head=head, pack=False), Engine(target, head=head, static=captured_mode(device)))
        for spec in (SpeculativeConfig(method=method, num_speculative_tokens=3, draft="h"),
                     SpeculativeConfig(method=method, num_speculative_tokens=3, draft="h", token_tree=tree),
                     SpeculativeConfig(method=method, num_speculative_tokens=3, draft="h", topk=2, num_draft_tokens=6)):
            for c in (1, 4):
                a, b = ([(g.output_ids, [(s.drafted, s.accepted) for s in g.steps])
                         for g in scheduler.run(e, reqs, spec, concurrency=c)[0]] for e in pair)
                ok &= a == b
                shape = "tree" if spec.token_tree else "dynamic tree" if spec.topk > 1 else "chain"
                console.print(f"{captured_mode(device)} greedy {method} {shape} k=3 c={c}: "
                              f"{'equal to the eager step' if a == b else 'DIFFERS'}")
    return batch_independent(captured, f"{captured_mode(device)} ", console) and ok


def step_times(target, draft, device: str, console: Console) -> None:
    """Median step time (ms) of the default pair's shapes, eager against captured: baseline and
    draft_model k=4 (random weights: acceptance means nothing here, the cost of a step does)."""
    engines = {"eager": Engine(target, draft, pack=False), captured_mode(device): Engine(target, draft,
                                                                                       static=captured_mode(device))}
    ids = min(1000, target.config.vocab_size - 20)
    pairs = [([(11 * i + j) % ids + 10 for j in range(128)], SamplingParams(max_new_tokens=32, ignore_eos=True))
             for i in range(32)]
    for c in (1, 4, 16):
        for spec in (SpeculativeConfig(), SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d")):
            line = []
            for path, engine in engines.items():
                scheduler.run(engine, pairs[:c], spec, concurrency=c)  # warm (and build the graphs)
                _, stats = scheduler.run(engine, pairs[:2 * c], spec, concurrency=c)
                full = stats.by_batch_size.get(c)
                line.append(f"{path} {1e3 * full.step_s / full.steps:.2f} ms" if full else f"{path} -")
            console.print(f"step time c={c} {spec.short}: " + ", ".join(line))


def count_syncs(device: str, console: Console, static: str | None = None) -> None:
    if device != "cuda":
        console.print("host syncs: CUDA only")
        return
    target = random_model("tiny", device, torch.float32)
    engine = Engine(target, perturbed(target, 0.05), pack=False if static else None, static=static)
    batch = engine.batch(SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d"))
    for i in range(4):
        batch.admit([5 + i, 6, 7, 8], SamplingParams(max_new_tokens=64, ignore_eos=True))
    batch.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        batch.step()
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    console.print(f"host syncs in one speculative step (4 rows, k=4, greedy, {static or 'eager'} step): "
                  f"{len(syncs)}")


def timed(fn, device: str, reps: int):
    """(seconds per call of `fn` over `reps` calls after one warm-up, the warm-up's result);
    the device is synchronized around the timed window."""
    first = fn()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps, first


def training_throughput(target: Qwen2ForCausalLM, device: str, tokens: int, console: Console, reps: int = 3) -> None:
    """Seconds per target prefill (features) and per TTT step at batch 4 and 16, and what they
    come to per million training tokens."""
    cfg = target.config
    L = int(cfg.num_hidden_layers)
    aux = default_aux_layers(L) if L >= 8 else tuple(range(min(L, 3)))  # --quick: a 2-layer target
    runner = ModelRunner(target)
    runner.set_capture((*aux, L))
    vocab = min(8192, int(cfg.vocab_size))
    ids = torch.randint(10, int(cfg.vocab_size) - 10, (1, tokens), device=device)

    def prefill() -> torch.Tensor:
        with torch.inference_mode():
            _, f = runner.forward(ids, slice(0, 1), torch.zeros(1, dtype=torch.long, device=device),
                                  positions="all", prefill=True)
        return f[0].float().clone()

    prefill_s, feats = timed(prefill, device, reps)
    hcfg = head_config_for(target, draft_vocab_size=vocab, intermediate_size=min(2048, int(cfg.intermediate_size)),
                           aux_layers=aux)
    head = init_head(target, hcfg, torch.arange(vocab), from_target=False).to(device).train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    width = len(aux) * int(cfg.hidden_size)
    rows = [f"target prefill ({tokens} tokens, features captured): {prefill_s * 1e3:.1f} ms, "
            f"{prefill_s / tokens * 1e6 / 60:.1f} min per million tokens"]
    for batch in (4, 16):
        x = feats[:, :width].unsqueeze(0).expand(batch, -1, -1).contiguous()
        tok = ids[0].unsqueeze(0).expand(batch, -1).contiguous()
        logits = torch.randn(batch, tokens, vocab, device=device)
        valid = torch.ones(batch, tokens, dtype=torch.bool, device=device)

        def step() -> None:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                loss, _ = ttt_loss(head, x, tok, logits, valid, steps=3)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        step_s, _ = timed(step, device, reps)
        rows.append(f"TTT step, batch {batch} x {tokens} tokens (3 steps unrolled): {step_s * 1e3:.1f} ms, "
                    f"{step_s / (batch * tokens) * 1e6 / 60:.1f} min per million tokens per epoch")
    for r in rows:
        console.print(f"EAGLE-3 training: {r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes for the overhead part (logic check)")
    ap.add_argument("--train-tokens", type=int, default=256, help="sequence length of the EAGLE-3 training check")
    args = ap.parse_args()
    console = Console(width=150)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    console.print(f"device {name}, torch {torch.__version__}")
    t = time.perf_counter()
    ok = check_lossless(args.device, console)
    ok &= check_captured(args.device, console)
    count_syncs(args.device, console)
    count_syncs(args.device, console, static=captured_mode(args.device))
    host_overhead.main(["--device", args.device, "--paths", f"eager,{captured_mode(args.device)}", "--steps", "16"]
                       + (["--layers", "4,3"] if args.quick else []))
    shape_t, shape_d = ("tiny", "tiny") if args.quick else ("1.5b", "0.5b")
    dtype = torch.float32 if args.quick else torch.bfloat16
    target = random_model(shape_t, args.device, dtype, init=0.02)
    draft = random_model(shape_d, args.device, dtype, seed=1, init=0.02)
    step_times(target, draft, args.device, console)  # before a CPU engine packs the models in place
    engine = Engine(target, draft)
    ids = min(1000, SHAPES[shape_t]["vocab_size"] - 20)
    pairs = [([(11 * i + j) % ids + 10 for j in range(128)], SamplingParams(max_new_tokens=24, ignore_eos=True))
             for i in range(32)]
    table = overhead_table(24)
    for c in (1, 4, 16):
        for k in (0, 2, 4):
            point = measure_point(engine, pairs, c, k, reps=5)
            if point:
                add_row(table, point)
    console.print(table)
    training_throughput(target, args.device, args.train_tokens, console)
    if args.device == "cuda":
        console.print(f"peak CUDA memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    console.print(f"gpu_check: {'PASS' if ok else 'FAIL'} in {time.perf_counter() - t:.0f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""Forward-pass cost of the target (and draft) at the shapes speculative decoding uses.

One process, one model file, several forward paths side by side, each timed over the same
shapes (rows x new tokens after a fixed cached context) in interleaved rounds:

  eager     transformers' forward with its DynamicCache, weights as loaded
  packed    the same forward with every linear prepacked into oneDNN's blocked layout
            (specbench.engine.model.pack_linears: what the engine runs on CPU by default)
  runner    the engine's ModelRunner on the packed weights: slot KV cache, per-row
            positions, slot attention
  fused     the runner with the decoder layers fused (specbench.engine.fused: one stacked
            q/k/v GEMM; SiLU, gate product and residual adds as oneDNN post-ops): what an
            engine step calls on CPU by default, where the architecture is one it fuses
  compiled  torch.compile (inductor, freezing: inductor prepacks and fuses itself) of the
            eager forward; compile time is printed separately (optional: --paths)

Beside them: the memory-bandwidth floor, streamed weight bytes / measured read bandwidth (the
time any pass over a few tokens must take just to stream the weights once; the input embedding
table is left out, since a pass reads only its tokens' rows of it).

    python benchmarks/forward_cost.py                          # 1.5B target, bf16 where native
    python benchmarks/forward_cost.py --dtype float32 --paths eager,packed,runner,fused
    python benchmarks/forward_cost.py --paths runner,fused --shapes 1x1,1x256   # prefill-like
    python benchmarks/forward_cost.py --model qwen2.5-coder-0.5b-instruct
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from specbench.config import EngineConfig
from specbench.engine.fused import can_fuse, fuse_layers
from specbench.engine.model import ModelRunner, pack_linears
from specbench.models.loading import load_model


VOCAB = 256  # token ids drawn below this (any model's vocabulary is larger)


def streamed_bytes(model) -> int:
    """Weight bytes one forward pass must read: every parameter except the input embedding
    table, of which a pass reads only the rows of its tokens (unless the LM head shares it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or emb.weight is not head.weight:
        total -= emb.weight.numel() * emb.weight.element_size()
    return total


def read_bandwidth(n_bytes: int = 2 << 30) -> float:
    """Bytes/s of streaming a buffer larger than any cache once (a sum reads every byte)."""
    buf = torch.ones(n_bytes // 4, dtype=torch.float32)
    buf.sum()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t)
    return n_bytes / min(times)


class HFPath:
    """transformers' forward + DynamicCache; each call feeds rows x width after `context`."""

    def __init__(self, model, fn=None):
        self.model, self.fn = model, (model if fn is None else fn)
        self.cache, self.shape = None, None

    def setup(self, rows: int, context: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            self.model(input_ids=torch.randint(0, VOCAB, (rows, context)), cache=self.cache,
                       logits_to_keep=torch.tensor([context - 1]))

    def __call__(self, rows: int, context: int, width: int) -> None:
        with torch.inference_mode():
            self.fn(input_ids=torch.randint(0, VOCAB, (rows, width)), cache=self.cache)
        self.cache.crop(-width)


class RunnerPath:
    def __init__(self, model):
        self.runner = ModelRunner(model)

    def setup(self, rows: int, context: int) -> None:
        self.runner.reserve(rows, context + 32)
        for b in range(rows):
            self.runner.forward(torch.randint(0, VOCAB, (1, context)), slice(b, b + 1),
                                torch.zeros(1, dtype=torch.long), positions=None, prefill=True)

    def __call__(self, rows: int, context: int, width: int) -> None:
        self.runner.forward(torch.randint(0, VOCAB, (rows, width)), slice(0, rows),
                            torch.full((rows,), context))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--shapes", default="1x1,1x5,4x1,4x5,16x1,16x5", help="rows x tokens per row")
    ap.add_argument("--paths", default="eager,packed,runner,fused")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is shown")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    names = [p.strip() for p in args.paths.split(",")]
    console = Console(width=160)
    cfg = EngineConfig(device="cpu", dtype=args.dtype)

    paths: dict[str, object] = {}
    weight_bytes = 0
    compile_s = None
    dtype = None
    for name in names:
        loaded = load_model(args.model, cfg)
        model, dtype = loaded.model, loaded.dtype
        weight_bytes = streamed_bytes(model)
        if name == "eager":
            paths[name] = HFPath(model)
        elif name == "packed":
            pack_linears(model)
            paths[name] = HFPath(model)
        elif name == "runner":
            pack_linears(model)
            paths[name] = RunnerPath(model)
        elif name == "fused":
            fusable, why = can_fuse(model)
            if not fusable:
                raise SystemExit(f"--paths fused: {args.model} has layers it does not fuse: {why}")
            fuse_layers(model)
            pack_linears(model)
            paths[name] = RunnerPath(model)
        elif name == "compiled":
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
            paths[name] = HFPath(model, torch.compile(model, dynamic=False))
        else:
            raise SystemExit(f"unknown path {name!r}; valid: eager, packed, runner, fused, compiled")
    bw = read_bandwidth()
    gc.collect()
    console.print(f"{args.model}: {weight_bytes / 1e9:.2f} GB of weights read per pass ({str(dtype).replace('torch.', '')}), "
                  f"read bandwidth {bw / 1e9:.1f} GB/s, floor {weight_bytes / bw * 1e3:.1f} ms, "
                  f"{torch.get_num_threads()} threads, context {args.context}")

    times: dict[tuple[str, tuple[int, int]], list[float]] = {}
    for rows, width in shapes:
        for name, path in paths.items():
            path.setup(rows, args.context)
            if name == "compiled":
                t = time.perf_counter()
                path(rows, args.context, width)
                compile_s = (compile_s or 0.0) + time.perf_counter() - t
            path(rows, args.context, width)  # warm
        for r in range(args.rounds):
            order = list(paths.items()) if r % 2 == 0 else list(paths.items())[::-1]
            for name, path in order:
                t = time.perf_counter()
                path(rows, args.context, width)
                times.setdefault((name, (rows, width)), []).append(time.perf_counter() - t)
        console.print(f"{rows}x{width}: " + ", ".join(
            f"{n} {statistics.median(times[(n, (rows, width))]) * 1e3:.0f} ms" for n in paths))

    table = Table(title=f"forward cost, {args.model}, {args.context}-token context (median of {args.rounds})")
    table.add_column("rows x tokens")
    for name in paths:
        table.add_column(f"{name} ms", justify="right")
        table.add_column(f"{name} / 1x1", justify="right")
    table.add_column("floor ms", justify="right")
    one = {n: statistics.median(times[(n, (1, 1))]) for n in paths} if (1, 1) in shapes else None
    for shape in shapes:
        row = [f"{shape[0]} x {shape[1]}"]
        for name in paths:
            t = statistics.median(times[(name, shape)])
            row += [f"{t * 1e3:.0f}", f"{t / one[name]:.2f}" if one else "-"]
        table.add_row(*row, f"{weight_bytes / bw * 1e3:.0f}")
    console.print(table)
    if compile_s is not None:
        console.print(f"compile time (inductor, all shapes): {compile_s:.1f} s")


if __name__ == "__main__":
    main()

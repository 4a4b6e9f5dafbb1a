"""Host overhead per decode step: the eager step against the static step, with compute removed.

A GPU runs a decode step of a small model in about the time it takes the host to launch it,
so an engine whose step is thousands of dispatched ops measures its own Python there. This
benchmark shows that cost on any machine: random Qwen2 models with the default pair's depth
(target 28 layers, draft 24) but hidden size 64 and a 1,000-token vocabulary, so the
arithmetic is negligible and a step's time is its host work (op dispatch, Python, launches).

For each path (`eager`: Engine(pack=False), the path CUDA takes today; `static`: the static
step op by op; `compile`: the static step through torch.compile; `cudagraph` on CUDA), each
configuration (baseline; draft_model k=4 greedy; draft_model k=4 at T=0.8, top-p 0.95) and
each batch size, B requests with 128-token prompts are admitted, the step is warmed up (graphs
are built there: `build_s`), and then the steps are timed in blocks, the configurations
interleaved in ABBA order so that drift favours none. Printed per row: host ms per step
(median over the timed steps), dispatched aten ops per step and host reads per step (each
read of a tensor's value by Python, and each explicit synchronize: on a GPU every one of
them waits for the device), counted in separate untimed steps, and the ratio to eager.

On a CPU the compiled step's own kernels run on the host too, so its host ms is not what a
GPU's host would spend. For the `compile` path, separate steps after the timed ones also time
the calls of the compiled graphs themselves (Inductor's generated kernels and the library
calls they make: what a captured CUDA graph replays on the device) and report the rest of the
step, `outside_ms` (Python, dynamo's guard checks, the table's one read, which a CUDA-graph
replay has no guard checks for: an upper bound of a captured GPU step's host work), with its
ratio to eager's host ms.

    python benchmarks/host_overhead.py                               # eager vs compile, batch 1 and 4
    python benchmarks/host_overhead.py --paths eager,static,compile --layers 8,6 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator

import torch
from rich.console import Console
from rich.table import Table
from transformers import Qwen2Config, Qwen2ForCausalLM

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.eagle3 import fit_to_target
from specbench.models.eagle3_train import head_config_for, init_head
from specbench.models.medusa import MedusaConfig, MedusaHeads

PATHS = ("eager", "static", "compile", "cudagraph")


def random_model(layers: int, hidden: int, vocab: int, seed: int, device: str) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False, attn_implementation="sdpa", dtype="float32")
    return Qwen2ForCausalLM(cfg).eval().to(device)


def random_head(target: Qwen2ForCausalLM, vocab: int, seed: int) -> torch.nn.Module:
    """A random EAGLE-3 head for `target` (one layer, the default feature layers) over a
    256-token draft vocabulary: a head's per-step cost, whatever it drafts."""
    size = min(vocab, 256)
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    n = target.config.num_hidden_layers
    aux = None if n >= 4 else tuple(range(min(3, n + 1)))  # the default layers need a deeper target
    head = init_head(target, head_config_for(target, draft_vocab_size=size, aux_layers=aux), ids, seed=seed)
    dev = next(target.parameters()).device
    return fit_to_target(head.to(dev), target, path="<random>", target_name="random")


def random_medusa(target: Qwen2ForCausalLM, k: int, seed: int) -> torch.nn.Module:
    """k random Medusa heads (one residual block each) on `target`'s hidden size and vocabulary."""
    torch.manual_seed(seed)
    cfg = target.config
    heads = MedusaHeads(MedusaConfig(num_heads=k, num_layers=1, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                                     draft_vocab_size=cfg.vocab_size))
    return heads.eval().to(next(target.parameters()).device)


@contextlib.contextmanager
def count_reads(engine: Engine) -> Iterator[list[int]]:
    """Counts Python reads of tensor values (item, tolist, bool, int, float) and explicit
    synchronizes while inside: [count]."""
    n = [0]
    names = ("item", "tolist", "__bool__", "__int__", "__float__")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def wrap(fn):
        def counted(self, *a, **k):
            n[0] += 1
            return fn(self, *a, **k)
        return counted

    sync = engine._sync
    engine._sync = wrap(lambda _: sync()).__get__(engine)
    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(fn))
    try:
        yield n
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        engine._sync = sync


@contextlib.contextmanager
def graph_time() -> Iterator[list[float]]:
    """Seconds spent inside compiled graphs (Inductor's CompiledFxGraph calls: the generated
    kernels and the library calls they make) while inside: [total]. The wrapper's own few
    instructions count as outside the graph."""
    from torch._inductor.output_code import CompiledFxGraph

    total = [0.0]
    real = CompiledFxGraph.__call__

    def timed(self, inputs):
        inner = self.current_callable

        def run(x):
            t = time.perf_counter()
            try:
                return inner(x)
            finally:
                total[0] += time.perf_counter() - t
        self.current_callable = run
        try:
            return real(self, inputs)
        finally:
            self.current_callable = inner
    CompiledFxGraph.__call__ = timed
    try:
        yield total
    finally:
        CompiledFxGraph.__call__ = real


def count_ops(step) -> int:
    """aten ops dispatched by one call of step() (top-level ones: an op another op calls is
    not counted again). Kernels a compiled graph generates are not aten ops."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


class Point:
    """One (path, configuration, batch size): its own engine and running batch."""

    def __init__(self, path: str, label: str, spec: SpeculativeConfig, sampling: SamplingParams, batch: int,
                 target, draft, prompt_len: int, vocab: int, steps: int, cpp_wrapper: bool = False, head=None):
        self.path, self.label, self.spec, self.batch_size = path, label, spec, batch
        self.engine = Engine(target, draft, pack=False, static=None if path == "eager" else path, head=head,
                             compile_options={"cpp_wrapper": True} if cpp_wrapper and path == "compile" else None)
        self.batch = self.engine.batch(spec)
        k = spec.num_speculative_tokens
        self.split_steps = max(4, steps // 2)  # the compile path's steps timed apart (`measure`)
        sp = sampling.with_(max_new_tokens=(steps + self.split_steps + 8) * (k + 1) + 8, ignore_eos=True)
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]
        self.batch.reserve(batch, prompt_len + sp.max_new_tokens)
        for i, p in enumerate(prompts):
            self.batch.admit(p, sp.with_(seed=i))
        self.times: list[float] = []

    def warm(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def step(self) -> float:
        t = time.perf_counter()
        self.batch.step()
        dt = time.perf_counter() - t
        if len(self.batch) != self.batch_size:
            raise RuntimeError(f"{self.path} {self.label}: a row finished early (budget too small)")
        return dt

    def measure(self) -> dict:
        with count_reads(self.engine) as reads:
            self.step()
        ops = count_ops(self.step)
        graphs = getattr(self.batch, "graphs", None)
        graph_ms = outside_ms = None
        if self.path == "compile":
            with graph_time() as inside:
                wall = sum(self.step() for _ in range(self.split_steps))
            graph_ms, outside_ms = 1e3 * inside[0] / self.split_steps, 1e3 * (wall - inside[0]) / self.split_steps
        return {"path": self.path, "method": self.spec.method, "k": self.spec.num_speculative_tokens,
                "batch": self.batch_size, "sampling": "sampled" if self.label.endswith("sampled") else "greedy",
                "tree": self.spec.draft_nodes if self.spec.is_tree else None, "topk": self.spec.topk,
                "host_ms": statistics.median(self.times) * 1e3, "ops": ops, "syncs": reads[0],
                "build_s": round(graphs.build_s, 2) if graphs is not None else 0.0,
                "graphs": len(graphs.built) if graphs is not None else 0, "steps": len(self.times),
                "graph_ms": graph_ms, "outside_ms": outside_ms}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default="eager,compile", help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--layers", default="28,24", help="target,draft decoder layers (the default pair's: 28,24)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--batch", default="1,4", help="batch sizes")
    ap.add_argument("-k", type=int, default=4, help="draft tokens per step")
    ap.add_argument("--configs", default="baseline,greedy,sampled",
                    help="of baseline, greedy (draft_model k, greedy), sampled (draft_model k, T=0.8, top-p 0.95), "
                         "tree (draft_model, a static tree k deep: the best child and the second-best at every "
                         "depth, 2k nodes, greedy), dtree (draft_model, a dynamic EAGLE-2 tree k deep, topk 2, the "
                         "2k best of its candidates kept, greedy), eagle3 (a random EAGLE-3 head on the target, k, "
                         "greedy), medusa (k random Medusa heads, greedy), e3tree (the EAGLE-3 head drafting the tree "
                         "of `tree`), mtree (the k Medusa heads drafting it)")
    ap.add_argument("--steps", type=int, default=24, help="timed steps per point (in blocks of 4, ABBA)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cpp-wrapper", action="store_true",
                    help="compile: Inductor's C++ wrapper (less host time per step, minutes of C++ per graph)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = ap.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        ap.error(f"--paths: unknown {', '.join(bad)} (valid: {', '.join(PATHS)})")
    try:
        t_layers, d_layers = (int(x) for x in args.layers.split(","))
        batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error("--layers takes TARGET,DRAFT and --batch comma-separated integers")
    torch.set_num_threads(args.threads)
    console = Console(stderr=args.json, width=160)
    target = random_model(t_layers, args.hidden, args.vocab, 0, args.device)
    draft = random_model(d_layers, args.hidden, args.vocab, 1, args.device)
    # a static tree k deep: the best child and the second-best at every depth (2k nodes)
    chain_and_seconds = tuple((0,) * (d - 1) + (r,) for d in range(1, args.k + 1) for r in (0, 1))
    configs = [("baseline", SpeculativeConfig(), SamplingParams()),
               ("draft_model greedy", SpeculativeConfig(method="draft_model", num_speculative_tokens=args.k, draft="d"),
                SamplingParams()),
               ("draft_model sampled", SpeculativeConfig(method="draft_model", num_speculative_tokens=args.k, draft="d"),
                SamplingParams(temperature=0.8, top_p=0.95)),
               ("draft_model tree", SpeculativeConfig(method="draft_model", num_speculative_tokens=args.k, draft="d",
                                                      token_tree=chain_and_seconds), SamplingParams()),
               ("draft_model dtree", SpeculativeConfig(method="draft_model", num_speculative_tokens=args.k, draft="d",
                                                       topk=2, num_draft_tokens=2 * args.k + 1), SamplingParams()),
               ("eagle3 eagle3", SpeculativeConfig(method="eagle3", num_speculative_tokens=args.k, draft="h"),
                SamplingParams()),
               ("medusa medusa", SpeculativeConfig(method="medusa", num_speculative_tokens=args.k, draft="h"),
                SamplingParams()),
               ("eagle3 e3tree", SpeculativeConfig(method="eagle3", num_speculative_tokens=args.k, draft="h",
                                                   token_tree=chain_and_seconds), SamplingParams()),
               ("medusa mtree", SpeculativeConfig(method="medusa", num_speculative_tokens=args.k, draft="h",
                                                  token_tree=chain_and_seconds), SamplingParams())]
    wanted = {c.strip() for c in args.configs.split(",")}
    known = {"baseline", "greedy", "sampled", "tree", "dtree", "eagle3", "medusa", "e3tree", "mtree"}
    if wanted - known:
        ap.error(f"--configs: unknown {', '.join(sorted(wanted - known))}")
    configs = [c for c in configs if c[0].split()[-1] in wanted]
    heads = {"eagle3": random_head(target, args.vocab, 2) if wanted & {"eagle3", "e3tree"} else None,
             "medusa": random_medusa(target, args.k, 3) if wanted & {"medusa", "mtree"} else None}
    points = []
    with torch.inference_mode():
        for path in paths:
            for label, spec, sp in configs:
                for b in batches:
                    t = time.perf_counter()
                    pt = Point(path, label, spec, sp, b, target, draft, args.prompt, args.vocab, args.steps,
                               args.cpp_wrapper, head=heads.get(spec.method))
                    pt.warm(3)
                    console.print(f"[dim]{path} {label} batch {b}: ready in {time.perf_counter() - t:.1f} s[/]")
                    points.append(pt)
        blocks = max(1, args.steps // 4)
        for i in range(blocks):  # ABBA: every other block runs the points in reverse order
            for pt in points if i % 2 == 0 else reversed(points):
                pt.times += [pt.step() for _ in range(4)]
        rows = [pt.measure() for pt in points]
    eager = {(r["method"], r["sampling"], r["tree"], r["topk"], r["batch"]): r["host_ms"] for r in rows
             if r["path"] == "eager"}
    for r in rows:
        base = eager.get((r["method"], r["sampling"], r["tree"], r["topk"], r["batch"]))
        r["vs_eager"] = round(r["host_ms"] / base, 3) if base else None
        r["outside_vs_eager"] = round(r["outside_ms"] / base, 3) if base and r["outside_ms"] is not None else None
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    cpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else _cpu_name()
    table = Table(title=f"host work per step: {t_layers}/{d_layers} layers, hidden {args.hidden}, "
                        f"vocab {args.vocab}, {args.prompt}-token prompts, float32, {args.threads} thread(s), {cpu}")
    for col in ("path", "configuration", "batch", "host ms/step", "x eager", "outside graphs ms", "x eager ",
                "aten ops/step", "host reads/step", "graphs", "build s"):
        table.add_column(col, justify="left" if col in ("path", "configuration") else "right")
    for r in rows:
        label = "baseline" if r["method"] == "none" else f"{r['method']} k={r['k']} {r['sampling']}" + \
            (f", {'dynamic tree (topk ' + str(r['topk']) + ')' if r['topk'] > 1 else 'tree'} of {r['tree']} nodes"
             if r["tree"] else "")
        table.add_row(r["path"], label, str(r["batch"]), f"{r['host_ms']:.2f}",
                      "" if r["vs_eager"] is None else f"{r['vs_eager']:.2f}",
                      "" if r["outside_ms"] is None else f"{r['outside_ms']:.2f}",
                      "" if r["outside_vs_eager"] is None else f"{r['outside_vs_eager']:.2f}", str(r["ops"]), str(r["syncs"]),
                      str(r["graphs"]), f"{r['build_s']:.1f}")
    console.print(table)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "cpu"


if __name__ == "__main__":
    sys.exit(main())

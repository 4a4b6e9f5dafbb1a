"""`specbench serve` under concurrency: does a batch of concurrent clients cost about one pass?

Starts `specbench serve` (default: the perf gate's tiny fixture models, float32, CPU), then in
interleaved rounds times one request alone and N requests sent at once (same length, greedy,
ignore EOS), and prints the wall times, their ratio, and the mean batch size the server
reported on /metrics. With continuous batching the ratio stays far below N.

    python benchmarks/serve_concurrency.py                   # tiny models, 8 clients, goal <= 2.5x
    python benchmarks/serve_concurrency.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --max-tokens 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from specbench.backends.launcher import ServerLauncher
from specbench.backends.openai import parse_prometheus

HERE = Path(__file__).resolve().parent


def counters(base: str) -> tuple[float, float]:
    m = parse_prometheus(httpx.get(base + "/metrics").text)
    return m["specbench:engine_steps_total"][0][1], m["specbench:engine_step_rows_total"][0][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        target, draft = args.target, args.draft
        if target is None:
            subprocess.run([sys.executable, str(HERE / "perf_gate" / "make_models.py"), tmp], check=True,
                           stdout=subprocess.DEVNULL)
            target, draft = f"{tmp}/target", f"{tmp}/draft"
        template = ("{python} -m specbench.server --target {target} --port {port} --dtype " + args.dtype
                    + " --device cpu" + (" --draft {draft} -k " + str(args.k) if draft else ""))
        launcher = ServerLauncher(template, {"python": sys.executable, "target": target, "draft": draft},
                                  ready_timeout_s=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        base = launcher.start()
        try:
            body = {"prompt": [11, 12, 13, 14, 15, 16], "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True}

            def one(_: int = 0) -> float:
                t = time.perf_counter()
                httpx.post(base + "/v1/completions", json=body, timeout=600).raise_for_status()
                return time.perf_counter() - t

            one()  # warm-up
            alone, together = [], []
            steps0, rows0 = counters(base)
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(one, range(args.clients)))  # warm the batched shapes
                for r in range(args.rounds):
                    for what in (("alone", "together") if r % 2 == 0 else ("together", "alone")):
                        if what == "alone":
                            alone.append(one())
                        else:
                            t = time.perf_counter()
                            list(pool.map(one, range(args.clients)))
                            together.append(time.perf_counter() - t)
            steps, rows = counters(base)
        finally:
            launcher.stop()
    a, b = statistics.median(alone), statistics.median(together)
    print(f"one request: {a * 1e3:.0f} ms; {args.clients} at once: {b * 1e3:.0f} ms; "
          f"ratio {b / a:.2f}x (goal <= 2.5x); mean batch size {(rows - rows0) / (steps - steps0):.2f} "
          f"({args.max_tokens} tokens per request, {args.rounds} rounds, median)")


if __name__ == "__main__":
    main()

"""How on time `specbench run --trace` sends a trace: a seeded Poisson trace (--requests at
--rate requests/s, --input/--output tokens each) replayed by the openai backend against the
known-timing server (its own process; first token 20 ms after a request is read, then one
every 10 ms). Per request, the send lag is when its bytes went out minus when the trace said
(records' sent_s - arrival_s); the server's log (its read times) gives the gaps between
requests as the server saw them, against the trace's gaps (connection set-up and request
parsing included).

    nice -n 10 .venv/bin/python benchmarks/trace_lag.py --requests 200 --rate 20

Name the CPU (`lscpu`) and the load (printed) with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_fidelity import ROOT, Server, write_inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--input", type=int, default=64)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        prompts, tok_dir = write_inputs(tmp, 8)
        rng = np.random.default_rng(a.seed)
        times = np.cumsum(rng.exponential(1000.0 / a.rate, a.requests))
        trace = tmp / "trace.jsonl"
        trace.write_text("".join(json.dumps({"timestamp": round(float(t), 3), "input_length": a.input,
                                             "output_length": a.output}) + "\n" for t in times))
        server = Server({"ttft_s": 0.020, "itl_s": 0.010}, env)
        try:
            out = tmp / "run"
            cmd = [sys.executable, "-m", "specbench", "run", "--backend", "openai", "--base-url", server.url,
                   "--tokenizer", str(tok_dir), "--workload", str(prompts), "--trace", str(trace), "--method", "none",
                   "--warmup", "1", "--no-chat-template", "--out", str(out)]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
            if p.returncode != 0:
                raise SystemExit(f"specbench run failed ({p.returncode}):\n{p.stderr[-3000:]}")
            wall = time.perf_counter() - t0
            log = server.call("/_log")
        finally:
            server.close()
        import pandas as pd

        df = pd.read_parquet(out / "samples.parquet").sort_values("arrival_s")
        lag = (df["sent_s"] - df["arrival_s"]).to_numpy() * 1e3
        streams = sorted((s for s in log if s["tokens"] == a.output), key=lambda s: s["read"])[-a.requests:]
        reads = np.array([s["read"] for s in streams])
        gap_error = np.abs(np.diff(reads) - np.diff(times) / 1000.0) * 1e3
    print(f"trace: {a.requests} requests, Poisson at {a.rate:g}/s, {a.input} in / {a.output} out tokens; "
          f"run {wall:.1f} s; load {os.getloadavg()[0]:.2f}")
    for name, xs in (("client send lag (sent_s - arrival_s)", lag),
                     ("server-read gap minus trace gap, |error|", gap_error)):
        print(f"{name}: p50 {np.percentile(xs, 50):.2f} ms, p99 {np.percentile(xs, 99):.2f} ms, max {xs.max():.2f} ms")


if __name__ == "__main__":
    main()

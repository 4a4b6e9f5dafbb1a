"""A soak of the server path: `specbench run --backend openai` for --minutes at --concurrency
against the known-timing server with a seeded mix of faults (dropped streams, 429s with
Retry-After, stalls), then the accounting, from the records and the server's own log:

- every request in the records, succeeded + failed = requests planned;
- the server received exactly the attempts the records count (sum of `attempts`), so
  retries = attempts - requests, and each failure class beside what the server injected;
- the client's memory flat: its RSS (sampled every --rss-every s) at the end within 10% of
  its RSS after the first minute.

    .venv/bin/python benchmarks/soak.py                       # 10 min, c=64, 1% drops, 1% 429, 0.5% stalls
    .venv/bin/python benchmarks/soak.py --minutes 1 --concurrency 16

Name the CPU (`lscpu`) with the figures; nothing here is a timing, so load only changes
how many requests fit in the minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_fidelity import ROOT, Server, write_inputs  # noqa: E402


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def error_class(error) -> str:
    if not isinstance(error, str) or not error:
        return "ok"
    for prefix, name in (("HTTP 429", "HTTP 429"), ("HTTP 5", "HTTP 5xx"), ("stream dropped", "dropped"),
                         ("stream ended without", "dropped"), ("timed out", "timeout")):
        if error.startswith(prefix):
            return name
    return "other: " + error[:60]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--drop", type=float, default=0.01)
    ap.add_argument("--status-429", type=float, default=0.01)
    ap.add_argument("--stall", type=float, default=0.005)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--rss-every", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import pandas as pd

    sched = {"ttft_s": 0.05, "itl_s": 0.02, "token_ids": True}
    faults = {"drop": args.drop, "status_429": args.status_429, "stall": args.stall, "seed": args.seed}
    per_request = sched["ttft_s"] + args.tokens * sched["itl_s"]
    n = int(args.minutes * 60 * args.concurrency / per_request)
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    prompts, tok_dir = write_inputs(tmp, n)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    srv = Server(sched, env, faults)
    out = tmp / "run"
    cmd = [sys.executable, "-m", "specbench", "run", "--backend", "openai", "--base-url", srv.url,
           "--tokenizer", str(tok_dir), "--workload", str(prompts), "--num-prompts", str(n),
           "--max-new-tokens", str(args.tokens), "--concurrency", str(args.concurrency), "--method", "none",
           "--warmup", "0", "--retries", str(args.retries), "--no-chat-template", "--ignore-eos", "--out", str(out)]
    print(f"{n} requests of {args.tokens} tokens at concurrency {args.concurrency} (~{args.minutes:g} min), "
          f"faults {faults}, --retries {args.retries}; load {os.getloadavg()}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp)
    rss: list[tuple[float, float]] = []
    try:
        while proc.poll() is None:
            r = rss_mib(proc.pid)
            if r is not None:
                rss.append((time.monotonic() - t0, r))
            time.sleep(args.rss_every)
        output = proc.stdout.read()
        if proc.returncode != 0:
            raise SystemExit(f"specbench run failed ({proc.returncode}):\n{output[-3000:]}")
        log = [s for s in srv.call("/_log") if s["tokens"] == args.tokens]
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.close()
    wall = time.monotonic() - t0
    df = pd.read_parquet(out / "samples.parquet")
    classes = df["error"].map(error_class).value_counts().to_dict()
    attempts = int(df["attempts"].sum())
    injected: dict[str, int] = {}
    for s in log:
        injected[s["fault"] or "none"] = injected.get(s["fault"] or "none", 0) + 1
    print(f"\nwall {wall / 60:.1f} min; records {len(df)} of {n} planned "
          f"({'every request accounted' if len(df) == n and df['prompt_id'].nunique() == n else 'MISSING REQUESTS'})")
    print(f"  succeeded {classes.get('ok', 0)}, failed {len(df) - classes.get('ok', 0)}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(classes.items()) if k != "ok"))
    print(f"  attempts in the records {attempts} = requests received by the server {len(log)}: "
          f"{'yes' if attempts == len(log) else 'NO'}; retries {attempts - len(df)}")
    print("  the server injected: " + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())))
    after_1min = next((r for t, r in rss if t >= 60), rss[0][1] if rss else float("nan"))
    end = rss[-1][1] if rss else float("nan")
    print(f"  client RSS: {after_1min:.0f} MiB after the first minute, {end:.0f} MiB at the end "
          f"({100 * (end / after_1min - 1):+.1f}%; {'flat' if end <= 1.1 * after_1min else 'GREW'}); "
          f"max {max(r for _, r in rss):.0f} MiB over {len(rss)} samples")
    step = max(1, len(rss) // 12)
    print("  RSS over time (s: MiB): " + ", ".join(f"{t:.0f}: {r:.0f}" for t, r in rss[::step]))


if __name__ == "__main__":
    main()

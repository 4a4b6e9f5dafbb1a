"""Helpers for the report tests: synthetic runs written through the records API (no models),
the `specbench` entry point with the report command, and a headless Chromium driven over the
DevTools protocol.

Chromium is driven with `--remote-debugging-pipe`: the DevTools protocol as NUL-terminated
JSON on file descriptors 3 (commands in) and 4 (replies and events out), the transport
Puppeteer and Playwright use. Compared with `--remote-debugging-port` it needs no free port,
no websocket client and no polling for the browser to come up, and the browser cannot outlive
the pipe; compared with `--dump-dom` plus console logging on stderr it reports console errors
and uncaught exceptions as structured events, can wait for the plots to render and can take a
screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
from specbench.metrics import sample_metrics
from specbench.records import RunMetadata, RunWriter, make_row
from specbench.types import Request, Result, StepEvent

# --------------------------------------------------------------------------------------
# Synthetic runs


def sample_row(run_id: str, spec: SpeculativeConfig, concurrency: int, prompt_id: str, *,
               tpot: float, ttft: float = 0.05, n_out: int = 17, arrival: float = 0.0,
               accepted: tuple[int, ...] = (), peak: int | None = None,
               output: list[int] | None = None, reference: list[int] | None = None,
               category: str = "code", workload: str = "real", kind: str = "real",
               temperature: float = 0.0, error: str | None = None) -> dict[str, Any]:
    """A records row whose tokens come at arrival + ttft + i * tpot (so TPOT is exactly
    `tpot`), with one verification step per entry of `accepted` (k = spec's k), or one plain
    decode step per token after the first for the baseline; steps run at batch size
    `concurrency`."""
    req = Request(id=prompt_id, prompt_ids=(1, 2, 3),
                  sampling=SamplingParams(temperature=temperature, max_new_tokens=n_out),
                  category=category, workload=workload, kind=kind)
    k = spec.num_speculative_tokens
    steps, ctx = [], 4
    for a in (accepted if spec.speculative else [0] * (n_out - 1)):
        d = k if spec.speculative else 0
        steps.append(StepEvent(d, a, -1 if a == d else a, a + 1, 1e-3 if d else 0.0, 2e-3,
                               batch_size=concurrency, context_tokens=ctx))
        ctx += a + 1
    if error:
        res = Result(prompt_id, [], arrival, arrival, [], "error", error=error)
    else:
        times = [arrival + ttft + i * tpot for i in range(n_out)]
        ids = output if output is not None else [(7 * i) % 250 for i in range(n_out)]
        res = Result(prompt_id, ids, arrival, arrival, times, "length", steps=steps,
                     target_forward_passes=1 + len(steps), prefill_time_s=ttft / 2,
                     peak_memory_bytes=peak)
    m = sample_metrics(req, res, config_start=0.0, reference_ids=reference)
    return make_row(run_id=run_id, config_id=f"{spec.short}-c{concurrency}", backend="embedded",
                    spec=spec, concurrency=concurrency, request_rate=None, request=req, metrics=m)


def write_run(path: Path, rows: list[dict], *, config: dict | None = None,
              complete: bool = True) -> Path:
    """Write rows as a run directory through RunWriter, as `specbench run` does."""
    cfg = {"target": "tiny-target", "draft": "tiny-draft", "dtype": "float32",
           "dtype_resolved": "float32", "backend": "embedded", **(config or {})}
    meta = RunMetadata.collect(path.name, cfg, device="cpu (x86_64)",
                               command=["specbench", "run", "--out", str(path)])
    writer = RunWriter(path, meta)
    writer.add(rows)
    writer.close(complete=complete)
    return path


CATEGORIES = ("code", "chat", "business")
ALPHA = {"code": 0.85, "chat": 0.55, "business": 0.7}  # per-token acceptance probability


def synthetic_run(path: Path, *, method: str = "draft_model", ks=(2, 4), concurrencies=(1, 4),
                  n_prompts: int = 12, workload: str = "real", kind: str = "real",
                  seed: int = 0, baseline: bool = True, diverge: bool = True) -> Path:
    """A plausible run without models: speculation wins at concurrency 1 and loses at the
    highest concurrency, acceptance depends on the category, one output diverges from the
    baseline, and run.json carries batch-size statistics."""
    rng = np.random.default_rng(seed)
    run_id = path.name
    prompts = [(f"p{i:02d}", CATEGORIES[i % 3]) for i in range(n_prompts)]
    base_tpot = {p: 0.02 * (1 + 0.3 * rng.random()) for p, _ in prompts}
    outputs = {p: [int(x) for x in rng.integers(0, 250, 17)] for p, _ in prompts}
    rows, stats = [], {}
    draft = "tiny-draft" if method == "draft_model" else None
    for ci, c in enumerate(concurrencies):
        load = 1 + 0.25 * ci  # everything slows down with concurrency
        specs = ([BASELINE] if baseline else []) + [
            SpeculativeConfig(method=method, num_speculative_tokens=k, draft=draft) for k in ks]
        for spec in specs:
            k = spec.num_speculative_tokens
            for j, (p, cat) in enumerate(prompts):
                accepted: list[int] = []
                if spec.speculative:
                    produced = 1
                    while produced < 17:
                        a = 0
                        while a < k and rng.random() < ALPHA[cat]:
                            a += 1
                        accepted.append(a)
                        produced += a + 1
                    # fast at low concurrency, slower than the baseline at the highest
                    last = ci == len(concurrencies) - 1
                    gain = (1.3 + 0.1 * k) if ci == 0 else (0.75 if last else 1.1)
                    tpot = base_tpot[p] * load / gain * (1 + 0.05 * rng.standard_normal())
                else:
                    tpot = base_tpot[p] * load * (1 + 0.05 * rng.standard_normal())
                out = list(outputs[p])
                if diverge and spec.speculative and k == max(ks) and j == 1 and ci == 0:
                    out[5] = (out[5] + 1) % 250
                rows.append(sample_row(
                    run_id, spec, c, p, tpot=tpot, ttft=0.04 * load * (1 + rng.random()),
                    arrival=0.01 * j, accepted=tuple(accepted),
                    peak=int((900 + (120 if spec.speculative else 0) + 10 * c) * 2**20),
                    output=out, reference=None if not spec.speculative else outputs[p],
                    category=cat, workload=workload, kind=kind))
            config_id = f"{spec.short}-c{c}"
            sizes = {str(b): int(rng.integers(5, 40)) for b in range(1, c + 1)}
            stats[config_id] = {"wall_s": 1.0, "steps": sum(sizes.values()),
                                "batch_sizes": sizes, "peak_memory_bytes": None}
    return write_run(path, rows, config={
        "method": method, "workload": workload, "workload_kind": kind,
        "num_speculative_tokens": list(ks), "concurrency": list(concurrencies),
        "num_prompts": n_prompts, "sampling": {}, "configuration_stats": stats})



# --------------------------------------------------------------------------------------
# The command line


from cli_harness import specbench  # noqa: E402,F401  (re-exported to the report tests)


# --------------------------------------------------------------------------------------
# Headless Chromium over the DevTools protocol


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-dev-shm-usage", "--remote-debugging-pipe")


def find_chromium() -> str | None:
    env = os.environ.get("SPECBENCH_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal DevTools protocol client over Chromium's debugging pipe."""

    def __init__(self, binary: str, user_data_dir: Path, log: Path, timeout: float = 60.0):
        self.timeout = timeout
        self.events: list[dict] = []
        self._buf = b""
        self._id = 0
        cmd_r, self._cmd_w = os.pipe()
        self._ev_r, ev_w = os.pipe()

        def to_fds_3_and_4() -> None:
            # Move both ends clear of 3 and 4 first (either may already sit there), then into
            # place; dup2 makes the copies inheritable across exec.
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(ev_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            # close_fds would run after preexec_fn and close 3 and 4 again; Python's own
            # descriptors are non-inheritable anyway.
            preexec_fn=to_fds_3_and_4, close_fds=False)
        os.close(cmd_r)
        os.close(ev_w)

    def _read_until(self, match, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                msg = json.loads(raw)
                self.events.append(msg)
                if match(msg):
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self._ev_r], [], [], left)
            if ready:
                chunk = os.read(self._ev_r, 1 << 20)
                if not chunk:
                    raise EOFError(f"Chromium exited (code {self.proc.poll()})")
                self._buf += chunk

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        i = self._id
        reply = self._read_until(lambda m: m.get("id") == i)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def wait_event(self, method: str, session: str | None = None) -> dict:
        for m in self.events:
            if m.get("method") == method and m.get("sessionId") == session:
                return m
        return self._read_until(lambda m: m.get("method") == method and m.get("sessionId") == session)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._ev_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()


@dataclass
class PageResult:
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    plots: list[dict] = field(default_factory=list)
    omitted: int = 0
    screenshot: Path | None = None
    requests: list[str] = field(default_factory=list)
    extra: Any = None  # the value of `script`, run after the screenshot


# Runs in the page once it has loaded: every plot container and what it rendered.
_INSPECT = """
(async () => {
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const out = [];
  const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  for (const el of document.querySelectorAll('.plot')) {
    const gd = el.querySelector('.js-plotly-plot');
    const box = (gd || el).getBoundingClientRect();
    const legend = el.querySelector('g.legend');
    const titles = Array.from(el.querySelectorAll('g.annotation')).map(a => a.getBoundingClientRect());
    const lb = legend ? legend.getBoundingClientRect() : null;
    out.push({
      legend_overlaps_titles: lb ? titles.filter(t => overlap(lb, t)).length : 0,
      id: gd ? gd.id : null,
      width: box.width, height: box.height,
      svgs: el.querySelectorAll('svg.main-svg').length,
      traces: gd && gd._fullData ? gd._fullData.length : 0,
      marks: el.querySelectorAll('g.trace path, g.trace image, g.hm image, g.point, path.point').length,
    });
  }
  return {plots: out, omitted: document.querySelectorAll('.omitted').length};
})()
"""


def load_in_chromium(binary: str, html: Path, workdir: Path, width: int = 1400,
                     script: str | None = None) -> PageResult:
    """Open `html` from disk in headless Chromium; collect console errors, uncaught exceptions,
    network requests and what each plot container rendered; save a full-page screenshot to
    `workdir/report.png`; then evaluate `script` (a JS expression) and keep its value."""
    workdir.mkdir(parents=True, exist_ok=True)
    dt = DevTools(binary, workdir / "profile", workdir / "chromium.log")
    result = PageResult()
    try:
        target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            dt.call(f"{domain}.enable", session=sid)
        dt.call("Emulation.setDeviceMetricsOverride",
                {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, sid)
        dt.call("Page.navigate", {"url": html.resolve().as_uri()}, sid)
        dt.wait_event("Page.loadEventFired", sid)
        got = dt.call("Runtime.evaluate", {"expression": _INSPECT, "awaitPromise": True,
                                           "returnByValue": True}, sid)
        value = got["result"]["value"]
        result.plots, result.omitted = value["plots"], value["omitted"]
        size = dt.call("Page.getLayoutMetrics", session=sid)["cssContentSize"]
        shot = dt.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}}, sid)
        result.screenshot = workdir / "report.png"
        result.screenshot.write_bytes(base64.b64decode(shot["data"]))
        if script:
            got = dt.call("Runtime.evaluate", {"expression": script, "returnByValue": True,
                                               "awaitPromise": True}, sid)
            if "exceptionDetails" in got:
                raise AssertionError(f"script failed: {got['exceptionDetails']}")
            result.extra = got["result"].get("value")
    finally:
        dt.close()
    for m in dt.events:
        p = m.get("params", {})
        if m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            result.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                  for a in p.get("args", [])))
        elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            result.console_errors.append(p["entry"].get("text", ""))
        elif m.get("method") == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            result.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))
        elif m.get("method") == "Network.requestWillBeSent":
            result.requests.append(p.get("request", {}).get("url", ""))
    return result

"""What the OpenAI backend says about one configuration beside its samples: the entry of
run.json's `configuration_stats` (where acceptance came from, per-request figures pooled
and the server-wide /metrics deltas side by side, errors, how tokens were counted) and the
console lines that word it.

Acceptance scope: "request" when any response carried per-request figures (`specbench
serve`'s steps, vLLM's per-request metrics, SGLang's counters), "server" when only /metrics
moved (the deltas count every request the server handled meanwhile), "none" otherwise.

Boundary: `Result`s and counter dicts in, a dict and lines of text out.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from specbench.acceptance import SpecDecodingStats
from specbench.backends.openai.lag import LAG_KEYS, summarize_lags
from specbench.backends.openai.prometheus import counter_deltas, counters_reset
from specbench.formatting import dash_or
from specbench.types import Result


def _observe(stats: SpecDecodingStats, r: Result) -> bool:
    """Add one result's per-request acceptance to `stats`; whether it carried any. Per-position
    counts come from step events, per-step arrays or vLLM's histogram, whichever it has."""
    if r.steps:
        stats.observe_steps(r.steps)
        return True
    ra = r.reported_acceptance
    if ra is None:
        return False
    stats.add_totals(ra.num_steps, ra.drafted, ra.accepted)
    if ra.accepted_per_step is not None:
        for a in ra.accepted_per_step:
            stats.observe_accepted(a)
        # positions up to the longest draft, accepted or not
        stats.observe_accepted(0, max(ra.drafted_per_step or (), default=0), count=0)
    elif ra.histogram is not None:  # index j: drafts that accepted exactly j
        for j, n in enumerate(ra.histogram):
            stats.observe_accepted(j, count=n)
    return True


def request_acceptance(results: Sequence[Result]) -> dict[str, Any] | None:
    """Per-request acceptance pooled over `results`, in the shape of `counter_deltas` (so the
    two can be set side by side); None when no result carries any."""
    tally = Tally()
    for r in results:
        tally.add(r)
    return tally.acceptance()


class Tally:
    """A configuration's figures gathered result by result as each finishes, so a run of
    tens of thousands of requests need not hold every `Result` (output ids and per-token
    times, a few KiB each) until its end: acceptance pooled, errors, sources, and the two
    loop-lag figures per request (8 bytes each)."""

    def __init__(self) -> None:
        self.requests = self.errors = 0
        self._acceptance = SpecDecodingStats()
        self._seen = False
        self.sources: set[str] = set()
        self.lags = {key: array("d") for key in LAG_KEYS}

    def add(self, r: Result) -> None:
        self.requests += 1
        self.errors += r.finish_reason == "error"
        self._seen |= _observe(self._acceptance, r)
        if r.reported_acceptance is not None:
            self.sources.add(r.reported_acceptance.source)
        if r.steps:
            self.sources.add("specbench")
        for key, xs in self.lags.items():
            if r.extra.get(key) is not None:
                xs.append(r.extra[key])

    def acceptance(self) -> dict[str, Any] | None:
        return self._acceptance.to_dict() if self._seen else None

    def stats(self, before: dict | None, after: dict | None, wall: float, token_counting: str) -> dict[str, Any]:
        """The configuration's run.json entry, with the /metrics scrapes around it."""
        request_spec = self.acceptance()
        server_spec = counter_deltas(before, after)
        scope = "request" if request_spec is not None else ("server" if server_spec is not None else "none")
        return {"wall_s": wall, "requests": self.requests, "errors": self.errors,
                "acceptance_scope": scope, "acceptance_sources": sorted(self.sources),
                "server_spec_decode": server_spec,
                "request_spec_decode": request_spec, "token_counting": token_counting,
                "server_counters_reset": counters_reset(before, after), "peak_memory_bytes": None,
                "client_loop_lag": summarize_lags(self.lags)}


def configuration_stats(results: list[Result], before: dict | None, after: dict | None, wall: float,
                        token_counting: str) -> dict[str, Any]:
    """The configuration's run.json entry, from its results and the /metrics scrapes around it."""
    tally = Tally()
    for r in results:
        tally.add(r)
    out = tally.stats(before, after, wall, token_counting)
    del out["client_loop_lag"]
    return out


def acceptance_lines(configuration_stats: dict[str, dict]) -> list[str]:
    """Console lines saying where each configuration's acceptance figures come from."""
    lines = []
    for config_id, info in configuration_stats.items():
        scope = (info or {}).get("acceptance_scope")
        srv = (info or {}).get("server_spec_decode") or {}
        if (info or {}).get("server_counters_reset"):
            lines.append(f"{config_id}: the server's /metrics counters went backwards during it (the server "
                         "restarted): no server-wide acceptance for this configuration")
        if scope == "server" and srv.get("num_drafts"):
            lines.append(f"{config_id}: acceptance is server-wide (/metrics deltas over every request the "
                         f"server handled, not per sample): rate {srv['acceptance_rate']:.3f}, "
                         f"{srv['mean_acceptance_length']:.2f} tokens per step over {srv['num_drafts']} drafts")
        elif scope == "server":
            lines.append(f"{config_id}: the server's spec-decode counters did not move (nothing drafted)")
        elif scope == "request" and srv.get("num_drafts"):
            req = (info or {}).get("request_spec_decode") or {}
            src = ", ".join((info or {}).get("acceptance_sources") or []) or "server"
            lines.append(f"{config_id}: acceptance per request ({src}): rate {dash_or(req.get('acceptance_rate'), '.3f')}, "
                         f"{dash_or(req.get('mean_acceptance_length'), '.2f')} tokens per step over "
                         f"{req.get('num_drafts')} drafts; /metrics deltas: rate {dash_or(srv.get('acceptance_rate'), '.3f')}, "
                         f"{dash_or(srv.get('mean_acceptance_length'), '.2f')} over {srv['num_drafts']} drafts")
        elif scope == "none" and (info or {}).get("speculative") and not (info or {}).get("server_counters_reset"):
            lines.append(f"{config_id}: no acceptance figures (no per-request data, no vllm:spec_decode_* "
                         "counters on /metrics)")
        errors = (info or {}).get("errors")
        if errors:
            lines.append(f"{config_id}: {errors} request(s) failed (finish_reason error; see the error column)")
    return lines

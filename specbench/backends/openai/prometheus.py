"""vLLM's spec-decode counters read from a server's /metrics (Prometheus text format): the
samples parsed, the counters summed over engines and models, and the deltas of two scrapes
with vLLM's derived acceptance figures (`specbench.acceptance`).

Boundary: text in, counts out; the scrape itself is the client's.
"""

from __future__ import annotations

import re
from typing import Any

from specbench.acceptance import COUNT_FIELDS, PER_POSITION, PROMETHEUS, SpecDecodingStats

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: name -> [(labels, value)]. Comments and `_created` skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1).endswith("_created"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def spec_decode_counters(samples: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any] | None:
    """vLLM's spec-decode counters summed over engines/models; None when the server has none
    (vLLM registers them only when it speculates)."""
    def series(name: str) -> list[tuple[dict[str, str], float]]:
        return samples.get(name + "_total", []) + samples.get(name, [])

    if not any(series(n) for n in [*(name for name, _ in PROMETHEUS.values()), PER_POSITION[0]]):
        return None
    out: dict[str, Any] = {key: sum(v for _, v in series(name)) for key, (name, _) in PROMETHEUS.items()}
    per_pos: dict[int, float] = {}
    for labels, value in series(PER_POSITION[0]):
        try:
            pos = int(labels.get("position", ""))
        except ValueError:
            continue
        per_pos[pos] = per_pos.get(pos, 0.0) + value
    out["num_accepted_tokens_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return out


def counters_reset(before: dict[str, Any] | None, after: dict[str, Any] | None) -> bool:
    """Whether a counter went backwards between two scrapes: the server restarted between
    them, so no delta of them means anything."""
    if before is None or after is None:
        return False
    b, a = before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"]
    return (any(after[k] < before[k] for k in COUNT_FIELDS)
            or any((a[i] if i < len(a) else 0.0) < b[i] for i in range(len(b))))


def counter_deltas(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """after - before, plus the derived acceptance figures (vLLM's definitions). None when
    either scrape lacks the counters or a counter went backwards (server restarted)."""
    if before is None or after is None or counters_reset(before, after):
        return None
    totals = {k: after[k] - before[k] for k in COUNT_FIELDS}
    b, a = before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"]
    n = max(len(a), len(b))
    per_pos = [(a[i] if i < len(a) else 0.0) - (b[i] if i < len(b) else 0.0) for i in range(n)]
    return SpecDecodingStats(**{k: int(v) for k, v in totals.items()},
                             num_accepted_tokens_per_pos=[int(x) for x in per_pos]).to_dict()

"""Arrival traces: replaying a production hour (`specbench run --trace FILE`).

A trace is JSONL in the Mooncake / AIPerf shape, one request a line: `timestamp` (ms since
the trace began, non-decreasing), `input_length` and `output_length` (tokens), and optionally
`hash_ids` (one id per block of `BLOCK_TOKENS` prompt tokens; equal ids mean the same block,
a shared prefix) or `text_input` (the prompt itself). `load_trace` checks every line and names
file, line and field in one line when one is wrong.

`trace_requests` turns the entries into `Request`s: a prompt of exactly `input_length` tokens
(the text given, else blocks of real text from the run's workload, the same text for the same
hash id, so shared prefixes are really shared), `max_new_tokens` the output length with EOS
ignored (a trace fixes lengths: say so, it biases acceptance), and the arrival schedule in
seconds from the first request, divided by `speedup`.

Boundary: a trace file and a tokenizer in, requests and send times out.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from specbench.config import SamplingParams
from specbench.errors import WorkloadError
from specbench.types import Request
from specbench.workload.files import jsonl_rows
from specbench.workload.prompt import Workload
from specbench.workload.requests import request_seed

BLOCK_TOKENS = 512  # Mooncake's hash block: 512 prompt tokens per id
MAX_TOKENS = 1 << 22  # a length past this is a typo, not a request


@dataclass(frozen=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    text: str | None = None
    line: int = 0  # its line in the trace file


def _length(row: dict, name: str, where: str, minimum: int) -> int:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise WorkloadError(f"{where}: field {name!r} must be an integer number of tokens, got {value!r}")
    if not minimum <= value <= MAX_TOKENS:
        raise WorkloadError(f"{where}: field {name!r} must be between {minimum} and {MAX_TOKENS}, got {value!r}")
    return int(value)


def _entry(row: Any, where: str, previous_ms: float | None, line: int) -> TraceEntry:
    if not isinstance(row, dict):
        raise WorkloadError(f"{where}: expected a JSON object with timestamp, input_length and output_length")
    ts = row.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise WorkloadError(f"{where}: field 'timestamp' must be a number of ms >= 0, got {ts!r}")
    if previous_ms is not None and ts < previous_ms:
        raise WorkloadError(f"{where}: field 'timestamp' {ts:g} is before the previous line's {previous_ms:g}; "
                            "a trace's timestamps must not decrease")
    text = row.get("text_input")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise WorkloadError(f"{where}: field 'text_input' must be a non-empty string, got {text!r}"[:300])
    hashes = row.get("hash_ids") or []
    if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                for h in hashes):
        raise WorkloadError(f"{where}: field 'hash_ids' must be a list of integers >= 0")
    inp = _length(row, "input_length", where, 1) if text is None or "input_length" in row else 0
    out = _length(row, "output_length", where, 1)
    if hashes and inp > len(hashes) * BLOCK_TOKENS:
        raise WorkloadError(f"{where}: {len(hashes)} hash_ids cover {len(hashes) * BLOCK_TOKENS} tokens "
                            f"({BLOCK_TOKENS} each), fewer than input_length {inp}")
    return TraceEntry(float(ts), inp, out, tuple(hashes), text, line)


def load_trace(path: Path) -> list[TraceEntry]:
    """Every entry of a trace file, checked (see the module docstring)."""
    if not path.is_file():
        raise WorkloadError(f"{path}: trace file not found")
    entries: list[TraceEntry] = []
    try:
        _read(path, entries)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start} of a line); a trace is "
                            "JSONL, one object a line") from None
    if not entries:
        raise WorkloadError(f"{path}: empty trace")
    return entries


def _read(path: Path, entries: list[TraceEntry]) -> None:
    for where, row in jsonl_rows(path):
        line = int(where.rsplit(":", 1)[1])
        entries.append(_entry(row, where, entries[-1].timestamp_ms if entries else None, line))


class _Corpus:
    """Token ids of real text, cut into windows: the same key, the same window."""

    def __init__(self, workload: Workload, tokenizer: Any):
        text = "\n\n".join(p.display_text for p in workload.prompts)
        self.ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(self.ids) < 2:
            raise WorkloadError(f"{workload.name}: too little text to synthesize trace prompts from")

    def window(self, key: str, n: int) -> list[int]:
        start = zlib.crc32(key.encode()) % len(self.ids)
        out: list[int] = []
        while len(out) < n:
            out.extend(self.ids[start:start + n - len(out)])
            start = 0
        return out


def trace_requests(entries: Sequence[TraceEntry], tokenizer: Any, base: SamplingParams, workload: Workload, *,
                   speedup: float = 1.0, seed: int = 0, max_context: int | None = None,
                   source: str = "trace") -> tuple[list[Request], list[float]]:
    """(requests, send time of each in s from the first), see the module docstring. A request
    longer than `max_context` (prompt + output) is refused, naming its line of `source`."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise WorkloadError(f"--trace-speedup must be a number > 0, got {speedup!r}")
    corpus = None
    t0 = entries[0].timestamp_ms
    requests, schedule = [], []
    for i, e in enumerate(entries):
        if e.text is not None:
            ids = list(tokenizer.encode(e.text, add_special_tokens=False))
            ids = ids[:e.input_length] if e.input_length else ids
        else:
            corpus = corpus or _Corpus(workload, tokenizer)
            keys = [f"block:{h}" for h in e.hash_ids] or [f"request:{seed}:{i}"]
            ids = [t for k in keys for t in corpus.window(k, BLOCK_TOKENS if e.hash_ids else e.input_length)]
            ids = ids[:e.input_length]
        if not ids:
            raise WorkloadError(f"{source}:{e.line}: its prompt is no token long with this tokenizer")
        if max_context is not None and len(ids) + e.output_length > max_context:
            raise WorkloadError(f"{source}:{e.line}: {len(ids)} prompt + {e.output_length} output tokens exceed the "
                                f"model's context of {max_context}")
        rid = f"trace-{i:05d}"
        sampling = base.with_(max_new_tokens=e.output_length, ignore_eos=True,
                              seed=request_seed(base.seed, rid))
        requests.append(Request(id=rid, prompt_ids=tuple(ids), sampling=sampling, category="trace",
                                workload=workload.name, kind=workload.kind,
                                prompt_text=tokenizer.decode(ids, skip_special_tokens=False)))
        schedule.append((e.timestamp_ms - t0) / 1000.0 / speedup)
    return requests, schedule

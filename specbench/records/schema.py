"""The records schema: one pyarrow `SCHEMA`, its column descriptions, and `make_row`, which
turns a request, its result's metrics and the configuration into one row.

Boundary: the shape of a row and nothing else; files are `specbench.records.files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from specbench.config import SpeculativeConfig
from specbench.metrics import METRIC_COLUMNS
from specbench.types import Request

if TYPE_CHECKING:
    pass


SAMPLES_FILE = "samples.parquet"
RUN_FILE = "run.json"
JOURNAL_FILE = ".samples.journal.arrows"  # every sample as it completes; gone once the run closes
METADATA_KEY = b"specbench"
SCHEMA_VERSION = 7
DEFAULT_RUNS_DIR = Path("runs")


def _f(name: str, type_: pa.DataType, description: str, nullable: bool = False, unit: str = "") -> pa.Field:
    """One column: its description and, for a quantity, its unit (field metadata `unit`: s, bytes,
    tokens, requests/s, ...), which a name ending in `_s`, `_bytes` or `_tokens` also states."""
    metadata = {"description": description, **({"unit": unit} if unit else {})}
    return pa.field(name, type_, nullable=nullable, metadata=metadata)


_I32 = pa.int32()
_I64 = pa.int64()
_F64 = pa.float64()
_STR = pa.string()

SCHEMA = pa.schema(
    [
        # --- what was run -------------------------------------------------------------
        _f("run_id", _STR, "Run identifier (also the run directory name)."),
        _f("config_id", _STR, "Configuration label within the run (method, k, concurrency)."),
        _f("backend", _STR, "Backend that served the request: embedded | hf | openai."),
        _f("method", _STR, "Speculative method: none | draft_model | ngram | eagle3 | medusa | suffix."),
        _f("num_speculative_tokens", _I32,
           "k: draft tokens proposed per verification step (0 = baseline).", unit="tokens"),
        _f("topk", _I32,
           "Draft trees: children expanded per node (1 = a chain; null: written before trees).", True),
        _f("num_draft_tokens", _I32,
           "Tokens each row verifies per step, root included (a chain: k + 1; 1 = baseline; null: written "
           "before trees).", True, unit="tokens"),
        _f("draft_model", _STR,
           "Draft model name or path (draft_model), the EAGLE-3 head's directory (eagle3) or the "
           "Medusa heads' directory (medusa); "
           "null otherwise.", True),
        _f("concurrency", _I32, "Maximum requests in flight at once."),
        _f("request_rate", _F64,
           "Poisson arrival rate in requests/s (null = all requests at once, closed loop).", True,
           unit="requests/s"),
        _f("is_baseline", pa.bool_(), "True for the non-speculative reference configuration."),
        # --- the prompt and how it was sampled ------------------------------------------
        _f("workload", _STR, "Prompt set name."),
        _f("workload_kind", _STR, "Prompt set kind: real | high-entropy | regression | custom."),
        _f("category", _STR, "Prompt category within the workload (e.g. code, chat)."),
        _f("prompt_id", _STR,
           "Prompt identifier, stable across runs (pairs baseline and speculative samples)."),
        _f("scenario", _STR,
           "What the prompt asks the output to be: free | json | tools | regex | grammar | choice "
           "(its response_format, tools / tool_choice or structured_outputs; specbench.structured)."),
        _f("conversation_id", _STR,
           "A replayed conversation (--turns): its first prompt's id, shared by its turns; null for single prompts.",
           True),
        _f("turn", _I32,
           "A replayed conversation's turn, 1-based (its prompt holds the turns before, with this "
           "configuration's own answers); null for single prompts.", True),
        _f("repeat", _I32, "Which repeat of the prompt this sample is (0-based; --repeats), paired across configurations."),
        _f("block", _I32,
           "Which interleaved block of its concurrency level the sample was measured in (0-based, "
           "counted on over repeats). A block's prompts ran together under each configuration in "
           "turn, so above concurrency 1 the block, not the prompt, is the unit a paired interval "
           "treats as independent. Null in runs written before schema 6.", True),
        _f("seed", _I64, "Per-request sampling seed (null = derived from the prompt id).", True),
        _f("temperature", _F64, "Sampling temperature (0 = greedy)."),
        _f("top_p", _F64, "Nucleus sampling mass (1 = off)."),
        _f("top_k", _I32, "Top-k sampling cutoff (0 = off)."),
        _f("max_new_tokens", _I32, "Cap on generated tokens.", unit="tokens"),
        _f("input_tokens", _I32, "Prompt length in tokens.", unit="tokens"),
        _f("output_tokens", _I32, "Generated tokens.", unit="tokens"),
        # --- latency, from per-token timestamps (vLLM definitions) ----------------------
        _f("arrival_s", _F64,
           "Arrival time in s, relative to the start of this configuration: when the request was due "
           "(a slot freed, its --request-rate arrival, or its send time in a replayed --trace).", True, unit="s"),
        _f("sent_s", _F64,
           "When the request actually went out, on the same clock (openai: its bytes written to the socket; "
           "embedded: its prefill began): arrival_s + queue_s. sent_s - arrival_s is the send lag of a "
           "replayed trace.", True, unit="s"),
        _f("finish_s", _F64,
           "Last-token time in s, relative to the start of this configuration.", True, unit="s"),
        _f("ttft_s", _F64, "Time to first token in s: arrival to first output token (openai: from when the "
           "request's bytes were written to the server's socket).", True, unit="s"),
        _f("tpot_s", _F64,
           "Time per output token in s: (e2e_s - ttft_s) / (output_tokens - 1).", True, unit="s"),
        _f("e2e_s", _F64, "End-to-end latency in s: arrival to last output token (openai: from the write, as "
           "ttft_s).", True, unit="s"),
        _f("queue_s", _F64, "Queue wait in s: arrival to start of prefill (openai: the client's "
           "wait from when the request was due, its slot freed or its --request-rate arrival, "
           "until its bytes were written: a concurrency slot and the client's own send delay).", unit="s"),
        _f("itl_s", pa.list_(_F64),
           "Inter-token latencies in s (zero gaps inside one accepted burst kept).", unit="s"),
        _f("chunk_itl_s", pa.list_(_F64),
           "Gaps in s between successive token-carrying arrivals: streamed chunks (openai, as "
           "vllm bench serve's ITL) or emitting engine steps (embedded).", unit="s"),
        # --- speculative decoding -------------------------------------------------------
        _f("target_forward_passes", _I32, "Target model forward passes, prefill included."),
        _f("num_steps", _I32, "Verification steps that proposed at least one draft token."),
        _f("drafted_tokens", _I32, "Draft tokens proposed, summed over steps.", unit="tokens"),
        _f("accepted_tokens", _I32, "Draft tokens accepted, summed over steps.", unit="tokens"),
        _f("acceptance_rate", _F64,
           "accepted_tokens / drafted_tokens (null when nothing was drafted).", True),
        _f("mean_acceptance_length", _F64,
           "1 + accepted_tokens / num_steps: tokens per drafting step, vLLM's definition (1 for baseline).",
           unit="tokens/step"),
        _f("tokens_per_target_pass", _F64,
           "output_tokens / target_forward_passes (prefill included): steps without drafts count.", True,
           unit="tokens/pass"),
        _f("accepted_per_step", pa.list_(_I32), "Accepted draft tokens at each verification step.", unit="tokens"),
        _f("rejection_positions", pa.list_(_I32),
           "First rejected draft index at each verification step (-1 = all accepted)."),
        _f("prefill_time_s", _F64, "Time of the prefill pass in s (embedded: one pass holds the requests "
           "admitted together, and each of them records its whole time).", unit="s"),
        _f("draft_time_s", _F64, "Time spent drafting in s, summed over steps.", unit="s"),
        _f("verify_time_s", _F64, "Time spent in target verification in s, summed over steps.", unit="s"),
        # --- per target step after the prefill (drafting or not), one entry each -------------
        _f("step_batch_size", pa.list_(_I32),
           "Rows in the target pass of each step (null entries: not reported by the backend)."),
        _f("step_context_tokens", pa.list_(_I32),
           "Tokens in context (prompt + output so far) before each step (null: not reported).", unit="tokens"),
        _f("step_drafted", pa.list_(_I32), "Draft tokens proposed at each step (0 = plain decode step).",
           unit="tokens"),
        _f("step_accepted", pa.list_(_I32), "Draft tokens accepted at each step.", unit="tokens"),
        _f("step_emitted", pa.list_(_I32), "Tokens emitted by each step (accepted + 1, clipped at a stop).",
           unit="tokens"),
        _f("step_draft_depth", pa.list_(_I32),
           "Depth of the draft tree of each step (a chain: step_drafted; null, or null entries: not "
           "reported).", True),
        _f("step_accepted_ranks", pa.list_(pa.list_(_I32)),
           "Per step, the branch rank (0 = the drafter's best child) of each accepted node along the "
           "accepted path, root's child first (a chain: zeros; null, or null entries: not reported).", True),
        _f("step_draft_time_s", pa.list_(_F64),
           "Drafting time of each step in s (shared by the rows of a batched step).", unit="s"),
        _f("step_verify_time_s", pa.list_(_F64),
           "Target verification time of each step in s (shared by the rows of a batched step).", unit="s"),
        _f("peak_memory_bytes", _I64,
           "Peak memory in bytes the backend reported (accelerator, or process RSS on CPU).", True,
           unit="bytes"),
        # --- outcome --------------------------------------------------------------------
        _f("finish_reason", _STR, "Why generation ended: stop | length | error | cancelled."),
        _f("error", _STR, "Error message (null when the request succeeded).", True),
        _f("output_token_ids", pa.list_(_I32), "Generated token ids."),
        _f("token_match_rate", _F64,
           "Fraction of positions equal to the reference output (agreeing positions / longer "
           "length; null without a reference).", True),
        _f("first_divergence", _I32,
           "First position that differs from the reference output (-1 = identical; null without "
           "a reference).", True),
        # --- the client's own fidelity (openai) ---------------------------------------------
        _f("token_count_delta", _I32,
           "openai: the server's usage.completion_tokens minus the tokens the client counted in the "
           "stream (token ids, logprobs or the re-tokenized text); output_tokens is the server's "
           "count. Null without usage, and for the other backends.", True, unit="tokens"),
        _f("client_loop_lag_s", _F64,
           "openai: the worst delay of the client's event loop while the request was in flight (a "
           "1 ms timer firing late): its timestamps may be late by up to this much. Null for the "
           "other backends.", True, unit="s"),
        _f("attempts", _I32,
           "openai: how many times the request was sent (1, or more with --retries: a retry after a "
           "429/5xx, a timeout or a dropped stream); TTFT and E2E are timed from the last attempt's write, "
           "queue_s holds the attempts before it. Null for the other backends.", True),
        _f("output_valid", pa.bool_(),
           "Structured output: whether the output parses and satisfies its JSON schema, tool signature, "
           "regex or choices; null for free prompts, grammars, failed requests and backends that return "
           "no text.", True),
        _f("validation_error", _STR,
           "Structured output: the first reason the output is not valid (null when valid or not checked).", True),
        _f("meets_slo", pa.bool_(),
           "Whether the sample met every --goodput SLO (TTFT, TPOT, E2E latency; vLLM's goodput "
           "definition); null when the run set none.", True),
    ]
)

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
# Columns each schema version added; runs written by an older version read them back as nulls.
ADDED_IN: dict[int, frozenset[str]] = {
    2: frozenset({"repeat", "tokens_per_target_pass", "step_batch_size", "step_context_tokens", "step_drafted",
                  "step_accepted", "step_emitted", "step_draft_time_s", "step_verify_time_s"}),
    3: frozenset({"chunk_itl_s"}),
    4: frozenset({"token_count_delta", "client_loop_lag_s", "meets_slo", "topk", "num_draft_tokens",
                  "step_draft_depth", "step_accepted_ranks"}),
    5: frozenset({"attempts"}),
    6: frozenset({"block"}),
    7: frozenset({"scenario", "output_valid", "validation_error", "sent_s", "conversation_id", "turn"}),
}


def added_since(version: int) -> frozenset[str]:
    """Columns a run written with schema `version` lacks (filled with nulls when read)."""
    return frozenset().union(*(cols for v, cols in ADDED_IN.items() if v > version))

_REQUIRED_NON_NULL = frozenset(f.name for f in SCHEMA if not f.nullable)

assert set(METRIC_COLUMNS) <= set(COLUMNS), set(METRIC_COLUMNS) - set(COLUMNS)


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {"double": "float64", "bool": "bool", "string": "string"}.get(str(t), str(t))


def column_docs() -> list[tuple[str, str, str, str]]:
    """(name, type, unit, description) for every column, in schema order (the table in
    docs/records.md, written by `python tests/schemadoc.py`). Types read like `float64`,
    `list<int32>`; nullable columns end in `?`; the unit is "" where a column has none."""
    return [
        (f.name, _type_name(f.type) + ("?" if f.nullable else ""), f.metadata.get(b"unit", b"").decode(),
         f.metadata[b"description"].decode())
        for f in SCHEMA
    ]


def make_row(
    *,
    run_id: str,
    config_id: str,
    backend: str,
    spec: SpeculativeConfig,
    concurrency: int,
    request_rate: float | None,
    request: Request,
    metrics: dict[str, Any],
    is_baseline: bool | None = None,
    repeat: int = 0,
    block: int | None = None,
    meets_slo: bool | None = None,
) -> dict[str, Any]:
    """One records row: the configuration and request columns plus `metrics`
    (the dict from `specbench.metrics.sample_metrics`). `is_baseline` defaults to whether
    `spec` is non-speculative."""
    s = request.sampling
    row: dict[str, Any] = {
        "run_id": run_id,
        "config_id": config_id,
        "backend": backend,
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "topk": spec.topk,
        "num_draft_tokens": spec.verify_width,
        "draft_model": spec.draft,
        "concurrency": concurrency,
        "request_rate": request_rate,
        "is_baseline": (not spec.speculative) if is_baseline is None else is_baseline,
        "workload": request.workload,
        "workload_kind": request.kind,
        "category": request.category,
        "prompt_id": request.id,
        "scenario": request.scenario,
        "conversation_id": request.conversation_id,
        "turn": request.turn if request.conversation_id is not None else None,
        "repeat": repeat,
        "block": block,
        "seed": s.seed,
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": s.top_k,
        "max_new_tokens": s.max_new_tokens,
    }
    row.update(metrics)
    row["meets_slo"] = meets_slo
    return row

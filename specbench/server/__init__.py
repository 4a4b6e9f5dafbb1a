"""`specbench serve`'s server: the embedded engine behind an OpenAI-compatible HTTP API that
speaks vLLM's dialect where vLLM has a shape for the same thing, so peers' clients (the
`openai` package, AIPerf, GuideLLM, `vllm bench serve`) and `specbench run --backend openai`
read it, the latter recording exactly what the embedded backend records. Greedy outputs equal
the embedded backend's; a sampled request's tokens depend only on its seed.

One job per module, in the order a request meets them:
- `connection`: the socket: deadlines, body reading, JSON and event-stream replies, refusals
  of malformed HTTP (408, 411, 413, 415, ...);
- `api`: the routes and `SpecbenchServer` (ThreadingHTTPServer), admission (429), the stream
  of one request, cancellation when its client goes away;
- `requests`: the body validated into token ids and `SamplingParams` (4xx naming the field);
- `worker`: `EngineWorker`, the one thread that owns the engine's continuous batch;
- `responses`: the OpenAI shapes plus `token_ids`, `spec_decode`, vLLM's per-request
  `metrics.speculative_decoding` and the model card;
- `exposition`: /metrics in Prometheus text under vLLM's counter names;
- `text`: the shared tokenizer and incremental detokenization.

Boundary: JSON/HTTP and the tokenizer here; token ids in and out of the engine. It never
prints and never imports `specbench.cli`: the command `specbench.cli.serve` loads the models
and runs it. `python -m specbench.server` is `specbench serve` (`__main__.py`, the one entry
point in this package, like `specbench/__main__.py`).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.server.api import LISTEN_BACKLOG, ROUTES, SpecbenchServer, is_loopback
    from specbench.server.connection import MAX_BODY_BYTES, READ_TIMEOUT_S
    from specbench.server.worker import EngineWorker, Job

__getattr__, __dir__ = exports(__name__, {
    "LISTEN_BACKLOG": "specbench.server.api",
    "ROUTES": "specbench.server.api",
    "SpecbenchServer": "specbench.server.api",
    "is_loopback": "specbench.server.api",
    "MAX_BODY_BYTES": "specbench.server.connection",
    "READ_TIMEOUT_S": "specbench.server.connection",
    "EngineWorker": "specbench.server.worker",
    "Job": "specbench.server.worker",
})

__all__ = ["EngineWorker", "Job", "LISTEN_BACKLOG", "MAX_BODY_BYTES", "READ_TIMEOUT_S", "ROUTES",
           "SpecbenchServer", "is_loopback"]

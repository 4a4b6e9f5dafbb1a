"""Prompt sets: named sets shipped with the tool, user files, `hf:` datasets, and their
conversion into tokenized `Request`s.

- `load_workload(spec)`: a named set (`real`, `high-entropy`, `regression`, and the parts
  `humaneval`, `sharegpt`, `business`), a prompt file (.jsonl/.json/.parquet/.csv/.tsv) or
  `hf:NAME[:split]` (local cache or local directory only) -> `Workload` of `Prompt`s.
- `list_workloads()`: the named sets (`WorkloadInfo`).
- `build_requests(workload, tokenizer, base)`: chat template, token ids, context limit and
  per-request sampling -> `(requests, skipped_count)`.

Boundary: text in, `specbench.types.Request` out. Nothing here loads a model or runs one.
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.workload.prompt import SAMPLING_FIELDS, Prompt, Workload, WorkloadInfo
    from specbench.workload.registry import NAMED, list_workloads, load_workload
    from specbench.workload.requests import (
        build_requests,
        render_prompt,
        request_seed,
        resolve_sampling,
    )

__getattr__, __dir__ = exports(__name__, {
    "SAMPLING_FIELDS": "specbench.workload.prompt",
    "Prompt": "specbench.workload.prompt",
    "Workload": "specbench.workload.prompt",
    "WorkloadInfo": "specbench.workload.prompt",
    "NAMED": "specbench.workload.registry",
    "list_workloads": "specbench.workload.registry",
    "load_workload": "specbench.workload.registry",
    "build_requests": "specbench.workload.requests",
    "render_prompt": "specbench.workload.requests",
    "request_seed": "specbench.workload.requests",
    "resolve_sampling": "specbench.workload.requests",
})

__all__ = [
    "NAMED",
    "SAMPLING_FIELDS",
    "Prompt",
    "Workload",
    "WorkloadInfo",
    "build_requests",
    "list_workloads",
    "load_workload",
    "render_prompt",
    "request_seed",
    "resolve_sampling",
]

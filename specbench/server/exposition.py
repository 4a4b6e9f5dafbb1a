"""/metrics of `specbench serve`: the worker's counters in the Prometheus text format 0.0.4,
written as vLLM's prometheus_client writes its own, so scrapers that read vLLM (AIPerf, the
OpenAI backend's `specbench.backends.openai.prometheus`) read these: a counter's HELP and TYPE
lines name it with its `_total` suffix, like its samples (parsers such as AIPerf's type each
sample by the TYPE line of the same name). The spec-decode series exist only when the server
speculates, as in vLLM; their names are `specbench.acceptance.PROMETHEUS`.

Boundary: text from a `ServerCounters` snapshot; no HTTP.
"""

from __future__ import annotations

from specbench.acceptance import PER_POSITION, PROMETHEUS
from specbench.server.worker import ServerCounters


def metrics_text(c: ServerCounters, model_name: str, speculative: bool) -> str:
    """Prometheus text format 0.0.4; counters under vLLM's names."""
    lab = 'model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        full = name + ("_total" if kind == "counter" else "")
        out.append(f"# HELP {full} {help_}")
        out.append(f"# TYPE {full} {kind}")
        out.extend(f"{full}{{{labels}}} {float(v)}" for labels, v in samples)

    metric("vllm:num_requests_running", "gauge", "Requests being decoded.", [(lab, c.running)])
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be decoded.", [(lab, c.waiting)])
    metric("specbench:engine_steps", "counter", "Batched engine steps (one target pass each).",
           [(lab, c.steps)])
    metric("specbench:engine_step_rows", "counter",
           "Rows decoded, summed over steps (divided by engine_steps: the mean running batch size).",
           [(lab, c.step_rows)])
    metric("specbench:request_cancelled", "counter", "Requests whose client went away.",
           [(lab, c.cancelled)])
    metric("vllm:prompt_tokens", "counter", "Prefill tokens processed.", [(lab, c.prompt_tokens)])
    metric("vllm:generation_tokens", "counter", "Generation tokens processed.", [(lab, c.generation_tokens)])
    metric("vllm:request_success", "counter", "Successfully processed requests.",
           [(f'{lab},finished_reason="{r}"', n) for r, n in sorted(c.success.items())])
    if speculative:  # as vLLM: the spec-decode series exist only when speculating
        for key, (name, help_) in PROMETHEUS.items():
            metric(name, "counter", help_, [(lab, getattr(c.spec, key))])
        metric(PER_POSITION[0], "counter", PER_POSITION[1],
               [(f'{lab},position="{i}"', n) for i, n in enumerate(c.spec.num_accepted_tokens_per_pos)])
    return "\n".join(out) + "\n"

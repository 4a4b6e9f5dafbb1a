"""The speculators side of tests/models/test_eagle3_speculators.py: run with the python of a
virtualenv holding speculators==0.9.0 (never specbench's own: speculators pins an older
transformers). It imports nothing from specbench; files (and with `-`, lines of stdin) are the
only interface.

    python speculators_ref.py JOBS.json     (a list of jobs, run in order in one process)
    python speculators_ref.py -             (a list of jobs per line of stdin, each answered
                                             "done" on stdout: one import for several lists)

    {"op": "build", "spec": {...}, "out": DIR}
        a random EAGLE-3 head built with speculators' own classes (Eagle3SpeculatorConfig,
        Eagle3DraftModel) for the verifier spec["verifier"] (a local model directory: its
        embedding is loaded the way speculators loads it), saved with save_pretrained
    {"op": "logits", "head": DIR, "cases": FILE, "out": FILE}
        Eagle3DraftModel.from_pretrained(DIR) run on each case of FILE (safetensors:
        "<i>.features" [T, F], "<i>.ids" [T], "<i>.steps" [1]) through its own forward (the
        training-time test, teacher-forced: step j at position t reads the token ids[t + j]);
        the draft logits of every step are caught at its lm_head and written as "<i>"
        [steps, T, draft vocab], with "d2t" and "layer_ids" (the feature layers it resolved).
        The head's verifier must be a local directory (speculators reads its config, and its
        embedding when the head ships none)
    {"op": "convert", "src": DIR, "out": DIR, "base_model": DIR}
        speculators' converter (Eagle3Converter) from the original EAGLE-3 layout
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def build(spec: dict, out: str) -> None:
    from transformers import LlamaConfig, Qwen3Config

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = {"llama": LlamaConfig, "qwen3": Qwen3Config}[spec.get("model_type", "llama")](**spec["layer"])
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=spec["draft_vocab_size"],
        norm_before_residual=spec["norm_before_residual"],
        eagle_aux_hidden_state_layer_ids=spec.get("aux_layers"),
        target_hidden_size=layer.hidden_size,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            verifier=VerifierConfig.from_pretrained(spec["verifier"])))
    model = Eagle3DraftModel(config)
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms away from 1, so a misplaced norm shows in the logits
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
            else:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        vocab = layer.vocab_size
        if spec["draft_vocab_size"] < vocab:  # a scattered draft vocabulary: d2t offsets matter
            ids = torch.randperm(vocab, generator=g)[: spec["draft_vocab_size"]].sort().values
            model.d2t.copy_(ids - torch.arange(ids.numel()))
            model.t2d.zero_()
            model.t2d[ids] = True
    model.load_verifier_weights()  # the verifier's embedding, as speculators' training does
    model.save_pretrained(out)


def logits(head: str, cases: str, out: str) -> None:
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(head, torch_dtype=torch.float32)
    with safe_open(f"{head}/model.safetensors", "pt") as fh:
        shipped = set(fh.keys())
    if "embed_tokens.weight" not in shipped:
        # speculators 0.9.0 loads the verifier's embedding only where its own reads NaN, but
        # with transformers 5.19 a weight missing from the checkpoint is left uninitialized
        # (whatever memory held), so a head without embed_tokens would run on garbage: load
        # the verifier's explicitly, which is what that check means to do (and what vLLM does)
        model._load_verifier_weights(overwrite_embed_tokens=True)  # noqa: SLF001
    model.config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "eager"  # noqa: SLF001
    model._attn_impl = "eager"  # noqa: SLF001
    from speculators.models.attention import create_float_mask

    model._create_mask_fn = create_float_mask  # noqa: SLF001
    assert not torch.isnan(model.embed_tokens.weight).any(), "no embedding: neither the head's nor the verifier's"
    model = model.float().eval()
    caught: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda mod, inp, outp: caught.append(outp.detach().clone()))
    cases = load_file(cases)
    d2t = model.d2t if model.d2t is not None else torch.zeros(model.draft_vocab_size, dtype=torch.long)
    results = {"d2t": d2t.long().contiguous(),
               "layer_ids": torch.tensor(model.config.eagle_aux_hidden_state_layer_ids, dtype=torch.long)}
    for i in range(len({k.split(".")[0] for k in cases})):
        caught.clear()
        feats, ids = cases[f"{i}.features"].float(), cases[f"{i}.ids"].long()
        steps = int(cases[f"{i}.steps"][0])
        with torch.no_grad():
            model(hidden_states=feats.unsqueeze(0), input_ids=ids.unsqueeze(0),
                  document_ids=torch.zeros(1, ids.numel(), dtype=torch.long), ttt_steps=steps)
        results[str(i)] = torch.cat(caught, dim=0).contiguous()  # [steps, T, draft vocab]
    save_file(results, out)


def convert(src: str, out: str, base_model: str) -> None:
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    Eagle3Converter().convert(src, out, base_model=base_model, validate=True)


def run(jobs: list[dict]) -> None:
    for job in jobs:
        op = job.pop("op")
        {"build": build, "logits": logits, "convert": convert}[op](**job)


if __name__ == "__main__":
    if sys.argv[1] == "-":
        answers = sys.stdout
        for line in sys.stdin:
            with contextlib.redirect_stdout(sys.stderr):  # whatever the jobs print is not an answer
                run(json.loads(line))
            print("done", file=answers, flush=True)
    else:
        run(json.loads(open(sys.argv[1]).read()))

"""Fused decoder layers (specbench.engine.fused): the same function as transformers' layers.

In float32 the fused pass equals the unfused one up to summation order, for each
architecture it fuses (Qwen2 with q/k/v biases, Llama with biases everywhere, Mistral with a
sliding window), at prefill and at ragged decode over the slot cache; greedy decoding through
the engine gives the same tokens either way. Architectures it does not fuse are left alone with
a reason. (Baseline and speculative outputs on the fused path: tests/engine/test_engine.py and
test_lossless_sampling.py, whose engines fuse by default.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine.engine import Engine
from specbench.engine.fused import FusedLayer, can_fuse, fuse_layers
from specbench.engine.model import ModelRunner, pack_linears

VOCAB = 300
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             initializer_range=0.2, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
             pad_token_id=None, attn_implementation="sdpa", dtype="float32")


def llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**SMALL, "attention_bias": True, **overrides})).eval()


def mistral() -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(**SMALL, sliding_window=8)).eval()


MODELS = {"qwen2": lambda: tiny.make_model(vocab_size=VOCAB, seed=0), "llama": llama, "mistral": mistral}


def _passes(model) -> list[torch.Tensor]:
    """Logits and the captured layer inputs (EAGLE-3 reads them) of a prefill of two rows (20
    and 13 tokens), then of a ragged 2-row x 3-token pass."""
    runner = ModelRunner(model, rows=2, capacity=64, capture_layers=(0, 1, 2))
    g = torch.Generator().manual_seed(0)
    out = []
    for row, n in ((0, 20), (1, 13)):
        out += runner.forward(torch.randint(0, VOCAB, (1, n), generator=g), slice(row, row + 1),
                              torch.tensor([0]), positions="all", prefill=True)
    out += runner.forward(torch.randint(0, VOCAB, (2, 3), generator=g), slice(0, 2),
                          torch.tensor([20, 13]), positions="all")
    return out


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_fused_layers_compute_what_transformers_layers_compute(arch):
    model = MODELS[arch]()
    reference = copy.deepcopy(model)
    pack_linears(reference)
    assert can_fuse(model) == (True, "")
    before = ModelRunner(model).weight_bytes
    assert fuse_layers(model) == SMALL["num_hidden_layers"]
    assert fuse_layers(model) == 0 and can_fuse(model) == (True, "")  # idempotent
    pack_linears(model)
    assert all(isinstance(layer, FusedLayer) for layer in model.model.layers)
    assert ModelRunner(model).weight_bytes == before
    want, got = _passes(reference), _passes(model)
    assert len(want) == len(got) == 6
    for w, g in zip(want, got):
        assert torch.allclose(g, w, atol=1e-4, rtol=1e-4), (g - w).abs().max()


def test_unfused_architectures_are_left_alone_with_a_reason():
    gelu = llama(hidden_act="gelu")
    ok, why = can_fuse(gelu)
    assert not ok and "activation" in why and "SiLU" in why
    biased_mlp = llama(mlp_bias=True)
    assert can_fuse(biased_mlp) == (False, "LlamaDecoderLayer: MLP biases")
    with pytest.raises(ValueError, match="layer 0: LlamaDecoderLayer: MLP biases"):
        fuse_layers(biased_mlp)
    gpt2 = pytest.importorskip("transformers").GPT2LMHeadModel(
        pytest.importorskip("transformers").GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    ok, why = can_fuse(gpt2)
    assert not ok
    # the engine keeps such a model on the prepacked transformers layers, and says why
    engine = Engine(biased_mlp)
    assert engine.packed and engine.unfused == {"target": "LlamaDecoderLayer: MLP biases"}
    assert not any(isinstance(m, FusedLayer) for m in biased_mlp.modules())


def test_greedy_decoding_is_the_same_on_fused_and_unfused_layers():
    sp = SamplingParams(max_new_tokens=40)
    prompts = [[3, 17, 42, 9, 5], [100, 7, 7, 7, 250, 31, 2]]
    fused = Engine(tiny.make_model(vocab_size=VOCAB, seed=0), tiny.make_model(vocab_size=VOCAB, seed=3))
    unfused = Engine(tiny.make_model(vocab_size=VOCAB, seed=0), tiny.make_model(vocab_size=VOCAB, seed=3), pack=False)
    assert fused.unfused == {} and isinstance(fused.target.model.layers[0], FusedLayer)
    for prompt in prompts:
        for spec in (SpeculativeConfig(), SpeculativeConfig("draft_model", 3, draft="d")):
            assert fused.generate(prompt, sp, spec).output_ids == unfused.generate(prompt, sp, spec).output_ids

"""What the reference check against speculators (tests/models/test_eagle3_speculators.py, which
needs its own virtualenv) found, held here without it:

- speculators' converter writes `"target_hidden_size": null`: null reads as absent;
- a Qwen3 decoder layer (q/k norms, what speculators builds for Qwen3 targets) and a llama
  layer with attention or MLP biases (o_proj and MLP biases included) run as they were
  trained, checked against transformers' own Qwen3 / Llama attention math;
- a weight the head has no place for is refused (it used to be dropped silently, and the head
  then drafted differently from where it was trained), as are the config flags this engine
  does not run (fc_norm, norm_output) and decoder layer types other than llama / qwen3.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny
from specbench.errors import ModelError
from specbench.models.eagle3 import load_head, save_head


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=300, layers=4, seed=0)


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    head = tiny.make_head(target, draft_vocab_size=90, aux_layers=(0, 2, 3), seed=1, fit=False)
    return save_head(head, tmp_path_factory.mktemp("head") / "h")


def edit(src, dst, *, config=None, weights=None):
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    if config:
        config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    state = load_file(src / "model.safetensors")
    if weights:
        weights(state)
    save_file(state, dst / "model.safetensors")
    return dst


def refusal(path, target) -> str:
    with pytest.raises(ModelError) as exc:
        load_head(path, target, target_name="tiny")
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_a_null_target_hidden_size_reads_as_absent(saved, target, tmp_path):
    path = edit(saved, tmp_path / "null", config=lambda c: c.update(target_hidden_size=None))
    assert load_head(path, target).config.target_hidden_size == 64


def test_a_weight_with_no_place_is_refused(saved, target, tmp_path):
    def extra(state):
        state["fc_norm.0.weight"] = torch.ones(64)
    msg = refusal(edit(saved, tmp_path / "extra", weights=extra), target)
    assert "'fc_norm.0.weight' has no place" in msg


@pytest.mark.parametrize("flag", ["fc_norm", "norm_output"])
def test_flags_this_engine_does_not_run_are_refused(saved, target, tmp_path, flag):
    msg = refusal(edit(saved, tmp_path / flag, config=lambda c: c.update({flag: True})), target)
    assert f"{flag} is set" in msg


def test_an_unknown_layer_type_is_refused(saved, target, tmp_path):
    def qwen3_next(c):
        c["transformer_layer_config"]["model_type"] = "qwen3_next"
    msg = refusal(edit(saved, tmp_path / "next", config=qwen3_next), target)
    assert "'qwen3_next'" in msg and "'llama' or 'qwen3'" in msg


def _reference_attention(kind, attn_weights, cfg_kwargs, x, positions):
    """transformers' own attention (Llama or Qwen3) holding the head's weights, causal."""
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    Config, Attention = (Qwen3Config, Qwen3Attention) if kind == "qwen3" else (LlamaConfig, LlamaAttention)
    cfg = Config(**cfg_kwargs)
    cfg._attn_implementation = "eager"
    cfg.hidden_size *= 2  # q/k/v read [embedding, hidden]: 2H (o_proj is replaced below)
    attn = Attention(cfg, layer_idx=0)
    attn.o_proj = torch.nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size // 2,
                                  bias=cfg_kwargs.get("attention_bias", False))
    attn.load_state_dict(attn_weights)
    rot = LlamaRotaryEmbedding(Config(**cfg_kwargs))
    cos, sin = rot(x, positions)
    T = x.shape[1]
    mask = torch.full((T, T), float("-inf")).triu(1).view(1, 1, T, T)
    return attn(x, (cos, sin), attention_mask=mask)[0]


@pytest.mark.parametrize("kind,bias", [("qwen3", False), ("llama", True)])
def test_qwen3_and_biased_layers_follow_transformers(saved, target, tmp_path, kind, bias):
    """A head dir with a Qwen3 layer (q_norm/k_norm) or with attention and MLP biases: its
    attention equals transformers' Qwen3Attention / LlamaAttention on the same weights."""
    g = torch.Generator().manual_seed(3)

    def weights(state):
        if kind == "qwen3":
            for n in ("q_norm", "k_norm"):
                state[f"layers.0.self_attn.{n}.weight"] = 1 + 0.5 * torch.randn(16, generator=g)
        if bias:
            for n, width in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)):
                state[f"layers.0.self_attn.{n}.bias"] = torch.randn(width, generator=g)
            for n, width in (("gate_proj", 128), ("up_proj", 128), ("down_proj", 64)):
                state[f"layers.0.mlp.{n}.bias"] = torch.randn(width, generator=g)

    def config(c):
        c["transformer_layer_config"].update(model_type=kind, attention_bias=bias, mlp_bias=bias)

    head = load_head(edit(saved, tmp_path / kind, config=config, weights=weights), target)
    attn = head.layers[0].self_attn
    assert (attn.q_norm is not None) == (kind == "qwen3") and (attn.o_proj.bias is not None) == bias
    assert (head.layers[0].mlp.gate_proj.bias is not None) == bias
    x = torch.randn(1, 6, 128, generator=g)
    pos = torch.arange(6).view(1, 6)
    cos, sin = head.rotary(x, pos)

    def causal(q, k, v):
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2)

    with torch.no_grad():
        ours = attn(x, cos, sin, causal)
        ref = _reference_attention(kind, attn.state_dict(), dict(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            rms_norm_eps=1e-6, vocab_size=300, attention_bias=bias, rope_theta=head.config.rope.get("rope_theta", 1e4)),
            x, pos)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    # and the q/k norms / biases matter: without them the output is another one
    if kind == "qwen3":
        attn.q_norm, attn.k_norm = None, None
        with torch.no_grad():
            assert (attn(x, cos, sin, causal) - ref).abs().max() > 1e-2


def test_a_full_vocabulary_head_is_saved_without_a_vocabulary_map(target, tmp_path):
    """vLLM refuses d2t/t2d on a head whose draft vocabulary is the target's (it has no
    draft_id_to_target_id there), and speculators saves none: neither do we; it loads back."""
    head = tiny.make_head(target, draft_vocab_size=None, aux_layers=(0, 2, 3), seed=2, fit=False)
    path = save_head(head, tmp_path / "full")
    assert not {"d2t", "t2d"} & set(load_file(path / "model.safetensors"))
    back = load_head(path, target)
    assert back.draft_ids.tolist() == list(range(300))
    reduced = save_head(tiny.make_head(target, draft_vocab_size=90, seed=2, fit=False), tmp_path / "reduced")
    assert {"d2t", "t2d"} <= set(load_file(reduced / "model.safetensors"))

"""Medusa heads on disk (`specbench.models.medusa`): vLLM's layout (with or without the
`medusa_heads.` prefix, fc bias, a shared LM head, a reduced vocabulary through token_map)
and FasterDecoding's `medusa_lm_head` layout (.pt read with weights_only=True, .safetensors)
load into heads that compute the paper's residual block + LM head; save/load round-trips;
every bad directory is one ModelError line naming the directory and what is wrong."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import tiny
from specbench.errors import ModelError
from specbench.models.medusa import build_heads, load_heads, read_heads, save_heads
from specbench.models.medusa_train import init_heads

H, V, K, L = 16, 30, 3, 2


def reference(h, blocks, lm):
    """The paper's head by hand: x + SiLU(W x + b) per layer, then the LM head."""
    outs = []
    for i in range(K):
        x = h
        for W, b in blocks[i]:
            x = x + torch.nn.functional.silu(x @ W.T + (b if b is not None else 0))
        outs.append(x @ lm[i].T)
    return torch.stack(outs, dim=-2)


def random_weights(bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = [[(torch.randn(H, H, generator=g) * 0.3, torch.randn(H, generator=g) * 0.1 if bias else None)
               for _ in range(L)] for _ in range(K)]
    lm = [torch.randn(V, H, generator=g) for _ in range(K)]
    return blocks, lm


def write(d: Path, cfg: dict, weights: dict, name: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in weights.items()}, str(d / name))
    else:
        torch.save(weights, d / name)
    return d


def vllm_dir(tmp: Path, bias: bool, prefix: str = "") -> tuple[Path, tuple]:
    blocks, lm = random_weights(bias)
    w = {}
    for i in range(K):
        for j, (W, b) in enumerate(blocks[i]):
            w[f"{prefix}blocks.{i}.layers.{j}.weight"] = W
            if b is not None:
                w[f"{prefix}blocks.{i}.layers.{j}.bias"] = b
        w[f"{prefix}lm_heads.{i}.weight"] = lm[i]
    cfg = {"model_type": "medusa", "num_heads": K, "num_hidden_layers": L, "hidden_size": H, "vocab_size": V,
           "medusa_fc_bias": bias}
    return write(tmp / "vllm", cfg, w, "model.safetensors"), (blocks, lm)


def fasterdecoding_dir(tmp: Path, name: str) -> tuple[Path, tuple]:
    blocks, lm = random_weights(True, seed=1)
    w = {}
    for i in range(K):
        for j, (W, b) in enumerate(blocks[i]):
            w[f"{i}.{j}.linear.weight"], w[f"{i}.{j}.linear.bias"] = W, b
        w[f"{i}.{L}.weight"] = lm[i]
    cfg = {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": "some/model"}
    return write(tmp / "fd", cfg, w, name), (blocks, lm)


@pytest.mark.parametrize("bias,prefix", [(True, ""), (False, "medusa_heads.")])
def test_vllm_layout(tmp_path, bias, prefix):
    d, (blocks, lm) = vllm_dir(tmp_path, bias, prefix)
    cfg, w = read_heads(d)
    assert (cfg.format, cfg.num_heads, cfg.num_layers, cfg.bias) == ("vllm", K, L, bias)
    h = torch.randn(4, H)
    assert torch.allclose(build_heads(cfg, w, d)(h), reference(h, blocks, lm), atol=1e-5)


@pytest.mark.parametrize("name", ["medusa_lm_head.pt", "medusa_lm_head.safetensors"])
def test_fasterdecoding_layout(tmp_path, name):
    d, (blocks, lm) = fasterdecoding_dir(tmp_path, name)
    cfg, w = read_heads(d)
    assert (cfg.format, cfg.num_heads, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == ("medusa", K, L, H, V)
    h = torch.randn(4, H)
    assert torch.allclose(build_heads(cfg, w, d)(h), reference(h, blocks, lm), atol=1e-5)


def test_a_shared_lm_head_and_a_reduced_vocabulary(tmp_path):
    g = torch.Generator().manual_seed(2)
    token_map = torch.tensor([0, 3, 7, 11])
    w = {f"blocks.{i}.layers.0.weight": torch.randn(H, H, generator=g) for i in range(K)}
    w["lm_heads.0.weight"] = torch.randn(4, H, generator=g)
    w["token_map"] = token_map
    cfg = {"num_heads": K, "num_hidden_layers": 1, "hidden_size": H, "vocab_size": V, "original_lm_head": True,
           "truncated_vocab_size": 4}
    d = write(tmp_path / "shared", cfg, w, "model.safetensors")
    heads = build_heads(*read_heads(d), d)
    out = heads(torch.randn(2, H))
    assert out.shape == (2, K, V)
    assert torch.isinf(out[..., [i for i in range(V) if i not in token_map.tolist()]]).all()
    assert torch.isfinite(out[..., token_map]).all()


def test_save_and_load_round_trip_against_a_target(tmp_path):
    target = tiny.make_model(vocab_size=V, hidden=H, layers=1)
    heads = init_heads(target, 2, num_layers=1, seed=0)
    with torch.no_grad():
        heads.blocks[0].layers[0].weight.normal_()
    save_heads(heads, tmp_path / "h", base_model="tiny")
    again = load_heads(tmp_path / "h", target, target_name="tiny")
    h = torch.randn(3, H)
    assert torch.equal(again(h), heads(h))
    assert json.loads((tmp_path / "h" / "config.json").read_text())["num_heads"] == 2


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def _bad(tmp_path: Path, what: str) -> Path:
    d = tmp_path / what
    d.mkdir()
    good_cfg = {"num_heads": 1, "num_hidden_layers": 1}
    if what == "no_config":
        return d
    (d / "config.json").write_text("{nope" if what == "bad_json" else json.dumps(good_cfg))
    if what == "pickle":
        torch.save({"x": _Evil()}, d / "medusa_lm_head.pt")
    elif what == "layout":
        save_file({"fc.weight": torch.zeros(2, 2)}, str(d / "model.safetensors"))
    elif what == "missing_lm":
        save_file({"blocks.0.layers.0.weight": torch.zeros(H, H)}, str(d / "model.safetensors"))
    elif what == "corrupt":
        (d / "model.safetensors").write_bytes(b"not a safetensors file")
    return d


@pytest.mark.parametrize("what,needle", [
    ("no_config", "no config.json"),
    ("bad_json", "config.json is not valid JSON"),
    ("no_weights", "no weights"),
    ("pickle", "weights_only=True"),
    ("layout", "no known layout"),
    ("missing_lm", "missing weight 'lm_heads.0.weight'"),
    ("corrupt", "not a safetensors file"),
])
def test_bad_directories_are_one_line(tmp_path, what, needle):
    d = _bad(tmp_path, what)
    with pytest.raises(ModelError) as exc:
        read_heads(d)
    msg = str(exc.value)
    assert needle in msg and str(d) in msg and "\n" not in msg, msg


def test_missing_directory_and_target_mismatches(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        read_heads(tmp_path / "nowhere")
    d, _ = vllm_dir(tmp_path, True)
    with pytest.raises(ModelError, match="hidden size 32"):
        load_heads(d, tiny.make_model(vocab_size=V, hidden=32, layers=1), target_name="t")
    with pytest.raises(ModelError, match="vocabulary has 30 tokens, but target 't' has 40"):
        load_heads(d, tiny.make_model(vocab_size=40, hidden=H, layers=1), target_name="t")


@pytest.mark.parametrize("token_map, cfg_extra, needle", [
    (torch.tensor([0.0, 2.5, 5.0, 7.5]), {}, "token_map must hold integer token ids, it holds float32"),
    (torch.tensor([0, 0, 0, 0]), {}, "token_map lists a token id twice"),
    (torch.tensor([0, 3, 7, 11]), {"vocab_size": "abc"}, "config.json's vocab_size must be a positive integer, got 'abc'"),
    (torch.tensor([0, 3, 7, 11]), {"hidden_size": True}, "config.json's hidden_size must be a positive integer"),
])
def test_malformed_reduced_vocabularies_are_refused_in_one_line(tmp_path, token_map, cfg_extra, needle):
    """Issue 44, items 4 and 7: a float or duplicate token_map loaded without a word, a string
    vocab_size raised ValueError from int()."""
    g = torch.Generator().manual_seed(2)
    w = {f"blocks.{i}.layers.0.weight": torch.randn(H, H, generator=g) for i in range(K)}
    w["lm_heads.0.weight"] = torch.randn(4, H, generator=g)
    w["token_map"] = token_map
    cfg = {"num_heads": K, "num_hidden_layers": 1, "hidden_size": H, "vocab_size": V, "original_lm_head": True,
           "truncated_vocab_size": 4, **cfg_extra}
    d = write(tmp_path / "heads", cfg, w, "model.safetensors")
    with pytest.raises(ModelError) as exc:
        build_heads(*read_heads(d), d)
    assert needle in str(exc.value) and "\n" not in str(exc.value)

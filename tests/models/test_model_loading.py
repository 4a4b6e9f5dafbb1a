from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tiny
from specbench.config import EngineConfig
from specbench.errors import ConfigError, ModelError, TokenizerMismatchError
from specbench.models import catalog, fetch, loading


def test_missing_path_names_it_and_lists_what_is_valid():
    with pytest.raises(ModelError) as err:
        loading.resolve_model_path("/no/such/model")
    msg = str(err.value)
    assert msg.startswith("model '/no/such/model': no such file or directory; pass a catalog name (")
    models = [n for n in catalog.names() if n not in catalog.head_names()]
    assert models and all(n in msg for n in models)
    assert not any(n in msg for n in catalog.head_names())  # a head is no model: it is not offered as one
    assert "Hugging Face model directory or a .gguf file" in msg


def test_directory_without_config_and_non_gguf_file_are_refused(tmp_path):
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match="no config.json; pass the .gguf file itself"):
        loading.resolve_model_path(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="not a .gguf file"):
        loading.resolve_model_path(str(tmp_path / "weights.bin"))


def test_catalog_name_not_pulled_is_not_fetched_when_told_not_to(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(fetch, "pull", lambda *a, **k: pytest.fail("pulled"))
    with pytest.raises(ModelError, match="specbench models pull smollm2-135m-instruct"):
        loading.resolve_model_path("smollm2-135m-instruct", pull_missing=False)


def test_device_and_dtype_resolution(monkeypatch):
    assert loading.resolve_device(EngineConfig(device="cpu")) == torch.device("cpu")
    assert loading.resolve_dtype(EngineConfig(dtype="float32"), torch.device("cpu")) == torch.float32
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: True)
    assert loading.resolve_dtype(EngineConfig(), torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(loading, "cpu_has_bf16", lambda: False)
    assert loading.resolve_dtype(EngineConfig(), torch.device("cpu")) == torch.float32


def test_cuda_device_without_cuda_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="--device cuda:1: CUDA is not available"):
        loading.resolve_device(EngineConfig(device="cuda:1"))
    assert loading.resolve_device(EngineConfig(device="auto")) == torch.device("cpu")


def test_load_model_from_a_saved_directory(tiny_pair):
    target_dir, _ = tiny_pair
    m = loading.load_model(str(target_dir), EngineConfig(device="cpu", dtype="float32"))
    assert m.name == "target" and m.path == Path(target_dir).resolve()
    assert m.device == torch.device("cpu") and m.dtype == torch.float32
    assert next(m.model.parameters()).dtype == torch.float32
    assert not m.model.training and not any(p.requires_grad for p in m.model.parameters())
    assert m.eos_token_ids == (m.tokenizer.convert_tokens_to_ids("<|endoftext|>"),)
    assert m.max_context == 512 and m.vocab_size == len(m.tokenizer)
    with torch.inference_mode():
        logits = m.model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, m.vocab_size)


def test_load_model_converts_a_gguf_path_once(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    path, _ = tiny_gguf
    m = loading.load_model(str(path), EngineConfig(device="cpu", dtype="bfloat16"))
    assert m.name == "tiny-qwen2" and m.path == fetch.user_gguf_dir(path)
    assert m.dtype == torch.bfloat16 and len(m.eos_token_ids) == 2
    assert loading.resolve_model_path(str(path), pull_missing=False) == m.path


# --- target/draft tokenizer check --------------------------------------------------------


def _loaded(name: str, model, tokenizer) -> loading.LoadedModel:
    return loading.LoadedModel(name=name, path=Path(name), model=model, tokenizer=tokenizer,
                               device=torch.device("cpu"), dtype=torch.float32,
                               eos_token_ids=(tokenizer.eos_token_id,), max_context=512)


def test_shared_tokenizer_pair_passes(tiny_pair):
    cfg = EngineConfig(device="cpu", dtype="float32")
    target, draft = (loading.load_model(str(p), cfg) for p in tiny_pair)
    loading.check_same_tokenizer(target, draft)


def test_different_vocabulary_sizes_are_refused(tmp_path, tiny_pair):
    tok = tiny.make_tokenizer()
    tok.add_tokens(["<extra>"])
    other = tiny.make_model(vocab_size=len(tok), eos_token_id=tok.eos_token_id)
    other.save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "other")
    cfg = EngineConfig(device="cpu", dtype="float32")
    target = loading.load_model(str(tiny_pair[0]), cfg)
    draft = loading.load_model(str(tmp_path / "other"), cfg)
    with pytest.raises(TokenizerMismatchError) as err:
        loading.check_same_tokenizer(target, draft)
    msg = str(err.value)
    assert "'target'" in msg and "'other'" in msg and "259 vs 260" in msg


def test_same_size_but_different_id_mapping_is_refused(tiny_tokenizer):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_tokenizer.get_vocab()
    swapped = dict(vocab, a=vocab["b"], b=vocab["a"])
    spec = json.loads(tiny_tokenizer.backend_tokenizer.to_str())
    spec["model"]["vocab"] = swapped
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                    eos_token="<|endoftext|>")
    model = tiny.make_model(vocab_size=len(vocab))
    with pytest.raises(TokenizerMismatchError, match="2 token ids map to different strings"):
        loading.check_same_tokenizer(_loaded("t", model, tiny_tokenizer), _loaded("d", model, other))


def test_same_tokenizer_but_different_lm_head_width_is_refused(tiny_tokenizer):
    target = _loaded("t", tiny.make_model(vocab_size=len(tiny_tokenizer)), tiny_tokenizer)
    draft = _loaded("d", tiny.make_model(vocab_size=len(tiny_tokenizer) + 64), tiny_tokenizer)
    with pytest.raises(TokenizerMismatchError, match="lm_head rows"):
        loading.check_same_tokenizer(target, draft)
    # Padded alike is fine: embedding rows beyond len(tokenizer) on both sides.
    padded = tiny.make_model(vocab_size=len(tiny_tokenizer) + 64)
    loading.check_same_tokenizer(draft, _loaded("d2", padded, tiny_tokenizer))

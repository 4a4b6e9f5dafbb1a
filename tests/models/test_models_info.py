"""`specbench models info` and model loading on files that are not what they claim: a .gguf
described from its header before any conversion, a corrupt or truncated .gguf, a broken
config.json and a config that asks for repository code each get one line naming the file
(exit 2), never a traceback or advice that cannot work."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_harness import specbench


def refused(res, *needles):
    assert res.code == 2 and "Traceback" not in res.output, res.output
    assert len(res.error_lines) == 1, res.err
    for n in needles:
        assert n in res.error_lines[0], (n, res.error_lines[0])


def test_info_describes_a_gguf_from_its_header_without_converting(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    res = specbench("models", "info", str(tiny_gguf[0]))
    assert res.code == 0, res.output
    text = " ".join(res.out.split())
    assert "qwen2" in text and "converted" in text and "models pull" in text
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


@pytest.mark.parametrize("content", [b"not a gguf at all", b"GGUF\x03\x00\x00\x00truncated"])
def test_a_corrupt_gguf_is_refused_in_one_line(tmp_path, content, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(content)
    refused(specbench("models", "info", str(fake)), str(fake), "not a readable GGUF")
    res = specbench("run", "--target", str(fake), "--method", "ngram", "--out", str(tmp_path / "o"))
    refused(res, str(fake), "not a readable GGUF")
    assert not (tmp_path / "o").exists()


def test_a_broken_config_is_refused_in_one_line(tiny_pair, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_pair[0], broken)
    (broken / "config.json").write_text("{not json")
    refused(specbench("models", "info", str(broken)), "config.json", "not a readable model config")


def test_remote_code_is_named_not_run(tiny_pair, tmp_path):
    remote = tmp_path / "remote"
    shutil.copytree(tiny_pair[0], remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XModel"}
    (remote / "config.json").write_text(json.dumps(cfg))
    (remote / "configuration_x.py").write_text("raise SystemExit('repository code ran')\n")
    refused(specbench("models", "info", str(remote)), "auto_map", "--trust-remote-code")

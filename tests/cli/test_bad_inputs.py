"""Bad inputs a hostile pass over the command line found slipping through (tracebacks, a
silent write to a bad place, messages that hid what was typed): each is refused in one line
that names what is wrong, before anything is measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_harness import specbench
from specbench.sweep.urls import storage_url
from specbench.errors import ConfigError


@pytest.fixture
def broken_target(tiny_pair, tmp_path) -> callable:
    def make(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(tiny_pair[0], d)
        edit(d)
        return d
    return make


def _weights(d: Path) -> Path:
    return next(d.glob("*.safetensors"))


@pytest.mark.parametrize("name, edit, needles", [
    ("listconfig", lambda d: (d / "config.json").write_text("[]"), ["could not load from", "listconfig"]),
    ("truncweights", lambda d: _weights(d).write_bytes(_weights(d).read_bytes()[:1000]),
     ["could not load from", "truncweights"]),
    ("garbageweights", lambda d: _weights(d).write_bytes(b"\xff" * 4096), ["could not load from", "garbageweights"]),
])
def test_a_broken_model_directory_is_one_line(broken_target, tmp_path, name, edit, needles):
    target = broken_target(name, edit)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    specbench("run", "--target", target, "--method", "ngram", "-k", "2", "--workload", prompts,
              "--max-new-tokens", "4", "--warmup", "0", "--out", tmp_path / "out").refusal(*needles, alone=False)


def test_models_info_on_a_config_that_is_not_an_object(broken_target):
    target = broken_target("listconfig", lambda d: (d / "config.json").write_text("[]"))
    specbench("models", "info", target).refusal("config.json", "JSON object", "list")


def test_an_unwritable_model_cache_is_named(tmp_path, monkeypatch):
    gguf = tmp_path / "garbage.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 64)
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    monkeypatch.setenv("SPECBENCH_CACHE", str(blocker / "cache"))
    specbench("models", "pull", gguf).refusal("cannot create the model cache directory",
                                              str(blocker / "cache"), "$SPECBENCH_CACHE")


def test_top_k_beyond_what_the_records_hold_is_refused(tiny_pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    out = tmp_path / "out"
    specbench("run", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--workload", prompts,
              "--top-k", "99999999999", "--out", out).refusal("--top-k", "2147483647")
    assert not out.exists()


def test_a_device_with_colons_is_shown_as_typed(tmp_path):
    msg = specbench("run", "--device", "cuda:abc:", "--out", tmp_path / "o").output
    assert "cuda:abc" in msg and "Traceback" not in msg, msg


def test_speculative_config_with_a_negative_k_names_the_json_field(tmp_path):
    specbench("run", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": -1}',
              "--out", tmp_path / "o").refusal("--speculative-config", "num_speculative_tokens", ">= 0")


def test_serve_refuses_an_empty_host():
    specbench("serve", "--host", "", "--port", "0").refusal("--host", "127.0.0.1")


@pytest.mark.parametrize("url", ["sqlite:/relative.db", "postgresql:host/db"])
def test_a_storage_url_missing_its_slashes_is_refused(url):
    with pytest.raises(ConfigError, match="without '//'"):
        storage_url(url)


@pytest.mark.parametrize("path", ["studies/x.db", "/abs/x.db", "x.db"])
def test_plain_paths_still_mean_sqlite_files(path):
    assert storage_url(path) == "sqlite:///" + path


LONG = "x" * 5000  # over the file system's 255 per name: Path.exists() raises ENAMETOOLONG


@pytest.mark.parametrize("args, where", [
    (["models", "info", LONG], "specbench models info: argument"),
    (["models", "pull", LONG, "--no-check"], "specbench models pull: argument"),
    (["workloads", "show", LONG], "specbench workloads show: argument"),
    (["run", "--method", "ngram", f"--workload={LONG}"], "--workload"),
])
def test_a_path_longer_than_the_file_system_allows_is_one_line(args, where):
    specbench(*args).refusal(where, "5000 characters", "longer than the file system allows")


@pytest.mark.parametrize("args, where", [
    (["run", "--method", "ngram", "--workload", "~nosuchuser-x/p.jsonl"], "--workload"),
    (["models", "info", "~nosuchuser-x/model"], "specbench models info: argument"),
    (["workloads", "show", "~nosuchuser-x/p.jsonl"], "specbench workloads show: argument"),
])
def test_a_home_directory_of_an_unknown_user_is_one_line(args, where):
    # Path.expanduser() raises RuntimeError for ~user without such a user
    specbench(*args).refusal(where, "~nosuchuser-x", "no user 'nosuchuser-x'")


@pytest.mark.parametrize("extra, needles", [
    (["--dynamic-k"], ["--dynamic-k", "--method none"]),
    (["--disable-by-batch-size", "2"], ["--disable-by-batch-size", "--method none"]),
    (["--topk", "2", "--num-draft-tokens", "3"], ["--topk, --num-draft-tokens", "--method none"]),
])
def test_speculation_knobs_with_method_none_are_refused(tmp_path, extra, needles):
    # these were accepted and ignored: the run measured the baseline alone without a word
    specbench("run", "--method", "none", *extra, "--out", tmp_path / "o").refusal(*needles)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, needles", [
    (["--base-url", "http://127.0.0.1:99999"], ["--base-url", "port 99999", "1..65535"]),
    (["--base-url", "http://127.0.0.1:8000", "--api-key-env", ""], ["--api-key-env is empty"]),
])
def test_openai_flags_are_checked_before_connecting(tmp_path, extra, needles):
    # both went on to a connection attempt ("cannot reach ...") that hid what was wrong
    specbench("run", "--backend", "openai", *extra, "--out", tmp_path / "o").refusal(*needles)


def test_ngram_sizes_name_the_speculative_config_keys(tmp_path):
    specbench("run", "--speculative-config", '{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
              "--out", tmp_path / "o").refusal("prompt_lookup_min", "--speculative-config", "5..2")


@pytest.mark.parametrize("args, needles", [
    (["--host", "a\nb"], ["--host 'a\\nb'", "127.0.0.1"]),  # its newline split the message in two
    (["--method", ""], ["--method is empty"]),
    (["--speculative-config", " "], ["--speculative-config is empty"]),
    (["--served-model-name", ""], ["--served-model-name ''", "printable"]),
    (["--served-model-name", "a\nb"], ["--served-model-name 'a\\nb'"]),
])
def test_serve_refuses_empty_or_unprintable_values_before_loading(args, needles):
    # an empty --method or --speculative-config meant "no speculation", an empty served name
    # went to the API: all accepted without a word
    specbench("serve", "--target", "/nonexistent/model", "--port", "0", *args).refusal(*needles)


def test_serve_a_host_it_cannot_listen_on_is_one_line():
    # the "not a loopback address" warning came first, then the error: two lines
    res = specbench("serve", "--target", "/nonexistent/model", "--host", "999.1.1.1", "--port", "0")
    res.refusal("--host 999.1.1.1", "cannot listen")

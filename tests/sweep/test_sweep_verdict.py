"""One verdict everywhere: studies of paired trials (each with its own baseline samples and
paired speedup interval, as `specbench sweep` measures them) where speculation pays at some
concurrency bands and not others; the console, profile.yaml, profile.vllm.json,
profile.vllm-legacy.json, profile.sglang.txt and profile.rollout.yaml must all say the same
thing per band. Impossible results (a speedup above tokens per target pass) are flagged and
never recommended; a break-even MAL below 1 is never written."""

from __future__ import annotations

import json
import re

import optuna
import pytest
import yaml
from rich.console import Console

from specbench.analysis import SUMMARY_COLUMNS
from specbench.cli.sweep import _print_results
from specbench.runner import Configuration
from specbench.sweep import build_profile, write_profile
from specbench.sweep.space import configuration
from test_sweep_profile import BASE_TPOT, make_spec, study_with

HALF = 0.08  # half-width of each trial's paired interval (relative)
LEVELS = (1, 4, 16)


def _summary(p: Configuration, speedup: float, mal: float) -> dict:
    s = {c: None for c in SUMMARY_COLUMNS}
    method, k = p.spec.method, p.spec.num_speculative_tokens
    s.update(config_id=f"{method}-k{k}-c{p.concurrency}", method=method,
             num_speculative_tokens=k, concurrency=p.concurrency,
             is_baseline=p.is_baseline, n=8, errors=0, tpot_p50_s=BASE_TPOT / speedup,
             output_tps=100.0 * speedup, mean_acceptance_length_tok=mal if not p.is_baseline else None,
             peak_memory_bytes=float(2**30))
    return s


def paired_study(spec, speedups: dict[tuple[int, int], float], mal: float = 3.0,
                 flagged: dict[tuple[int, int], str] | None = None) -> optuna.Study:
    """(k, concurrency) -> paired TPOT speedup; each trial carries its interval and baseline.
    The objective is the speedup (`make_spec`'s default)."""
    flagged = flagged or {}

    def paired(p: Configuration, x: float) -> dict:
        out = {"summary": _summary(p, x, mal)}
        if not p.is_baseline:
            outcome = "win" if x * (1 - HALF) > 1 else "loss" if x * (1 + HALF) < 1 else "even"
            out["baseline_summary"] = _summary(configuration(concurrency=p.concurrency), 1.0, mal)
            out["paired"] = {"point": x, "lo": x * (1 - HALF), "hi": x * (1 + HALF), "n": 8,
                             "planned": 24, "outcome": outcome, "stopped": None}
            if (p.spec.num_speculative_tokens, p.concurrency) in flagged:
                out["inconsistent"] = [flagged[(p.spec.num_speculative_tokens, p.concurrency)]]
        return out

    return study_with(spec, speedups, attrs=paired)


def outputs(tmp_path, spec, study) -> dict[str, list[bool]]:
    """What each of the six outputs says per band: speculate (True) or not."""
    prof = build_profile(spec, study)
    written = write_profile(tmp_path / "profile.yaml", prof)
    bands = yaml.safe_load((tmp_path / "profile.yaml").read_text())["bands"]
    ranges = [(b["batch_size"]["min"], b["batch_size"]["max"] or b["measured_at_concurrency"]) for b in bands]
    out = {"profile.yaml": [b["profile"] == "speculative" for b in bands]}

    console = Console(record=True, width=250)
    _print_results(spec, prof, written=True, why="", serving=written, out=console)
    text = console.export_text()
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^│\s*(\d+)\s*│\s*(\w+)", text, re.M)}
    out["console"] = [rows[b["measured_at_concurrency"]] == "speculative" for b in bands]
    recommendation = re.search(r"recommendation: (\w+)", text).group(1)
    assert (recommendation == "speculative") == any(out["console"])

    vllm = json.loads((tmp_path / "profile.vllm.json").read_text())
    out["vllm"] = ([k > 0 for _, _, k in vllm["num_speculative_tokens_per_batch_size"]]
                   if vllm else [False] * len(bands))
    legacy = json.loads((tmp_path / "profile.vllm-legacy.json").read_text())
    limit = (legacy.get("disable_by_batch_size") or 10**9) if legacy else 0
    out["vllm-legacy"] = [hi <= limit for lo, hi in ranges]
    sglang = (tmp_path / "profile.sglang.txt").read_text()
    out["sglang"] = [not sglang.startswith("#")] * len(bands)
    rollout = yaml.safe_load((tmp_path / "profile.rollout.yaml").read_text())
    ks = [r["k"] > 0 for r in rollout["monitor"]["per_batch_size"]]
    assert ("canary" in rollout["rollout"]) == any(ks)
    out["rollout"] = ks
    return out


SCENARIOS = {
    "pays everywhere": ({(2, 1): 1.6, (4, 1): 1.8, (2, 4): 1.3, (4, 4): 1.2, (2, 16): 1.15}, [True] * 3),
    "pays nowhere": ({(2, 1): 0.8, (4, 4): 0.7, (2, 16): 0.6}, [False] * 3),
    "pays up to 4": ({(2, 1): 1.5, (4, 1): 1.7, (2, 4): 1.3, (2, 16): 0.7}, [True, True, False]),
    # the reported contradiction: loses at 1 (the console said baseline) but pays at 4 and 16
    "loses at 1 only": ({(2, 1): 0.8, (2, 4): 1.4, (4, 16): 1.3}, [False, False, False]),
    "even at 1": ({(2, 1): 1.03, (2, 4): 1.4}, [False, False, False]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_all_six_outputs_say_the_same_thing_per_band(tmp_path, name):
    speedups, expected = SCENARIOS[name]
    spec = make_spec(**{"study.out": str(tmp_path)})
    got = outputs(tmp_path, spec, paired_study(spec, speedups))
    assert got["profile.yaml"] == expected
    if all(expected) or not any(expected):
        assert got == {k: expected for k in got}  # SGLang too
    else:  # SGLang cannot switch off above a batch size: it says baseline, with the reason
        assert {k: v for k, v in got.items() if k != "sglang"} == {k: expected for k in got if k != "sglang"}
        assert got["sglang"] == [False] * len(expected)


def test_a_flagged_trial_is_never_the_recommendation(tmp_path):
    spec = make_spec(**{"study.out": str(tmp_path)})
    why = "inconsistent: TPOT speedup 4.100x exceeds tokens per target pass (1.850) by more than 10%"
    study = paired_study(spec, {(2, 1): 1.5, (4, 4): 4.1, (2, 4): 0.9, (2, 16): 0.8},
                         flagged={(4, 4): why})
    prof = build_profile(spec, study)
    band = prof["bands"][1]
    assert band["profile"] == "baseline"
    assert band["speculative"]["config"]["num_speculative_tokens"] == 2  # the flagged k=4 is skipped
    assert band["flagged"][0]["why"] == [why]
    assert outputs(tmp_path, spec, study)["vllm"] == [True, False, False]
    console = Console(record=True, width=250)
    _print_results(spec, prof, written=True, why="", serving={}, out=console)
    text = console.export_text()
    assert "flagged: trial 4" in text and "exceeds tokens per target pass" in text


def test_a_break_even_mal_below_1_is_flagged_and_never_written(tmp_path):
    spec = make_spec(**{"study.out": str(tmp_path)})
    # MAL 1.0 with a 1.08x speedup (within the bound's 10% tolerance): break-even 0.93
    study = paired_study(spec, {(2, 1): 1.6, (2, 4): 1.08 / (1 - HALF) * 1.01, (2, 16): 0.7}, mal=1.0)
    prof = build_profile(spec, study)
    write_profile(tmp_path / "profile.yaml", prof)
    rollout = yaml.safe_load((tmp_path / "profile.rollout.yaml").read_text())
    rows = rollout["monitor"]["per_batch_size"]
    assert all(r["break_even_mal"] is None or r["break_even_mal"] >= 1 for r in rows)
    assert any(r.get("inconsistent") for r in rows)
    assert rollout["monitor"]["mal_alert_below"] is None or rollout["monitor"]["mal_alert_below"] >= 1

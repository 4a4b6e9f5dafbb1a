"""Serving configurations ready to paste, derived from a profile (`build_profile`'s dict, or a
profile.yaml read back): what to pass to vLLM and SGLang, a rollout plan and what to watch.

Every file repeats the profile's one decision per band (`profile: speculative` or
`baseline`, see `specbench.sweep.profile`): speculation from batch size 1 up to the last band
before the first that does not pay, with one drafter family.

- vLLM, current: `--speculative-config` JSON with `num_speculative_tokens_per_batch_size`, a
  list of `[start_bs, end_bs, K]` bands, one per measured concurrency band of the profile:
  K is the band's best measured k where the profile speculates and 0 where it does not. The
  bands cover 1..(highest concurrency measured) without gaps or overlaps (`check_bands`);
  vLLM carries the last band's K past its end. `num_speculative_tokens` is the largest K.
- vLLM, versions without the table: the profile's `speculative_config` with
  `disable_by_batch_size` (no drafting above that many requests in flight), the first band's k.
- SGLang: the first band's drafting flags (`--speculative-algorithm STANDALONE|EAGLE3
  --speculative-draft-model-path D --speculative-num-steps k --speculative-eagle-topk T
  --speculative-num-draft-tokens N`: a chain's T = 1, N = k + 1; a draft tree's T and node
  budget) only where the profile speculates at every measured band: SGLang has no
  per-batch-size schedule, so flags that speculate where it loses would contradict the
  profile. Otherwise the file says baseline and why, with the flags for traffic that stays
  below the crossover.
- Draft trees (a sweep over `topk`): vLLM serves none, so where the profile's pick is a tree
  the vLLM files carry the best chain measured in that band when that chain pays too (the
  profile's `chain` evidence), else K = 0 there; each band's explanation says so.
- Rollout: `profiles:` (`baseline`, `spec_decode_<method>_k<K>`) and `rollout:` (canary
  stages, promote/rollback rules), and `monitor:`: the MAL (mean acceptance length, vLLM's
  1 + accepted / drafts) measured per batch-size band, and the break-even MAL below which the
  band's speedup is gone: measured MAL / measured TPOT speedup (speedup scales with MAL when
  the step costs stay as measured). The alert threshold is the highest break-even MAL of the
  bands that speculate; a break-even MAL below 1 (a speedup above the MAL, which physics
  forbids) is flagged and never written.
- With nothing paying every file is still written and says baseline (vLLM: JSON `null`).

Every number comes from the profile's evidence (trial, run id) and is repeated next to it.

Boundary: a pure function of the profile dict; nothing here runs a model or reads records.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from specbench.analysis import physics
from specbench.config import SUFFIX_KNOBS, SpeculativeConfig
from specbench.atomic import atomic_write

_NGRAM = SpeculativeConfig(method="ngram")  # the n-gram lookup sizes (and suffix knobs) measured
SERVING_FILES = {"vllm": ".vllm.json", "vllm_legacy": ".vllm-legacy.json",
                 "sglang": ".sglang.txt", "rollout": ".rollout.yaml"}
PROMQL_MAL = ("1 + rate(vllm:spec_decode_num_accepted_tokens_total[5m]) / "
              "rate(vllm:spec_decode_num_drafts_total[5m])")
CANARY_STAGES = (5, 25, 50, 100)  # percent of traffic, each held HOLD_MINUTES
HOLD_MINUTES = 30


def _cfg(ev: dict[str, Any] | None) -> dict[str, Any]:
    return (ev or {}).get("config") or {}


def _family(cfg: dict[str, Any]) -> tuple[Any, Any]:
    return cfg.get("method"), cfg.get("draft")


def _pays(band: dict[str, Any], min_speedup: float) -> bool:
    """The profile's own decision for the band (`profile: speculative`: it pays, and so does
    every band below it), never this band's point estimate or interval alone, so every file
    says what profile.yaml and the console say."""
    return band.get("profile") == "speculative" and bool(band.get("speculative"))


def _end(band: dict[str, Any]) -> int:
    return int(band["batch_size"]["max"] if band["batch_size"]["max"] is not None
               else band["measured_at_concurrency"])


def bands_table(profile: dict[str, Any]) -> tuple[list[list[int]], list[dict[str, Any]], tuple | None]:
    """([[start, end, K], ...], one explanation per band, the drafter family used)."""
    min_speedup = float((profile.get("objective") or {}).get("min_speedup", 1.0))
    bands = profile.get("bands") or []
    first = next((b for b in bands if _pays(b, min_speedup)), None)
    fam = _family(_cfg(first["speculative"])) if first else None
    table, why = [], []
    for b in bands:
        cfg = _cfg(b.get("speculative"))
        k = 0
        if fam is None:
            reason = "speculation pays at no measured concurrency"
        elif not _pays(b, min_speedup):
            reason = b.get("why") or "not measured"
        elif _family(cfg) != fam:
            reason = (f"best here is {cfg.get('method')} ({cfg.get('draft')}), another drafter than the "
                      "schedule's; vLLM's table changes only K")
        elif cfg.get("topk", 1) > 1:  # the profile's pick is a draft tree, which vLLM cannot run
            chain = b.get("chain") or {}
            if chain.get("pays"):
                k = int(_cfg(chain)["num_speculative_tokens"])
                reason = (f"the profile's pick is a draft tree (topk={cfg['topk']}, {cfg['num_draft_tokens']} "
                          f"tokens per pass), which vLLM does not serve: the best chain measured here, k={k}, "
                          f"also pays (TPOT speedup {chain.get('speedup_tpot_p50')})")
            else:
                reason = (f"the profile's pick is a draft tree (topk={cfg['topk']}), which vLLM does not serve, "
                          "and no chain measured here pays")
        else:
            k = int(cfg["num_speculative_tokens"])
            reason = f"pays: gain {b['gain']:.3f}x with k={k}"
        ev = b.get("speculative") or b.get("baseline") or {}
        table.append([int(b["batch_size"]["min"]), _end(b), k])
        why.append({"batch_size": f"{b['batch_size']['min']}–{_end(b)}", "k": k, "why": reason,
                    "measured_at_concurrency": b["measured_at_concurrency"],
                    "trial": ev.get("trial"), "run_id": ev.get("run_id")})
    return table, why, fam


def check_bands(table: list[list[int]], max_concurrency: int) -> None:
    """Raise ValueError unless the bands start at 1, end at `max_concurrency` and neither
    overlap nor leave gaps, with K >= 0."""
    if not table:
        raise ValueError("no bands")
    expect = 1
    for start, end, k in table:
        if start != expect:
            raise ValueError(f"band [{start}, {end}, {k}] starts at {start}, expected {expect}")
        if end < start or k < 0:
            raise ValueError(f"band [{start}, {end}, {k}] is empty or has K < 0")
        expect = end + 1
    if expect - 1 != max_concurrency:
        raise ValueError(f"bands end at {expect - 1}, not at the highest concurrency {max_concurrency}")


def vllm_speculative_config(method: str, draft: str | None, k: int) -> dict[str, Any]:
    """vLLM's `--speculative-config` for one configuration: `model` is the draft model, the
    EAGLE-3 head or the Medusa heads; n-gram gets the lookup sizes specbench's drafter uses
    (`SpeculativeConfig`'s defaults; vLLM's own default is 5..5), suffix the four suffix-tree
    knobs it measured with."""
    cfg: dict[str, Any] = {"method": method}
    if draft:
        cfg["model"] = draft
    cfg["num_speculative_tokens"] = k
    if method == "ngram":
        cfg.update(prompt_lookup_min=_NGRAM.ngram_min, prompt_lookup_max=_NGRAM.ngram_max)
    elif method == "suffix":  # the suffix-tree knobs measured (vLLM's names; its defaults too)
        cfg.update({knob: getattr(_NGRAM, knob) for knob in SUFFIX_KNOBS})
    return cfg


SGLANG_ALGORITHMS = {"draft_model": "STANDALONE", "eagle3": "EAGLE3"}  # tree drafters (num_steps, topk)


def sglang_args(method: str, draft: str | None, k: int, topk: int = 1,
                num_draft_tokens: int | None = None) -> list[str] | None:
    """SGLang's flags for one configuration (None: SGLang has no such method). Its
    `--speculative-num-draft-tokens` counts what one target pass verifies (a chain's k + 1,
    a tree's node budget, the root included), as specbench's `num_draft_tokens` does."""
    if method in SGLANG_ALGORITHMS:
        return ["--speculative-algorithm", SGLANG_ALGORITHMS[method], "--speculative-draft-model-path", str(draft),
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
                "--speculative-num-draft-tokens", str(num_draft_tokens if topk > 1 and num_draft_tokens else k + 1)]
    if method == "ngram":
        # SGLang's NGRAM drafts a BFS tree up to 10 wide by default (its topk becomes the
        # breadth, its steps num_draft_tokens // breadth): breadth 1 makes it the chain of k
        # drafts that was measured
        return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k + 1),
                "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]
    return None


def _mal_rows(profile: dict[str, Any], table: list[list[int]]) -> list[dict[str, Any]]:
    rows = []
    for b, (start, end, k) in zip(profile.get("bands") or [], table):
        s = b.get("speculative") or {}
        mal, sp = s.get("mean_acceptance_length_tok"), s.get("speedup_tpot_p50")
        rows.append({
            "batch_size": f"{start}–{end}" if end > start else str(start), "k": k,
            "measured_mal": mal, "measured_speedup": sp,
            "break_even_mal": round(mal / sp, 3) if mal and sp else None,
            "trial": s.get("trial"), "run_id": s.get("run_id")})
    return rows


def serving_profiles(profile: dict[str, Any]) -> dict[str, Any]:
    """Everything `write_serving` writes, as data (see the module docstring)."""
    table, why, fam = bands_table(profile)
    bands = profile.get("bands") or []
    max_c = max((b["measured_at_concurrency"] for b in bands), default=0)
    notes: list[str] = []
    out: dict[str, Any] = {"bands": why, "notes": notes, "vllm": None, "vllm_legacy": None,
                           "sglang": None}
    spec_name = None
    if fam is not None and table:
        check_bands(table, max_c)
        method, draft = fam
        kmax = max(k for _, _, k in table)
        if kmax > 0:
            vllm = vllm_speculative_config(method, draft, kmax)
            vllm["num_speculative_tokens_per_batch_size"] = table
            out["vllm"] = vllm
        else:  # the profile speculates with a draft tree only, and no chain pays
            notes.append("vLLM: baseline (the profile speculates with a draft tree, which vLLM does not "
                         "serve, and no chain measured pays)")
        legacy = profile.get("speculative_config")
        if legacy and legacy.get("topk", 1) > 1:
            # a tree: vLLM runs the chains of its table instead, on from batch size 1 while they pay
            on = 0
            while on < len(table) and table[on][2] > 0:
                on += 1
            legacy = ({"method": method, "model": draft, "num_speculative_tokens": table[0][2],
                       "disable_by_batch_size": table[on - 1][1] if on < len(table) else None} if on else None)
        if legacy:
            out["vllm_legacy"] = vllm_speculative_config(legacy["method"], legacy.get("model"),
                                            int(legacy["num_speculative_tokens"]))
            if legacy.get("disable_by_batch_size") is not None:
                out["vllm_legacy"]["disable_by_batch_size"] = int(legacy["disable_by_batch_size"])
        first = _cfg(next(b for b in bands if _pays(b, 1.0)).get("speculative"))
        first_k = int(first["num_speculative_tokens"])
        sglang = sglang_args(method, draft, first_k, first.get("topk", 1), first.get("num_draft_tokens"))
        spec_name = (f"spec_decode_{method}_k{first_k}_topk{first['topk']}" if first.get("topk", 1) > 1
                     else f"spec_decode_{method}_k{kmax}")
        if table[-1][2] > 0:
            notes.append(f"speculation still pays at the highest concurrency measured ({max_c}); vLLM "
                         f"keeps K={table[-1][2]} above it: measure higher concurrency before relying on that")
        if draft and "/" not in str(draft) and not Path(str(draft)).exists():
            notes.append(f"model {draft!r} is a specbench catalog name: point vLLM/SGLang at a path "
                         f"or Hugging Face id of the same weights (`specbench models pull {draft}` prints "
                         "the directory it fills)")
        if method == "ngram":
            notes.append("SGLang's NGRAM looks n-grams up in a trie of the requests it has served, not "
                         "only the prompt: its flags (k -> --speculative-num-draft-tokens k+1, BFS breadth "
                         "1: a chain) match the measured chain's shape, not its drafts")
        # the profile's own bands (a tree counts: SGLang serves trees), not vLLM's K table
        speculating = [_pays(b, 1.0) and _family(_cfg(b.get("speculative"))) == fam for b in bands]
        if sglang is None:
            out["sglang_why"] = f"SGLang has no {method} speculation: serve SGLang without it"
            notes.append(f"SGLang: baseline ({out['sglang_why']})")
        elif all(speculating):
            out["sglang"] = sglang
            notes.append("SGLang has no per-batch-size schedule: its flags speculate at every batch size "
                         f"(k={first_k}, the first band's)")
        else:
            last = max(_end(b) for b, on in zip(bands, speculating) if on)
            out["sglang_why"] = (f"speculation pays only up to batch size {last}, and SGLang cannot switch it "
                                 "off above a batch size: serve SGLang without it, or where traffic stays at "
                                 f"{last} concurrent requests or fewer: {shlex.join(sglang)}")
            notes.append(f"SGLang: baseline ({out['sglang_why']})")
    else:
        notes.append("speculation does not pay at any measured concurrency: serve without "
                     "--speculative-config")
    if out["sglang"] is None and "sglang_why" not in out:
        out["sglang_why"] = "speculation does not pay at any measured concurrency: serve without speculation"
    mal = _mal_rows(profile, table)
    for r in mal:  # a MAL is >= 1: a lower threshold could never fire (a speedup above MAL)
        flags = physics.mal_threshold("the break-even MAL", r["break_even_mal"])
        if flags:
            r["inconsistent"], r["break_even_mal"] = flags, None
            notes.append(f"batch size {r['batch_size']}: {flags[0]}; no threshold written")
    on = [r for r in mal if r["k"] > 0 and r["break_even_mal"] is not None]
    monitor: dict[str, Any] = {
        "mal_promql": PROMQL_MAL,
        "mal_alert_below": max((r["break_even_mal"] for r in on), default=None),
        "mal_warn_below": round(0.9 * min(r["measured_mal"] for r in on), 3) if on else None,
        "per_batch_size": mal,
        "also_watch": ["vllm:num_requests_running (the batch size the table is keyed on)",
                       "TPOT p50/p95 of the canary against the baseline at the same load"],
        "why": ("alert: below the highest break-even MAL (measured MAL / measured TPOT speedup) of "
                "the bands that speculate, speculation no longer pays there; warn: 10% under the "
                "lowest measured MAL"),
    }
    profiles: dict[str, Any] = {"baseline": {"vllm": {"speculative_config": None}, "sglang": {"args": []}}}
    rollout: dict[str, Any] = {"default": "baseline"}
    if spec_name:
        profiles[spec_name] = {"vllm": {"speculative_config": out["vllm"]},
                               "vllm_legacy": {"speculative_config": out["vllm_legacy"]},
                               "sglang": {"args": out["sglang"]},
                               "bands": why}
        rollout.update({
            "canary": spec_name,
            "stages_percent": list(CANARY_STAGES), "hold_minutes": HOLD_MINUTES,
            "promote_if": [f"MAL >= {monitor['mal_warn_below']} over the hold",
                           "canary TPOT p50 below the baseline's at the same load"],
            "rollback_if": [f"MAL < {monitor['mal_alert_below']} for 10 minutes",
                            "canary TPOT p50 above the baseline's for 10 minutes"],
        })
    out["rollout"] = {"profiles": profiles, "rollout": rollout, "monitor": monitor,
                      "source": {"study": (profile.get("study") or {}).get("name"),
                                 "generated_at": profile.get("generated_at")}}
    return out


def vllm_flag(cfg: dict[str, Any]) -> str:
    """`--speculative-config '<json>'`, quoted for a POSIX shell."""
    return "--speculative-config " + shlex.quote(json.dumps(cfg, separators=(", ", ": ")))


def write_serving(profile_path: Path, profile: dict[str, Any]) -> dict[str, Path]:
    """Write the paste-ready files next to `profile_path` (`<stem>.vllm.json`,
    `<stem>.vllm-legacy.json`, `<stem>.sglang.txt`, `<stem>.rollout.yaml`), always all four,
    so a script that pastes them never applies a stale one: where the profile says baseline,
    the vLLM files hold JSON `null` (no --speculative-config) and the SGLang file one comment
    line, `# baseline: <why>` (no flags)."""
    import yaml


    serving = serving_profiles(profile)
    written: dict[str, Path] = {}
    texts: dict[str, str] = {
        # JSON null = no --speculative-config (baseline): a script pasting it never keeps a stale one
        "vllm": json.dumps(serving["vllm"], indent=2) + "\n",
        "vllm_legacy": json.dumps(serving["vllm_legacy"], indent=2) + "\n",
        "sglang": (shlex.join(serving["sglang"]) + "\n") if serving["sglang"]
        else f"# baseline: {serving['sglang_why']}\n",
        "rollout": ("# Rollout plan and monitoring written by `specbench sweep` from "
                    f"{profile_path.name}.\n# Notes:\n"
                    + "".join(f"#  - {n}\n" for n in serving["notes"])
                    + yaml.safe_dump(serving["rollout"], sort_keys=False, allow_unicode=True, width=100)),
    }
    for key, text in texts.items():
        path = profile_path.with_name(profile_path.stem + SERVING_FILES[key])
        atomic_write(path, lambda fh, t=text: fh.write(t.encode("utf-8")))
        written[key] = path
    return written

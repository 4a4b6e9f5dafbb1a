"""Whether two runs measured the same thing, and what else differs between them.

- Must match, else "not comparable" (exit 2, naming the difference): the workload (name and
  kind), the prompt ids of every compared configuration, each prompt's sampling
  (temperature, top_p, top_k, seed, max_new_tokens), the run flags that change what is
  generated (ignore_eos, chat_template, truncate; the run seed when request seeds are
  derived from it), and the configurations (config_id = method, k, concurrency, rate).
  `pair_configs` with `allow_diff` compares the configurations present in both runs and
  pairs the rest by (baseline or not, concurrency, request rate) when that is unambiguous, so
  `draft_model-k4-c1` vs `draft_model-k5-c1` (a change of k) can be gated too.
- May differ, reported as information (`info_differences`): target and draft models, dtype,
  device, backend, package versions, git revision, host, warm-up.

Boundary: records DataFrames and run.json metadata in, reasons and differences out.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

import pandas as pd

from specbench.config import RunConfig
from specbench.formatting import plain, same


_SAMPLING = ("temperature", "top_p", "top_k", "seed", "max_new_tokens")
_SETUP_FLAGS = ("ignore_eos", "chat_template", "truncate")


def fmt_ids(ids: list[str], limit: int = 3) -> str:
    ids = sorted(ids)
    shown = ", ".join(ids[:limit])
    return shown + (f", … ({len(ids) - limit} more)" if len(ids) > limit else "")


def config_keys(df: pd.DataFrame) -> dict[str, tuple]:
    """config_id -> (is_baseline, concurrency, request_rate), in order of appearance."""
    out: dict[str, tuple] = {}
    for cid, g in df.groupby("config_id", sort=False):
        r = g.iloc[0]
        rate = plain(r["request_rate"])
        out[str(cid)] = (bool(r["is_baseline"]), int(r["concurrency"]), rate)
    return out


def pair_configs(base: dict[str, tuple], cur: dict[str, tuple],
                 allow_diff: bool) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(pairs, only in baseline, only in current). Same ids pair up; with `allow_diff` the
    leftovers pair by (is_baseline, concurrency, rate) when exactly one is left on each side."""
    pairs = [(c, c) for c in base if c in cur]
    left_b = [c for c in base if c not in cur]
    left_c = [c for c in cur if c not in base]
    if allow_diff:
        for key in dict.fromkeys(base[c] for c in left_b):
            bs = [c for c in left_b if base[c] == key]
            cs = [c for c in left_c if cur[c] == key]
            if len(bs) == 1 and len(cs) == 1:
                pairs.append((bs[0], cs[0]))
                left_b.remove(bs[0])
                left_c.remove(cs[0])
    return pairs, left_b, left_c


def _file_name(workload: Any) -> Any:
    """A prompt file's name without its directory (which depends on where each run was started
    from); named sets and hf: datasets stay as they are. The prompts themselves are compared
    by id and sampling below."""
    text = str(workload)
    if text.startswith("hf:") or ("/" not in text and "\\" not in text):
        return workload
    return PurePath(text).name


def _unique(df: pd.DataFrame, col: str) -> list[Any]:
    return sorted({plain(v) for v in df[col].unique()}, key=str)


def setup_differences(base_df: pd.DataFrame, base_meta: dict, cur_df: pd.DataFrame,
                      cur_meta: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """Reasons the runs did not measure the same thing (empty when they did)."""
    reasons: list[str] = []
    for col in ("workload", "workload_kind"):
        b, c = _unique(base_df, col), _unique(cur_df, col)
        if col == "workload" and [_file_name(v) for v in b] == [_file_name(v) for v in c]:
            continue  # one prompt file, spelled relative in one run and absolute in the other
        if b != c:
            show = lambda v: ", ".join(map(repr, v))  # noqa: E731
            reasons.append(f"{col} differs (baseline {show(b)}, current {show(c)})")

    # prompt ids, per compared configuration; identical differences are reported once
    by_diff: dict[tuple, list[str]] = {}
    for bc, cc in pairs:
        b = set(base_df.loc[base_df["config_id"] == bc, "prompt_id"])
        c = set(cur_df.loc[cur_df["config_id"] == cc, "prompt_id"])
        if b != c:
            key = (tuple(sorted(b - c)), tuple(sorted(c - b)))
            by_diff.setdefault(key, []).append(bc if bc == cc else f"{bc} -> {cc}")
    for (only_b, only_c), cfgs in by_diff.items():
        parts = []
        if only_b:
            parts.append(f"{len(only_b)} only in baseline ({fmt_ids(list(only_b))})")
        if only_c:
            parts.append(f"{len(only_c)} only in current ({fmt_ids(list(only_c))})")
        reasons.append(f"prompt ids differ in {', '.join(cfgs)}: {'; '.join(parts)}")
    for name, meta in (("baseline", base_meta), ("current", cur_meta)):
        if by_diff and meta.get("status") not in (None, "complete"):
            reasons.append(f"the {name} run is {meta.get('status')} (it did not finish)")

    # sampling of each shared prompt
    b_s = base_df.groupby("prompt_id")[list(_SAMPLING)].first()
    c_s = cur_df.groupby("prompt_id")[list(_SAMPLING)].first()
    shared = b_s.index.intersection(c_s.index)
    for col in _SAMPLING:
        bad = [p for p in shared if not same(plain(b_s.at[p, col]), plain(c_s.at[p, col]))]
        if bad:
            p = sorted(bad)[0]
            reasons.append(f"sampling differs: {col} on {len(bad)} prompt(s) (e.g. {p}: "
                           f"baseline {plain(b_s.at[p, col])}, current {plain(c_s.at[p, col])})")

    bcfg, ccfg = _config(base_meta), _config(cur_meta)
    flags = list(_SETUP_FLAGS)
    if base_df["seed"].isna().any() or cur_df["seed"].isna().any():
        flags.append("seed")  # request seeds are derived from the run seed and the prompt id
    for key in flags:  # a setting an older run did not record (None) is not compared
        b, c = getattr(bcfg, key), getattr(ccfg, key)
        if b is not None and c is not None and not same(b, c):
            reasons.append(f"run setting {key} differs (baseline {b!r}, current {c!r})")
    return reasons


def _config(meta: dict) -> RunConfig:
    return RunConfig.from_dict(meta.get("config"))


def _info_fields(meta: dict) -> dict[str, Any]:
    cfg = _config(meta)
    out = {
        "target": cfg.target,
        "draft": cfg.draft,
        "ngram": list(cfg.ngram) if cfg.method == "ngram" and cfg.ngram is not None else None,
        "dtype": cfg.dtype_used,
        "device": meta.get("device"),
        "backend": cfg.backend,
        "warmup": cfg.warmup,
        "git_revision": meta.get("git_revision"),
        "hostname": meta.get("hostname"),
    }
    for name, version in sorted((meta.get("versions") or {}).items()):
        out[f"{name} version"] = version
    return out


def info_differences(base_meta: dict, cur_meta: dict) -> list[dict[str, Any]]:
    """What may differ (the change under test, the machine), as {field, baseline, current}."""
    b, c = _info_fields(base_meta), _info_fields(cur_meta)
    return [{"field": k, "baseline": b.get(k), "current": c.get(k)}
            for k in dict.fromkeys([*b, *c]) if not same(b.get(k), c.get(k))]


def comparable_pairs(bdf: pd.DataFrame, bmeta: dict, cdf: pd.DataFrame, cmeta: dict, allow_diff: bool
                     ) -> tuple[list[tuple[str, str]], list[str], list[dict[str, Any]], list[str]]:
    """Whether two runs can be compared at all, and which of their configurations pair up:
    (the (baseline, current) config id pairs, every reason they cannot be compared (empty when
    they can), their metadata differences, the configurations left unpaired)."""
    reasons = [f"the {name} run has no samples" for name, df in (("baseline", bdf), ("current", cdf)) if not len(df)]
    if reasons:
        return [], reasons, [], []
    differences = info_differences(bmeta, cmeta)
    bkeys, ckeys = config_keys(bdf), config_keys(cdf)
    pairs, only_b, only_c = pair_configs(bkeys, ckeys, allow_diff)
    if not pairs:
        reasons.append(f"no configuration in common (baseline: {', '.join(bkeys)}; current: {', '.join(ckeys)})")
    elif (only_b or only_c) and not allow_diff:
        parts = ([f"only in baseline: {', '.join(only_b)}"] if only_b else []) + \
                ([f"only in current: {', '.join(only_c)}"] if only_c else [])
        reasons.append(f"configurations differ ({'; '.join(parts)}); pass --allow-config-diff to compare the ones "
                       "in common and pair the rest by concurrency")
    unmatched = [f"{c} (baseline only)" for c in only_b] + [f"{c} (current only)" for c in only_c]
    reasons += setup_differences(bdf, bmeta, cdf, cmeta, pairs)
    return pairs, reasons, differences, unmatched

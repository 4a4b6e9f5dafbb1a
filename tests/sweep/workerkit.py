"""Shared by the multi-worker sweep tests: start `python -m specbench sweep` worker processes
on the tiny models, and check a finished study against its run directories on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from specbench.records import read_run
from specbench.sweep.space import config_key, configuration
from specbench.sweep.workers import RECENT_S, WORKER_ATTR

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
]
ENV = {"COLUMNS": "200", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def write_prompts(tmp_path: Path, prompts: list[dict] = PROMPTS) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def sweep_args(tiny_pair, prompts: Path, storage: str, out: Path, *extra: str,
               study: str = "shared") -> list[str]:
    return [sys.executable, "-m", "specbench", "sweep", "--target", str(tiny_pair[0]),
            "--draft", str(tiny_pair[1]), "--workload", str(prompts), "--dtype", "float32",
            "--device", "cpu", "--warmup", "0", "--study-name", study, "--storage", storage,
            "--out", str(out), *extra]


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    # the worktree on the path, whatever the current directory
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(workers: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    deadline = time.monotonic() + timeout
    out = []
    for w in workers:
        o, e = w.communicate(timeout=max(1.0, deadline - time.monotonic()))
        out.append((w.returncode, o, e))
    return out


def tpot_p50(run_dir: Path, method: str | None = None) -> float:
    """TPOT p50 straight from a run's Parquet (successful samples of `method`, or all),
    independent of the summary the trial stored."""
    df, _ = read_run(run_dir)
    if method is not None:
        df = df[df["method"] == method]
    ok = df[df["error"].isna()]["tpot_s"].dropna().to_numpy(dtype=float)
    return float(np.percentile(ok, 50))


def paired_speedup(run_dir: Path) -> float:
    """A paired trial's speedup straight from its Parquet: the geometric mean over prompts of
    the TPOT of the baseline measured with it / its own."""
    df, _ = read_run(run_dir)
    ok = df[df["error"].isna()]
    base = ok[ok["method"] == "none"].groupby("prompt_id")["tpot_s"].mean()
    spec = ok[ok["method"] != "none"].groupby("prompt_id")["tpot_s"].mean()
    shared = base.index.intersection(spec.index)
    return float(np.exp(np.log(base.loc[shared] / spec.loc[shared]).mean()))


_SHOWN = ("worker", "run_id", "duplicate_of", "fail_reason", "ticket", "config_key")


def check_study(study: optuna.Study, out: Path, concurrency: tuple[int, ...],
                n_prompts: int = len(PROMPTS), unrecorded: set[int] = frozenset()) -> list:
    """Invariants of a finished study shared by workers; returns its trials. `unrecorded`:
    failed trials whose worker lost the storage after measuring; their run directories may
    be on disk, linked to no trial."""
    trials = study.trials
    unfinished = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert not unfinished, [(t.number, t.state.name, t.params, t.user_attrs.get("worker")) for t in trials]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]

    # no configuration measured twice: one measuring trial per key, one run directory each
    measured = [t for t in complete if "duplicate_of" not in t.user_attrs]
    keys = [config_key(configuration(**t.params)) for t in measured]
    assert len(keys) == len(set(keys)), sorted(keys)
    linked = {t.user_attrs["run_id"] for t in measured}
    on_disk = {p.name for p in (out / "runs").iterdir()}
    assert linked <= on_disk
    for name in on_disk - linked:  # only where a worker lost the storage after measuring
        number = int(name.split("-t", 1)[1][:4])
        assert number in unrecorded and trials[number].state == TrialState.FAIL, (name, [
            (t.number, t.state.name, t.params, {k: v for k, v in t.user_attrs.items() if k in _SHOWN},
             t.system_attrs.get("retry_history")) for t in trials])
    by_number = {t.number: t for t in measured}

    # the baseline exists at every concurrency
    baselines = {t.params["concurrency"]: t for t in measured if t.params["method"] == "none"}
    assert sorted(baselines) == sorted(concurrency)

    for t in complete:
        source = by_number[t.user_attrs.get("duplicate_of", t.number)]
        assert config_key(configuration(**source.params)) == config_key(configuration(**t.params))
        run_dir = out / t.user_attrs["run_dir"]
        assert run_dir.is_dir() and t.user_attrs["run_id"] == source.user_attrs["run_id"]
        df, meta = read_run(run_dir)
        speculative = t.params["method"] != "none"  # a paired trial holds its own baseline too
        assert set(df["run_id"]) == {t.user_attrs["run_id"]}
        if speculative:  # both alike: every prompt, or as many as the sequential rule took
            paired = t.user_attrs["paired"]
            per_config = df.groupby("config_id").size()
            assert len(per_config) == 2 and (per_config == (paired["n"] if paired["stopped"] else n_prompts)).all()
        else:
            assert len(df) == n_prompts
        assert meta["config"]["sweep"]["trial"] == source.number
        # the host that measured it, in the run directory and in the trial
        assert meta["hostname"] == meta["config"]["sweep"]["host"] == t.user_attrs["host"]
        # the stored values are what the Parquet says
        mine = tpot_p50(run_dir, t.params["method"])
        assert t.user_attrs["tpot_p50_ms"] == round(mine * 1e3, 3)
        want = paired_speedup(run_dir) if speculative else 1.0
        assert abs(t.value - want) <= 1e-9 * max(1.0, t.value), (t.number, t.value, want)
    return trials


def check_profile_writers(study: optuna.Study, workers: list[subprocess.Popen],
                          results: list[tuple[int, str, str]], profile: Path) -> bool:
    """Who wrote the profile, against when each worker measured: its first trial's start (the
    storage's clock; a worker registers before it), and `seen` in its study attr, set when it
    marked itself done, just before deciding. The last worker to finish writes, or, where
    others finished within RECENT_S of it, the one whose claim stood, which the last one names
    (claims race through the storage, not through the clocks of the hosts); a worker that
    finished while another was clearly still measuring does not. Returns whether all the
    workers overlapped (then exactly one wrote): a worker that reached its first trial only
    after another had finished (a slow start on a loaded machine) leaves that one the last at
    its time, and both rightly write."""
    attrs = {v["pid"]: v for k, v in study.user_attrs.items() if k.startswith(WORKER_ATTR)}
    first: dict[str, float] = {}
    for t in study.trials:
        wid = t.user_attrs.get("worker")
        if wid is not None and t.datetime_start is not None:
            first[wid] = min(first.get(wid, float("inf")), t.datetime_start.timestamp())
    span, ids, outs = {}, {}, {}
    for w, (_, out, _) in zip(workers, results):
        (wid,) = [k[len(WORKER_ATTR):] for k, v in study.user_attrs.items()
                  if k.startswith(WORKER_ATTR) and v["pid"] == w.pid]
        assert attrs[w.pid]["state"] == "done", attrs[w.pid]
        wrote = f"\nprofile: {profile}" in out
        assert wrote != ("profile: not written by this worker" in out), out[-400:]
        span[w.pid] = (first[wid], attrs[w.pid]["seen"], wrote)
        ids[w.pid], outs[w.pid] = wid, out
    last = max(span, key=lambda pid: span[pid][1])
    if not span[last][2]:  # then a worker that finished with it holds the claim, and it says so
        claimed = [pid for pid, (_, end, wrote) in span.items()
                   if wrote and span[last][1] - end < RECENT_S]
        assert len(claimed) == 1, f"the last worker to finish did not write the profile: {span}"
        said = " ".join(outs[last].split())
        assert f"the profile is written by worker {ids[claimed[0]]}, which finished at the same time" in said, \
            outs[last][-400:]
    for pid, (_, end, wrote) in span.items():
        busy = [q for q, (start, fin, _) in span.items() if q != pid and start < end and fin > end + 1.0]
        assert not (wrote and busy), f"pid {pid} wrote the profile while {busy} were still measuring: {span}"
    overlapped = max(s for s, _, _ in span.values()) < min(f for _, f, _ in span.values())
    if overlapped:
        assert sum(w for _, _, w in span.values()) == 1, span
    return overlapped


def get_json(app, path: str) -> dict:
    """GET `path` from a WSGI app in-process (no server, no port)."""
    import io
    from wsgiref.util import setup_testing_defaults

    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status and status[0].startswith("200"), (path, status, body[:300])
    return json.loads(body)

"""Can a team act on a sweep? Two studies of one spec, back to back, side by side.

    # exhaustive grid against the adaptive sweep, on a quiet machine:
    python benchmarks/sweep_trust.py --studies grid,model
    # the same adaptive study twice on a loaded machine (one CPU burner per --burn):
    python benchmarks/sweep_trust.py --studies model,model --burn 1
    # a shipped spec twice, as it is written (its sampler and stopping rule):
    python benchmarks/sweep_trust.py --spec sweeps/quick-cpu.toml --studies spec,spec --burn 1
    # the same spec twice beside a bursty neighbour (busy ~20 s, idle ~20 s, at random):
    python benchmarks/sweep_trust.py --studies spec,spec --burn 1 --burst 20,20 -- -k 2,4 --concurrency 1,8

Each study is `specbench sweep benchmarks/sweep_trust.toml` (or --spec) in its own directory under --out,
with its own SQLite storage, run one after the other:
  - `grid`: --sampler grid --no-sequential --batch level (every point, every prompt: the
    exhaustive answer, measured the cheapest way: one run per concurrency level, one baseline
    for all its configurations);
  - `grid-trial`: the same with --batch trial (each configuration with its own baseline);
  - `model`: --sampler model --sequential --batch level (the corner levels first, points the
    fitted model rules out skipped, each configuration leaving its level's rotation once its
    paired interval decides).
Before the first study a one-prompt warm-up run loads the models, so neither study pays for a
cold page cache. --burn N starts N busy-looping processes for the whole comparison (the load
the sweep's pairing in time must stand up to); with --burst ON,OFF each burner alternates busy
and idle spells of random length (exponential, means ON and OFF seconds, seeded): the bursty
neighbour that moves one configuration's block and not the other's, which ABBA order alone
does not cancel.

Printed: each study's wall time, trials measured, points skipped, prompts measured
(speculative + the baseline samples measured with them), flagged trials (physics checks), and
per concurrency band the recommendation (profile, method, k), the paired TPOT speedup and its
interval, then whether the two studies agree band by band, and the wall-time ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml

SPEC = Path(__file__).with_name("sweep_trust.toml")
MODES = {"grid": ["--sampler", "grid", "--no-sequential", "--batch", "level"],
         "grid-trial": ["--sampler", "grid", "--no-sequential", "--batch", "trial"],
         "model": ["--sampler", "model", "--sequential", "--batch", "level"],
         "spec": []}  # as the spec file says


def burn(burst: tuple[float, float] | None = None, seed: int = 0) -> None:
    import random

    rng = random.Random(seed)
    while True:
        until = time.monotonic() + (rng.expovariate(1 / burst[0]) if burst else 3600.0)
        while time.monotonic() < until:
            pass
        if burst:
            time.sleep(rng.expovariate(1 / burst[1]))


def run_study(spec: Path, mode: str, name: str, out: Path, extra: list[str]) -> float:
    d = out / name
    cmd = [sys.executable, "-m", "specbench", "sweep", str(spec), "--study-name", name,
           "--storage", f"sqlite:///{d}.db", "--out", str(d), *MODES[mode], *extra]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def describe(name: str, out: Path) -> dict:
    profile = yaml.safe_load((out / name / "profile.yaml").read_text())
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / name}.db")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # prompts measured: the rows of every run the study wrote (a level batch's trials share one)
    from specbench.records import read_run

    runs = {t.user_attrs["run_dir"] for t in study.trials if t.user_attrs.get("run_dir")}
    prompts = sum(len(read_run(out / name / r)[0]) for r in runs)
    flagged = sum(1 for t in done if t.user_attrs.get("inconsistent"))
    # the physics bound: paired TPOT speedup / tokens per target pass (mean acceptance length)
    ratios = [((t.user_attrs.get("paired") or {}).get("point") or 0) / mal
              for t in done if not t.user_attrs.get("inconsistent")
              and (mal := (t.user_attrs.get("summary") or {}).get("mean_acceptance_length_tok"))]
    measured: dict[int, dict[str, tuple]] = {}  # concurrency -> configuration -> (point, lo, hi)
    for t in done:
        p = t.user_attrs.get("paired") or {}
        if p.get("point") is not None and t.params.get("method", "none") != "none":
            k = t.params.get("num_speculative_tokens")
            measured.setdefault(t.params.get("concurrency"), {})[f"{t.params['method']} k={k}"] = (
                p["point"], p.get("lo"), p.get("hi"))
    bands = {}
    for b in profile["bands"]:
        bands[b["measured_at_concurrency"]] = {
            "profile": b["profile"], "pays": b["pays"],
            "config": (f"{b['method']} k={b['num_speculative_tokens']}" if b["profile"] == "speculative"
                       else "baseline"),
            "best": (f"k={b['speculative']['config']['num_speculative_tokens']}"
                     if b.get("speculative") else "-"),
            "ci": b.get("tpot_speedup_ci")}
    return {"trials": len(done), "skipped": len(profile["study"].get("skipped_by_model", {})),
            "prompts": prompts, "flagged": flagged, "bands": bands, "measured": measured,
            "max_speedup_over_mal": round(max(ratios), 3) if ratios else None,
            "recommendation": profile["recommendation"],
            "disable_by_batch_size": profile["disable_by_batch_size"]["value"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--studies", default="grid,model", help="two of grid|grid-trial|model|spec, run in this order")
    ap.add_argument("--spec", type=Path, default=SPEC, help="the sweep spec both studies run")
    ap.add_argument("--out", type=Path, default=Path("/tmp/sweep-trust"))
    ap.add_argument("--burn", type=int, default=0, help="CPU burner processes during both studies")
    ap.add_argument("--burst", default=None,
                    help="ON,OFF: mean busy and idle seconds of each burner (default: always busy)")
    ap.add_argument("--tag", default="", help="suffix of the study names (to run the pair again)")
    ap.add_argument("--no-run", action="store_true",
                    help="only compare two studies already in --out (as --studies and --tag name them)")
    ap.add_argument("extra", nargs="*", help="further `specbench sweep` flags, after --")
    args = ap.parse_args()
    modes = args.studies.split(",")
    assert len(modes) == 2 and all(m in MODES for m in modes), "--studies: two of grid|grid-trial|model|spec"
    args.out.mkdir(parents=True, exist_ok=True)
    names = [f"{m}{i}{args.tag}" for i, m in enumerate(modes)]
    if args.no_run:
        summary = args.out / f"summary{args.tag}.json"
        missing = [str(p) for p in (summary, *(args.out / f"{n}.db" for n in names)) if not p.exists()]
        if missing:
            sys.exit(f"--no-run compares studies already measured in --out: {', '.join(missing)} missing "
                     "(run without --no-run first, with the same --studies and --tag)")
        walls = json.loads(summary.read_text())["walls"]
        report(args, names, walls, None)
        return
    subprocess.run([sys.executable, "-m", "specbench", "run", "--num-prompts", "1", "--max-new-tokens", "4",
                    "--no-baseline", "--overwrite", "--out", str(args.out / "warmup")], check=True,
                   stdout=subprocess.DEVNULL)
    burst = tuple(float(x) for x in args.burst.split(",")) if args.burst else None
    burners = [multiprocessing.Process(target=burn, args=(burst, i), daemon=True) for i in range(args.burn)]
    for p in burners:
        p.start()
    try:
        walls = [run_study(args.spec, m, n, args.out, args.extra) for m, n in zip(modes, names)]
    finally:
        for p in burners:
            p.terminate()
    report(args, names, walls, burst)


def report(args: argparse.Namespace, names: list[str], walls: list[float], burst: tuple | None) -> None:
    res = [describe(n, args.out) for n in names]
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    print(f"\nCPU: {cpu}, {os.cpu_count()} cores; burners: {args.burn}"
          + (f", bursts of ~{burst[0]:g} s busy / ~{burst[1]:g} s idle" if burst else ""))
    print(f"{'':24}" + "".join(f"{n:>36}" for n in names))
    for label, vals in (("wall time (s)", [f"{w:.0f}" for w in walls]),
                        ("trials measured", [r["trials"] for r in res]),
                        ("points skipped by model", [r["skipped"] for r in res]),
                        ("prompts measured", [r["prompts"] for r in res]),
                        ("trials flagged (physics)", [r["flagged"] for r in res]),
                        ("max speedup / MAL", [r["max_speedup_over_mal"] for r in res]),
                        ("recommendation", [r["recommendation"] for r in res]),
                        ("disable_by_batch_size", [r["disable_by_batch_size"] for r in res])):
        print(f"{label:24}" + "".join(f"{str(v):>36}" for v in vals))
    agree = agree_profile = ties_only = True
    for c in sorted(set(res[0]["bands"]) | set(res[1]["bands"])):
        cells = []
        for r in res:
            b = r["bands"].get(c)
            if b is None:  # no band: nothing measured there (ruled out by the model): baseline
                cells.append("baseline (not measured)")
                continue
            ci = b["ci"]
            shown = b["config"] if b["profile"] == "speculative" else f"baseline ({b['best']})"
            cells.append(f"{shown} {ci[0]:.2f}x [{ci[1]:.2f},{ci[2]:.2f}]" if ci else shown)
        configs = [r["bands"].get(c, {}).get("config", "baseline") for r in res]
        profiles = [r["bands"].get(c, {}).get("profile", "baseline") for r in res]
        same, same_profile = len(set(configs)) == 1, len(set(profiles)) == 1
        agree &= same
        agree_profile &= same_profile
        print(f"{f'c={c}':24}" + "".join(f"{x:>36}" for x in cells)
              + ("" if same else "   <- differ" + ("" if same_profile else " (profile)")))
        if not same and not (same_profile and all(x != "baseline" for x in configs)):
            ties_only = False
        if not same and all(x != "baseline" for x in configs):
            # what each study measured for the other's pick: a difference inside its own noise
            # is a tie the two studies broke differently, not a different answer
            for r, name, other in ((res[0], names[0], configs[1]), (res[1], names[1], configs[0])):
                mine = r["bands"][c]["config"]
                got, own = r["measured"].get(c, {}).get(other), r["measured"].get(c, {}).get(mine)
                inside = bool(got and own and own[1] is not None and own[1] <= got[0] <= own[2])
                ties_only &= inside
                if got and own:
                    print(f"{'':26}{name} measured {other} at {got[0]:.2f}x [{got[1]:.2f},{got[2]:.2f}] "
                          f"beside its own {mine} at {own[0]:.2f}x [{own[1]:.2f},{own[2]:.2f}]: "
                          + ("inside its pick's interval" if inside else "outside its pick's interval"))
    print(f"\nsame profile (speculative or baseline) in every band: {'yes' if agree_profile else 'NO'}; "
          f"same configuration too: {'yes' if agree else 'NO'}"
          + ("" if agree else f" (each difference a tie inside both studies' own intervals: "
                              f"{'yes' if ties_only else 'NO'})") + "; "
          f"wall time {names[1]} / {names[0]}: {walls[1] / walls[0]:.2f}")
    if args.no_run:
        return
    (args.out / f"summary{args.tag}.json").write_text(json.dumps(
        {"names": names, "walls": walls, "results": res, "burn": args.burn, "burst": burst, "cpu": cpu}, indent=1, default=str))


if __name__ == "__main__":
    main()

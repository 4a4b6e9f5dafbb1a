"""Recheck the survivors of a finished mutation run (benchmarks/mutation.sh) against tests
written since, without mutating again: each mutant that survived (or had no test) runs the
given test files with mutmut's MUTANT_UNDER_TEST set, in one process, and is counted killed
when they fail. Prints the module's score before and after, and the mutants still alive.

    python benchmarks/mutation_recheck.py WORK_DIR TEST_FILE... [--equivalent FILE.md]

WORK_DIR is the run's directory (…/specbench_analysis_paired_py); the test files are copied
from this checkout into its mutated copy. `--equivalent` names a file of `- \\`mutant\\` ...`
lines: those are reported as explained, not alive. Run it with the python of the mutation venv
(WORK_DIR/../venv/bin/python), which imports specbench only from the mutated copy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def statuses(work: Path) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work,
                         capture_output=True, text=True, check=False).stdout
    return {name.strip(): status.strip() for name, status in
            (line.rsplit(":", 1) for line in out.splitlines() if ":" in line)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("tests", nargs="+")
    ap.add_argument("--equivalent", type=Path)
    args = ap.parse_args()
    work = args.work.resolve()
    equivalent_file = args.equivalent.resolve() if args.equivalent else None  # before the chdir below
    if equivalent_file is not None and not equivalent_file.is_file():
        print(f"mutation_recheck: --equivalent {args.equivalent}: no such file", file=sys.stderr)
        return 2
    status = statuses(work)
    if not status:
        print(f"mutation_recheck: no mutmut results in {work}", file=sys.stderr)
        return 2
    mutants = work / "mutants"
    for t in args.tests:
        shutil.copy2(ROOT / t, mutants / t)
    sys.path.insert(0, str(mutants))
    os.chdir(mutants)
    import pytest  # after the mutated copy is first on the path

    alive = sorted(n for n, s in status.items() if s in ("survived", "no tests"))
    killed_now = []
    for name in alive:
        os.environ["MUTANT_UNDER_TEST"] = name
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = pytest.main(["-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=",
                                "-q", "-x", *args.tests])
        if code == pytest.ExitCode.TESTS_FAILED:
            killed_now.append(name)
    os.environ.pop("MUTANT_UNDER_TEST", None)
    equivalent: set[str] = set()  # full names, or their tail after the module (`x_f__mutmut_3`, `f__mutmut_3`)
    if equivalent_file is not None:
        equivalent = set(re.findall(r"`([\w.]+__mutmut_\d+)`", equivalent_file.read_text()))
    counts = collections.Counter(status.values())
    total = sum(counts.values())
    before = counts["killed"] + counts["timeout"]
    after = before + len(killed_now)
    left = [n for n in alive if n not in killed_now]
    def explained(name: str) -> bool:
        tail = name.rsplit(".", 1)[-1]
        return name in equivalent or tail in equivalent or tail.removeprefix("x_") in equivalent

    unexplained = [n for n in left if not explained(n)]
    print(f"{work.name}: {total} mutants; before {before} killed ({before / total:.1%}); "
          f"after {after} killed ({after / total:.1%}) with {len(killed_now)} more; "
          f"{len(left) - len(unexplained)} equivalent (explained); {len(unexplained)} alive; "
          f"{counts['not checked']} not checked")
    for n in unexplained:
        print("  alive:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Mutation testing of the modules whose mistakes would change a verdict without failing loudly
# (issue 43), with mutmut (https://github.com/boxed/mutmut): a well-kept mutation tester that
# runs only the tests that reach each mutated function, and remembers what it has done.
# Not part of CI's time budget: one module takes minutes to an hour.
#
#   benchmarks/mutation.sh MODULE [TESTS...]     e.g.  benchmarks/mutation.sh specbench/analysis/physics.py
#
# MODULE is mutated in a copy of the working tree (the files git tracks or would, under $MUTATION_DIR,
# default /tmp/specbench-mutation/<module>), with the fast tests given, or the ones listed
# below for it. It prints mutmut's results and the score (killed / all mutants).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
module="${1:?usage: benchmarks/mutation.sh MODULE [TESTS...]}"
shift
declare -A TESTS=(
  [specbench/engine/verify.py]="tests/engine/test_verify.py tests/engine/test_engine.py"
  [specbench/engine/sampling.py]="tests/engine/test_sampling.py tests/engine/test_sampling_boundaries.py tests/engine/test_verify.py tests/engine/test_engine.py tests/engine/test_static.py::test_row_probs_is_probs_from_logits_per_row tests/engine/test_static.py::test_counter_uniforms_are_uniform_and_keyed_by_seed_salt_and_position"
  [specbench/engine/tree.py]="tests/engine/test_tree.py tests/engine/test_tree_greedy.py tests/engine/test_static.py::test_greedy_static_step_equals_the_eager_step tests/engine/test_static.py::test_greedy_static_eagle3_equals_the_eager_step tests/engine/test_static.py::test_greedy_static_medusa_equals_the_eager_step"
  [specbench/acceptance.py]="tests/test_acceptance.py tests/serve/test_exposition.py"
  [specbench/metrics.py]="tests/test_metrics.py tests/test_runner.py"
  [specbench/analysis/paired.py]="tests/test_analysis.py"
  [specbench/analysis/sequential.py]="tests/test_sequential.py"
  [specbench/analysis/physics.py]="tests/test_physics.py tests/test_analysis.py tests/sweep/test_sweep_verdict.py tests/sweep/test_sweep_serving.py"
  [specbench/compare/gate.py]="tests/test_compare.py tests/test_gate_boundaries.py"
  [specbench/sweep/profile.py]="tests/sweep/test_sweep_profile.py tests/sweep/test_sweep_verdict.py tests/sweep/test_sweep_serving.py tests/sweep/test_profile_boundaries.py tests/sweep/test_profile_writer.py"
)
if [ "$#" -gt 0 ]; then tests="$*"; else tests="${TESTS[$module]:-}"; fi
[ -n "$tests" ] || { echo "benchmarks/mutation.sh: no tests listed for $module: give them after it" >&2; exit 2; }
[ -f "$module" ] || { echo "benchmarks/mutation.sh: $module is not a file here" >&2; exit 2; }
base="${PYTHON:-$root/.venv/bin/python}"
"$base" -c "import mutmut" 2>/dev/null || { echo "mutmut is not installed: $base -m pip install -e '.[mutation]'" >&2; exit 2; }
# The project's venv imports specbench through its editable install, a finder that comes before
# PYTHONPATH, so the tests would run the unmutated code. A venv beside it sees the same packages
# (its site-packages named in a .pth, whose own .pth files, the editable finder's among them,
# are not run) and finds specbench only where PYTHONPATH says.
venv="${MUTATION_DIR:-/tmp/specbench-mutation}/venv"
if [ ! -x "$venv/bin/python" ]; then
    "$(cd "$(dirname "$base")" && "$base" -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
    site=$("$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/specbench-base.pth"
fi
python="$venv/bin/python"
work="${MUTATION_DIR:-/tmp/specbench-mutation}/$(echo "$module" | tr '/.' '__')"
rm -rf "$work" && mkdir -p "$work"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work"
cd "$work"
args=""
for t in $tests; do args+="\"$t\", "; done
# the suite's addopts (xdist, durations) are the full suite's: one process, quiet, here
sed -i 's/^addopts = .*/addopts = "-q -p no:randomly"/' pyproject.toml
cat >> pyproject.toml <<TOML

[tool.mutmut]
source_paths = ["specbench"]
only_mutate = ["$module"]
pytest_add_cli_args_test_selection = [${args%, }]
pytest_add_cli_args = ["-p", "no:xdist", "-x", "-q"]
TOML
# the tests import specbench from the mutated copy, not the editable install
# (made now: a path that does not exist when Python starts is remembered as having no modules)
mkdir -p "$work/mutants"
export PYTHONPATH="$work/mutants"
"$python" -m mutmut run || true
"$python" -m mutmut results --all true > results.txt 2>&1 || "$python" -m mutmut results > results.txt 2>&1 || true
"$python" - "$module" <<'PY'
import collections, re, sys
lines = [l.strip() for l in open("results.txt") if ":" in l]
status = collections.Counter(l.rsplit(":", 1)[1].strip() for l in lines)
total = sum(status.values())
killed = status.get("killed", 0) + status.get("timeout", 0)
print(f"{sys.argv[1]}: {dict(status)}; score {killed}/{total}" + (f" = {killed / total:.1%}" if total else ""))
for l in lines:
    if not l.endswith(("killed", "timeout")):
        print("  survivor:", l)
PY

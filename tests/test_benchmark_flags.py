"""Bad values of the benchmark scripts' flags added for issues 22, 25, 26 and 42: one line, a
non-zero exit, nothing written, before any model loads."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def refused(fn, needle: str) -> None:
    with pytest.raises(SystemExit) as exc:
        fn()
    msg = str(exc.value)
    assert needle in msg and len(msg.splitlines()) == 1, msg


def test_train_medusa_refuses_a_tree_of_no_nodes(tmp_path):
    mod = load("train_medusa")
    refused(lambda: mod.main(["--out", str(tmp_path / "heads"), "--tree-nodes", "0"]), "--tree-nodes must be >= 1")
    assert not (tmp_path / "heads").exists()


@pytest.mark.parametrize("content, extra, needle", [
    ("{not json", [], "not readable JSON"),
    ('{"speculative_token_tree": 3}', [], "expected a list of paths"),
    ('[[0], [0, 0, 0]]', [], "missing"),  # a path whose prefix [0, 0] is not in the tree
    ('[[0]]', ["--head", "H"], "--medusa-tree needs --medusa"),
])
def test_eagle3_vs_draft_refuses_a_bad_medusa_tree(tmp_path, monkeypatch, content, extra, needle):
    tree = tmp_path / "tree.json"
    tree.write_text(content)
    heads = extra or ["--medusa", str(tmp_path / "heads")]
    monkeypatch.setattr(sys, "argv", ["eagle3_vs_draft.py", *heads, "--medusa-tree", str(tree),
                                      "--out", str(tmp_path / "run")])
    refused(load("eagle3_vs_draft").main, needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--head", "H", "--topk", "0"], "--topk must be an integer >= 1"),
    (["--head", "H", "--topk", "2", "--num-draft-tokens", "12"], "--num-draft-tokens 12 exceeds"),  # 10 nodes at k 3
    (["--medusa", "M", "--topk", "2"], "--medusa-tree"),
])
def test_eagle3_vs_draft_refuses_a_bad_tree_shape(tmp_path, monkeypatch, extra, needle):
    monkeypatch.setattr(sys, "argv", ["eagle3_vs_draft.py", *extra, "-k", "3", "--out", str(tmp_path / "run")])
    refused(load("eagle3_vs_draft").main, needle)
    assert not (tmp_path / "run").exists()


def test_sweep_trust_no_run_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["sweep_trust.py", "--studies", "grid,model", "--out", str(tmp_path), "--no-run"])
    refused(load("sweep_trust").main, "summary.json")
    assert [p.name for p in tmp_path.iterdir()] == []
    (tmp_path / "summary.json").write_text(json.dumps({"walls": [1.0, 1.0]}))
    refused(load("sweep_trust").main, "grid0.db")


def test_eagle3_vs_draft_without_a_head_needs_a_target_the_catalog_has_a_head_for(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["eagle3_vs_draft.py", "--target", str(tmp_path / "other"),
                                      "--out", str(tmp_path / "run")])
    refused(load("eagle3_vs_draft").main, "--head: the catalog has no EAGLE-3 head for")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--name", "../escape", "--recipe", "r", "--measured", "m"], "--name must be a catalog name"),
    (["--name", "Tiny Head", "--recipe", "r", "--measured", "m"], "--name must be a catalog name"),
    (["--name", "tiny-head", "--recipe", "r", "--measured", "m", "--part-mb", "0"], "--part-mb must be in 1..95"),
    (["--name", "tiny-head", "--recipe", "r", "--measured", "m", "--part-mb", "200"], "--part-mb must be in 1..95"),
    (["--name", "tiny-head"], "--recipe and --measured: 'tiny-head' is no catalog head yet"),
])
def test_ship_head_refuses_bad_flags_before_writing_anything(tmp_path, extra, needle):
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"")
    before = sorted(p.name for p in (REPO / "specbench" / "models" / "heads").iterdir())
    refused(lambda: load("ship_head").main(["--head", str(head), *extra]), needle)
    assert sorted(p.name for p in (REPO / "specbench" / "models" / "heads").iterdir()) == before


@pytest.mark.parametrize("flags, needle", [
    (["--paths", "eager,warp"], "--paths: unknown warp"),
    (["--configs", "baseline,fast"], "--configs: unknown fast"),
    (["--layers", "28"], "--layers takes TARGET,DRAFT"),
])
def test_host_overhead_refuses_bad_flags(flags, needle, capsys):
    mod = load("host_overhead")
    with pytest.raises(SystemExit) as exc:
        mod.main(flags)
    assert exc.value.code == 2 and needle in capsys.readouterr().err


def test_host_overhead_json_counts_one_host_read_per_static_step(capsys):
    """The keys issue 41 names, one object per line; the static step reads the device once a
    step where the eager step reads it several times (the count can tell them apart)."""
    mod = load("host_overhead")
    mod.main(["--paths", "eager,static", "--layers", "2,1", "--batch", "1,2", "--steps", "4", "--prompt", "16",
              "--configs", "baseline,greedy,tree,eagle3,medusa,e3tree,mtree", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 * 7 * 2
    for heads in ("eagle3", "medusa"):  # the heads' chains and their trees
        assert {r["tree"] for r in rows if r["method"] == heads} == {8, None}
    assert {r["method"] for r in rows} == {"none", "draft_model", "eagle3", "medusa"}
    assert sorted({r["tree"] for r in rows}, key=str) == [8, None]  # k=4: best and second-best child per depth
    for r in rows:
        assert {"path", "method", "k", "batch", "sampling", "host_ms", "ops", "syncs"} <= set(r)
        assert r["host_ms"] > 0 and r["ops"] > 0
    assert {r["syncs"] for r in rows if r["path"] == "static"} == {1}
    assert min(r["syncs"] for r in rows if r["path"] == "eager") > 1


@pytest.mark.parametrize("extra, needle", [
    (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["--num-prompts", "-3"], "--num-prompts must be >= 1, got -3"),
    (["--tool-call-parser", ""], "--tool-call-parser must be a vLLM tool parser's name"),
    (["--tool-call-parser", "hermes --trust-remote-code"], "--tool-call-parser must be a vLLM tool parser's name"),
    (["--draft", "/no/such/draft"], "--draft must be a model directory, got '/no/such/draft'"),
])
def test_structured_vllm_refuses_bad_flags_before_starting_vllm(tmp_path, monkeypatch, extra, needle):
    started = []
    mod = load("structured_vllm")
    monkeypatch.setattr(mod.subprocess, "Popen", lambda *a, **k: started.append(a))
    monkeypatch.setattr(mod.tempfile, "mkdtemp", lambda **k: started.append(k))
    monkeypatch.setenv("SPECBENCH_VLLM_PYTHON", sys.executable)
    monkeypatch.setattr(sys, "argv", ["structured_vllm.py", *extra, "--out", str(tmp_path / "run")])
    refused(mod.main, needle)
    assert not started and not (tmp_path / "run").exists()



def test_host_overhead_reports_the_compile_paths_time_outside_its_graphs(capsys):
    """The default step count on the compile path (its extra steps timed apart fit the
    requests' budget), a one-layer model: the graphs' time and the rest add up to a step."""
    mod = load("host_overhead")
    mod.main(["--paths", "eager,compile", "--layers", "1,1", "--batch", "1", "--configs", "baseline", "--prompt", "8",
              "--json"])
    eager, compiled = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert eager["outside_ms"] is None and eager["outside_vs_eager"] is None
    assert compiled["path"] == "compile" and 0 < compiled["outside_ms"] and 0 < compiled["graph_ms"]
    assert compiled["outside_vs_eager"] == round(compiled["outside_ms"] / eager["host_ms"], 3)


def test_host_overhead_times_the_compiled_graphs_apart_from_the_rest_of_the_step():
    """What the compile path's `outside_ms` subtracts: the time inside Inductor's compiled
    graphs, counted while the context is open and only then."""
    mod = load("host_overhead")
    from torch._inductor.output_code import CompiledFxGraph

    real = CompiledFxGraph.__call__
    f = torch.compile(lambda x: (x @ x.T).relu().sum(), fullgraph=True, dynamic=False)
    x = torch.randn(256, 256)
    f(x)  # built outside the window
    with mod.graph_time() as inside:
        t = time.perf_counter()
        for _ in range(5):
            f(x)
        wall = time.perf_counter() - t
    assert 0 < inside[0] < wall and CompiledFxGraph.__call__ is real
    before = inside[0]
    f(x)
    assert inside[0] == before  # nothing counted once closed

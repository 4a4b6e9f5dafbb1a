"""`specbench run` at concurrency 1..8 on tiny float32 models: every greedy speculative sample
equals the non-speculative baseline token for token, at every concurrency and method, on the
engine's fast path, on transformers' forward as loaded (`--onednn off`) and on the static step
(`--capture static`), and the records
carry the per-step facts (batch size, context, drafted/accepted) and the per-configuration
statistics (batch sizes reached, memory)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cli_harness import specbench

FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "1", "--max-new-tokens", "14"]
PROMPTS = [{"id": f"p{i}", "prompt": text} for i, text in enumerate(
    ["Say hello to the team.", "abc abc abc abc abc", "def add(a, b):\n    return", "1, 2, 3, 4, 5,",
     "The quick brown fox", "SELECT * FROM", "Dear customer, thank you", "x = [i * i for i in"])]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


PATHS = {"auto": (["--onednn", "auto"], "fused oneDNN layers"), "off": (["--onednn", "off"], "transformers eager"),
         "static": (["--capture", "static"], "static step, op by op")}


@pytest.mark.parametrize("method,path", [("draft_model", "auto"), ("ngram", "auto"), ("draft_model", "off"),
                                         ("draft_model", "static")])
def test_greedy_outputs_equal_the_baseline_at_every_concurrency(tiny_pair, prompts_file, tmp_path, method, path):
    out = tmp_path / "run"
    draft = ["--draft", str(tiny_pair[1])] if method == "draft_model" else []
    res = specbench("run", "--target", str(tiny_pair[0]), *draft, "--method", method, "-k", "3",
                    "--concurrency", "1,2,4,8", "--workload", str(prompts_file), *PATHS[path][0],
                    *FAST, "--out", str(out))
    assert res.code == 0, res.output
    df = pd.read_parquet(out / "samples.parquet")
    base = {(r.prompt_id): list(r.output_token_ids) for r in df[df.is_baseline & (df.concurrency == 1)].itertuples()}
    for r in df.itertuples():
        assert list(r.output_token_ids) == base[r.prompt_id], (r.config_id, r.prompt_id)
        assert len(r.step_batch_size) == len(r.step_drafted) == r.target_forward_passes - 1
        assert max(r.step_batch_size, default=1) <= r.concurrency
        assert r.tokens_per_target_pass == pytest.approx(r.output_tokens / r.target_forward_passes)
    assert (df.loc[~df.is_baseline, "token_match_rate"] == 1.0).all()
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["engine"]["forward_path"] == PATHS[path][1]
    assert run["config"]["engine"]["capture"] == ("static" if path == "static" else "off")
    stats = run["config"]["configuration_stats"]
    for cid, s in stats.items():
        c = int(cid.rsplit("-c", 1)[1])
        assert max(int(b) for b in s["batch_sizes"]) == c
        assert s["memory"]["target_kv_peak_bytes"] <= s["memory"]["target_kv_allocated_bytes"]
        if cid.startswith("draft_model"):
            assert s["memory"]["draft_weight_bytes"] > 0 and s["memory"]["draft_kv_peak_bytes"] > 0
        else:
            assert s["memory"]["draft_weight_bytes"] == 0


def test_capture_refuses_a_method_the_static_step_does_not_run(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "ngram", "-k", "2", "--capture", "static",
                    "--workload", str(prompts_file), *FAST, "--out", str(tmp_path / "run"))
    res.refusal("--capture static", "method ngram", "--capture off or auto", alone=False)

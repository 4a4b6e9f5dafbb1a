"""benchmarks/train_eagle3.py on the tiny pair: it writes a head that loads and drafts, resumes
from its work directory without redoing a finished phase, and pauses while the quiet lock
exists during training (checkpoint first, then wait, then go on; the pause is not counted
as training time)."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.eagle3 import load_head
from specbench.engine import scheduler

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("train_eagle3", REPO / "benchmarks" / "train_eagle3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    texts = ["def add(a, b):", "Say hello.", "abc abc abc", "Sort a list.", "x = 1\ny = 2", "Write a poem.",
             "for i in range(3):", "Explain JSON.", "1, 2, 3, 4"]
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    return path


def argv(tiny_pair, prompts, out, *extra) -> list[str]:
    return ["--target", str(tiny_pair[0]), "--out", str(out), "--workload", str(prompts), "--holdout", "2",
            "--num-train-prompts", "6", "--answer-prompts", "3", "--max-new-tokens", "8",
            "--max-prompt-tokens", "32", "--concurrency", "2", "--shard-size", "4", "--draft-vocab", "64",
            "--intermediate-size", "64", "--batch-size", "2", "--dtype", "float32", "--aux-layers", "0,1,2",
            "--no-bf16", "--save-every", "2", "--val-sequences", "0", *extra]


def training(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["specbench_training"]


def test_writes_a_head_that_drafts_and_resumes(tiny_pair, prompts, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "3"))
    info = training(out)
    assert info["steps"] == 3 and info["prompts"] == 6 and info["answered_prompts"] == 3
    assert info["draft_vocab_size"] == 64 and len(info["held_out"]) == 2
    target = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype="float32").eval()
    head = load_head(out, target)
    assert head.config.format == "speculators" and head.aux_layers == (0, 1, 2)
    eng = Engine(target, head=head, pack=False)
    sp = SamplingParams(max_new_tokens=10, ignore_eos=True)
    spec, _ = scheduler.run(eng, [([5, 6, 7], sp)], SpeculativeConfig(method="eagle3", num_speculative_tokens=2, draft="h"))
    base, _ = scheduler.run(eng, [([5, 6, 7], sp)], SpeculativeConfig())
    assert spec[0].output_ids == base[0].output_ids and sum(s.drafted for s in spec[0].steps) > 0

    answers = (out / "work" / "responses.jsonl").read_text()
    capsys.readouterr()
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "5"))
    err = capsys.readouterr().err
    assert "resumed from step 3" in err and "generating" not in err  # answers and features kept
    assert (out / "work" / "responses.jsonl").read_text() == answers
    assert training(out)["steps"] == 5


def test_pauses_while_the_quiet_lock_exists(tiny_pair, prompts, tmp_path, monkeypatch, capsys):
    mod = load_script()
    out = tmp_path / "head"
    lock = tmp_path / "quiet"
    monkeypatch.setattr(mod, "QUIET_POLL_S", 0.05)
    real_loss, calls, seen = mod.ttt_loss, [], {}

    def release():
        seen["checkpoint_at_pause"] = (out / "work" / "checkpoint.pt").exists()
        lock.unlink()

    def loss_then_lock(*a, **kw):  # someone starts timing a benchmark after training step 2
        calls.append(1)
        if len(calls) == 2:
            lock.touch()
            threading.Timer(0.6, release).start()
        return real_loss(*a, **kw)

    monkeypatch.setattr(mod, "ttt_loss", loss_then_lock)
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "4", "--save-every", "100", "--pause-while", str(lock)))
    info = training(out)
    assert "paused" in capsys.readouterr().err and seen == {"checkpoint_at_pause": True}
    assert info["steps"] == 4 and info["quiet_paused_s"] >= 0.5
    assert info["train_active_s"] < info["train_wall_s"] - 0.4  # the pause is not training time


@pytest.mark.parametrize("curve, needle", [("x", "expected sequence counts"), ("0,2", "each K must be >= 1"),
                                           ("2,99", "each K must be in 1..")])
def test_a_bad_curve_is_refused_in_one_line_and_writes_no_head(tiny_pair, prompts, tmp_path, curve, needle):
    mod = load_script()
    out = tmp_path / "head"
    with pytest.raises(SystemExit) as exc:
        mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--curve", curve))
    assert needle in str(exc.value) and len(str(exc.value).splitlines()) == 1
    assert not (out / "config.json").exists() and not list(out.glob("curve-*"))


def test_a_curve_trains_one_head_per_data_size(tiny_pair, prompts, tmp_path):
    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "2", "--curve", "2,5"))
    assert sorted(p.name for p in out.glob("curve-*")) == ["curve-2", "curve-5"]
    assert [training(out / f"curve-{k}")["sequences"] for k in (2, 5)] == [2, 5]
    assert not (out / "config.json").exists()  # the curve's heads only


def test_a_negative_sharegpt_count_is_refused(tiny_pair, prompts, tmp_path):
    mod = load_script()
    with pytest.raises(SystemExit, match="--sharegpt must be >= 0"):
        mod.main(argv(tiny_pair, prompts, tmp_path / "head", "--sharegpt", "-1"))
    assert not (tmp_path / "head").exists()


def test_validation_keeps_the_best_head_and_patience_stops_training(tiny_pair, prompts, tmp_path):
    """With a learning rate that wrecks the head after its first step, the first validation is
    the best: training stops after --patience worse ones, and the head written is the best one,
    not the last."""
    import torch
    from safetensors.torch import load_file

    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "50", "--val-sequences", "3", "--eval-every", "1",
                  "--patience", "2", "--lr", "30", "--warmup-steps", "1", "--save-every", "100"))
    info = training(out)
    vals = info["validation"]
    assert info["validation_sequences"] == {"sharegpt": 3} and info["validation_tokens"]["sharegpt"] > 0
    assert [v["step"] for v in vals] == [1, 2, 3] and info["steps"] == 3  # stopped long before 50 steps
    assert info["validation_best"]["step"] == 1 and vals[1]["loss"] > vals[0]["loss"] < vals[2]["loss"]
    assert all(len(v["acc"]) == 3 and 0 <= v["expected_acceptance"] <= 1 for v in vals)
    ck = torch.load(out / "work" / "checkpoint.pt", weights_only=False)
    written = load_file(out / "model.safetensors")
    fc = next(k for k in written if k.endswith("fc.weight"))
    assert torch.equal(written[fc], ck["best_weights"]["fc.weight"])  # the best head ...
    assert not torch.equal(written[fc], ck["head"]["fc.weight"].cpu())  # ... not the last


def test_the_learning_rate_warms_up_holds_and_decays_to_a_tenth_from_the_step_asked():
    lr = load_script().learning_rate
    assert lr(0, 1e-3, 20, 100, None) == pytest.approx(1e-3 / 20)  # warm-up
    assert [lr(s, 1e-3, 20, 100, None) for s in (19, 50, 99)] == [1e-3] * 3  # constant without decay
    assert lr(49, 1e-3, 20, 100, 50) == 1e-3  # untouched before the decay starts
    assert lr(50, 1e-3, 20, 100, 50) == 1e-3
    assert lr(75, 1e-3, 20, 100, 50) == pytest.approx(1e-3 * 0.55)  # half way down to a tenth
    assert lr(100, 1e-3, 20, 100, 50) == pytest.approx(1e-4)
    decayed = [lr(s, 1e-3, 20, 100, 50) for s in range(50, 101)]
    assert all(a > b for a, b in zip(decayed, decayed[1:]))  # strictly falling


def test_evaluate_scores_each_step_on_its_own_positions_and_chains_them(monkeypatch):
    """evaluate() weighs each step's accuracy by the positions that step is scored on (the
    loss by step 0's), turns per-step accuracies a_j into the chain's acceptance (mean over j
    of a_1 * ... * a_j), and leaves the head in the mode it found it in."""
    import torch

    from specbench.models import eagle3_train
    from specbench.models.eagle3_train import StepStats

    # per batch: loss, accuracies, positions scored per step (a step scores fewer positions
    # than the one before it: step j needs j + 1 tokens ahead)
    calls = iter([(2.0, [1.0, 0.5], [4, 3]), (6.0, [0.5, 0.0], [2, 1])])

    def fake_loss(head, feats, ids, logits, valid, steps):
        loss, acc, scored = next(calls)
        return None, StepStats(loss=loss, accuracy=acc, scored=scored)

    monkeypatch.setattr(eagle3_train, "ttt_loss", fake_loss)
    monkeypatch.setattr(eagle3_train, "make_batch", lambda *a: (None, None, None, None))
    head = torch.nn.Linear(1, 1).eval()
    r = eagle3_train.evaluate(head, [5, 3], None, None, torch.zeros(1, 1), batch_size=1, steps=2, bf16=False)
    acc0 = (1.0 * 4 + 0.5 * 2) / 6
    acc1 = (0.5 * 3 + 0.0 * 1) / 4
    assert r["acc"] == [round(acc0, 4), round(acc1, 4)]
    assert r["expected_acceptance"] == round((acc0 + acc0 * acc1) / 2, 4)
    assert r["loss"] == round((2.0 * 4 + 6.0 * 2) / 6, 4)
    assert not head.training


def test_an_unavailable_device_is_refused_in_one_line(tiny_pair, prompts, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    mod = load_script()
    for device, needle in (("cuda", "CUDA is not available"), ("tpu", "--device must be one of")):
        with pytest.raises(SystemExit) as exc:
            mod.main(argv(tiny_pair, prompts, tmp_path / "head", "--device", device))
        assert needle in str(exc.value) and len(str(exc.value).splitlines()) == 1
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("flag, value", [("--val-sequences", "-1"), ("--patience", "-2"), ("--eval-every", "0"),
                                         ("--answer-sharegpt", "-1"), ("--val-answers", "3"),
                                         ("--lr-decay-from", "100000"), ("--lr-decay-from", "-1")])
def test_bad_validation_flags_are_refused_in_one_line_before_anything_is_written(tiny_pair, prompts, tmp_path,
                                                                                flag, value):
    mod = load_script()
    with pytest.raises(SystemExit) as exc:
        mod.main(argv(tiny_pair, prompts, tmp_path / "head", flag, value))
    msg = str(exc.value)
    assert flag in msg and value in msg and len(msg.splitlines()) == 1
    assert not (tmp_path / "head").exists()


def test_the_target_answers_sharegpt_prompts_and_the_held_back_answers_decide_early_stopping(tiny_pair, prompts,
                                                                                             tmp_path):
    """--answer-sharegpt N: the target answers the first user turns of N ShareGPT conversations
    other than those trained on as text or held for validation; --val-answers V of them validate,
    scored on their answers, and that set decides early stopping (the conversations are only
    reported)."""
    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "2", "--sharegpt", "2", "--val-sequences", "2",
                  "--answer-sharegpt", "3", "--val-answers", "1", "--eval-every", "1"))
    info = training(out)
    answered = [json.loads(line) for line in (out / "work" / "responses.jsonl").read_text().splitlines()]
    asked = [r for r in answered if r["id"].startswith("sharegpt-")]
    assert len(asked) == 3 and len(answered) == 3 + 3  # and the workload's --answer-prompts 3
    assert all(r["output_ids"] for r in asked)
    assert info["answered_sharegpt"] == 2 and info["sequences"] == 2 + 6 + 2
    assert info["validation_sequences"] == {"answers": 1, "sharegpt": 2}
    assert info["validation_best"]["set"] == "answers"
    vals = info["validation"]
    assert [v["step"] for v in vals] == [1, 2] and all(set(v["by_set"]) == {"answers", "sharegpt"} for v in vals)
    assert all(v["loss"] == v["by_set"]["answers"]["loss"] for v in vals)
    # the conversations trained on as text (or validating) are not the ones answered: the asks come
    # after them in ShareGPT's order
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    texts, asks = mod.sharegpt_sequences(tok, 4, 256, set(), prompts=3)
    _, every = mod.sharegpt_sequences(tok, 0, 256, set(), prompts=7)
    assert len(texts) == 4 and asks == every[4:]
    assert [a[0] for a in asks] == [r["id"] for r in asked]


def test_a_head_continues_from_init_head_with_its_weights(tiny_pair, prompts, tmp_path):
    """--init-head DIR starts from DIR's weights: with no training step and the same data the
    head written is DIR's head; with another vocabulary size the layer is DIR's and each draft
    token both vocabularies hold keeps DIR's lm_head row; training then moves on from there."""
    import torch
    from safetensors.torch import load_file

    mod = load_script()
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    mod.main(argv(tiny_pair, prompts, first, "--max-steps", "3"))
    mod.main(argv(tiny_pair, prompts, second, "--max-steps", "0", "--init-head", str(first)))
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert training(second)["init_head"] == str(first)

    mod.main(argv(tiny_pair, prompts, third, "--max-steps", "0", "--init-head", str(first), "--draft-vocab", "48"))
    c = load_file(third / "model.safetensors")
    ids = lambda w: (torch.arange(w["d2t"].numel()) + w["d2t"]).tolist()  # noqa: E731
    old, new = ids(a), ids(c)
    both = [(new.index(t), old.index(t)) for t in new if t in old]
    assert len(new) == 48 and len(both) >= 24
    assert all(torch.equal(c["lm_head.weight"][j], a["lm_head.weight"][i]) for j, i in both)
    assert all(torch.equal(a[k], c[k]) for k in a if k not in ("lm_head.weight", "d2t", "t2d"))

    mod.main(argv(tiny_pair, prompts, second, "--max-steps", "2", "--init-head", str(first)))
    d = load_file(second / "model.safetensors")
    assert not torch.equal(a["fc.weight"], d["fc.weight"])  # trained on from there


def test_a_bad_init_head_is_refused_in_one_line(tiny_pair, prompts, tmp_path):
    mod = load_script()
    other = tmp_path / "other"
    mod.main(argv(tiny_pair, prompts, other, "--max-steps", "1", "--aux-layers", "0,1,1"))
    for head, needle in ((tmp_path / "missing", "no such directory"), (other, "layers [0, 1, 1]")):
        with pytest.raises(SystemExit) as exc:
            mod.main(argv(tiny_pair, prompts, tmp_path / "head", "--init-head", str(head)))
        msg = str(exc.value)
        assert "--init-head" in msg and needle in msg and len(msg.splitlines()) == 1, msg
    assert not (tmp_path / "head" / "config.json").exists()


def test_feature_shards_of_other_sequences_are_refused(tiny_pair, prompts, tmp_path):
    """Feature shards are positional: a rerun whose data flags put other sequences in their places
    is refused in one line instead of training on features of the wrong text."""
    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1"))
    with pytest.raises(SystemExit) as exc:
        mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--max-prompt-tokens", "8"))
    msg = str(exc.value)
    assert "holds other sequences" in msg and "features" in msg and len(msg.splitlines()) == 1


def test_answers_added_later_extend_the_features_when_the_last_shard_was_short(tiny_pair, prompts, tmp_path):
    """A rerun with more --answer-sharegpt appends sequences. The earlier run's last shard held
    fewer than --shard-size: it is filled again, so each later sequence keeps its place; full
    shards are reused as they are."""
    from safetensors.torch import load_file

    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--answer-sharegpt", "1"))  # 6 + 1: shards of 4, 3
    shards = out / "work" / "features"
    full = (shards / "shard-00000.safetensors").stat().st_mtime_ns
    assert len(load_file(shards / "shard-00001.safetensors")) == 3 * 5
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--answer-sharegpt", "3"))  # 6 + 3: 4, 4, 1
    assert training(out)["sequences"] == 9 and training(out)["answered_sharegpt"] == 3
    assert [len(load_file(shards / f"shard-{i:05d}.safetensors")) // 5 for i in range(3)] == [4, 4, 1]
    assert (shards / "shard-00000.safetensors").stat().st_mtime_ns == full


def test_a_short_shard_of_other_sequences_is_refused_and_left_as_it_was(tiny_pair, prompts, tmp_path):
    """Refilling a short last shard is for sequences appended to the same data. A rerun whose data
    flags changed (here: more answers and shorter prompts) must not overwrite that shard with
    other sequences' features: it is refused in one line and the shard keeps its bytes."""
    mod = load_script()
    out = tmp_path / "head"
    mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--answer-sharegpt", "1"))  # shards of 4, 3
    short = out / "work" / "features" / "shard-00001.safetensors"
    before = short.read_bytes()
    with pytest.raises(SystemExit) as exc:
        mod.main(argv(tiny_pair, prompts, out, "--max-steps", "1", "--answer-sharegpt", "3",
                      "--max-prompt-tokens", "8"))
    msg = str(exc.value)
    assert "holds other sequences" in msg and "shard-00001" in msg and len(msg.splitlines()) == 1, msg
    assert short.read_bytes() == before

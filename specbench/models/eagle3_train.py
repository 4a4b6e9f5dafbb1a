"""Training an EAGLE-3 head on a target's own features: the pieces a training script needs.

The recipe is the public one (EAGLE-3's training-time test, as in SafeAILab/EAGLE's
`traineagle3`): for a sequence x_0..x_{T-1} with target features f_t (the concatenated inputs
of the feature layers at position t) and target next-token distributions p_t (p_t predicts
x_{t+1}), head step j at position t reads

    hidden  fc(f_t) at step 0, the head's own step j-1 output at t afterwards
    token   x_{t+1+j} (the sequence's own tokens, shifted one more place each step)
    target  p_{t+1+j} restricted to the draft vocabulary and renormalized

at rotary position t + j, and attends to the step-0 entries at positions <= t and to its own
earlier steps' entries at position t only: exactly what the head sees when it drafts j + 1
tokens ahead from the target's features at t. The loss is the soft cross-entropy to the target
distribution at positions whose target argmax lies in the draft vocabulary, step j weighted
by 0.8^j. Unrolling the steps is what makes the head robust to reading its own outputs.

Also here: the draft vocabulary (the most frequent target tokens of the training text) and a
head initialized for a target (its sizes, rotary settings and, optionally, its final norm and
lm_head rows). Also the batches a script builds from its stored examples (dicts of features, last-layer
output, ids, answer start, target argmax) and the validation of a head on such examples.
Nothing here loops over training data or writes files; benchmarks/train_eagle3.py does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbench.engine.kv import slot_attention
from specbench.models.eagle3 import Eagle3Head, HeadConfig, default_aux_layers, output_rows

STEP_DECAY = 0.8  # weight of TTT step j is STEP_DECAY ** j (EAGLE-3's training script)


def select_vocabulary(sequences: Iterable[Sequence[int]], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent target ids of `sequences` (ties: lower id first), ascending.
    When the text has fewer distinct tokens, the rest are filled with the lowest unused ids."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    if len(ranked) < size:
        used = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in used][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def head_config_for(target, *, draft_vocab_size: int, intermediate_size: int | None = None,
                    aux_layers: Sequence[int] | None = None, norm_before_residual: bool = False,
                    verifier: str | None = None) -> HeadConfig:
    """A head shaped for `target` (a transformers causal LM): its hidden size (the head shares
    the target's embedding), attention shape and rotary settings."""
    cfg = target.config.get_text_config()
    heads = int(cfg.num_attention_heads)
    rope = {}
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        rope["rope_theta"] = float(params["rope_theta"])
    elif getattr(cfg, "rope_theta", None) is not None:
        rope["rope_theta"] = float(cfg.rope_theta)
    return HeadConfig(
        hidden_size=int(cfg.hidden_size), num_attention_heads=heads,
        num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        intermediate_size=int(intermediate_size or cfg.intermediate_size),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)), hidden_act=str(getattr(cfg, "hidden_act", "silu")),
        vocab_size=output_rows(target), draft_vocab_size=draft_vocab_size,
        target_hidden_size=int(cfg.hidden_size), norm_before_residual=norm_before_residual,
        aux_layers=tuple(aux_layers or default_aux_layers(int(cfg.num_hidden_layers))), rope=rope,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 32768)),
        verifier=verifier,
    )


def init_head(target, cfg: HeadConfig, vocabulary: torch.Tensor, *, seed: int = 0,
              from_target: bool = False, lm_head_weight: torch.Tensor | None = None) -> Eagle3Head:
    """A fresh float32 head for `target` over the draft `vocabulary` (target ids). With
    `from_target`, its final norm and lm_head start as the target's (rows of the draft
    vocabulary): the head then starts out reading the target's own output space.
    `lm_head_weight`: the target's lm_head weight, when its lm_head has been packed."""
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    std = 0.02
    for m in head.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
    head.set_vocabulary(vocabulary)
    if from_target:
        with torch.no_grad():
            weight = lm_head_weight if lm_head_weight is not None else target.get_output_embeddings().weight
            head.lm_head.weight.copy_(weight[vocabulary].float())
            final_norm = target.get_decoder().norm
            head.norm.weight.copy_(final_norm.weight.float())
    head.share_embedding(target.get_input_embeddings())
    head.aux_layers = tuple(cfg.aux_layers or ())
    return head


@dataclass
class StepStats:
    loss: float
    accuracy: list[float]  # per TTT step: draft argmax == target argmax, over valid positions
    scored: list[int]  # per TTT step: the valid positions it is scored on

    @property
    def positions(self) -> int:
        """Valid positions at step 0."""
        return self.scored[0] if self.scored else 0


def _ttt_attend(j: int, keys: list[torch.Tensor], values: list[torch.Tensor], T: int, device) -> tuple:
    """Keys/values/mask for step j: step-0 entries causal, steps 1..j at the query's position."""
    t = torch.arange(T, device=device)
    blocks = [t.view(-1, 1) >= t.view(1, -1)] + [torch.eye(T, dtype=torch.bool, device=device)] * j
    mask = torch.cat(blocks, dim=1).view(1, 1, T, (j + 1) * T)
    return torch.cat(keys, dim=2), torch.cat(values, dim=2), mask


def ttt_loss(head: Eagle3Head, features: torch.Tensor, ids: torch.Tensor, target_logits: torch.Tensor,
             valid: torch.Tensor, steps: int = 3, decay: float = STEP_DECAY) -> tuple[torch.Tensor, StepStats]:
    """The training-time-test loss for a batch.

    features [B, T, F]: target features per position; ids [B, T]: the sequence's target ids;
    target_logits [B, T, Vd]: the target's logits at each position restricted to the draft
    vocabulary (draft id order); valid [B, T] bool: positions whose target distribution is a
    training target (in the response, target argmax in the draft vocabulary, not padding).
    Padding goes at the end of a row (causal attention never lets a real position see it)."""
    B, T, _ = features.shape
    dev = features.device
    hidden = head.project(features)
    zeros_i = torch.zeros(B, 1, dtype=ids.dtype, device=dev)
    total = torch.zeros((), device=dev)
    weight_sum = 0.0
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    acc: list[float] = []
    scored: list[int] = []
    base_pos = torch.arange(T, device=dev).view(1, T).expand(B, T)
    for j in range(steps):
        shift = j + 1
        if shift >= T:
            break
        tok = torch.cat([ids[:, shift:], zeros_i.expand(B, shift)], dim=1)
        tgt = torch.cat([target_logits[:, shift:], target_logits[:, :shift] * 0], dim=1)
        ok = torch.cat([valid[:, shift:], torch.zeros(B, shift, dtype=torch.bool, device=dev)], dim=1)

        def attend(q, k, v, j=j):
            keys.append(k)
            values.append(v)
            kk, vv, mask = _ttt_attend(j, keys, values, T, dev)
            return slot_attention(None, q, kk, vv, mask.expand(B, 1, T, -1), scaling=q.shape[-1] ** -0.5)[0]

        hidden = head.decode(tok, hidden, base_pos + j, attend)
        n_ok = int(ok.sum())
        scored.append(n_ok)
        if n_ok == 0:
            acc.append(float("nan"))
            continue
        # The lm_head runs only where there is a target (the answer, not the prompt or padding).
        logits = head.logits(hidden[ok]).float()  # [n_ok, Vd]
        p = torch.softmax(tgt[ok].float(), dim=-1)
        ce = -(p * F.log_softmax(logits, dim=-1)).sum(-1)
        w = decay ** j
        total = total + w * ce.mean()
        weight_sum += w
        with torch.no_grad():
            acc.append(float((logits.argmax(-1) == p.argmax(-1)).float().mean()))
    loss = total / max(weight_sum, 1e-9)
    return loss, StepStats(float(loss.detach()), acc, scored)


# ---- batches and validation for a training script (examples as train_eagle3.py stores them) ----

def loss_region(e, loss_on: str) -> torch.Tensor:
    """Target positions [T] whose distribution is a training target (before the vocabulary)."""
    n, start = int(e["ids"].numel()), int(e["start"])
    region = torch.ones(n, dtype=torch.bool)
    if loss_on == "answers":
        region[: max(start - 1, 0)] = False
        if start >= n:  # a prompt without an answer
            region[:] = False
    return region


def make_batch(examples, vocab_mask, norm, w_draft, loss_on):
    """Padded [B, T] tensors for ttt_loss, on `w_draft`'s device; the target logits come from
    its last layer output through its own final norm and the draft vocabulary's rows of its
    lm_head."""
    dev = w_draft.device
    T = max(int(e["ids"].numel()) for e in examples)
    B = len(examples)
    F = examples[0]["features"].shape[1]
    feats = torch.zeros(B, T, F, device=dev)
    ids = torch.zeros(B, T, dtype=torch.long)
    logits = torch.zeros(B, T, w_draft.shape[0], device=dev)
    valid = torch.zeros(B, T, dtype=torch.bool)
    with torch.no_grad():
        for b, e in enumerate(examples):
            n = int(e["ids"].numel())
            feats[b, :n] = e["features"].to(dev).float()
            ids[b, :n] = e["ids"]
            logits[b, :n] = norm(e["last"].to(dev).float()) @ w_draft.T
            # p_t is a training target where the loss applies and the target's own choice there
            # lies in the draft vocabulary (as in EAGLE-3's training script)
            valid[b, :n] = loss_region(e, loss_on) & vocab_mask[e["top"].long()]
    return feats, ids.to(dev), logits, valid.to(dev)


def evaluate(head, examples, vocab_mask, norm, w_draft, *, batch_size: int, steps: int, bf16: bool,
             loss_on: str = "all") -> dict:
    """The head's TTT loss and per-step accuracy (draft argmax == target argmax, the true
    tokens fed) on sequences it never trains on, position-weighted over batches. `expected_
    acceptance` is what those accuracies imply for a chain of the TTT depth: the mean over
    steps of the product of the accuracies up to each step (an estimate; the measured figure
    is `specbench run --method eagle3`'s acceptance). `loss_on="answers"` scores only the
    answer positions (where a deployed head drafts)."""
    loss_sum, n_sum = 0.0, 0
    hits = [0.0] * steps
    counts = [0] * steps
    was_training = head.training
    head.eval()
    with torch.no_grad(), torch.autocast(w_draft.device.type, dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(examples), batch_size):
            batch = make_batch(examples[i:i + batch_size], vocab_mask, norm, w_draft, loss_on)
            _, st = ttt_loss(head, *batch, steps=steps)
            loss_sum += st.loss * st.positions
            n_sum += st.positions
            for j, (a, m) in enumerate(zip(st.accuracy, st.scored)):
                if m:
                    hits[j] += a * m
                    counts[j] += m
    head.train(was_training)
    acc = [h / c if c else float("nan") for h, c in zip(hits, counts)]
    chain, prod = [], 1.0
    for a in acc:
        prod *= a
        chain.append(prod)
    return {"loss": round(loss_sum / max(n_sum, 1), 4), "acc": [round(a, 4) for a in acc],
            "expected_acceptance": round(sum(chain) / len(chain), 4) if chain else None}


@torch.no_grad()
def capture(runner, ids: Sequence[int], *, logits: bool = True, row: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One prefill of `ids` through `runner` (a ModelRunner capturing the head's layers):
    (features [T, F], full logits [T, V] or None)."""
    out, feats = runner.forward(torch.tensor([list(ids)]), slice(row, row + 1), torch.zeros(1, dtype=torch.long),
                                positions="all" if logits else None, prefill=True)
    assert feats is not None, "set_capture(head layers) first"
    # clones: the runner works in inference mode, and training needs ordinary tensors
    return feats[0].clone(), (out[0].clone() if out is not None else None)

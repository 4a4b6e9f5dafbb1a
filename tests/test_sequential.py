"""The group-sequential paired speedup rule (specbench.analysis.sequential), by simulation:
thousands of synthetic paired configurations whose true speedup lies exactly at the threshold,
looked at after every pair of blocks as a sweep trial does. "Pays" must be declared wrongly in
at most 5% of them with the rule's error spending; the naive rule (a fixed 95% interval at
every look) must exceed that in the same simulation, which shows the check can fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specbench.analysis.sequential import Monitor, SequentialRule, look_points

THRESHOLD = 1.1
N_PROMPTS = 24
N_SIM = 2000


class NaiveRule(SequentialRule):
    """The broken variant: every look, the last included, spends the whole alpha (a 95%
    interval each time), as if no earlier look had been taken."""

    def spent(self, n: int) -> float:
        return 0.0

    def level(self, n: int, previous: int) -> float:
        return self.alpha


def simulate(rule_cls, true_speedup: float, block: int, sigma: float, seed: int,
             n_sim: int = N_SIM, heavy: bool = False) -> tuple[float, float, float]:
    """(share declared 'win', share declared 'loss', mean prompts measured)."""
    rng = np.random.default_rng(seed)
    points = look_points(N_PROMPTS, block)
    wins = losses = 0
    prompts = 0
    for _ in range(n_sim):
        noise = rng.standard_t(3, N_PROMPTS) / math.sqrt(3) if heavy else rng.standard_normal(N_PROMPTS)
        d = math.log(true_speedup) + sigma * noise
        monitor = Monitor(rule_cls(planned=N_PROMPTS, min_speedup=THRESHOLD))
        for n in points:
            look = monitor.update(d[:n])
            if look.stopped:
                break
        wins += look.outcome == "win"
        losses += look.outcome == "loss"
        prompts += look.n
    return wins / n_sim, losses / n_sim, prompts / n_sim


@pytest.mark.parametrize("block,heavy", [(1, False), (1, True), (2, False)])
def test_pays_is_declared_wrongly_at_most_5_percent_and_the_naive_rule_exceeds_it(block, heavy):
    wins, _, _ = simulate(SequentialRule, THRESHOLD, block, sigma=0.15, seed=1, heavy=heavy)
    naive, _, _ = simulate(NaiveRule, THRESHOLD, block, sigma=0.15, seed=1, heavy=heavy)
    # 2000 simulations (fixed seeds): the standard error of a 5% share is 0.5 percentage points
    assert wins <= 0.05, f"sequential rule declared 'pays' wrongly in {wins:.1%}"
    assert naive > 0.05, f"the naive rule stayed at {naive:.1%}: the simulation cannot tell them apart"
    assert naive > 1.5 * wins


def test_a_clear_win_stops_early_and_a_clear_loss_too():
    wins, _, prompts = simulate(SequentialRule, 1.6, 1, sigma=0.15, seed=2, n_sim=300)
    assert wins > 0.95 and prompts < 0.5 * N_PROMPTS
    _, losses, prompts = simulate(SequentialRule, 0.7, 1, sigma=0.15, seed=3, n_sim=300)
    assert losses > 0.95 and prompts < 0.5 * N_PROMPTS


def test_the_error_budget_is_spent_exactly_once():
    for spending in ("pocock", "obrien-fleming"):
        rule = SequentialRule(planned=24, spending=spending)
        points = look_points(24, 1)
        levels = [rule.level(n, prev) for n, prev in zip(points, [0, *points[:-1]])]
        assert all(a >= 0 for a in levels)
        assert sum(levels) == pytest.approx(0.05)
        assert rule.spent(24) == pytest.approx(0.05)


def test_look_points_follow_abba_pairs():
    assert look_points(24, 1) == [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]
    assert look_points(24, 16) == [24]
    assert look_points(10, 4) == [8, 10]
    assert look_points(3, 1) == [3]


def test_bad_rule_settings_are_refused():
    with pytest.raises(ValueError, match="spending"):
        SequentialRule(planned=4, spending="bonferroni")
    with pytest.raises(ValueError, match="alpha"):
        SequentialRule(planned=4, alpha=1.5)


def simulate_bursts(clustered: bool, true_speedup: float, block: int, sigma: float, tau: float, seed: int,
                    n_sim: int = N_SIM) -> tuple[float, float]:
    """Paired trials above concurrency 1: prompts run in blocks of `block`, and a burst of load
    during one configuration's half of a block shifts every ratio of that block alike (a
    shared N(0, tau) term per block). Returns (share declared 'win', mean blocks measured).
    `clustered=False` is the broken variant: prompts taken as independent."""
    rng = np.random.default_rng(seed)
    points = look_points(N_PROMPTS, block)
    groups = np.arange(N_PROMPTS) // block
    wins = 0
    measured = 0
    for _ in range(n_sim):
        shock = tau * rng.standard_normal(groups.max() + 1)[groups]
        d = math.log(true_speedup) + shock + sigma * rng.standard_normal(N_PROMPTS)
        monitor = Monitor(SequentialRule(planned=N_PROMPTS, min_speedup=THRESHOLD))
        for n in points:
            look = monitor.update(d[:n], clusters=groups[:n] if clustered else None)
            if look.stopped:
                break
        wins += look.outcome == "win"
        measured += len(np.unique(groups[:look.n]))
    return wins / n_sim, measured / n_sim


@pytest.mark.parametrize("block", [4, 8])
def test_bursts_that_hit_whole_blocks_do_not_make_pays_wrong_when_blocks_are_the_unit(block):
    # concurrency 4 (six one-wave blocks of 24 prompts) and 8 (three): the unit is the block
    wins, _ = simulate_bursts(True, THRESHOLD, block, sigma=0.10, tau=0.10, seed=4)
    naive, _ = simulate_bursts(False, THRESHOLD, block, sigma=0.10, tau=0.10, seed=4)
    assert wins <= 0.05, f"cluster-robust rule declared 'pays' wrongly in {wins:.1%}"
    assert naive > 0.10, f"the prompt-level rule stayed at {naive:.1%}: the simulation cannot tell them apart"


def test_blocks_as_the_unit_still_decide_a_clear_effect_and_match_prompts_at_one_prompt_per_block():
    wins, _ = simulate_bursts(True, 1.6, 4, sigma=0.10, tau=0.05, seed=5, n_sim=300)
    assert wins > 0.9
    d = np.random.default_rng(6).standard_normal(24) * 0.1 + 0.2
    rule = SequentialRule(planned=24)
    alone, clustered = rule.look(d), rule.look(d, clusters=np.arange(24))
    assert (alone.lo, alone.hi) == pytest.approx((clustered.lo, clustered.hi))


def test_too_few_blocks_come_out_even_not_decided():
    # two blocks whose ratios agree closely within each: a prompt-level interval would decide
    d = np.r_[np.full(8, 0.5), np.full(8, 0.52)] + np.random.default_rng(7).standard_normal(16) * 0.01
    rule = SequentialRule(planned=16)
    assert rule.look(d).outcome == "win"
    interim = rule.look(d, final=False, clusters=np.repeat([0, 1], 8))
    assert interim.outcome == "continue" and interim.level == 0.0
    assert rule.look(d[:8], final=True, clusters=np.zeros(8)).outcome == "even"

"""Races over arms with their own populations of unequal sizes (racing.independent)."""

import numpy as np
import pytest
from scipy import stats

from pymc_subsample.racing.independent import cluster_schedule, race_independent

SIZES = np.array([1, 2, 3, 7, 40, 300, 1500])


def too_many_errors(errors, trials, delta, alpha=1e-3):
    """One-sided binomial test of 'error rate <= delta' at level alpha."""
    return stats.binom.sf(errors - 1, trials, delta) < alpha


def populations(sizes, seed, spread=1.0, dist="normal"):
    """Per-arm reward arrays whose totals differ by O(1) (a hard race)."""
    rng = np.random.default_rng(seed)
    pops = []
    for n in sizes:
        if dist == "normal":
            x = rng.normal(0.0, spread, n)
        else:  # skewed: lognormal
            x = rng.lognormal(0.0, 1.0, n) * spread
        pops.append(x - x.mean() + rng.normal(0.0, 1.0) / n)  # total ~ N(0, 1)
    return pops


def arm_rewards(pops, calls=None):
    def rewards(arm, idx):
        if calls is not None:
            calls.append((arm, np.array(idx)))
        return pops[arm][idx]

    return rewards


def test_cluster_schedule_matches_paper():
    assert cluster_schedule(1000).tolist() == [3, 103, 206, 412, 824, 1000]
    assert cluster_schedule(1).tolist() == [1]
    assert cluster_schedule(3).tolist() == [3]
    assert cluster_schedule(5).tolist() == [3, 4, 5]
    for n in [1, 2, 4, 13, 1829]:
        s = cluster_schedule(n)
        assert s[-1] == n and (np.diff(s) > 0).all()


def test_exact_bound_returns_argmax_of_totals():
    pops = populations(SIZES, 0)
    offsets = np.random.default_rng(1).normal(size=len(SIZES)) / SIZES
    res = race_independent(arm_rewards(pops), SIZES, bound="exact", offsets=offsets)
    totals = np.array([p.sum() for p in pops]) + SIZES * offsets
    assert res.winner == int(np.argmax(totals))
    np.testing.assert_allclose(res.means * SIZES, totals)
    assert res.n_evaluations == SIZES.sum() and res.exhausted


@pytest.mark.parametrize(
    ("bound", "dist", "quantile"),
    [
        ("normal", "normal", "t"),
        ("normal", "lognormal", "t"),
        ("normal", "normal", "normal"),
        ("ebs", "normal", "t"),
    ],
)
def test_gumbel_race_error_rate_below_delta(bound, dist, quantile):
    """Gumbel-max draws over unequal populations: the race returns the exact argmax
    with probability >= 1 - delta (binomial test)."""
    delta, trials = 0.1, 400
    pops = populations(SIZES, 2, spread=0.3, dist=dist)
    totals = np.array([p.sum() for p in pops])
    crange = np.array([np.ptp(p) for p in pops]) if bound == "ebs" else None
    schedules = [cluster_schedule(n) for n in SIZES]
    rng = np.random.default_rng(3)
    errors, evals = 0, 0
    for _ in range(trials):
        eps = rng.gumbel(size=len(SIZES))
        res = race_independent(
            arm_rewards(pops),
            SIZES,
            delta=delta,
            bound=bound,
            schedules=schedules,
            rng=rng,
            reward_range=crange,
            offsets=eps / SIZES,
            quantile=quantile,
        )
        errors += res.winner != int(np.argmax(totals + eps))
        evals += res.n_evaluations
        assert res.n_evaluations <= SIZES.sum()
        assert np.isfinite(res.means[res.winner])
    assert not too_many_errors(errors, trials, delta), errors


def test_separated_arms_save_evaluations():
    """Clusters whose factors clearly disagree are dropped early (App. C.3 schedule)."""
    rng = np.random.default_rng(8)
    means = [0.0, 0.5, -0.5, 1.0, -1.0, -0.6, 1.0]
    pops = [rng.normal(m, 0.5, n) for m, n in zip(means, SIZES, strict=True)]
    schedules = [cluster_schedule(n) for n in SIZES]
    evals = [
        race_independent(arm_rewards(pops), SIZES, schedules=schedules, rng=k).n_evaluations
        for k in range(20)
    ]
    assert np.mean(evals) < 0.3 * SIZES.sum()


def test_racing_draws_match_softmax_of_totals():
    """Frequencies of Gumbel-race winners within delta (TV) of softmax(totals)."""
    delta, trials = 0.05, 3000
    sizes = np.array([1, 5, 60, 400])
    rng = np.random.default_rng(4)
    pops = []
    for n, total in zip(sizes, [0.0, 0.5, -0.3, 0.2], strict=True):
        x = rng.normal(0.0, 0.2, n)
        pops.append(x - x.mean() + total / n)
    p = np.exp([0.0, 0.5, -0.3, 0.2])
    p /= p.sum()
    counts = np.zeros(4)
    for _ in range(trials):
        eps = rng.gumbel(size=4)
        w = race_independent(
            arm_rewards(pops), sizes, delta=delta, rng=rng, offsets=eps / sizes, batch_size=3
        ).winner
        counts[w] += 1
    tv = 0.5 * np.abs(counts / trials - p).sum()
    # Monte Carlo sd of each frequency <= sqrt(p(1-p)/trials); 4 sd summed over arms
    mc = 0.5 * 4 * np.sqrt(p * (1 - p) / trials).sum()
    assert tv <= delta + mc, (tv, counts / trials, p)


def test_schedule_actually_used_and_small_arms_exact():
    pops = populations(SIZES, 5)
    calls = []
    schedules = [cluster_schedule(n) for n in SIZES]
    race_independent(arm_rewards(pops, calls), SIZES, schedules=schedules, rng=0, delta=1e-9)
    for arm, n in enumerate(SIZES):
        got = np.cumsum([len(idx) for a, idx in calls if a == arm])
        sched = schedules[arm]
        assert got.tolist() == sched[: len(got)].tolist()
        idx = np.concatenate([idx for a, idx in calls if a == arm])
        assert len(np.unique(idx)) == len(idx) and idx.min() >= 0 and idx.max() < n
    # arms of one and two observations are evaluated exactly, in one call
    for arm in (0, 1):
        (idx,) = [idx for a, idx in calls if a == arm]
        assert sorted(idx.tolist()) == list(range(SIZES[arm]))


def test_minus_inf_arm_leaves_at_once():
    pops = populations(SIZES, 6)
    pops[5] = pops[5].copy()
    pops[5][:] = -np.inf  # every factor -inf: found at the first look
    calls = []
    res = race_independent(arm_rewards(pops, calls), SIZES, rng=1, schedules=None, batch_size=3)
    assert res.winner != 5
    assert res.means[5] == -np.inf
    assert sum(len(idx) for a, idx in calls if a == 5) == 3


def test_all_minus_inf_is_an_error():
    pops = [np.full(n, -np.inf) for n in SIZES]
    with pytest.raises(ValueError, match="every arm has a -inf"):
        race_independent(arm_rewards(pops), SIZES, rng=0)


def test_survivors_minus_inf_late_are_rescued():
    """Arms 0 and 2 lead after the first look and both show a -inf at the second
    (a callback that hides it at first); arm 1, dropped at the first look, is then
    decided exactly on the rest of its population and wins."""
    sizes = np.array([400, 300, 400])
    seen = {0: 0, 2: 0}

    def rewards(arm, idx):
        if arm == 1:
            return np.zeros(len(idx))
        seen[arm] += 1
        return np.full(len(idx), 1.0 if seen[arm] == 1 else -np.inf)

    res = race_independent(rewards, sizes, rng=0, batch_size=3)
    assert res.winner == 1
    assert res.means[0] == res.means[2] == -np.inf and res.means[1] == 0.0
    assert res.n_evaluations == 6 + 300 + 6 and res.exhausted  # 3 + 3 per leader


def test_race_stops_when_one_arm_is_left():
    pops = [np.full(1000, 1.0), np.zeros(1000)]
    calls = []
    res = race_independent(arm_rewards(pops, calls), [1000, 1000], rng=0, batch_size=3)
    assert res.winner == 0 and len(calls) == 2 and res.n_evaluations == 6


def test_ties_end_exactly_at_lowest_index():
    pops = [np.full(50, 0.3), np.full(50, 0.3), np.full(25, 0.6)]
    res = race_independent(arm_rewards(pops), [50, 50, 25], rng=0, batch_size=3)
    assert res.winner == 0 and res.exhausted
    assert res.n_evaluations == 125


def test_unequal_sizes_compare_totals_not_means():
    # arm 0: mean 1 over 10 -> total 10; arm 1: mean 0.5 over 100 -> total 50
    pops = [np.full(10, 1.0), np.full(100, 0.5)]
    res = race_independent(arm_rewards(pops), [10, 100], rng=0, batch_size=3)
    assert res.winner == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": [3, 0]}, "sizes must be"),
        ({"sizes": [3.5, 2]}, "sizes must be"),
        ({"bound": "lilucb"}, "unknown bound"),
        ({"delta": 1.5}, "delta must lie"),
        ({"batch_size": 1}, "batch_size"),
        ({"offsets": [0.0]}, "offsets must be"),
        ({"reward_range": -1.0}, "reward_range"),
        ({"schedules": [[3, 2], [3]]}, "schedules"),
        ({"schedules": [[3]]}, "schedules has 1 entries"),
    ],
)
def test_bad_input(kwargs, match):
    args = {"sizes": [5, 4]} | kwargs
    pops = [np.zeros(5), np.zeros(4)]
    with pytest.raises(ValueError, match=match):
        race_independent(arm_rewards(pops), **args)


def test_bad_rewards():
    with pytest.raises(ValueError, match="1-D array"):
        race_independent(lambda a, i: np.zeros((1, len(i))), [5, 4])
    with pytest.raises(ValueError, match="NaN"):
        race_independent(lambda a, i: np.full(len(i), np.nan), [5, 4])

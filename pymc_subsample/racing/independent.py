r"""Races between arms with populations of their own, of unequal sizes.

Arm :math:`i` has :math:`N_i` rewards; arms are compared on totals
:math:`N_i (\hat\mu_i + o_i) \pm N_i G_i`, each arm following the doubling
schedule clipped at its own :math:`N_i` (Chen & Ghahramani 2016, Sec. 5.3).
"""

from __future__ import annotations

import numpy as np

from .bounds import ebs_width, normal_threshold, normal_width, rare_event_floor
from .common import RaceResult, argmax_or_raise, checked_rewards, exact_totals
from .schedule import IndexStream, doubling_schedule

__all__ = ["race_independent"]


def race_independent(
    rewards,
    sizes,
    *,
    delta: float = 0.05,
    bound: str = "normal",
    batch_size: int = 50,
    variance: str = "marginal",
    rng=None,
    reward_range: float | None = None,
    offsets=None,
) -> RaceResult:
    """Race arms with their own populations of sizes ``sizes``, compared on totals.

    ``rewards(arms, idx)`` is called with one arm at a time, ``idx`` indexing
    that arm's own population.
    """
    sizes = np.asarray(sizes)
    rng = np.random.default_rng(rng)
    offsets = np.zeros(len(sizes)) if offsets is None else np.asarray(offsets, dtype=float)
    if variance != "marginal":
        raise ValueError(
            "arms with different population sizes share no observations: pass variance='marginal'"
        )
    if bound == "lilucb":
        raise ValueError("bound='lilucb' needs a common population size; use 'normal' or 'ebs'")
    n_arms = len(sizes)
    if bound == "exact":
        sums = np.array(
            [exact_totals(rewards, np.array([i]), int(sizes[i]))[0] for i in range(n_arms)]
        )
        totals = sums + sizes * offsets
        return RaceResult(
            argmax_or_raise(totals), int(sizes.sum()), 1, True, int(sizes.max()), totals / sizes
        )
    delta_arm = delta / n_arms
    looks = [doubling_schedule(int(n), batch_size) for n in sizes]
    if bound == "normal":
        thresholds = np.array(
            [normal_threshold(lk[:-1], n, delta_arm) for lk, n in zip(looks, sizes, strict=True)]
        )
    streams = [IndexStream(int(n), rng) for n in sizes]
    mean = np.zeros(n_arms)
    m2 = np.zeros(n_arms)
    drawn = np.zeros(n_arms, dtype=np.int64)
    crange = np.zeros(n_arms)
    alive = np.ones(n_arms, dtype=bool)
    n_evals = 0
    n_rounds = 0
    for t in range(max(len(lk) for lk in looks)):
        n_rounds += 1
        for i in np.flatnonzero(alive):
            target = looks[i][min(t, len(looks[i]) - 1)]
            idx = streams[i].take(target - drawn[i])
            if len(idx) == 0:
                continue
            batch = checked_rewards(rewards, np.array([i]), idx)[0][0]
            n_evals += len(idx)
            if np.isneginf(batch).any():
                alive[i] = False
                mean[i] = -np.inf
                continue
            m, bmean = len(batch), batch.mean()
            n = drawn[i] + m
            d = bmean - mean[i]
            m2[i] += ((batch - bmean) ** 2).sum() + d * d * drawn[i] * m / n
            mean[i] += d * m / n
            drawn[i] = n
            crange[i] = batch.max() - batch.min()
        if not alive.any():  # the best arm was dropped earlier: decide the rest exactly
            others = np.flatnonzero(np.isfinite(mean))
            if len(others) == 0:
                argmax_or_raise(np.full(1, -np.inf))
            sums = np.array(
                [exact_totals(rewards, np.array([i]), int(sizes[i]))[0] for i in others]
            )
            sums = sums + sizes[others] * offsets[others]
            winner = int(others[argmax_or_raise(sums)])
            means = mean + offsets
            means[others] = sums / sizes[others]
            return RaceResult(
                winner, n_evals + int(sizes[others].sum()), n_rounds, True, int(sizes.max()), means
            )
        sigma = np.sqrt(m2 / np.maximum(drawn, 1))
        c = crange if reward_range is None else float(reward_range)
        if bound == "normal":
            sigma = np.maximum(sigma, rare_event_floor(c, drawn))
            width = normal_width(thresholds, sigma, np.maximum(drawn, 1), sizes)
        else:
            n_looks = np.array([max(len(lk) - 1, 1) for lk in looks])
            width = ebs_width(delta_arm / n_looks, sigma, np.maximum(drawn, 1), sizes, c)
        total = np.where(alive, sizes * (mean + offsets), -np.inf)
        half = sizes * width
        lead = int(np.argmax(total))
        drop = alive & (total[lead] - half[lead] > total + half)
        drop[lead] = False
        alive &= ~drop
        if alive.sum() == 1 or (drawn[alive] >= sizes[alive]).all():
            break
    total = np.where(alive, sizes * (mean + offsets), -np.inf)
    winner = argmax_or_raise(total)
    return RaceResult(
        winner, n_evals, n_rounds, bool((drawn >= sizes).any()), int(drawn.max()), mean + offsets
    )

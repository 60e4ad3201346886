r"""When racing stops paying: choosing the look after which a race goes exact.

A race round on :math:`m` new observations for :math:`S` surviving arms costs
a call of the subset function plus the race's bookkeeping, roughly
:math:`a + b\,S m` seconds; deciding exactly costs one fused pass over all
:math:`N` observations, :math:`t_\text{exact}`. For cheap per-observation terms
the fused pass is so much faster per term than gathering a subset that a long
race costs more than the exact answer. :func:`choose_exact_after` picks the
largest look of the schedule whose cumulative predicted race cost stays within
``budget`` (:data:`EXACT_SWITCH_BUDGET`) times :math:`t_\text{exact}`; the race
then evaluates all :math:`N` observations at its next look
(:func:`~pymc_subsample.racing.race`, ``exact_after``). A hard draw thus costs
at most about :math:`(1 + \text{budget})\, t_\text{exact}`, and the back-off
(:mod:`~pymc_subsample.mcmc.backoff`) keeps such draws rare: a chain whose
races keep giving up decides exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..racing.compiled import CompiledRace, CompiledRewards
from ..racing.race import RaceConfig, race_shared
from ..racing.schedule import doubling_schedule

__all__ = [
    "EXACT_SWITCH_BUDGET",
    "choose_exact_after",
    "choose_first_batch",
    "compiled_look_cost",
    "fit_round_cost",
    "median_seconds",
]


#: Largest predicted cost of a race's subsampled looks, as a fraction of an exact decision.
#: A race that gives up costs at most ``1 + EXACT_SWITCH_BUDGET`` exact decisions; one
#: that pays costs a fraction :math:`r` of one. With a budget too tight for two looks a
#: step decides every draw exactly even where one look in two would separate the arms;
#: the back-off (:data:`~pymc_subsample.mcmc.backoff.BACKOFF_SHARE`) bounds what the
#: looser budget can lose on draws that are hard.
EXACT_SWITCH_BUDGET = 0.5


def median_seconds(fn: Callable[[], object], repeats: int = 7) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, after one warm-up call.

    Parameters
    ----------
    fn : callable
        Function of no argument.
    repeats : int
        Number of timed calls.

    Returns
    -------
    float
        Seconds.
    """
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _bookkeeping_seconds(n_arms: int, m: int) -> float:
    """Race bookkeeping per look on ``m`` new observations, rewards excluded (no arm drops)."""
    looks = 4
    buffer = np.zeros((n_arms, m))  # every look's rewards: the first rows, one per arm alive
    config = RaceConfig(schedule=tuple(m * (k + 1) for k in range(looks)), batches="windows")
    rng = np.random.default_rng(0)

    def rewards(arms, idx):
        return buffer[: len(arms)]

    def run():
        race_shared(rewards, n_arms, m * (looks + 1), config, rng=rng)

    return median_seconds(run, repeats=3) / (looks + 1)


def fit_round_cost(call_seconds: Callable[[int], float], n_arms: int, n_obs: int):
    r"""Fit the cost :math:`a + b\,m` of a race round on ``m`` new observations.

    Parameters
    ----------
    call_seconds : callable
        ``call_seconds(m)``: time of one subset evaluation of ``n_arms`` arms
        on ``m`` observations.
    n_arms, n_obs : int
        :math:`D` and :math:`N`.

    Returns
    -------
    tuple of float
        ``(a, b)`` in seconds and seconds per observation (all arms).
    """
    small, large = 64, int(min(max(n_obs // 8, 128), 8192))
    costs = [call_seconds(m) + _bookkeeping_seconds(n_arms, m) for m in (small, large)]
    b = max((costs[1] - costs[0]) / (large - small), 0.0)
    a = max(costs[0] - b * small, 0.0)
    return a, b


def compiled_look_cost(
    rewards: CompiledRewards,
    candidates: np.ndarray,
    others: tuple,
    n_obs: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    r"""Fit the cost :math:`a + b\,m` of a compiled look on ``m`` new rows, all arms alive.

    Times :class:`~pymc_subsample.racing.compiled.CompiledRace` races of
    identical arms (copies of the first candidate, so that none drops): one
    look on a small and on a large batch, for :math:`b`, and nine small
    looks, for :math:`a` (each the fastest of 15 calls, the three timed in
    turn, so that a passing load does not skew one of them): the cost a
    further look adds inside the compiled driver, without the race's own
    call (a race costs :math:`c + L\,a + b\,T` for :math:`L` looks on
    :math:`T` rows, and :math:`c`, paid once, does not depend on the first
    batch).

    Parameters
    ----------
    rewards : CompiledRewards
        The compiled reward function and its data arrays.
    candidates : numpy.ndarray
        One candidate per arm.
    others : tuple
        Further inputs of the reward function.
    n_obs : int
        :math:`N`.
    rng : numpy.random.Generator
        Source of the block draws.

    Returns
    -------
    tuple of float
        ``(a, b)`` in seconds and seconds per row (all arms).
    """
    offsets = np.zeros(len(candidates))
    same = np.repeat(np.asarray(candidates)[:1], len(candidates), axis=0)  # no arm ever drops
    small, large, looks = 128, int(min(max(n_obs // 8, 256), 8192)), 9
    races = [
        CompiledRace(
            rewards,
            RaceConfig(schedule=(*schedule, n_obs), batches="blocks"),
            len(candidates),
            n_obs,
            len(others),
        )  # fmt: skip
        for schedule in ((small,), (large,), tuple(small * (k + 1) for k in range(looks)))
    ]
    # the three races timed in turn, the fastest of 15 calls each: a load that comes and
    # goes (another job on the machine) slows all three alike, or is not seen at all
    best = np.full(len(races), np.inf)
    for k in range(16):
        for i, race in enumerate(races):
            t0 = time.perf_counter()
            race.run(same, rewards.data, others, rng, offsets)
            if k:  # the first round warms up
                best[i] = min(best[i], time.perf_counter() - t0)
    one_small, one_large, several = best
    b = max((one_large - one_small) / (large - small), 0.0)
    a = max((several - one_small) / (looks - 1) - b * small, 0.0)
    return a, b


def choose_exact_after(
    n_obs: int,
    batch_size: int,
    round_cost: tuple[float, float],
    exact_seconds: float,
    budget: float = EXACT_SWITCH_BUDGET,
) -> int:
    """Largest look whose cumulative predicted race cost is within ``budget`` of exact.

    A race allowed only its first look before the exact pass is not worth
    running: that look seldom separates every arm, and its cost then adds to
    the pass's. So when only the
    first look fits the budget, the answer is 0 (decide exactly at once).

    Parameters
    ----------
    n_obs : int
        :math:`N`.
    batch_size : int
        First mini-batch size of the doubling schedule.
    round_cost : tuple of float
        ``(a, b)`` from :func:`fit_round_cost` (all arms alive: an upper bound).
    exact_seconds : float
        Time of one exact decision (all arms, all observations).
    budget : float
        Allowed race cost as a fraction of ``exact_seconds``.

    Returns
    -------
    int
        ``exact_after`` for :func:`~pymc_subsample.racing.race`: 0 means decide
        exactly at once; ``n_obs`` means race on the whole schedule.
    """
    a, b = round_cost
    looks = doubling_schedule(n_obs, batch_size)[:-1]
    spent, chosen, previous = 0.0, 0, 0
    for size in looks:
        spent += a + b * (size - previous)
        previous = size
        if spent > budget * exact_seconds:
            break
        chosen = int(size)
    else:
        return int(n_obs)
    return chosen if chosen > looks[0] else 0  # one look only: decide at once


def choose_first_batch(n_obs: int, round_cost: tuple[float, float], minimum: int = 50) -> int:
    r"""First mini-batch :math:`m^{(1)}` whose terms cost about as much as the look itself.

    A look costs :math:`a + b\,m`; below :math:`m = a/b` the fixed cost
    dominates, so smaller batches only add looks, and above it the terms do,
    so larger ones read rows an easy decision does not need. Returns the
    :math:`\text{minimum} \cdot 2^k` nearest :math:`a/b` on a log scale (the
    smallest with :math:`\text{minimum} \cdot 2^k \ge a / (b\sqrt 2)`), at
    most :math:`N/8` (and at least ``minimum``).

    Parameters
    ----------
    n_obs : int
        :math:`N`.
    round_cost : tuple of float
        ``(a, b)`` from :func:`fit_round_cost`.
    minimum : int
        Smallest first batch (the paper's 50).

    Returns
    -------
    int
    """
    a, b = round_cost
    target = a / b if b > 0 else float(n_obs)
    batch = int(minimum)
    while batch * np.sqrt(2.0) < target and 16 * batch <= n_obs:
        batch *= 2
    return batch

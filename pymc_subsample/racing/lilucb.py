r"""Adapted lil'UCB for finite reward populations (Chen & Ghahramani 2016, Sec. 3.2).

lil'UCB (Jamieson et al. 2014) pulls the arm of highest upper confidence bound

.. math::
    \hat\mu_i + (1+\beta)(1+\sqrt\varepsilon)
    \sqrt{\frac{2\sigma^2(1+\varepsilon)\log\left(\log((1+\varepsilon)T_i)/\delta\right)}{T_i}}

and stops when some arm has :math:`T_i \ge 1 + \lambda \sum_{j \ne i} T_j`.
Heuristic setting: :math:`\varepsilon = 0`, :math:`\beta = 1/2`,
:math:`\lambda = 1 + 10/D`, :math:`\delta \to \delta/5`, :math:`\sigma = C/2`.
Adaptations of Chen & Ghahramani (2016): (1) each arm draws its own indices without
replacement; (2) an arm with :math:`T_i = N` has the exact mean as its bound;
(3) the race also stops when the arm of highest bound is exact.
"""

from __future__ import annotations

import numpy as np

from .common import RaceResult, argmax_or_raise, checked_rewards
from .schedule import IndexStream

__all__ = ["lil_ucb"]

_BETA = 0.5
_EPS = 0.0


def lil_ucb(
    rewards,
    n_arms: int,
    n_obs: int,
    *,
    delta: float = 0.05,
    batch_size: int = 50,
    rng: np.random.Generator | None = None,
    reward_range: float | None = None,
    block_fraction: float = 0.125,
    offsets: np.ndarray | None = None,
) -> RaceResult:
    r"""Adapted lil'UCB on arms with a common population of size ``n_obs``.

    One departure from pulling one reward at a time: the arm of highest bound
    draws a block of :math:`\max(1, \lceil f\,T_i \rceil)` rewards
    (``block_fraction`` :math:`f`). The LIL bound holds at every sample size,
    so each arm's confidence statement is unchanged; the stopping rule is
    checked after each block and may stop a little later than pull-by-pull.
    Each arm starts with ``min(batch_size, n_obs)`` rewards.

    Parameters
    ----------
    rewards : callable
        ``rewards(arms, idx)`` as in :func:`~pymc_subsample.racing.race`
        (called with one arm at a time).
    n_arms, n_obs : int
        :math:`D` and :math:`N`.
    delta : float
        Error probability.
    batch_size : int
        Initial pulls per arm.
    rng : numpy.random.Generator, optional
        Source of index draws.
    reward_range : float, optional
        :math:`C`; the scale is :math:`\sigma = C/2`. When ``None``, the range
        of all rewards seen so far is used (not a guarantee on rare events).
    block_fraction : float
        :math:`f` above; ``0`` pulls one reward at a time.
    offsets : numpy.ndarray, optional
        Constant added to each arm's rewards (see :func:`~pymc_subsample.racing.race`).

    Returns
    -------
    RaceResult
    """
    rng = np.random.default_rng(rng)
    offsets = np.zeros(n_arms) if offsets is None else offsets
    lam = 1.0 + 10.0 / n_arms
    delta_l = delta / 5.0
    streams = [IndexStream(n_obs, rng) for _ in range(n_arms)]
    total = np.zeros(n_arms)
    pulls = np.zeros(n_arms, dtype=np.int64)
    lo = np.full(n_arms, np.inf)
    hi = np.full(n_arms, -np.inf)
    dead = np.zeros(n_arms, dtype=bool)
    n_evals = 0
    n_rounds = 0

    def pull(i: int, k: int) -> None:
        nonlocal n_evals
        idx = streams[i].take(k)
        vals = checked_rewards(rewards, np.array([i]), idx)[0][0]
        n_evals += len(idx)
        pulls[i] += len(idx)
        if np.isneginf(vals).any():
            dead[i] = True
            total[i] = -np.inf
            return
        total[i] += vals.sum()
        lo[i] = min(lo[i], vals.min())
        hi[i] = max(hi[i], vals.max())

    first = min(batch_size, n_obs)
    for i in range(n_arms):
        pull(i, first)
    while True:
        n_rounds += 1
        live = ~dead
        if not live.any():
            argmax_or_raise(np.full(1, -np.inf))
        if live.sum() == 1:
            winner = int(np.flatnonzero(live)[0])
            break
        mean = np.where(live, total / np.maximum(pulls, 1) + offsets, -np.inf)
        if reward_range is None:
            c = float(np.max(hi[live] - lo[live]))
        else:
            c = float(reward_range)
        sigma = c / 2.0
        t = pulls.astype(float)
        log_t = np.maximum(np.log((1.0 + _EPS) * t), 1.0)  # guard log log for small T
        radius = (
            (1 + _BETA)
            * (1 + np.sqrt(_EPS))
            * np.sqrt(2.0 * sigma**2 * (1 + _EPS) * np.log(log_t / delta_l) / t)
        )
        exact = pulls >= n_obs
        ucb = np.where(exact, mean, mean + radius)
        ucb[dead] = -np.inf
        best = int(np.argmax(ucb))
        if exact[best]:
            winner = best
            break
        live_pulls = np.where(live, pulls, 0)
        others = live_pulls.sum() - live_pulls
        done = live & (pulls >= 1 + lam * others)
        if done.any():
            winner = int(np.argmax(np.where(done, pulls, -1)))
            break
        k = max(1, int(np.ceil(block_fraction * pulls[best])))
        pull(best, min(k, n_obs - pulls[best]))
    means = np.where(dead, -np.inf, total / np.maximum(pulls, 1) + offsets)
    exhausted = bool((pulls >= n_obs).any())
    return RaceResult(winner, n_evals, n_rounds, exhausted, int(pulls.max()), means)

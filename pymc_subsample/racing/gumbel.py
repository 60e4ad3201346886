r"""Discrete sampling as best-arm identification via the Gumbel-max trick.

For :math:`p(X=i) \propto f_0(i) \prod_{n=1}^N f_n(i)` and
:math:`\varepsilon_i \sim \mathrm{Gumbel}(0, 1)`,
:math:`\arg\max_i \log \tilde p(i) + \varepsilon_i` is an exact draw from
:math:`p`. Spreading the cheap part over the :math:`N` terms gives a bandit
with a finite reward population per arm (Chen & Ghahramani 2016, Eq. 2–3):

.. math:: l_{i,n} = \log f_n(i) + \frac{\log f_0(i) + \varepsilon_i}{N}.

A race that returns the best arm with probability at least :math:`1-\delta`
for every :math:`\varepsilon` yields draws within total variation
:math:`\delta` of :math:`p` (Chen & Ghahramani 2016, Prop. 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..validation import check_int
from .common import RaceResult, RewardFn, TotalsFn, check_hooks, validate_race_args
from .config import RaceConfig
from .race import race, race_shared

__all__ = ["sample_categorical"]


def sample_categorical(
    log_f0,
    rewards: RewardFn,
    n_obs: int | Sequence[int],
    *,
    delta: float = 0.05,
    bound: str = "normal",
    batch_size: int = 50,
    variance: str = "pairwise",
    rng: np.random.Generator | int | None = None,
    reward_range: float | None = None,
    noise: np.ndarray | None = None,
    exact_after: int | None = None,
    totals: TotalsFn | None = None,
    skew_guard: bool = True,
    config: RaceConfig | None = None,
) -> tuple[int, RaceResult]:
    r"""Draw :math:`X \sim p(X=i) \propto f_0(i) \prod_n f_n(i)` by racing.

    Draws :math:`\varepsilon_i \sim \mathrm{Gumbel}(0,1)`, forms
    :math:`l_{i,n} = \log f_n(i) + (\log f_0(i) + \varepsilon_i)/N` and races
    them (:func:`~pymc_subsample.racing.race`); the total variation between
    the law of the result and :math:`p` is at most ``delta`` (Chen &
    Ghahramani 2016, Prop. 1). Arms with :math:`\log f_0 = -\infty` never win and cost no
    evaluations.

    Parameters
    ----------
    log_f0 : array_like
        Length-:math:`D` array of :math:`\log f_0(i)` (prior and other cheap
        terms); −inf allowed.
    rewards : callable
        ``rewards(arms, idx)`` returning :math:`\log f_n(i)` for ``i in arms``
        and ``n in idx``, shape ``(len(arms), len(idx))``.
    n_obs : int or sequence of int
        :math:`N`, or one population size per arm (see
        :func:`~pymc_subsample.racing.race`).
    delta, bound, batch_size, variance, reward_range
        As in :func:`~pymc_subsample.racing.race`. ``reward_range`` bounds the
        range of :math:`\log f_n(i)` over :math:`n`.
    rng : numpy.random.Generator or int, optional
        Source of the Gumbel noise and of the index draws.
    noise : numpy.ndarray, optional
        Gumbel noise to use instead of drawing it (for audits that replay a
        decision exactly).
    exact_after : int, optional
        See :func:`~pymc_subsample.racing.race`.
    skew_guard : bool
        See :func:`~pymc_subsample.racing.race`.
    totals : callable, optional
        ``totals(arms)`` returning :math:`\sum_n \log f_n(i)` (see
        :func:`~pymc_subsample.racing.race`).
    config : RaceConfig, optional
        Settings of a shared-index race, instead of ``delta``, ``bound``,
        ``batch_size``, ``variance``, ``reward_range``, ``exact_after`` and
        ``skew_guard`` (samplers build it once).

    Returns
    -------
    value : int
        The drawn index in ``range(D)``.
    result : RaceResult
        The race's record (``winner`` equals ``value``).
    """
    log_f0 = np.asarray(log_f0, dtype=np.float64)
    if log_f0.ndim != 1 or len(log_f0) < 1:
        raise ValueError(f"log_f0 must be a non-empty 1-D array, got shape {log_f0.shape}")
    if config is None:
        validate_race_args(delta, bound, batch_size, variance, len(log_f0))
        check_hooks(reward_range, exact_after, skew_guard)
        if np.ndim(n_obs) == 0:
            check_int("n_obs", n_obs, low=1, example=1000)
    every = np.isfinite(log_f0).all()
    if not every and (np.isnan(log_f0).any() or np.isposinf(log_f0).any()):
        raise ValueError("log_f0 must be finite or -inf (got NaN or +inf)")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    if noise is None:
        noise = rng.gumbel(size=len(log_f0))
    if every and config is not None and np.ndim(n_obs) == 0:  # the samplers' common path
        n_obs = int(n_obs)
        offsets = (log_f0 + noise) / n_obs
        result = race_shared(rewards, len(log_f0), n_obs, config, rng=rng, offsets=offsets,
                             totals=totals)  # fmt: skip
        return result.winner, result
    feasible = np.flatnonzero(np.isfinite(log_f0))
    if len(feasible) == 0:
        raise ValueError("log_f0 is -inf for every candidate: the target is zero everywhere")
    sizes = np.broadcast_to(np.asarray(n_obs), log_f0.shape)
    offsets = (log_f0[feasible] + noise[feasible]) / sizes[feasible]
    sub_sizes = n_obs if np.ndim(n_obs) == 0 else sizes[feasible]
    if len(feasible) == len(log_f0):
        sub_rewards, sub_totals = rewards, totals
    else:

        def sub_rewards(arms, idx):
            return rewards(feasible[arms], idx)

        sub_totals = None if totals is None else (lambda arms: totals(feasible[arms]))

    if config is not None and np.ndim(n_obs) == 0:  # the samplers' path: straight to the driver
        result = race_shared(
            sub_rewards, len(feasible), int(n_obs), config, rng=rng, offsets=offsets,
            totals=sub_totals,
        )  # fmt: skip
    elif config is not None:
        result = race(sub_rewards, len(feasible), sub_sizes, rng=rng, offsets=offsets,
                      totals=sub_totals, config=config)  # fmt: skip
    else:
        hooks = {}  # shared-index hooks, passed only where they apply
        if bound in ("normal", "ebs"):
            hooks = {"exact_after": exact_after, "skew_guard": skew_guard}
        if bound in ("normal", "ebs", "exact") and np.ndim(n_obs) == 0:
            hooks["totals"] = sub_totals
        result = race(
            sub_rewards, len(feasible), sub_sizes, delta=delta, bound=bound,
            batch_size=batch_size, variance=variance, rng=rng, reward_range=reward_range,
            offsets=offsets, **hooks,
        )  # fmt: skip
    value = int(feasible[result.winner])
    means = np.full(len(log_f0), -np.inf)
    means[feasible] = result.means
    return value, RaceResult(
        value, result.n_evaluations, result.n_rounds, result.exhausted, result.n_drawn, means
    )

r"""The Metropolis–Hastings accept test as a two-arm race.

MH from :math:`x` to :math:`x'` with :math:`u \sim U(0,1)` accepts iff

.. math:: \log u < \sum_{n=1}^N \big(l_n(x') - l_n(x)\big) + c,

with :math:`c` the exact part of the log ratio (prior and Jacobian terms,
the proposal densities, sums of control variates). As a race on two arms
(Chen & Ghahramani 2016, Sec. 4), arm 0 is :math:`x` with offset
:math:`\log u / N` and arm 1 is :math:`x'` with offset :math:`c / N`; the
proposal is accepted iff arm 1 wins. Racing-Normal gives the test of
Korattikara et al. (2014), Racing-EBS that of Bardenet et al. (2014).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .common import RaceResult, RewardFn, TotalsFn
from .config import RaceConfig
from .race import race_exact, race_shared

__all__ = ["MHDecision", "mh_test"]


class MHDecision(NamedTuple):
    r"""Outcome of a racing MH test.

    Attributes
    ----------
    accepted : bool
        Whether the proposal is accepted.
    log_alpha : float
        Estimated :math:`\log` of the MH ratio, :math:`N(\hat\mu_1 - \hat\mu_0) +
        \log u` computed back from the race's means (exact for exhausted races);
        −inf when a −inf term of the proposal was drawn, +inf when one of the
        current point was.
    race : RaceResult
        The race's record (arm 0: current point, arm 1: proposal).
    """

    accepted: bool
    log_alpha: float
    race: RaceResult

    @property
    def accept_probability(self) -> float:
        r""":math:`\min(1, e^{\log\alpha})` (1 when the current point has a −inf term)."""
        if np.isnan(self.log_alpha):
            return np.nan
        return float(np.exp(min(0.0, self.log_alpha)))


def mh_test(
    rewards: RewardFn,
    n_obs: int,
    exact_part: float,
    log_u: float,
    config: RaceConfig | None,
    *,
    rng: np.random.Generator,
    totals: TotalsFn | None = None,
) -> MHDecision:
    r"""Decide :math:`\log u < \sum_n (l_n(x') - l_n(x)) + c` by racing.

    Parameters
    ----------
    rewards : callable
        ``rewards(arms, idx)``: per-observation terms at the current point
        (arm 0) and the proposal (arm 1), shape ``(len(arms), n)``.
    n_obs : int
        :math:`N`.
    exact_part : float
        :math:`c`, the part of the log MH ratio computed exactly.
    log_u : float
        :math:`\log u`, :math:`u \sim U(0, 1)`.
    config : RaceConfig or None
        Settings of the race; None decides exactly (plain MH).
    rng : numpy.random.Generator
        Source of the race's index draws.
    totals : callable, optional
        ``totals(arms)``, the sums of the terms over all :math:`N` in one call.

    Returns
    -------
    MHDecision
        The decision; it agrees with exact MH for the same :math:`u` with
        probability at least :math:`1-\delta` under the bound's assumptions.
    """
    if not np.isfinite(exact_part):
        if exact_part == -np.inf:  # the proposal has zero density: reject without data
            means = np.array([np.nan, -np.inf])
            return MHDecision(False, -np.inf, RaceResult(0, 0, 0, False, 0, means))
        raise ValueError(f"the exact part of the MH log ratio is {exact_part!r}")
    offsets = np.array([log_u, exact_part]) / n_obs
    if config is None:
        result = race_exact(rewards, 2, n_obs, offsets, totals)
    else:
        result = race_shared(rewards, 2, n_obs, config, rng=rng, offsets=offsets, totals=totals)
    log_alpha = n_obs * (result.means[1] - result.means[0]) + log_u
    if not np.isfinite(log_alpha):  # a -inf term was drawn at the loser: the ratio is 0 or inf
        log_alpha = -np.inf if result.winner == 0 else np.inf
    return MHDecision(result.winner == 1, float(log_alpha), result)

r"""Control variates as a wrapper of the reward callbacks.

For :math:`h_{i,n} \approx l_{i,n}` whose sum :math:`H_i = \sum_n h_{i,n}` is
cheap, a race on the residuals :math:`l_{i,n} - h_{i,n}` with :math:`H_i/N`
added to the offsets decides the same argmax with a smaller reward variance
(Chen & Ghahramani 2016, Sec. 4; Bardenet et al. 2017).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .common import RewardFn, TotalsFn

__all__ = ["Residuals", "residual_callbacks"]


class Residuals(NamedTuple):
    """Callbacks of a race on residuals.

    Attributes
    ----------
    rewards : callable
        ``rewards(arms, idx)`` minus the control variate on ``idx``.
    totals : callable or None
        ``totals(arms)`` minus :math:`H_i` (None when no ``totals`` was given).
    shift : numpy.ndarray
        :math:`H_i` for every arm: add ``shift / N`` to the offsets.
    """

    rewards: RewardFn
    totals: TotalsFn | None
    shift: np.ndarray


def residual_callbacks(
    rewards: RewardFn,
    totals: TotalsFn | None,
    cv_terms: Callable[[np.ndarray, np.ndarray | slice], np.ndarray],
    cv_totals: np.ndarray,
) -> Residuals:
    r"""Wrap reward callbacks so that a race runs on :math:`l_{i,n} - h_{i,n}`.

    Parameters
    ----------
    rewards, totals : callable
        The race's callbacks on the raw terms.
    cv_terms : callable
        ``cv_terms(arms, idx)``: :math:`h_{i,n}`, same shape as ``rewards``.
    cv_totals : numpy.ndarray
        :math:`H_i = \sum_n h_{i,n}` for every arm, exact.

    Returns
    -------
    Residuals
    """
    cv_totals = np.asarray(cv_totals, dtype=np.float64)

    def residual_rewards(arms, idx):
        return rewards(arms, idx) - cv_terms(arms, idx)

    residual_totals = None
    if totals is not None:

        def residual_totals(arms):
            return totals(arms) - cv_totals[arms]

    return Residuals(residual_rewards, residual_totals, cv_totals)

r"""Taylor control variates for racing on per-observation log-likelihood terms.

Seed 001 (Sec. 4, "control variates") races on
:math:`l_{i,n} - h_{i,n} + \mathbb{E}_n[h_{i,n}]`, which has the mean of
:math:`l_{i,n}` and a much smaller variance when :math:`h_{i,n} \approx l_{i,n}`
and :math:`\sum_n h_{i,n}` is cheap. For a Metropolis–Hastings race between
parameter values :math:`\theta` and :math:`\theta'` the natural choice (the
expansion in the parameter used by Bardenet, Doucet & Holmes 2017, where seed
001 expands in the data) is the first-order Taylor expansion around a
reference point :math:`\hat\theta`:

.. math:: h_n(\theta) = l_n(\hat\theta) + g_n^\top (\theta - \hat\theta), \qquad
          \sum_n h_n(\theta) = \hat L + \hat G^\top (\theta - \hat\theta),

with :math:`g_n = \nabla l_n(\hat\theta)` (central differences, one pass over
the data per direction), :math:`\hat L = \sum_n l_n(\hat\theta)` and
:math:`\hat G = \sum_n g_n`. The residual of a difference,
:math:`l_n(\theta') - l_n(\theta) - g_n^\top(\theta' - \theta)
\approx (\theta'-\theta)^\top H_n (\bar\theta - \hat\theta)`, is second order
in the distance to :math:`\hat\theta`: near the posterior bulk its spread is a
factor :math:`\sim |\bar\theta - \hat\theta|` smaller, so races decide on far
fewer observations. Any :math:`\hat\theta` leaves the race's target unchanged
(the sums are exact); only the variance depends on it.

Pure NumPy: the caller supplies the full per-observation terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["TaylorControlVariate", "taylor_control_variate"]


@dataclass
class TaylorControlVariate:
    r"""First-order Taylor expansion of the per-observation terms around :math:`\hat\theta`.

    Attributes
    ----------
    theta_ref : numpy.ndarray
        :math:`\hat\theta`, flat, shape ``(d,)``.
    l_ref : numpy.ndarray
        :math:`l_n(\hat\theta)`, shape ``(N,)``.
    grad : numpy.ndarray
        :math:`g_n`, shape ``(N, d)``.
    """

    theta_ref: np.ndarray
    l_ref: np.ndarray
    grad: np.ndarray

    def __post_init__(self):
        self.total_l = float(np.sum(self.l_ref))
        self.total_grad = self.grad.sum(axis=0)

    def subset(self, thetas: np.ndarray, idx: np.ndarray) -> np.ndarray:
        r"""Return :math:`h_n(\theta_k)` for observations ``idx``, shape ``(K, len(idx))``."""
        delta = np.atleast_2d(thetas) - self.theta_ref
        return self.l_ref[idx][None, :] + delta @ self.grad[idx].T

    def total(self, thetas: np.ndarray) -> np.ndarray:
        r"""Return :math:`\sum_n h_n(\theta_k)`, shape ``(K,)``."""
        delta = np.atleast_2d(thetas) - self.theta_ref
        return self.total_l + delta @ self.total_grad


def taylor_control_variate(
    full_terms: Callable[[np.ndarray], np.ndarray],
    theta_ref: np.ndarray,
    step: np.ndarray | float,
) -> TaylorControlVariate:
    r"""Build :class:`TaylorControlVariate` by central differences.

    Parameters
    ----------
    full_terms : callable
        ``full_terms(thetas)`` with ``thetas`` of shape ``(K, d)`` returns
        :math:`l_n(\theta_k)`, shape ``(K, N)``.
    theta_ref : numpy.ndarray
        :math:`\hat\theta`, shape ``(d,)``.
    step : float or numpy.ndarray
        Difference step per coordinate (e.g. a fraction of the proposal scale).

    Returns
    -------
    TaylorControlVariate
        With :math:`g_{n,k} = (l_n(\hat\theta + \epsilon_k e_k) -
        l_n(\hat\theta - \epsilon_k e_k)) / (2\epsilon_k)`; ``d`` evaluations of
        two points each, plus one at :math:`\hat\theta`.
    """
    theta_ref = np.asarray(theta_ref, dtype=np.float64)
    d = len(theta_ref)
    eps = np.broadcast_to(np.asarray(step, dtype=np.float64), (d,))
    l_ref = np.asarray(full_terms(theta_ref[None, :])[0], dtype=np.float64)
    grad = np.empty((len(l_ref), d))
    for k in range(d):
        pts = np.stack([theta_ref, theta_ref])
        pts[0, k] += eps[k]
        pts[1, k] -= eps[k]
        both = full_terms(pts)
        grad[:, k] = (both[0] - both[1]) / (2 * eps[k])
    if not (np.all(np.isfinite(l_ref)) and np.all(np.isfinite(grad))):
        raise ValueError(
            "the log-likelihood terms are not finite at or near the control-variate reference "
            "point; start the chain inside the support or turn control_variates off"
        )
    return TaylorControlVariate(theta_ref=theta_ref.copy(), l_ref=l_ref, grad=grad)

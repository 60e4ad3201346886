r"""Uncertainty bounds :math:`G` for racing on a finite population.

Every bound here is the half-width of a one-sided confidence interval for the
mean of :math:`N` numbers estimated from :math:`T` of them drawn without
replacement, valid simultaneously over all looks of a schedule (Chen &
Ghahramani 2016, Eq. 5). :class:`NormalBound` and :class:`EBSBound` carry a
bound's constants for one race; the functions compute the widths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

__all__ = [
    "EBSBound",
    "EBS_KAPPA",
    "NormalBound",
    "ebs_width",
    "normal_threshold",
    "normal_width",
    "rare_event_floor",
    "union_threshold",
]

#: Constant of the empirical Bernstein–Serfling bound, :math:`7/3 + 3/\sqrt{2}`.
EBS_KAPPA = 7.0 / 3.0 + 3.0 / np.sqrt(2.0)


def union_threshold(n_looks: int, delta: float) -> float:
    r"""Union-bound threshold :math:`B = \Phi^{-1}(1 - \delta / K)` for ``K`` looks.

    Parameters
    ----------
    n_looks : int
        Number of looks :math:`K` at which an arm can be eliminated.
    delta : float
        Allowed probability that any look crosses :math:`B`.

    Returns
    -------
    float
        The threshold (conservative: the looks are positively correlated).
    """
    return float(stats.norm.isf(delta / max(n_looks, 1)))


def _crossing_probability(threshold: float, rho: np.ndarray, grid_step: float) -> float:
    """P(max_k Z_k > threshold) for a stationary-marginal Gaussian Markov chain.

    ``Z_1 ~ N(0, 1)`` and ``Z_{k+1} | Z_k = z ~ N(rho_k z, 1 - rho_k**2)``. The
    density of the chain killed at the threshold is propagated on a grid.
    """
    lo = -9.0
    z = np.arange(lo, threshold + grid_step / 2, grid_step)
    z[-1] = threshold
    w = np.full(len(z), grid_step)
    w[0] = w[-1] = grid_step / 2  # trapezoid weights
    g = stats.norm.pdf(z)
    for r in rho:
        s = np.sqrt(1.0 - r * r)
        kernel = np.exp(-0.5 * ((z[:, None] - r * z[None, :]) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        g = kernel @ (g * w)
    survive = float(np.sum(g * w)) + float(stats.norm.cdf(lo))
    return 1.0 - min(survive, 1.0)


@lru_cache(maxsize=4096)
def _normal_threshold_cached(sizes: tuple[int, ...], n_obs: int, delta: float) -> float:
    t = np.asarray(sizes, dtype=float)
    if len(t) == 0:
        return 0.0
    single = float(stats.norm.isf(delta))
    if len(t) == 1:
        return single
    # corr(Z_s, Z_t) = sqrt(T_s (N - T_t) / (T_t (N - T_s))) for T_s < T_t < N
    rho = np.sqrt(t[:-1] * (n_obs - t[1:]) / (t[1:] * (n_obs - t[:-1])))
    union = union_threshold(len(t), delta)
    s_min = float(np.sqrt(1.0 - rho.max() ** 2))
    if s_min < 0.05:  # nearly collinear looks: the grid would need to be very fine
        return union
    step = min(0.02, s_min / 8)
    f = lambda b: _crossing_probability(b, rho, step) - delta  # noqa: E731
    if f(union) > 0:  # numerical trouble: keep the valid, conservative bound
        return union
    return float(optimize.brentq(f, single, union, xtol=1e-4))


def normal_threshold(sizes, n_obs: int, delta: float) -> float:
    r"""Threshold :math:`B` of the Racing-Normal bound for a whole schedule.

    Under the normal approximation, the standardized means
    :math:`Z_t = (\hat\mu^{(t)} - \mu)/s_{T^{(t)}}` at the looks
    :math:`T^{(1)} < \dots < T^{(K)} < N` of one race are jointly Gaussian
    with :math:`\mathrm{corr}(Z_s, Z_t) = \sqrt{T_s (N-T_t) / (T_t (N-T_s))}`
    (Chen & Ghahramani 2016, Sec. 3.3.2). That sequence is Markov, so
    :math:`P(\max_t Z_t > B)` is a one-dimensional recursion; :math:`B` solves
    :math:`P(\max_t Z_t > B) = \delta`. Results are cached per
    ``(sizes, n_obs, delta)``. When the recursion is ill-conditioned (looks
    closer than a correlation of 0.9987), the union bound
    :func:`union_threshold` is used instead; it is always at least as large.

    Parameters
    ----------
    sizes : sequence of int
        Cumulative sample sizes of the looks strictly below ``n_obs``.
    n_obs : int
        Population size :math:`N`.
    delta : float
        Allowed one-sided crossing probability.

    Returns
    -------
    float
        :math:`B` (0 when there is no look before ``n_obs``).
    """
    return _normal_threshold_cached(tuple(int(s) for s in sizes), int(n_obs), float(delta))


def normal_width(threshold: float, sigma, n_drawn, n_obs):
    r"""Racing-Normal half-width :math:`G = B\, s_T` (Chen & Ghahramani 2016, Sec. 3.3.2).

    .. math:: s_T = \frac{\hat\sigma}{\sqrt{T}} \sqrt{1 - \frac{T-1}{N-1}}

    with :math:`\hat\sigma` the biased (1/T) standard deviation and the
    finite-population correction of sampling without replacement.

    Parameters
    ----------
    threshold : float
        :math:`B` from :func:`normal_threshold`.
    sigma : array_like
        :math:`\hat\sigma`.
    n_drawn : int or array_like
        :math:`T`.
    n_obs : int or array_like
        :math:`N`.

    Returns
    -------
    numpy.ndarray or float
        The half-width, 0 where :math:`T = N`.
    """
    n_drawn = np.asarray(n_drawn, dtype=float)
    fpc = np.sqrt(np.clip((n_obs - n_drawn) / np.maximum(n_obs - 1.0, 1.0), 0.0, 1.0))
    return threshold * sigma / np.sqrt(n_drawn) * fpc


def ebs_width(delta: float, sigma, n_drawn, n_obs, reward_range):
    r"""Empirical Bernstein–Serfling half-width (Bardenet & Maillard 2015).

    With probability at least :math:`1-\delta`, for :math:`n \le N`,

    .. math::
        \hat\mu_n - \mu \le \hat\sigma_n \sqrt{\frac{2 \rho_n \log(5/\delta)}{n}}
        + \frac{\kappa C \log(5/\delta)}{n},

    :math:`\kappa = 7/3 + 3/\sqrt{2}`, :math:`\rho_n = 1 - (n-1)/N` for
    :math:`n \le N/2` and :math:`(1 - n/N)(1 + 1/n)` above (Chen & Ghahramani 2016, Eq. 6).
    Callers divide :math:`\delta` by the number of looks (union bound).

    Parameters
    ----------
    delta : float
        Confidence parameter for this look.
    sigma : array_like
        Biased standard deviation :math:`\hat\sigma_n`.
    n_drawn : int or array_like
        :math:`n`.
    n_obs : int or array_like
        :math:`N`.
    reward_range : array_like
        :math:`C`, a bound on the range of the rewards.

    Returns
    -------
    numpy.ndarray or float
        The half-width, 0 where :math:`n = N`.
    """
    n = np.asarray(n_drawn, dtype=float)
    big_n = np.asarray(n_obs, dtype=float)
    rho = np.where(n <= big_n / 2, 1.0 - (n - 1.0) / big_n, (1.0 - n / big_n) * (1.0 + 1.0 / n))
    log_term = np.log(5.0 / delta)
    width = sigma * np.sqrt(2.0 * rho * log_term / n) + EBS_KAPPA * reward_range * log_term / n
    return np.where(n >= big_n, 0.0, width)


def rare_event_floor(reward_range, n_drawn):
    r"""Floor on the standard deviation for rewards that may hide rare events.

    After :math:`T` draws that saw no rare event, an event of probability
    :math:`p_0 = 1/(T+1)` is still plausible; a reward that jumps by the range
    :math:`C` with that probability has standard deviation

    .. math:: C \sqrt{p_0 (1 - p_0)}.

    Racing-Normal uses :math:`\max(\hat\sigma, C\sqrt{p_0(1-p_0)})`
    (a safeguard of ours against rare-event rewards, on which the normal
    approximation fails).

    Parameters
    ----------
    reward_range : array_like
        :math:`C`.
    n_drawn : int
        :math:`T`.

    Returns
    -------
    numpy.ndarray or float
        The floor.
    """
    p0 = 1.0 / (np.asarray(n_drawn, dtype=float) + 1.0)
    return reward_range * np.sqrt(p0 * (1.0 - p0))


@dataclass(frozen=True)
class NormalBound:
    r"""Racing-Normal bound of one race: :math:`G = B\, \max(\hat\sigma, \text{floor})\, s_T`.

    Parameters
    ----------
    threshold : float
        :math:`B` for the race's schedule (:func:`normal_threshold`).
    n_obs : int
        Population size :math:`N`.
    floor_range : float or None
        :math:`C'` of the rare-event floor :func:`rare_event_floor` (twice the
        reward range for pairwise differences); None: no floor.
    skew_guard : bool
        Whether eliminations wait for Cochran's rule :math:`T \ge 25 \hat g_1^2`
        on the latest batch (only without ``floor_range``).
    cantelli : float
        :math:`k` with :math:`1/(1+k^2)` the error allowed per look and
        comparison: a gap of :math:`k` standard errors is decisive whatever the
        shape of the rewards (Cantelli's inequality), so the skew guard does
        not hold it back.
    """

    threshold: float
    n_obs: int
    floor_range: float | None = None
    skew_guard: bool = True
    cantelli: float = np.inf

    def factor(self, n_drawn: int) -> float:
        r"""Half-width per unit standard deviation, :math:`B\sqrt{(N-T)/((N-1)T)}`."""
        return self.threshold * math.sqrt((self.n_obs - n_drawn) / (self.n_obs - 1.0) / n_drawn)

    def floor(self, n_drawn: int) -> float:
        """Floor on the standard deviation after ``n_drawn`` observations (0 without a range)."""
        if self.floor_range is None:
            return 0.0
        return float(rare_event_floor(self.floor_range, n_drawn))

    def width(self, sigma, n_drawn: int):
        """Half-width :math:`G` for standard deviations ``sigma`` after ``n_drawn`` draws."""
        return np.maximum(sigma, self.floor(n_drawn)) * self.factor(n_drawn)

    @property
    def guards_skew(self) -> bool:
        """True when Cochran's rule applies (skew guard on, no reward range given)."""
        return self.skew_guard and self.floor_range is None


@dataclass(frozen=True)
class EBSBound:
    r"""Racing-EBS bound of one race (:func:`ebs_width` with a union bound over looks).

    Parameters
    ----------
    delta_look : float
        Confidence per look and comparison, :math:`\delta / (K (D-1))`.
    n_obs : int
        Population size :math:`N`.
    reward_range : float or None
        :math:`C` (doubled for pairwise differences); None: the range seen on
        the latest batch is plugged in (no guarantee on rare events).
    """

    delta_look: float
    n_obs: int
    reward_range: float | None = None

    def width(self, sigma, n_drawn: int, batch_range=None):
        """Half-width for ``sigma``; ``batch_range`` stands in for a missing ``reward_range``."""
        c = self.reward_range if self.reward_range is not None else batch_range
        return ebs_width(self.delta_look, sigma, n_drawn, self.n_obs, c)

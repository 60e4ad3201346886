r"""Erraqabi et al.'s (2016) test targets, with the decomposition A* sampling needs.

Each target is :math:`f(x) = q(x) \exp(o(x))` on a box: :math:`q` a tractable
product density (the proposal of simple rejection sampling and A*), :math:`o`
a bounded function with a computable upper bound on any sub-box.

* peakiness (§4.1): :math:`f \propto e^{-x}/(1+x)^a` on :math:`[0, 10]`,
  :math:`q` = Exponential(1) truncated to the box, :math:`o = -a\log(1+x)`;
* sine (§4.2): :math:`f \propto (1+\sin(4\pi x-\pi/2))(1+\sin(4\pi y-\pi/2))`
  on :math:`[0,1]^2`, :math:`q` uniform, :math:`o = \log f`;
* clutter (§4.3, Minka 2001): posterior of the mean :math:`\theta` of 20
  points in :math:`d` dimensions, half uniform on :math:`[-5,-3]^d`, half on
  :math:`[2,4]^d`, likelihood :math:`0.5\,N(x;\theta,I) + 0.5\,N(x;0,10I)`,
  prior :math:`N(0, 100 I)`, restricted to :math:`[-8, 8]^d` (the mass
  outside is below 1e-8); :math:`q` = prior truncated to the box,
  :math:`o` = log likelihood, bounded per observation at the box point
  nearest to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["Marginal", "Target", "clutter_target", "peakiness_target", "sine_target"]


@dataclass(frozen=True)
class Marginal:
    """A 1-D density restricted to ``[lo, hi]``: uniform, exponential(1) or normal.

    Scalar ``cdf``/``ppf`` use closed forms (fast enough for A*'s many tiny boxes).
    """

    kind: str
    lo: float
    hi: float
    loc: float = 0.0
    scale: float = 1.0

    def cdf(self, t: float) -> float:
        """Untruncated CDF."""
        if self.kind == "uniform":
            return (t - self.lo) / (self.hi - self.lo)
        if self.kind == "exponential":
            return -math.expm1(-max(t, 0.0))
        return float(ndtr((t - self.loc) / self.scale))

    def ppf(self, u: float) -> float:
        """Untruncated inverse CDF."""
        if self.kind == "uniform":
            return self.lo + u * (self.hi - self.lo)
        if self.kind == "exponential":
            return -math.log1p(-u)
        return self.loc + self.scale * float(ndtri(u))

    def logpdf(self, t: np.ndarray) -> np.ndarray:
        """Untruncated log density (vectorized)."""
        if self.kind == "uniform":
            return np.full(np.shape(t), -math.log(self.hi - self.lo))
        if self.kind == "exponential":
            return -np.asarray(t, dtype=float)
        z = (np.asarray(t) - self.loc) / self.scale
        return -0.5 * z**2 - math.log(self.scale * math.sqrt(2 * math.pi))


@dataclass(frozen=True)
class Target:
    r"""An unnormalized target :math:`f = q\,e^{o}` on a box, as in Erraqabi et al. (2016).

    Attributes
    ----------
    name : str
    bounds : list of (low, high)
    marginals : list of Marginal
        :math:`q`'s marginals, truncated to the box.
    o : callable
        :math:`o(x)` for points of shape ``(k, d)``.
    o_bound : callable
        ``o_bound(lo, hi)``: an upper bound of :math:`o` on the sub-box.
    """

    name: str
    bounds: list
    marginals: list
    o: Callable[[np.ndarray], np.ndarray]
    o_bound: Callable[[np.ndarray, np.ndarray], float]

    @property
    def dim(self) -> int:
        """Number of dimensions."""
        return len(self.bounds)

    def log_q(self, x: np.ndarray) -> np.ndarray:
        """Log density of the untruncated :math:`q` (the truncation is a constant)."""
        return sum(m.logpdf(x[:, k]) for k, m in enumerate(self.marginals))

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        r"""Return :math:`\log f(x)`, ``-inf`` outside the box."""
        x = np.atleast_2d(x)
        lo, hi = np.array(self.bounds).T
        inside = np.all((x >= lo) & (x <= hi), axis=1)
        out = np.full(len(x), -np.inf)
        out[inside] = self.log_q(x[inside]) + self.o(x[inside])
        return out


def peakiness_target(a: float) -> Target:
    r""":math:`f \propto e^{-x}(1+x)^{-a}` on :math:`[0, 10]` (Erraqabi et al. 2016, Sec. 4.1)."""

    def o(x):
        return -a * np.log1p(x[:, 0])

    def o_bound(lo, hi):
        return -a * math.log1p(lo[0])

    return Target(
        name=f"peakiness a={a:g}",
        bounds=[(0.0, 10.0)],
        marginals=[Marginal("exponential", 0.0, 10.0)],
        o=o,
        o_bound=o_bound,
    )


def _sine_max(lo: float, hi: float) -> float:
    """Largest value of 1 - cos(4 pi t) on [lo, hi] (peaks at t = 1/4 + k/2)."""
    k = math.ceil((lo - 0.25) * 2)
    if 0.25 + k / 2 <= hi:
        return 2.0
    return max(1 - math.cos(4 * math.pi * lo), 1 - math.cos(4 * math.pi * hi))


def sine_target() -> Target:
    r""":math:`(1+\sin(4\pi x-\pi/2))(1+\sin(4\pi y-\pi/2))` on :math:`[0,1]^2` (§4.2)."""

    def o(x):
        with np.errstate(divide="ignore"):
            return np.log1p(-np.cos(4 * np.pi * x[:, 0])) + np.log1p(-np.cos(4 * np.pi * x[:, 1]))

    def o_bound(lo, hi):
        return math.log(_sine_max(lo[0], hi[0])) + math.log(_sine_max(lo[1], hi[1]))

    return Target(
        name="sine 2-D",
        bounds=[(0.0, 1.0), (0.0, 1.0)],
        marginals=[Marginal("uniform", 0.0, 1.0), Marginal("uniform", 0.0, 1.0)],
        o=o,
        o_bound=o_bound,
    )


def clutter_target(dim: int, seed: int = 0, n_points: int = 20) -> Target:
    r"""Posterior of the clutter problem's mean in ``dim`` dimensions (§4.3)."""
    rng = np.random.default_rng(seed)
    half = n_points // 2
    data = np.concatenate(
        [rng.uniform(-5, -3, (half, dim)), rng.uniform(2, 4, (n_points - half, dim))]
    )
    w, var_c = 0.5, 10.0
    log_clutter = np.log(w) + (
        -0.5 * np.sum(data**2, axis=1) / var_c - 0.5 * dim * np.log(2 * np.pi * var_c)
    )
    log_norm = np.log(1 - w) - 0.5 * dim * np.log(2 * np.pi)

    def o(x):
        sq = np.sum((x[:, None, :] - data[None, :, :]) ** 2, axis=2)
        return np.logaddexp(log_norm - 0.5 * sq, log_clutter[None, :]).sum(axis=1)

    def o_bound(lo, hi):
        sq = np.sum((np.clip(data, lo, hi) - data) ** 2, axis=1)
        return float(np.logaddexp(log_norm - 0.5 * sq, log_clutter).sum())

    box = (-8.0, 8.0)
    return Target(
        name=f"clutter {dim}-D",
        bounds=[box] * dim,
        marginals=[Marginal("normal", *box, loc=0.0, scale=10.0)] * dim,
        o=o,
        o_bound=o_bound,
    )

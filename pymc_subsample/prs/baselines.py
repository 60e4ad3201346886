r"""Baselines of seed 002's experiments: simple rejection sampling and A* sampling.

Both sample :math:`f = q\,e^{o}` of a :class:`~pymc_subsample.prs.targets.Target`
and count evaluations of :math:`f` (one per evaluation of :math:`o`).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from .targets import Target

__all__ = ["AStarSampler", "simple_rejection"]


def _draw_q(target: Target, lo, hi, rng: np.random.Generator, k: int) -> np.ndarray:
    """Draw ``k`` points of :math:`q` restricted to the box ``[lo, hi]`` (inverse CDF)."""
    cols = []
    for j, m in enumerate(target.marginals):
        a, b = m.cdf(lo[j]), m.cdf(hi[j])
        cols.append([min(max(m.ppf(a + u * (b - a)), lo[j]), hi[j]) for u in rng.random(k)])
    return np.array(cols, dtype=float).T


def simple_rejection(
    target: Target, budget: int, rng: np.random.Generator | int | None = None
) -> tuple[np.ndarray, int]:
    r"""Rejection sampling from :math:`q` with constant :math:`e^{\max o}` on the box.

    Parameters
    ----------
    target : Target
        The target :math:`q e^o`.
    budget : int
        Number of evaluations of :math:`f`.
    rng : int or numpy.random.Generator, optional
        Source of randomness.

    Returns
    -------
    draws : numpy.ndarray
        The accepted points, shape ``(k, d)``.
    n_evaluations : int
        ``budget``.
    """
    rng = np.random.default_rng(rng)
    lo, hi = np.array(target.bounds).T
    bound = target.o_bound(lo, hi)
    u = rng.random((budget, target.dim))
    x = np.empty((budget, target.dim))
    for j, m in enumerate(target.marginals):
        a, b = m.cdf(lo[j]), m.cdf(hi[j])
        x[:, j] = np.clip([m.ppf(a + t * (b - a)) for t in u[:, j]], lo[j], hi[j])
    accept = np.log(rng.random(budget)) < target.o(x) - bound
    return x[accept], budget


class AStarSampler:
    r"""A* sampling (Maddison, Tarlow and Minka 2014, Alg. 2).

    Draws the Gumbel process of :math:`q` top-down by splitting boxes, keeps
    the best lower bound :math:`G + o(X)` and stops when no box's upper bound
    :math:`G + \max_B o` can beat it; the argmax is an exact draw of :math:`f`.
    Each popped box costs one evaluation of :math:`o` (of :math:`f`).

    Parameters
    ----------
    target : Target
        The target :math:`q e^o`; needs ``o_bound``.
    rng : int or numpy.random.Generator, optional
        Source of randomness.
    """

    def __init__(self, target: Target, rng: np.random.Generator | int | None = None):
        self.target = target
        self.rng = np.random.default_rng(rng)
        self.n_evaluations = 0
        self.n_draws = 0

    def _log_mass(self, lo, hi) -> float:
        total = 0.0
        for j, m in enumerate(self.target.marginals):
            p = m.cdf(hi[j]) - m.cdf(lo[j])
            if p <= 0:
                return -math.inf
            total += math.log(p)
        return total

    def _truncated_gumbel(self, loc: float, upper: float) -> float:
        g = loc - math.log(-math.log(self.rng.random()))
        return -math.log(math.exp(-upper) + math.exp(-g)) if g > -700 else g

    def draw(self) -> np.ndarray:
        """Return one exact draw, shape ``(d,)``."""
        t = self.target
        lo, hi = (np.array(b, dtype=float) for b in zip(*t.bounds, strict=True))
        g = self._log_mass(lo, hi) - math.log(-math.log(self.rng.random()))
        x = _draw_q(t, lo, hi, self.rng, 1)[0]
        heap = [(-(g + t.o_bound(lo, hi)), 0, g, x, lo, hi)]
        best, best_x, tick = -math.inf, None, 1
        while heap and best < -heap[0][0]:
            _, _, g, x, lo, hi = heapq.heappop(heap)
            value = g + float(t.o(x[None, :])[0])
            self.n_evaluations += 1
            if value > best:
                best, best_x = value, x
            k = int(np.argmax((hi - lo) / (np.array(t.bounds)[:, 1] - np.array(t.bounds)[:, 0])))
            for c_lo, c_hi in (
                (lo, np.where(np.arange(t.dim) == k, x, hi)),
                (np.where(np.arange(t.dim) == k, x, lo), hi),
            ):
                log_mass = self._log_mass(c_lo, c_hi)
                if log_mass == -math.inf:
                    continue
                g_c = self._truncated_gumbel(log_mass, g)
                upper = g_c + t.o_bound(c_lo, c_hi)
                if upper > best:
                    x_c = _draw_q(t, c_lo, c_hi, self.rng, 1)[0]
                    heapq.heappush(heap, (-upper, tick, g_c, x_c, c_lo, c_hi))
                    tick += 1
        self.n_draws += 1
        return best_x

    def sample_budget(self, budget: int) -> np.ndarray:
        """Draw until ``budget`` evaluations of :math:`f` are spent; return the draws."""
        out = []
        while self.n_evaluations < budget:
            out.append(self.draw())
        return np.array(out)

    @property
    def acceptance_rate(self) -> float:
        """Draws per evaluation of :math:`f`."""
        return self.n_draws / max(self.n_evaluations, 1)

r"""Baselines of Erraqabi et al.'s (2016) experiments: simple rejection and A* sampling.

Both sample :math:`f = q\,e^{o}` of a :class:`~support.targets.Target`
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
    r"""A* sampling (Maddison, Tarlow & Minka 2014), as in the authors' released code.

    The Gumbel process of :math:`f = q e^o` is searched top-down: a region
    :math:`B` of the state space carries the largest value :math:`G` of the
    Gumbel process of :math:`q` in it (:math:`G \sim \text{Gumbel}(\log q(B))`,
    truncated below its parent's) and the upper bound :math:`G + \max_B o`;
    the region with the largest upper bound is popped, its point
    :math:`X \sim q|_B` is drawn and :math:`G + o(X)` joins the lower bounds.
    When the largest lower bound is at least every remaining upper bound, its
    :math:`X` is the next point of the target's Gumbel process, an exact draw
    of :math:`f`.

    ``stream=True`` (default) is the iterator of Maddison et al.'s released
    code (``astar_sampling_iterator``), the one Erraqabi et al. (2016) ran:
    **one** Gumbel process yields all the draws (the locations of its points,
    in decreasing order of value, are i.i.d. from :math:`f`). After popping
    :math:`B` the search either advances :math:`B` to its next Gumbel value
    :math:`\text{TruncGumbel}(\log q(B), G)` with the same bound (if the
    best lower bound already beats every upper bound) or splits :math:`B` at
    :math:`X` along its widest side (relative to the state space), the next
    value going to a child chosen with probability :math:`\propto q(\text{child})`
    and the other child drawing its own, truncated at it. At most one draw is
    returned per popped region. Since regions shrink as draws accumulate, the
    bounds tighten and evaluations per draw fall toward one.

    ``stream=False`` restarts the search for every draw (Alg. 2 of the paper
    run once per draw): every draw pays for the whole search from the root.

    **Accounting.** One evaluation of :math:`f` per popped region (its
    :math:`o(X)`); :attr:`acceptance_rate` is draws per evaluation. Bound
    evaluations (:attr:`n_bounds`, one per region created) are not counted
    as evaluations of :math:`f`, as in both papers.

    Parameters
    ----------
    target : Target
        The target :math:`q e^o`; needs ``o_bound``.
    rng : int or numpy.random.Generator, optional
        Source of randomness.
    stream : bool
        One Gumbel process for all draws (default), or a new one per draw.
    """

    def __init__(
        self,
        target: Target,
        rng: np.random.Generator | int | None = None,
        *,
        stream: bool = True,
    ):
        self.target = target
        self.rng = np.random.default_rng(rng)
        self.stream = bool(stream)
        self.n_evaluations = 0
        self.n_bounds = 0
        self.n_draws = 0
        box = np.array(target.bounds, dtype=float)
        self._lo, self._hi = box[:, 0], box[:, 1]
        self._span = self._hi - self._lo
        self._start()

    def _start(self) -> None:
        """Start a new Gumbel process: the root region on the upper-bound heap."""
        log_mass = self._log_mass(self._lo, self._hi)
        g = log_mass + self._gumbel()
        self._upper: list = []
        self._lower: list = []
        self._tick = 0
        self._push(g, self._lo, self._hi, log_mass)

    def _gumbel(self) -> float:
        return -math.log(self.rng.exponential())

    def _truncated(self, loc: float, upper: float) -> float:
        """Gumbel(loc) conditioned on being below ``upper``."""
        return -math.log(self.rng.exponential() * math.exp(-loc) + math.exp(-upper))

    def _push(self, g: float, lo, hi, log_mass: float) -> None:
        bound = float(self.target.o_bound(lo, hi))
        self.n_bounds += 1
        heapq.heappush(self._upper, (-(g + bound), self._tick, g, bound, lo, hi, log_mass))
        self._tick += 1

    def _log_mass(self, lo, hi) -> float:
        total = 0.0
        for j, m in enumerate(self.target.marginals):
            p = m.cdf(hi[j]) - m.cdf(lo[j])
            if p <= 0:
                return -math.inf
            total += math.log(p)
        return total

    def draw(self) -> np.ndarray:
        """Return one exact draw, shape ``(d,)``."""
        if not self.stream:
            self._start()
        o = self.target.o
        while True:
            _, _, g, bound, lo, hi, log_mass = heapq.heappop(self._upper)
            x = _draw_q(self.target, lo, hi, self.rng, 1)[0]
            value = g + float(o(x[None, :])[0])
            self.n_evaluations += 1
            heapq.heappush(self._lower, (-value, self._tick, x))
            self._tick += 1
            g_next = self._truncated(log_mass, g)  # the region's next Gumbel value
            best_upper = max(g_next + bound, -self._upper[0][0] if self._upper else -math.inf)
            if -self._lower[0][0] < best_upper:  # still searching: split at x
                k = int(np.argmax((hi - lo) / self._span))
                children = [
                    (lo, np.where(np.arange(len(lo)) == k, x[k], hi)),
                    (np.where(np.arange(len(lo)) == k, x[k], lo), hi),
                ]
                masses = [self._log_mass(c_lo, c_hi) for c_lo, c_hi in children]
                finite = [m for m in masses if m > -math.inf]
                if finite:
                    p = np.exp(np.array(masses) - max(finite))
                    heir = int(self.rng.choice(2, p=p / p.sum()))
                    for c, ((c_lo, c_hi), m) in enumerate(zip(children, masses, strict=True)):
                        if m == -math.inf:
                            continue
                        g_c = g_next if c == heir else self._truncated(m, g_next)
                        self._push(g_c, c_lo, c_hi, m)
            else:
                heapq.heappush(
                    self._upper, (-(g_next + bound), self._tick, g_next, bound, lo, hi, log_mass)
                )
                self._tick += 1
            top = -self._upper[0][0] if self._upper else -math.inf
            if -self._lower[0][0] >= top:
                _, _, best = heapq.heappop(self._lower)
                self.n_draws += 1
                return best

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

r"""Racing Gibbs sampler for clustering models with pairwise factors.

The model (Singh et al. 2012; Chen & Ghahramani 2016, Sec. 5.3) puts items
:math:`x_1, \dots, x_n` into clusters :math:`y` with one factor per pair in
the same cluster and a weight per cluster,

.. math:: \log p(y \mid x) = \sum_{i<j:\, y_i = y_j} w(x_i, x_j)
          + \omega\, |\{\text{clusters of } y\}| + \text{const},

where :math:`w = \log f_\theta` may be −inf (a cannot-link). Optionally the
items are split into blocks (canopies) and only items of one block may share a
cluster. The affinity/repulsion parameterization of Singh et al.,
:math:`\sum_{y_i=y_j} \phi_{ij} - \sum_{y_i\neq y_j} \phi_{ij}`, is this model
with :math:`w = 2\phi`. The Gibbs conditional of one item is

.. math:: p(y_i = c \mid y_{-i}) \propto \exp\!\Big(\tfrac{1}{\tau}
          \sum_{j \in C_c \setminus \{i\}} w(x_i, x_j)\Big), \qquad
          p(y_i = \text{new} \mid y_{-i}) \propto \exp(\omega / \tau),

over the clusters :math:`C_c` of the other items of its block, plus a new
cluster; :math:`\tau = 1` samples the posterior and :math:`\tau \to 0`
anneals towards the MAP clustering (Finkel et al. 2005). The neighbourhoods
change at every step, so the conditional cannot be compiled once.

The racing draw (Chen & Ghahramani 2016) adds Gumbel noise
:math:`\varepsilon_c` to each candidate's log weight and finds
:math:`\arg\max_c S_c/\tau + \varepsilon_c` with
:func:`~pymc_subsample.racing.independent.race_independent`: one arm per
candidate cluster, whose population is the :math:`N_c = |C_c \setminus\{i\}|`
factors with its members, read in mini-batches of 3, then
:math:`\lceil (N_c-3)/10 \rceil`, then doubling
(:func:`~pymc_subsample.racing.independent.cluster_schedule`). The draw is
within :math:`\delta` of the exact conditional in total variation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pymc_subsample.racing.common import check_probability
from pymc_subsample.racing.independent import INDEPENDENT_BOUNDS, cluster_schedule, race_independent

__all__ = ["GibbsCounters", "PairwiseFactorGibbs", "geometric_temperatures"]

#: ``log_factor(i, js) -> w(x_i, x_j) for j in js`` (1-D float array, finite or −inf).
LogFactorFn = Callable[[int, np.ndarray], np.ndarray]

METHODS = ("racing", "exact")


@dataclass
class GibbsCounters:
    """Cumulative work and audit counts of a :class:`PairwiseFactorGibbs`.

    Attributes
    ----------
    updates : int
        Conditional draws made.
    factor_evaluations : int
        Pairwise factors evaluated by the draws (audits excluded).
    exact_evaluations : int
        Factors an exact draw would have evaluated for the same updates
        (the other items of the block), the reference for the saving.
    races : int
        Draws decided by a race (more than one candidate with a factor).
    audits : int
        Racing draws checked against the exact argmax with the same noise.
    audit_errors : int
        Audited draws whose race returned another candidate than the exact one.
    audit_evaluations : int
        Factors evaluated by the audits (not in ``factor_evaluations``).
    """

    updates: int = 0
    factor_evaluations: int = 0
    exact_evaluations: int = 0
    races: int = 0
    audits: int = 0
    audit_errors: int = 0
    audit_evaluations: int = 0


def geometric_temperatures(n_sweeps: int, start: float = 2.0, end: float = 0.05) -> np.ndarray:
    r"""Geometric annealing schedule :math:`\tau_k = \tau_0 (\tau_K/\tau_0)^{k/(K-1)}`.

    Parameters
    ----------
    n_sweeps : int
        Number of sweeps :math:`K \ge 1`.
    start, end : float
        First and last temperatures, both > 0.

    Returns
    -------
    numpy.ndarray
        ``n_sweeps`` temperatures from ``start`` to ``end``.
    """
    if int(n_sweeps) != n_sweeps or n_sweeps < 1:
        raise ValueError(f"n_sweeps must be a positive integer, got {n_sweeps!r}")
    if not (start > 0 and end > 0):
        raise ValueError(f"temperatures must be > 0, got start={start}, end={end}")
    if n_sweeps == 1:
        return np.array([float(end)])
    return start * (end / start) ** (np.arange(n_sweeps) / (n_sweeps - 1))


class PairwiseFactorGibbs:
    r"""Gibbs sampler (exact or racing) for a pairwise-factor clustering model.

    See the module docstring for the model and the conditional.

    Parameters
    ----------
    log_factor : callable
        ``log_factor(i, js)`` returns :math:`w(x_i, x_j)` for each ``j`` of the
        int64 array ``js`` (items of the same block, never ``i``), as a 1-D
        float array; −inf forbids the pair. It should be symmetric. A race
        sees a −inf only if it draws that member: a cannot-link hidden in a
        large cluster can be missed, so express hard constraints through
        ``blocks`` (or use ``method="exact"``).
    n_items : int
        Number of items :math:`n`.
    blocks : array_like of int, optional
        Block of each item; items of different blocks never share a cluster.
        Default: one block.
    labels : array_like of int, optional
        Initial clustering (any integer labels; relabelled internally).
        Default: every item alone (the paper's initialization). Labels that
        span two blocks are a ``ValueError``.
    log_new : float
        :math:`\omega`, the log weight of opening a new cluster.
    method : {"racing", "exact"}
        ``"exact"`` evaluates every factor between the item and the rest of
        its block; ``"racing"`` races the candidate clusters.
    delta : float
        Racing: bound on the total variation between the racing draw and the
        exact conditional.
    bound : {"normal", "ebs", "exact"}
        Racing: the uncertainty bound of
        :func:`~pymc_subsample.racing.independent.race_independent`.
    first, fraction : int, float
        Racing: the schedule of each arm, :func:`cluster_schedule` ``(N_c,
        first, fraction)``.
    reward_range : float, optional
        Racing: a bound on the range of :math:`w` over one cluster's members
        (needed by ``bound="ebs"`` for a guarantee; otherwise the range drawn
        so far is used).
    audit : float
        Racing: probability, per race, of also computing the exact argmax with
        the same Gumbel noise and counting a disagreement in
        :attr:`counters` (its factors are counted apart).
    rng : numpy.random.Generator or int, optional
        Source of randomness.

    Attributes
    ----------
    counters : GibbsCounters
        Work done so far.
    """

    def __init__(
        self,
        log_factor: LogFactorFn,
        n_items: int,
        *,
        blocks: Sequence[int] | np.ndarray | None = None,
        labels: Sequence[int] | np.ndarray | None = None,
        log_new: float = 0.0,
        method: str = "racing",
        delta: float = 0.05,
        bound: str = "normal",
        first: int = 3,
        fraction: float = 0.1,
        reward_range: float | None = None,
        audit: float = 0.0,
        rng: np.random.Generator | int | None = None,
    ):
        if int(n_items) != n_items or n_items < 1:
            raise ValueError(f"n_items must be a positive integer, got {n_items!r}")
        n = int(n_items)
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
        if bound not in INDEPENDENT_BOUNDS:
            raise ValueError(f"unknown bound {bound!r}; choose one of {INDEPENDENT_BOUNDS}")
        self.delta = check_probability(delta)
        if not 0.0 <= audit <= 1.0:
            raise ValueError(f"audit must be a probability in [0, 1], got {audit!r}")
        if not np.isfinite(log_new):
            raise ValueError(f"log_new must be finite, got {log_new!r}")
        cluster_schedule(10, first, fraction)  # validates first and fraction
        self.log_factor = log_factor
        self.n_items = n
        self.log_new = float(log_new)
        self.method = method
        self.bound = bound
        self.first = int(first)
        self.fraction = float(fraction)
        self.reward_range = reward_range
        self.audit = float(audit)
        self.rng = np.random.default_rng(rng)
        self.counters = GibbsCounters()
        self._schedules: dict[int, np.ndarray] = {}

        blocks = np.zeros(n, dtype=np.int64) if blocks is None else np.asarray(blocks)
        if blocks.shape != (n,) or not np.issubdtype(blocks.dtype, np.integer):
            raise ValueError(f"blocks must be {n} integers (one block id per item)")
        _, self._block = np.unique(blocks, return_inverse=True)
        self._block_items = [
            np.flatnonzero(self._block == b) for b in range(int(self._block.max()) + 1)
        ]
        if labels is None:
            labels = np.arange(n)
        labels = np.asarray(labels)
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be {n} integers (one cluster label per item)")
        _, labels = np.unique(labels, return_inverse=True)
        first_block = np.full(labels.max() + 1, -1)
        first_block[labels] = self._block
        if (first_block[labels] != self._block).any():
            raise ValueError(
                "labels put items of different blocks in one cluster; relabel them or "
                "merge the blocks"
            )
        # cluster storage: members in a buffer per cluster, swap-removal via positions
        self._labels = labels.astype(np.int64)
        self._members: dict[int, np.ndarray] = {}
        self._size: dict[int, int] = {}
        self._pos = np.zeros(n, dtype=np.int64)
        self._block_clusters: list[set[int]] = [set() for _ in self._block_items]
        for c in range(int(labels.max()) + 1):
            mem = np.flatnonzero(labels == c)
            self._members[c] = np.concatenate([mem, np.empty(max(len(mem), 4), np.int64)])
            self._size[c] = len(mem)
            self._pos[mem] = np.arange(len(mem))
            self._block_clusters[int(self._block[mem[0]])].add(c)
        self._next_id = int(labels.max()) + 1
        self._free: list[int] = []

    # ------------------------------------------------------------------ state
    @property
    def labels(self) -> np.ndarray:
        """Current cluster label of each item (a copy)."""
        return self._labels.copy()

    def cluster_sizes(self) -> np.ndarray:
        """Sizes of the current clusters."""
        return np.array([s for s in self._size.values() if s > 0], dtype=np.int64)

    def _remove(self, i: int) -> None:
        c = int(self._labels[i])
        buf = self._members[c]
        last = self._size[c] - 1
        p = self._pos[i]
        moved = buf[last]
        buf[p] = moved
        self._pos[moved] = p
        self._size[c] = last
        if last == 0:
            del self._members[c], self._size[c]
            self._block_clusters[int(self._block[i])].discard(c)
            self._free.append(c)
        self._labels[i] = -1

    def _add(self, i: int, c: int | None) -> int:
        if c is None:  # a new cluster
            c = self._free.pop() if self._free else self._next_id
            if c == self._next_id:
                self._next_id += 1
            self._members[c] = np.empty(4, dtype=np.int64)
            self._size[c] = 0
            self._block_clusters[int(self._block[i])].add(c)
        buf = self._members[c]
        k = self._size[c]
        if k == len(buf):
            buf = self._members[c] = np.concatenate([buf, np.empty(len(buf), np.int64)])
        buf[k] = i
        self._pos[i] = k
        self._size[c] = k + 1
        self._labels[i] = c
        return c

    def _candidates(self, i: int) -> list[int]:
        """Clusters of the other items of ``i``'s block, sorted (``i`` removed)."""
        return sorted(self._block_clusters[int(self._block[i])])

    # ------------------------------------------------------------- conditional
    def _exact_scores(self, i: int, cands: list[int]) -> tuple[np.ndarray, int]:
        """:math:`S_c` for each candidate and the number of factors evaluated."""
        scores = np.empty(len(cands))
        js = [self._members[c][: self._size[c]] for c in cands]
        if not js:
            return scores, 0
        lens = np.array([len(j) for j in js])
        flat = np.concatenate(js)
        w = self._call(i, flat)
        seg = np.repeat(np.arange(len(cands)), lens)
        with np.errstate(invalid="ignore"):
            scores[:] = np.bincount(
                seg, weights=np.where(np.isneginf(w), 0.0, w), minlength=len(cands)
            )
        bad = np.zeros(len(cands), dtype=bool)
        np.logical_or.at(bad, seg, np.isneginf(w))
        scores[bad] = -np.inf
        return scores, len(flat)

    def _call(self, i: int, js: np.ndarray) -> np.ndarray:
        w = np.asarray(self.log_factor(i, js), dtype=np.float64)
        if w.shape != js.shape:
            raise ValueError(
                f"log_factor(i, js) must return one value per j, shape {js.shape}, got {w.shape}"
            )
        if not math.isfinite(w.sum()) and (np.isnan(w).any() or np.isposinf(w).any()):
            raise ValueError("log_factor returned NaN or +inf; factors must be finite or -inf")
        return w

    def conditional(self, i: int, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        r"""Compute the exact conditional of item ``i`` (every factor; not counted).

        Parameters
        ----------
        i : int
            Item.
        temperature : float
            :math:`\tau > 0`.

        Returns
        -------
        labels : numpy.ndarray
            Candidate cluster labels; −1 stands for a new cluster.
        probs : numpy.ndarray
            :math:`p(y_i = c \mid y_{-i})` at temperature :math:`\tau`.
        """
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        old = int(self._labels[i])
        self._remove(i)
        try:
            cands = self._candidates(i)
            scores, _ = self._exact_scores(i, cands)
        finally:
            self._restore(i, old)
        logits = np.append(scores, self.log_new) / temperature
        p = np.exp(logits - logits.max())
        return np.array([*cands, -1]), p / p.sum()

    def _restore(self, i: int, old: int) -> None:
        if old in self._size:
            self._add(i, old)
        else:  # i was alone: its cluster id was freed; take it back
            if self._free and self._free[-1] == old:
                self._free.pop()
            self._members[old] = np.empty(4, dtype=np.int64)
            self._size[old] = 0
            self._block_clusters[int(self._block[i])].add(old)
            self._add(i, old)

    def _choose(self, i: int, cands: list[int], temperature: float) -> int:
        """Index into ``cands + [new]`` of the draw (state without ``i``)."""
        n_c = len(cands)
        sizes = np.array([self._size[c] for c in cands] + [1], dtype=np.int64)
        self.counters.exact_evaluations += int(sizes[:-1].sum())
        eps = self.rng.gumbel(size=n_c + 1) if temperature > 0 else np.zeros(n_c + 1)
        inv_t = 1.0 / temperature if temperature > 0 else 1.0
        if self.method == "exact" or n_c == 0 or self.bound == "exact":
            scores, k = self._exact_scores(i, cands)
            self.counters.factor_evaluations += k
            keys = np.append(scores, self.log_new) * inv_t + eps
            return int(np.argmax(keys))
        # Clusters of at most `first` members are exact at the first look of their arm:
        # score them in one call and let the best of them (and of the new cluster) race
        # as a single arm whose total is known (reward 0, offset = its Gumbel key).
        small = np.flatnonzero(sizes[:-1] <= self.first)
        big = np.flatnonzero(sizes[:-1] > self.first)
        if len(big) == 0:
            scores, k = self._exact_scores(i, cands)
            self.counters.factor_evaluations += k
            keys = np.append(scores, self.log_new) * inv_t + eps
            return int(np.argmax(keys))
        small_scores, k = self._exact_scores(i, [cands[c] for c in small.tolist()])
        self.counters.factor_evaluations += k
        small_keys = np.append(small_scores, self.log_new) * inv_t + eps[np.append(small, n_c)]
        best_small = int(np.argmax(small_keys))
        members = [self._members[cands[c]][: self._size[cands[c]]] for c in big.tolist()]
        n_big = len(big)
        counted = [0]

        def rewards(arm: int, idx: np.ndarray) -> np.ndarray:
            if arm == n_big:
                return np.zeros(len(idx))
            counted[0] += len(idx)
            return self._call(i, members[arm][idx]) * inv_t

        arm_sizes = np.append(sizes[big], 1)
        offsets = np.append(eps[big] / sizes[big], small_keys[best_small])
        res = race_independent(
            rewards,
            arm_sizes,
            delta=self.delta,
            bound=self.bound,
            schedules=[self._schedule(int(s)) for s in arm_sizes],
            rng=self.rng,
            reward_range=None if self.reward_range is None else self.reward_range * inv_t,
            offsets=offsets,
        )
        self.counters.factor_evaluations += counted[0]
        self.counters.races += 1
        if res.winner == n_big:
            winner = n_c if best_small == len(small) else int(small[best_small])
        else:
            winner = int(big[res.winner])
        if self.audit and self.rng.random() < self.audit:
            scores, k = self._exact_scores(i, cands)
            keys = np.append(scores, self.log_new) * inv_t + eps
            self.counters.audits += 1
            self.counters.audit_evaluations += k
            self.counters.audit_errors += int(np.argmax(keys)) != winner
        return winner

    def _schedule(self, n: int) -> np.ndarray:
        """:func:`cluster_schedule` of ``n``, cached per sampler."""
        out = self._schedules.get(n)
        if out is None:
            out = self._schedules[n] = cluster_schedule(n, self.first, self.fraction)
        return out

    def draw(self, i: int, temperature: float = 1.0) -> int:
        r"""Draw :math:`y_i` from its conditional without changing the state.

        Parameters
        ----------
        i : int
            Item.
        temperature : float
            :math:`\tau \ge 0`; 0 returns the conditional's mode.

        Returns
        -------
        int
            A current cluster label, or −1 for a new cluster.
        """
        old = int(self._labels[i])
        self._remove(i)
        try:
            cands = self._candidates(i)
            k = self._choose(i, cands, self._check_temperature(temperature))
        finally:
            self._restore(i, old)
        self.counters.updates += 1
        return cands[k] if k < len(cands) else -1

    @staticmethod
    def _check_temperature(temperature: float) -> float:
        temperature = float(temperature)
        if not temperature >= 0 or not np.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        return temperature

    def update(self, i: int, temperature: float = 1.0) -> int:
        r"""One Gibbs step: redraw :math:`y_i` from its conditional and move the item.

        Parameters
        ----------
        i : int
            Item.
        temperature : float
            :math:`\tau \ge 0`; 0 moves the item to the conditional's mode.

        Returns
        -------
        int
            The item's new cluster label.
        """
        temperature = self._check_temperature(temperature)
        self._remove(int(i))
        cands = self._candidates(int(i))
        k = self._choose(int(i), cands, temperature)
        self.counters.updates += 1
        return self._add(int(i), cands[k] if k < len(cands) else None)

    def sweep(self, temperature: float = 1.0) -> None:
        r"""Update every item once, in a random order, at temperature :math:`\tau`."""
        temperature = self._check_temperature(temperature)
        for i in self.rng.permutation(self.n_items):
            self.update(int(i), temperature)

    def run(
        self,
        temperatures: Sequence[float] | np.ndarray,
        callback: Callable[[int, PairwiseFactorGibbs], None] | None = None,
    ) -> np.ndarray:
        """Sweep once per temperature (annealed Gibbs when they decrease).

        Parameters
        ----------
        temperatures : sequence of float
            One temperature per sweep, e.g. :func:`geometric_temperatures`, or
            all ones to sample the posterior.
        callback : callable, optional
            ``callback(k, sampler)`` after sweep ``k``.

        Returns
        -------
        numpy.ndarray
            The final labels.
        """
        for k, t in enumerate(temperatures):
            self.sweep(t)
            if callback is not None:
                callback(k, self)
        return self.labels

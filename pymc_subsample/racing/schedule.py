"""Mini-batch schedules and index draws without replacement.

The race of seed 000 (Alg. 1) looks at the data at cumulative sample sizes
``T(1) < T(2) < ... < T(t*) = N``. This module builds that schedule and draws
the indices, without replacement, at a cost proportional to the batch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IndexStream", "doubling_schedule"]


def doubling_schedule(n_obs: int, batch_size: int) -> np.ndarray:
    r"""Cumulative sample sizes of the doubling schedule.

    .. math:: T^{(t)} = \min(m^{(1)} 2^{t-1}, N), \qquad t = 1, \dots, t^*,

    with :math:`t^* = \lceil \log_2 (N / m^{(1)}) \rceil + 1` (seed 000, Sec. 3.3).
    The last entry is always ``n_obs``, so a race that reaches it is exact.

    Parameters
    ----------
    n_obs : int
        Population size :math:`N`.
    batch_size : int
        First mini-batch size :math:`m^{(1)}`.

    Returns
    -------
    numpy.ndarray
        Strictly increasing int64 array of cumulative sizes ending at ``n_obs``.
    """
    sizes = []
    t = int(batch_size)
    while t < n_obs:
        sizes.append(t)
        t *= 2
    sizes.append(int(n_obs))
    return np.asarray(sizes, dtype=np.int64)


class IndexStream:
    r"""Uniformly random indices of ``range(n)`` drawn without replacement, in batches.

    Each batch is a uniformly random subset of the indices not drawn before, so
    the first ``k`` indices drawn are a uniformly random ``k``-subset. While
    fewer than half of the population has been drawn, new indices are found by
    rejection against the drawn ones,
    at a cost of :math:`O(T \log T)` for :math:`T` indices drawn so far; after
    that the remaining indices are listed once and shuffled (cost :math:`O(N)`,
    which is then proportional to the batch). A full permutation of ``range(n)``
    is never built for a short race.

    Parameters
    ----------
    n : int
        Population size.
    rng : numpy.random.Generator
        Source of randomness.

    Attributes
    ----------
    n_drawn : int
        Number of indices drawn so far.
    """

    def __init__(self, n: int, rng: np.random.Generator):
        self.n = int(n)
        self.rng = rng
        self.n_drawn = 0
        self._chunks: list[np.ndarray] = []
        self._sorted = np.empty(0, dtype=np.int64)
        self._rest: np.ndarray | None = None

    @property
    def drawn(self) -> np.ndarray:
        """All indices drawn so far, in draw order."""
        if len(self._chunks) != 1:
            self._chunks = [np.concatenate(self._chunks or [np.empty(0, dtype=np.int64)])]
        return self._chunks[0]

    def take(self, k: int) -> np.ndarray:
        """Draw ``k`` new indices, distinct from all earlier ones.

        Parameters
        ----------
        k : int
            Number of indices; at most ``n - n_drawn``.

        Returns
        -------
        numpy.ndarray
            int64 array of length ``k``.
        """
        k = int(k)
        remaining = self.n - self.n_drawn
        if k > remaining:
            raise ValueError(f"cannot draw {k} new indices: only {remaining} remain")
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        if self._rest is None and 2 * (self.n_drawn + k) > self.n:
            mask = np.ones(self.n, dtype=bool)
            mask[self.drawn] = False
            self._rest = np.flatnonzero(mask)
            self.rng.shuffle(self._rest)
        if self._rest is not None:
            new, self._rest = self._rest[:k], self._rest[k:]
        else:
            new = self._rejection(k)
            self._sorted = np.sort(np.concatenate([self._sorted, new]))
        self._chunks.append(new)
        self.n_drawn += k
        return new

    def _rejection(self, k: int) -> np.ndarray:
        """Draw ``k`` fresh indices by rejection (drawn fraction stays below 1/2).

        The distinct fresh values among i.i.d. uniform candidates form a uniformly
        random subset of the undrawn indices (given its size), and a uniformly
        random ``k``-subset of it is then a uniformly random ``k``-subset of the
        undrawn indices.
        """
        taken = self._sorted
        out: list[np.ndarray] = []
        need = k
        while need > 0:
            size = int(need * 1.25 / (1.0 - len(taken) / self.n)) + 4
            cand = np.sort((self.rng.random(size) * self.n).astype(np.int64))
            fresh = np.empty(len(cand), dtype=bool)
            fresh[0] = True
            np.not_equal(cand[1:], cand[:-1], out=fresh[1:])
            if len(taken):
                pos = taken.searchsorted(cand)
                np.minimum(pos, len(taken) - 1, out=pos)
                fresh &= taken[pos] != cand
            cand = cand[fresh]
            if len(cand) > need:
                cand = cand[self.rng.permutation(len(cand))[:need]]
            out.append(cand)
            need -= len(cand)
            if need > 0:
                taken = np.sort(np.concatenate([taken, cand]))
        return out[0] if len(out) == 1 else np.concatenate(out)

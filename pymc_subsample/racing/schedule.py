"""Mini-batch schedules and index streams without replacement.

The race of Chen & Ghahramani (2016, Alg. 1) looks at the data at cumulative sample sizes
``T(1) < T(2) < ... < T(t*) = N``. This module builds that schedule, draws
the indices without replacement at a cost proportional to the batch
(:class:`IndexStream`, through the compiled draws of
:mod:`~pymc_subsample.racing.draws`), or reads them as whole random blocks
(:class:`RandomBlocks`) or contiguous windows (:class:`CyclicWindows`) of a
randomly permuted population, and holds the policy that ends a race with one
exact pass (:class:`ExactSwitch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import check_int
from .draws import (
    STAMP_LIMIT,
    claim_bitmap,
    draw_sorted,
    expand_blocks,
    fresh_blocks,
    new_seed,
    unmark,
)

__all__ = [
    "BLOCK_ROWS",
    "MAX_BLOCK_ROWS",
    "MIN_BLOCKS",
    "CyclicWindows",
    "ExactSwitch",
    "IndexStream",
    "RandomBlocks",
    "block_rows",
    "doubling_schedule",
    "position_stream",
    "random_positions",
    "skip_taken",
]


def random_positions(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    r"""Draw a uniformly random ``k``-subset of ``range(n)``, sorted.

    For ``k <= n/2``: the distinct values among ``k`` i.i.d. uniform draws are
    a uniformly random subset (given its size); the missing ones are drawn the
    same way from the values not yet taken (:func:`skip_taken`). Cost
    :math:`O(k \log k)`. For ``k > n/2`` the ``n - k`` left out are drawn
    instead (cost :math:`O(n)`). Never shuffles all ``n``.

    Parameters
    ----------
    n, k : int
        Population and subset sizes.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    numpy.ndarray
        Sorted int64 values.
    """
    if 2 * k > n:
        keep = np.ones(n, dtype=bool)
        keep[random_positions(n, n - k, rng)] = False
        return np.flatnonzero(keep)
    out = (rng.random(k) * n).astype(np.int64)
    srt = np.sort(out)
    dup = srt[1:] == srt[:-1]
    if not dup.any():
        return srt
    uniq = srt[np.concatenate([[True], ~dup])]
    more = random_positions(n - len(uniq), k - len(uniq), rng)
    return np.sort(np.concatenate([uniq, skip_taken(more, uniq)]), kind="stable")


def skip_taken(positions: np.ndarray, taken_sorted: np.ndarray) -> np.ndarray:
    """Map positions in the complement of ``taken_sorted`` to values.

    The ``p``-th smallest value not in ``taken_sorted`` is
    ``p + #{j : taken_sorted[j] - j <= p}``.

    Parameters
    ----------
    positions : numpy.ndarray
        Positions ``p`` in ``range(n - len(taken_sorted))``.
    taken_sorted : numpy.ndarray
        Sorted distinct values already taken.

    Returns
    -------
    numpy.ndarray
        The values, none of them in ``taken_sorted``.
    """
    if len(taken_sorted) == 0:
        return positions
    gaps = taken_sorted - np.arange(len(taken_sorted))
    return positions + np.searchsorted(gaps, positions, side="right")


def doubling_schedule(n_obs: int, batch_size: int) -> np.ndarray:
    r"""Cumulative sample sizes of the doubling schedule.

    .. math:: T^{(t)} = \min(m^{(1)} 2^{t-1}, N), \qquad t = 1, \dots, t^*,

    with :math:`t^* = \lceil \log_2 (N / m^{(1)}) \rceil + 1` (Chen & Ghahramani 2016, Sec. 3.3).
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


#: Share of a population an :class:`IndexStream` with a bitmap draws by rejection (then lists).
REJECTION_SHARE = 0.75


class IndexStream:
    r"""Uniformly random indices of ``range(n)`` drawn without replacement, in batches.

    Each batch is a uniformly random subset of the indices not drawn before
    (sorted when large, which makes gathers of data rows cache-friendly), so
    the first ``k`` indices drawn are a uniformly random ``k``-subset. New
    indices are found by rejection against the drawn ones: with
    ``reuse_stamps`` and :math:`N \le` :data:`~.draws.STAMP_LIMIT` through a
    per-thread bitmap of the drawn indices, reused by every race and cleared of
    the previous race's indices when the next one starts (one compiled pass;
    at most 4 candidates per new index while up to three quarters of the
    population are drawn, :data:`REJECTION_SHARE`), otherwise, while fewer
    than half are drawn, through a sorted list of the drawn ones (cost
    :math:`O(T \log T)`); after that the remaining indices are listed once
    (cost :math:`O(N)`, then proportional to the batch). A full permutation of
    ``range(n)`` is never built.

    Parameters
    ----------
    n : int
        Population size.
    rng : numpy.random.Generator
        Source of randomness.
    reuse_stamps : bool
        Use the per-thread stamp array for this population size. At most one
        such stream per size may be drawing at a time in a thread (a race owns
        one); streams that live side by side (one per arm) must pass False.

    Attributes
    ----------
    n_drawn : int
        Number of indices drawn so far.
    """

    def __init__(self, n: int, rng: np.random.Generator, reuse_stamps: bool = False):
        self.n = int(n)
        self.rng = rng
        self.n_drawn = 0
        self._chunks: list[np.ndarray] = []
        self._sorted = np.empty(0, dtype=np.int64)
        self._rest: np.ndarray | None = None
        use = reuse_stamps and self.n <= STAMP_LIMIT
        self._entry = claim_bitmap(self.n, self) if use else None
        self._seed = None

    @property
    def drawn(self) -> np.ndarray:
        """All indices drawn so far, in draw order."""
        if len(self._chunks) != 1:
            self._chunks = [np.concatenate(self._chunks or [np.empty(0, dtype=np.int64)])]
        return self._chunks[0]

    def new_seed(self) -> np.ndarray:
        """Return a fresh SplitMix64 state for this stream (:func:`~.draws.new_seed`)."""
        return new_seed(self.rng)

    def release(self, bits: np.ndarray) -> None:
        """Unmark this stream's draws in the bitmap ``bits`` (its next owner clears it so)."""
        for chunk in self._chunks:
            unmark(bits, chunk)

    def take_blocks(self, k: int, block: int, n_rows: int) -> np.ndarray | None:
        """Draw ``k`` new indices as blocks of ``block`` rows and expand them, in one call.

        The common case of :meth:`RandomBlocks.take`: while the stream draws
        through its bitmap (below :data:`REJECTION_SHARE` of its population),
        the ``k`` fresh block ids are drawn as :meth:`take` draws them and
        returned as the positions of their rows (``n_rows`` in all, the last
        block cut there). Returns None, having drawn nothing, past that regime.
        """
        if (
            self._entry is None
            or self._rest is not None
            or self.n_drawn + k > REJECTION_SHARE * self.n
        ):
            return None
        if self._seed is None:
            self._seed = self.new_seed()
        out = fresh_blocks(self._entry[0], self.n, k, self._seed, block, n_rows)
        self._chunks.append(out[-k:])
        self.n_drawn += k
        return out[:-k]

    def _stamped(self, k: int) -> np.ndarray:
        """Draw ``k`` fresh indices by rejection against the bitmap of drawn ones.

        One compiled call (:func:`~pymc_subsample.racing.draws.draw_fresh`),
        seeded once per stream from ``rng``: the first ``k`` new distinct
        candidates are kept, a uniformly random ``k``-subset of the indices
        not drawn before.
        """
        if self._seed is None:  # one seed per stream; later draws continue its sequence
            self._seed = self.new_seed()
        return draw_sorted(self._entry[0], self.n, k, self._seed)

    def take(self, k: int) -> np.ndarray:
        """Draw ``k`` new indices, distinct from all earlier ones.

        Parameters
        ----------
        k : int
            Number of indices; at most ``n - n_drawn``.

        Returns
        -------
        numpy.ndarray
            int64 array of length ``k`` (in increasing order, or nearly so,
            when ``k > 512``).
        """
        k = int(k)
        remaining = self.n - self.n_drawn
        if k > remaining:
            raise ValueError(f"cannot draw {k} new indices: only {remaining} remain")
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        share = REJECTION_SHARE if self._entry is not None else 0.5
        if self._rest is None and self.n_drawn + k > share * self.n:
            mask = np.ones(self.n, dtype=bool)
            mask[self.drawn] = False
            self._rest = np.flatnonzero(mask)
        if self._rest is not None:
            rest = self._rest
            if k == len(rest):
                new, self._rest = rest, rest[:0]
            else:
                chosen = np.zeros(len(rest), dtype=bool)
                chosen[random_positions(len(rest), k, self.rng)] = True
                new, self._rest = rest[chosen], rest[~chosen]
        elif self._entry is not None:
            new = self._stamped(k)
        else:
            new = skip_taken(random_positions(remaining, k, self.rng), self._sorted)
            self._sorted = np.sort(np.concatenate([self._sorted, new]), kind="stable")
        self._chunks.append(new)
        self.n_drawn += k
        return new


class CyclicWindows:
    r"""Consecutive windows of positions ``start, start+1, ...`` of ``range(n)``, cyclically.

    When the population is stored in a uniformly random order (a row
    permutation :math:`\pi` of the data), the first :math:`T` positions read
    from a uniformly random ``start`` are a uniformly random :math:`T`-subset
    drawn without replacement, nested across looks, as a race needs; and each
    window is a contiguous slice of the permuted data, read without a gather.
    A window that wraps around the end is returned as an index array.

    Parameters
    ----------
    n : int
        Population size.
    start : int
        First position, in ``range(n)``.

    Attributes
    ----------
    n_drawn : int
        Number of positions read so far.
    """

    def __init__(self, n: int, start: int):
        self.n = int(n)
        self.start = int(start) % self.n
        self.n_drawn = 0

    def take(self, k: int) -> slice | np.ndarray:
        """Read the next ``k`` positions: a ``slice``, or an int64 array across the end."""
        k = int(k)
        if k > self.n - self.n_drawn:
            raise ValueError(f"cannot read {k} new positions: only {self.n - self.n_drawn} remain")
        lo = self.start + self.n_drawn
        if lo >= self.n:
            lo -= self.n
        self.n_drawn += k
        hi = lo + k
        if hi <= self.n:
            return slice(lo, hi)
        return np.concatenate([np.arange(lo, self.n), np.arange(0, hi - self.n)])


#: Fewest rows per block of :class:`RandomBlocks` (two cache lines of float64).
BLOCK_ROWS = 16
#: Most rows per block (:func:`block_rows`).
MAX_BLOCK_ROWS = 128
#: Blocks grow with :math:`N` only while at least this many remain (:func:`block_rows`).
MIN_BLOCKS = 2**13


def block_rows(n: int) -> int:
    r"""Rows per block of :class:`RandomBlocks` for a population of ``n``.

    The largest :math:`b = 16 \cdot 2^k \le 128` with at least
    :data:`MIN_BLOCKS` = 8192 blocks (:math:`n / b \ge 8192`), else 16: 16
    below :math:`N = 2^{18} \approx 2.6 \cdot 10^5`, 64 at :math:`10^6`,
    128 from :math:`2^{20} \approx 1.05 \cdot 10^6`. A block of fresh rows
    costs a cache and a TLB miss wherever it lies in a large array, so
    longer runs make a gather cheaper per row
    (:doc:`racing explanation </explanation/racing>`), while a race still
    draws among thousands of blocks: the dependence between races that
    share a permutation grows as the blocks get fewer (the permutation-reuse
    study in :doc:`/results/index` measures it).
    """
    b = BLOCK_ROWS
    while 2 * b <= MAX_BLOCK_ROWS and n >= 2 * b * MIN_BLOCKS:
        b *= 2
    return b


class RandomBlocks:
    r"""Positions of ``range(n)`` read as whole blocks, the blocks drawn without replacement.

    Positions are cut into consecutive blocks of ``b`` (the last one shorter
    when ``b`` does not divide ``n``); each :meth:`take` draws uniformly
    random new blocks (an :class:`IndexStream` over the blocks) until it holds
    at least ``k`` new positions, and returns them block after block (the
    blocks nearly in increasing order when there are more than 512). When the
    population is stored in a uniformly random order (a row permutation
    :math:`\pi` of the data, as for :class:`CyclicWindows`), the positions
    read so far are a uniformly random subset drawn without replacement,
    nested across looks; a gather of
    whole blocks reads memory in runs of ``b`` rows, far cheaper than rows
    scattered at random. Unlike windows, two races that share :math:`\pi`
    read nearly independent samples: a race draws its blocks afresh among
    :math:`n/b` of them.

    Parameters
    ----------
    n : int
        Population size.
    rng : numpy.random.Generator
        Source of the block draws.
    block : int
        Positions per block, ``b``.

    Attributes
    ----------
    n_drawn : int
        Number of positions read so far.
    """

    def __init__(self, n: int, rng: np.random.Generator, block: int = BLOCK_ROWS):
        self.n = int(n)
        self.block = int(block)
        self.n_blocks = -(-self.n // self.block)
        self._blocks = IndexStream(self.n_blocks, rng, reuse_stamps=True)
        self.n_drawn = 0

    def take(self, k: int) -> np.ndarray:
        """Read at least ``k`` new positions (whole blocks; fewer only when none remain).

        Returns
        -------
        numpy.ndarray
            int64 positions, at most ``k + b - 1`` of them.
        """
        k = int(k)
        if k > self.n - self.n_drawn:
            raise ValueError(f"cannot read {k} new positions: only {self.n - self.n_drawn} remain")
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        b = self.block
        want = -(-k // b)
        pos = self._blocks.take_blocks(want, b, self.n)  # the common case: one compiled call
        if pos is not None:
            if len(pos) >= k:
                self.n_drawn += len(pos)
                return pos
            parts, got = [pos], len(pos)
        else:
            parts, got = [], 0
        while got < k:
            left = self.n_blocks - self._blocks.n_drawn
            ids = self._blocks.take(min(max(-(-(k - got) // b), 1), left))
            pos = expand_blocks(ids, b, self.n)
            parts.append(pos)
            got += len(pos)
        self.n_drawn += got
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def position_stream(batches: str, n: int, rng: np.random.Generator):
    """Open the stream of positions one race reads, for a batch layout.

    Parameters
    ----------
    batches : {"blocks", "random", "windows"}
        The layout (``RaceConfig.batches``).
    n : int
        Population size.
    rng : numpy.random.Generator
        Source of the draws (or of the window's start).

    Returns
    -------
    RandomBlocks or IndexStream or CyclicWindows
        An object whose ``take(k)`` gives the next positions.
    """
    if batches == "windows":
        return CyclicWindows(n, int(rng.integers(n)))
    if batches == "blocks":
        return RandomBlocks(n, rng, block_rows(n))
    return IndexStream(n, rng, reuse_stamps=True)


@dataclass(frozen=True)
class ExactSwitch:
    """When a race stops subsampling and decides with one exact pass over all observations.

    A race draws growing batches on its schedule as long as the cumulative
    sample size stays at or below ``after``; its next look evaluates the
    surviving arms on all :math:`N` observations at once (through a fused
    ``totals`` callback when one is given), which is exact. Build it with
    :meth:`never`, :meth:`at_once` or :meth:`after_size`.

    Attributes
    ----------
    after : int or None
        Largest cumulative sample size raced on subsets; None races the whole
        schedule; 0 decides exactly at once.
    """

    after: int | None = None

    @classmethod
    def never(cls) -> ExactSwitch:
        """Race on the whole schedule, as in the paper."""
        return cls(None)

    @classmethod
    def at_once(cls) -> ExactSwitch:
        """Decide every race exactly, with no subsampled look."""
        return cls(0)

    @classmethod
    def after_size(cls, size: int) -> ExactSwitch:
        """Race while at most ``size`` observations have been drawn, then decide exactly."""
        return cls(check_int("size", size, low=0, example=1000))

    @property
    def decides_at_once(self) -> bool:
        """True when no look is subsampled."""
        return self.after == 0

    def truncate(self, looks: np.ndarray, n_obs: int) -> np.ndarray:
        """Drop the looks at or beyond the switch and ``n_obs``, then append ``n_obs``."""
        looks = looks[looks < n_obs]
        if self.after is not None:
            looks = looks[looks <= self.after]
        return np.append(looks, n_obs).astype(np.int64)

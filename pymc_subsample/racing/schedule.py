"""Mini-batch schedules and index draws without replacement.

The race of Chen & Ghahramani (2016, Alg. 1) looks at the data at cumulative sample sizes
``T(1) < T(2) < ... < T(t*) = N``. This module builds that schedule, draws
the indices without replacement at a cost proportional to the batch
(:class:`IndexStream`), or reads them as contiguous windows of a randomly
permuted population (:class:`CyclicWindows`), and holds the policy that ends a
race with one exact pass (:class:`ExactSwitch`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .._numba_cache import njit_cached
from ..validation import check_int

__all__ = [
    "claim_bitmap",
    "new_seed",
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

#: Populations up to this size get a reusable per-thread bitmap of drawn indices (N/8 bytes).
STAMP_LIMIT = 1 << 31
_local = threading.local()


@njit_cached()
def _draw_fresh(bits, n, k, state):  # pragma: no cover - compiled
    r"""Draw ``k`` values of ``range(n)`` not marked in ``bits``, uniformly, and mark them.

    Rejection sampling on uniform candidates from a SplitMix64 stream started
    at ``state[0]`` (a candidate is :math:`\lfloor n u \rfloor`, :math:`u` on 53
    bits): the first ``k`` new distinct values, in draw order, are a
    uniformly random ``k``-subset of the unmarked ones. ``state`` (one
    uint64) is advanced in place, so that the next draw of the same race
    continues the sequence.
    """
    out = np.empty(k, dtype=np.int64)
    x = state[0]
    scale = float(n) / 9007199254740992.0  # n / 2**53
    got = 0
    while got < k:
        x += np.uint64(0x9E3779B97F4A7C15)
        z = x
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        c = min(np.int64(float(z >> np.uint64(11)) * scale), n - 1)
        word = c >> 3
        bit = np.uint8(1 << (c & 7))
        if bits[word] & bit == 0:
            bits[word] |= bit
            out[got] = c
            got += 1
    state[0] = x
    return out


@njit_cached()
def _bucket_sorted(idx, n):  # pragma: no cover - compiled
    """Return ``idx`` ordered by its high bits (a counting sort on about ``len(idx)`` buckets).

    Nearly sorted in linear time: a gather in this order reads the rows
    front to back, which is what sorting buys.
    """
    k = len(idx)
    shift = 0
    while (n >> shift) > k:
        shift += 1
    nb = (n >> shift) + 1
    counts = np.zeros(nb + 1, dtype=np.int64)
    for c in idx:
        counts[(c >> shift) + 1] += 1
    for b in range(nb):
        counts[b + 1] += counts[b]
    out = np.empty(k, dtype=np.int64)
    for c in idx:
        b = c >> shift
        out[counts[b]] = c
        counts[b] += 1
    return out


@njit_cached()
def _draw_sorted(bits, n, k, state):  # pragma: no cover - compiled
    """:func:`_draw_fresh`, then bucket-sorted (:func:`_bucket_sorted`) above 512 values."""
    ids = _draw_fresh(bits, n, k, state)
    if k > 512:
        ids = _bucket_sorted(ids, n)
    return ids


@njit_cached()
def _expand_blocks(ids, block, n):  # pragma: no cover - compiled
    """Positions of blocks ``ids``, block after block, the last block cut at ``n``."""
    out = np.empty(len(ids) * block, dtype=np.int64)
    return out[: _write_blocks(ids, block, n, out)]


@njit_cached()
def _write_blocks(ids, block, n, out):  # pragma: no cover - compiled
    """Write the positions of blocks ``ids`` (as :func:`_expand_blocks`) into ``out``; count."""
    j = 0
    for i in ids:
        for p in range(i * block, min(i * block + block, n)):
            out[j] = p
            j += 1
    return j


@njit_cached()
def _gather_blocks(data, ids, block, n):  # pragma: no cover - compiled
    """Rows of ``data`` in blocks ``ids``, block after block, the last block cut at ``n``.

    The same rows as ``data[_expand_blocks(ids, block, n)]``, copied block by
    block from the C-contiguous ``data`` (about twice as fast).
    """
    total = 0
    for i in ids:
        total += min(block, n - i * block)
    flat = data.reshape(-1)
    width = flat.size // n if n > 0 else 1
    out = np.empty(total * width, dtype=data.dtype)
    j = 0
    for i in ids:
        stop = min(i * block + block, n) * width
        for p in range(i * block * width, stop):
            out[j] = flat[p]
            j += 1
    return out.reshape((total,) + data.shape[1:])


@njit_cached()
def _fresh_blocks(bits, n_blocks, k, state, block, n):  # pragma: no cover - compiled
    """Draw ``k`` unmarked blocks (:func:`_draw_fresh`, bucket-sorted above 512) and expand them.

    One compiled call for what :class:`IndexStream` and :class:`RandomBlocks`
    do in three; returns one array, the positions and then the ``k`` block
    ids (one array boxed for Python instead of two).
    """
    ids = _draw_sorted(bits, n_blocks, k, state)
    out = np.empty(k * block + k, dtype=np.int64)
    j = _write_blocks(ids, block, n, out)
    out[j : j + k] = ids
    return out[: j + k]


@njit_cached()
def _unmark(bits, idx):  # pragma: no cover - compiled
    for c in idx:
        bits[c >> 3] &= np.uint8(255 - (1 << (c & 7)))


def _bitmap_entry(n: int) -> list:
    """Per-thread ``[bits, last stream]`` for a population of size ``n``."""
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    entry = pool.get(n)
    if entry is None:
        if sum(len(e[0]) for e in pool.values()) + n // 8 > STAMP_LIMIT // 4:
            pool.clear()
        entry = pool[n] = [np.zeros(n // 8 + 1, dtype=np.uint8), None]
    return entry


def claim_bitmap(n: int, owner=None) -> list:
    """Return the per-thread bitmap entry of size ``n``, cleared of its last owner's draws.

    The previous owner (an :class:`IndexStream`) is the last stream that drew
    from it; ``owner`` becomes the new one (None: a caller that unmarks its own
    draws when done, as a compiled race does).
    """
    entry = _bitmap_entry(n)
    bits, previous = entry
    if previous is not None:
        for chunk in previous._chunks:
            _unmark(bits, chunk)
    entry[1] = owner
    return entry


def new_seed(rng: np.random.Generator) -> np.ndarray:
    """Return a fresh SplitMix64 state: 64 raw bits of ``rng`` (cheaper than ``integers``)."""
    return np.array([rng.bit_generator.random_raw()], dtype=np.uint64)


class IndexStream:
    r"""Uniformly random indices of ``range(n)`` drawn without replacement, in batches.

    Each batch is a uniformly random subset of the indices not drawn before
    (sorted when large, which makes gathers of data rows cache-friendly), so
    the first ``k`` indices drawn are a uniformly random ``k``-subset. New
    indices are found by rejection against the drawn ones: with
    ``reuse_stamps`` and :math:`N \le` :data:`STAMP_LIMIT` through a
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
        """Return a fresh SplitMix64 state for this stream (:func:`new_seed`)."""
        return new_seed(self.rng)

    def _stamped(self, k: int) -> np.ndarray:
        """Draw ``k`` fresh indices by rejection against the bitmap of drawn ones.

        One compiled call (:func:`_draw_fresh`), seeded once per stream from ``rng``: the
        first ``k`` new distinct candidates are kept, a uniformly random
        ``k``-subset of the indices not drawn before.
        """
        if self._seed is None:  # one seed per stream; later draws continue its sequence
            self._seed = self.new_seed()
        return _draw_sorted(self._entry[0], self.n, k, self._seed)

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
    longer runs make a gather cheaper per row (6,400 rows out of
    :math:`10^6`, cold: about 50-90 µs in blocks of 16, 20-37 µs in blocks
    of 64-128), while a race still draws among thousands of blocks: the
    dependence between races that share a permutation grows as the blocks
    get fewer, and the permutation-reuse study measures it down to 78.
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
        blocks = self._blocks
        want = -(-k // b)
        if (
            blocks._entry is not None
            and blocks._rest is None
            and blocks.n_drawn + want <= REJECTION_SHARE * blocks.n
        ):  # the common case: one compiled call
            if blocks._seed is None:
                blocks._seed = blocks.new_seed()
            out = _fresh_blocks(blocks._entry[0], blocks.n, want, blocks._seed, b, self.n)
            pos = out[:-want]
            blocks._chunks.append(out[-want:])
            blocks.n_drawn += want
            if len(pos) >= k:
                self.n_drawn += len(pos)
                return pos
            parts, got = [pos], len(pos)
        else:
            parts, got = [], 0
        while got < k:
            left = self.n_blocks - self._blocks.n_drawn
            ids = self._blocks.take(min(max(-(-(k - got) // b), 1), left))
            pos = _expand_blocks(ids, b, self.n)
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

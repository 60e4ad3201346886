r"""Compiled draws without replacement: a per-thread bitmap, SplitMix64 candidates, blocks.

The index streams of :mod:`~pymc_subsample.racing.schedule` and the compiled
race (:mod:`~pymc_subsample.racing.compiled`) draw fresh indices by rejection
against a bitmap of the indices drawn so far, reused by every race of a
thread and cleared of the previous race's draws when the next one starts
(:func:`claim_bitmap`); candidates come from a SplitMix64 stream seeded from
the caller's generator (:func:`new_seed`). Whole blocks of consecutive
positions are drawn the same way, then expanded (:func:`expand_blocks`) or
their rows copied (:func:`gather_blocks`).
"""

from __future__ import annotations

import threading

import numpy as np

from .._numba_cache import njit_cached

__all__ = [
    "STAMP_LIMIT",
    "bucket_sorted",
    "claim_bitmap",
    "draw_fresh",
    "draw_sorted",
    "expand_blocks",
    "fresh_blocks",
    "gather_blocks",
    "new_seed",
    "unmark",
    "write_blocks",
]

#: Populations up to this size get a reusable per-thread bitmap of drawn indices (N/8 bytes).
STAMP_LIMIT = 1 << 31
_local = threading.local()


@njit_cached()
def draw_fresh(bits, n, k, state):  # pragma: no cover - compiled
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
def bucket_sorted(idx, n):  # pragma: no cover - compiled
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
def draw_sorted(bits, n, k, state):  # pragma: no cover - compiled
    """:func:`draw_fresh`, then bucket-sorted (:func:`bucket_sorted`) above 512 values."""
    ids = draw_fresh(bits, n, k, state)
    if k > 512:
        ids = bucket_sorted(ids, n)
    return ids


@njit_cached()
def expand_blocks(ids, block, n):  # pragma: no cover - compiled
    """Positions of blocks ``ids``, block after block, the last block cut at ``n``."""
    out = np.empty(len(ids) * block, dtype=np.int64)
    return out[: write_blocks(ids, block, n, out)]


@njit_cached()
def write_blocks(ids, block, n, out):  # pragma: no cover - compiled
    """Write the positions of blocks ``ids`` (as :func:`expand_blocks`) into ``out``; count."""
    j = 0
    for i in ids:
        for p in range(i * block, min(i * block + block, n)):
            out[j] = p
            j += 1
    return j


@njit_cached()
def gather_blocks(data, ids, block, n):  # pragma: no cover - compiled
    """Rows of ``data`` in blocks ``ids``, block after block, the last block cut at ``n``.

    The same rows as ``data[expand_blocks(ids, block, n)]``, copied block by
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
def fresh_blocks(bits, n_blocks, k, state, block, n):  # pragma: no cover - compiled
    """Draw ``k`` unmarked blocks (:func:`draw_fresh`, bucket-sorted above 512) and expand them.

    One compiled call for what :class:`~.schedule.IndexStream` and
    :class:`~.schedule.RandomBlocks` do in three; returns one array, the
    positions and then the ``k`` block ids (one array boxed for Python
    instead of two).
    """
    ids = draw_sorted(bits, n_blocks, k, state)
    out = np.empty(k * block + k, dtype=np.int64)
    j = write_blocks(ids, block, n, out)
    out[j : j + k] = ids
    return out[: j + k]


@njit_cached()
def unmark(bits, idx):  # pragma: no cover - compiled
    """Clear the bits of indices ``idx`` in the bitmap ``bits`` (a race's draws, when done)."""
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

    The previous owner (an :class:`~pymc_subsample.racing.schedule.IndexStream`,
    or any object with a ``release(bits)`` method that unmarks its draws) is the
    last stream that drew from it; ``owner`` becomes the new one (None: a
    caller that unmarks its own draws when done, as a compiled race does).
    """
    entry = _bitmap_entry(n)
    bits, previous = entry
    if previous is not None:
        previous.release(bits)
    entry[1] = owner
    return entry


def new_seed(rng: np.random.Generator) -> np.ndarray:
    """Return a fresh SplitMix64 state: 64 raw bits of ``rng`` (cheaper than ``integers``)."""
    return np.array([rng.bit_generator.random_raw()], dtype=np.uint64)

r"""Sums of per-observation terms over every row, a cache-sized chunk of rows at a time.

A fused pass :math:`s_k = \sum_{n=1}^N \log f_n(\theta_k)` compiled as one
reduction over a ``(K, N)`` iteration space loops over the candidates
outside and the rows inside: it reads the data :math:`K` times. When the
data do not stay in cache between those reads (a race's exact pass over a
few surviving candidates, in a sampler whose other steps touch other
memory), each read comes from main memory. :class:`ChunkedSum` calls the same compiled reduction on
consecutive chunks of about :data:`CHUNK_BYTES` of rows from one compiled loop,
so that the data are read from memory once and the :math:`K` passes over a
chunk find it in cache (measured in the
:doc:`Gibbs results </results/gibbs>`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from numba import njit

__all__ = ["CHUNK_BYTES", "LOOP_SECONDS", "ChunkedSum"]

#: Bytes of data rows a chunk holds (every per-observation input together): small
#: enough to stay in a core's cache while each candidate reads it.
CHUNK_BYTES = 2**17
#: Seconds of one-call sums after which the chunk loop is compiled (a Numba function
#: generated for each model's kernel, compiled anew in every process): the first draws
#: do not wait for it.
LOOP_SECONDS = 0.5

_TEMPLATE = """
def driver({args}, chunk):
    n = len(d0)
    total = np.zeros(len(c0))
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        total += fn({call})[0]
    return total
"""


class ChunkedSum:
    r"""Row sums of a compiled function of data rows, evaluated chunk by chunk.

    ``fn(*candidates, *rows, *others)`` returns a tuple whose first element
    is :math:`(\sum_{n \in \text{rows}} \log f_n(\theta_k))_k`, shape ``(K,)``;
    calling this object on every row returns the same sums over all rows,
    computed on chunks of about :data:`CHUNK_BYTES` (one compiled loop)
    and added. Only the rounding differs from one call on every row. The
    loop is compiled once one-call sums of more than four chunks of rows have
    cost :data:`LOOP_SECONDS` (compiling it takes about 0.4 s); smaller
    populations, or a function not compiled by Numba, are summed in one call.

    Parameters
    ----------
    fn : callable
        The compiled function (a PyTensor function).
    n_cands, n_rows, n_others : int
        Number of candidate, data-row and other inputs of ``fn``, in that
        order.
    """

    def __init__(self, fn, n_cands: int, n_rows: int, n_others: int):
        self.fn = fn
        self._shape = (n_cands, n_rows, n_others)
        self._chunk = None  # rows per chunk, set at the first call
        self._driver = None
        self._unchunked_seconds = 0.0  # one-call sums of a population the loop would chunk

    def chunk_rows(self, rows: Sequence[np.ndarray]) -> int:
        """Rows in a chunk of :data:`CHUNK_BYTES` of ``rows`` (at least 1,024)."""
        row_bytes = sum(r.itemsize * int(np.prod(r.shape[1:])) for r in rows)
        return max(1024, CHUNK_BYTES // max(row_bytes, 1))

    def promote(self) -> None:
        """Compile the chunk loop at the next call on a large population, paid for or not."""
        self._unchunked_seconds = max(self._unchunked_seconds, LOOP_SECONDS)

    def reset(self) -> None:
        """Set the chunk length again at the next call (new rows: another population).

        A compiled loop is kept: it sums any number of rows.
        """
        self._chunk = None

    def __call__(
        self, cands: Sequence[np.ndarray], rows: Sequence[np.ndarray], others: Sequence
    ) -> np.ndarray:
        """Return the sums over every row of ``rows`` (C-contiguous, rows first), ``(K,)``.

        ``rows`` have the same shapes at every call (the population): the
        chunk length, and whether to loop, are set at the first call (computing the
        chunk length costs a fair share of a small sum).
        """
        if self._chunk is None:
            self._chunk = self.chunk_rows(rows)
        large = len(rows[0]) > 4 * self._chunk
        if self._driver is None and large:
            # a function compiled by Numba (a tiered one once it has moved) gets its loop,
            # once its one-call sums have cost LOOP_SECONDS (or this process holds the loop)
            jit_fn = getattr(getattr(self.fn, "vm", None), "jit_fn", None)
            if jit_fn is not None and (
                self._unchunked_seconds >= LOOP_SECONDS or _held(jit_fn, self._shape)
            ):
                self._driver = _driver(jit_fn, *self._shape)
        if self._driver is None:  # one call: a small population, or not compiled (yet)
            start = time.perf_counter()
            out = np.asarray(self.fn(*cands, *rows, *others), dtype=np.float64)
            if large:
                self._unchunked_seconds += time.perf_counter() - start
            return out
        return self._driver(*cands, *rows, *others, self._chunk)


#: Chunk loops compiled lately, by their function and its numbers of inputs: steps that
#: share a compiled function (:mod:`~pymc_subsample.model.function_cache`) share its loop.
_DRIVERS: OrderedDict = OrderedDict()
_RECENT_DRIVERS = 16


def _held(fn, shape: tuple) -> bool:
    """Return True when the chunk loop of ``fn`` for ``shape`` is compiled in this process."""
    found = _DRIVERS.get((id(fn), *shape))
    return found is not None and found[0] is fn and bool(found[1].signatures)


def _driver(fn, n_cands: int, n_rows: int, n_others: int):
    """Return the chunk loop of ``fn``, compiled once (kept with ``fn``, for the recent ones)."""
    key = (id(fn), n_cands, n_rows, n_others)
    found = _DRIVERS.get(key)
    if found is not None and found[0] is fn:
        _DRIVERS.move_to_end(key)
        return found[1]
    driver = _compile_driver(fn, n_cands, n_rows, n_others)
    _DRIVERS[key] = (fn, driver)  # fn held: its id is not reused while the entry lives
    while len(_DRIVERS) > _RECENT_DRIVERS:
        _DRIVERS.popitem(last=False)
    return driver


def _compile_driver(fn, n_cands: int, n_rows: int, n_others: int):
    """Compile the chunk loop of ``fn`` (bound in as a global: typed once, not at each call)."""
    cands = [f"c{i}" for i in range(n_cands)]
    rows = [f"d{i}" for i in range(n_rows)]
    others = [f"o{i}" for i in range(n_others)]
    source = _TEMPLATE.format(
        args=", ".join(cands + rows + others),
        call=", ".join(cands + [f"{r}[start:stop]" for r in rows] + others),
    )
    namespace = {"fn": fn, "np": np}
    exec(compile(source, "<chunked sum driver>", "exec"), namespace)  # noqa: S102
    return njit(namespace["driver"])

r"""Passes over every row of out-of-core inputs, as Dask computations over their chunks.

The sums over all :math:`N` rows (exact decisions, control variates' sums,
audits) and the data checks run on a ``dask.distributed`` cluster: the
cluster of a ``Client`` the user passes (:func:`use_client`), the default
client when one exists, else a ``LocalCluster`` started here once per
process. Each task reads one chunk of rows of every input (aligned: the inputs
of one likelihood share their row chunks), evaluates a compiled function on
it and returns a small result; the client adds the results.

:func:`scan` checks every chunk for missing values and records a CRC-32 of
its bytes; the passes recompute it on every chunk they read
(:func:`row_sums`), so that a source changed after the step was built is
refused (:class:`DataChangedError`) rather than summed.
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "DataChangedError",
    "PassFunction",
    "ScanResult",
    "WindowFunction",
    "client",
    "row_sums",
    "scan",
    "use_client",
]

#: The client given by :func:`use_client`, or started by :func:`client`.
_CLIENT = None
#: A cluster started here (closed with its client).
_CLUSTER = None
#: Compiled functions of this process, by token (workers in other processes compile their own),
#: each behind the lock of its function object.
_FUNCTIONS: dict[str, Callable] = {}
#: One lock per compiled function object (by id): a function shared by several passes
#: (:func:`~pymc_subsample.model.function_cache.compile_cached`) is called by one thread at a time.
_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock_of(fn: Callable) -> threading.Lock:
    """Return the lock of the function object ``fn`` (made on first use)."""
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(id(fn), threading.Lock())


class _Locked:
    """A compiled function called under its lock (a worker thread of this or another process)."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._lock = _lock_of(fn)

    def __call__(self, *args):
        with self._lock:
            return self.fn(*args)


#: Passes over at least this many chunks show a progress bar (when asked).
PROGRESS_CHUNKS = 64


class DataChangedError(ValueError):
    """Out-of-core rows differ from those checked when the step was built."""


def use_client(dask_client) -> None:
    """Run the passes on the cluster of ``dask_client`` (a ``distributed.Client``); None resets."""
    global _CLIENT
    if dask_client is not None:
        from distributed import Client

        if not isinstance(dask_client, Client):
            raise TypeError(f"client must be a distributed.Client, got {type(dask_client)}")
    _CLIENT = dask_client


def client():
    """Return the client the passes run on: the one given, the default one, or a new one.

    The new one runs a ``LocalCluster`` of one single-threaded worker process
    per core (at most four), started once per process.
    """
    global _CLIENT, _CLUSTER
    if _CLIENT is not None and _CLIENT.status not in ("closed", "closing"):
        return _CLIENT
    from distributed import Client, LocalCluster, default_client

    try:
        _CLIENT = default_client()
        return _CLIENT
    except ValueError:  # no client yet
        pass
    workers = max(1, min(4, os.cpu_count() or 1))
    _CLUSTER = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True)
    _CLIENT = Client(_CLUSTER)
    return _CLIENT


class WindowFunction:
    """A function of ``(*heads, start, stop, *rows, *others)`` called on every row given.

    Adapts a function of windows of whole arrays (the expansions' sums) to a
    pass, which gives each call one chunk's rows: ``start, stop = 0, len``.

    Parameters
    ----------
    fn : PassFunction
        The window function.
    n_heads : int
        Number of its inputs before ``start``.
    n_rows : int
        Number of row inputs.
    """

    def __init__(self, fn, n_heads: int, n_rows: int):
        self.fn = fn
        self.n_heads = n_heads
        self.n_rows = n_rows

    def __call__(self, *args):
        """Call the window function on every row given (``start, stop = 0, len``)."""
        heads, rest = args[: self.n_heads], args[self.n_heads :]
        rows, others = rest[: self.n_rows], rest[self.n_rows :]
        bounds = (np.asarray(0, dtype=np.int64), np.asarray(len(rows[0]), dtype=np.int64))
        return self.fn(*heads, *bounds, *rows, *others)


class PassFunction:
    """A compiled function sent to Dask workers as its graph, compiled once in each process.

    Parameters
    ----------
    fn : callable
        The function compiled in this process.
    outputs, inputs : PyTensor variables
        Its graph (compiled again in a worker process that lacks it).
    compile_kwargs : dict
        Passed to ``pymc.pytensorf.compile`` there.
    """

    def __init__(self, fn: Callable, outputs, inputs: Sequence, compile_kwargs: dict):
        promote = getattr(fn, "promote", None)
        if promote is not None:  # a pass reads every row: its final (compiled) tier at once
            promote()
        self.token = os.urandom(8).hex()
        self.fn = fn
        self._graph = (outputs, list(inputs), dict(compile_kwargs))
        # a compiled function keeps its inputs and outputs in storage of its own: the threads
        # of a worker (a cluster with processes=False, or threads_per_worker > 1) call it in
        # turn, through every PassFunction that wraps it and every copy unpickled by a task
        self._lock = _lock_of(fn)
        _FUNCTIONS[self.token] = self

    def __reduce__(self):
        return _restore, (self.token, self._graph)

    def __call__(self, *args):
        """Call the compiled function (one thread at a time)."""
        with self._lock:
            return self.fn(*args)


def _restore(token: str, graph) -> Callable:
    """Return the function of ``token``: this process's, or compiled from ``graph`` once."""
    fn = _FUNCTIONS.get(token)
    if fn is None:
        from pymc.pytensorf import compile as compile_fn

        with _lock_of(_FUNCTIONS):  # one compile when a worker's threads unpickle it at once
            fn = _FUNCTIONS.get(token)
            if fn is None:
                outputs, inputs, kwargs = graph
                fn = _FUNCTIONS[token] = _Locked(compile_fn(inputs, outputs, **kwargs))
    return fn


def _chunk_crc(block: np.ndarray) -> int:
    """CRC-32 of a chunk's bytes (C order)."""
    return zlib.crc32(memoryview(np.ascontiguousarray(block)).cast("B"))


def _scan_chunk(*blocks) -> tuple[list[bool], list[int]]:
    """Return, per input, whether the chunk holds a NaN, and its CRC-32."""
    nans = [bool(b.dtype.kind in "fc" and np.isnan(b).any()) for b in blocks]
    return nans, [_chunk_crc(b) for b in blocks]


class ScanResult:
    """What :func:`scan` found: per chunk and input, NaN and CRC-32; the data's fingerprint.

    Attributes
    ----------
    crcs : numpy.ndarray
        ``(n_chunks, n_inputs)`` CRC-32 of each chunk of each input.
    nan_chunks : list of tuple
        ``(chunk, input)`` of the chunks holding a NaN.
    fingerprint : str
        A digest of the inputs' dtypes, shapes, chunks and contents.
    """

    def __init__(self, crcs: np.ndarray, nan_chunks: list, fingerprint: str):
        self.crcs = crcs
        self.nan_chunks = nan_chunks
        self.fingerprint = fingerprint


def _delayed_blocks(arrays: Sequence) -> list[list]:
    """Return, per chunk of rows, the delayed chunk of every input."""
    per_input = [a.to_delayed().reshape(len(a.chunks[0]), -1)[:, 0] for a in arrays]
    return [list(blocks) for blocks in zip(*per_input, strict=True)]


def _compute(tasks: list, progress: bool) -> list:
    """Compute ``tasks`` on the client, showing progress for long passes when asked."""
    from distributed import wait

    dask_client = client()
    futures = dask_client.compute(tasks)
    if progress and len(tasks) >= PROGRESS_CHUNKS:
        from distributed import progress as show

        show(futures)
    # every task finished (or failed) before the results are read: a failed pass leaves no
    # task still writing behind it (the permuted copy is then removed whole)
    wait(futures)
    return dask_client.gather(futures)


def scan(arrays: Sequence, names: Sequence[str], progress: bool = True) -> ScanResult:
    """Read every chunk once: NaN, CRC-32 per chunk and input, and the fingerprint.

    Parameters
    ----------
    arrays : sequence of dask.array.Array
        The inputs, sharing their row chunks.
    names : sequence of str
        Their names (in the fingerprint).
    progress : bool
        Show a progress bar for long scans.
    """
    from dask import delayed

    tasks = [delayed(_scan_chunk)(*blocks) for blocks in _delayed_blocks(arrays)]
    results = _compute(tasks, progress)
    crcs = np.array([r[1] for r in results], dtype=np.int64).reshape(len(results), len(arrays))
    nan_chunks = [(i, k) for i, r in enumerate(results) for k, has in enumerate(r[0]) if has]
    digest = hashlib.blake2b(digest_size=16)
    for name, a in zip(names, arrays, strict=True):
        digest.update(repr((name, str(a.dtype), a.shape, a.chunks[0])).encode())
    digest.update(crcs.tobytes())
    return ScanResult(crcs, nan_chunks, digest.hexdigest())


def _sum_chunk(fn, index: int, crcs, cands, others, *blocks) -> np.ndarray:
    """Sum ``fn`` over one chunk of rows, after checking its CRC-32 against ``crcs``."""
    for k, b in enumerate(blocks):
        if crcs is not None and _chunk_crc(b) != crcs[k]:
            return ("changed", index, k)
    rows = [np.require(b, requirements=["A", "C"]) for b in blocks]
    # arrays sent to another process may arrive unaligned (pickled buffers): PyTensor refuses
    cands = [np.require(c, requirements=["A", "C"]) for c in cands]
    others = [np.require(o, requirements=["A", "C"]) for o in others]
    out = fn(*cands, *rows, *others)
    if isinstance(out, list | tuple):
        return [np.asarray(o, dtype=np.float64) for o in out]
    return np.asarray(out, dtype=np.float64)


def row_sums(
    fn: PassFunction,
    arrays: Sequence,
    names: Sequence[str],
    cands: Sequence[np.ndarray],
    others: Sequence[np.ndarray],
    crcs: np.ndarray | None,
    combine: Sequence[Callable] | None = None,
) -> np.ndarray:
    r"""Return :math:`\sum_n` of ``fn(*cands, *rows, *others)`` over every chunk of rows.

    ``fn`` returns sums over the rows it is given (an array, such as the
    per-candidate sums of shape ``(K,)``, or a list of arrays, added
    elementwise). Each chunk's CRC-32 is checked against ``crcs`` (from
    :func:`scan`) before it is summed. With ``combine`` (one function per
    array of ``fn``'s list), the chunks' values are combined by those
    functions instead of added (extremes over rows, for instance).

    Raises
    ------
    DataChangedError
        When a chunk's bytes differ from those scanned, naming the input and
        the chunk.
    """
    from dask import delayed

    tasks = [
        delayed(_sum_chunk, pure=False)(
            fn, i, None if crcs is None else crcs[i], list(cands), list(others), *blocks
        )
        for i, blocks in enumerate(_delayed_blocks(arrays))
    ]
    total = None
    for out in _compute(tasks, progress=False):
        if isinstance(out, tuple):
            _, index, k = out
            raise DataChangedError(
                f"the out-of-core data {names[k]!r} changed after the step was built "
                f"(chunk {index} of its rows differs from the one checked then): the draws "
                "would mix two data sets. Leave the source unchanged while sampling, or "
                "build the step again on the new data"
            )
        if total is None:
            total = out
        elif combine is not None:
            total = [c(t, o) for c, t, o in zip(combine, total, out, strict=True)]
        elif isinstance(out, list):
            total = [t + o for t, o in zip(total, out, strict=True)]
        else:
            total = total + out
    return total

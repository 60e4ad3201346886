r"""The rows of out-of-core inputs as the per-observation terms read them.

:class:`~pymc_subsample.model.terms.ObservationTerms` evaluates compiled
functions of data rows given as inputs; in memory it gathers them from
``pm.Data`` arrays. For the placeholders of
:func:`~pymc_subsample.model.out_of_core.Data`, :class:`OutOfCoreRows`
supplies them instead: batches of a race from the row-permuted copy in the
store (:mod:`~pymc_subsample.model.out_of_core_copy`) through a small cache,
rows of the data in their own order from the source, and sums over every row
as Dask passes (:mod:`~pymc_subsample.model.out_of_core_passes`). Nothing of
size :math:`N` is held here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .blocks import ModelSplitError
from .out_of_core import source_of

__all__ = ["OutOfCoreRows"]

#: Rows read for the construction-time checks of the terms (row locality), from the head.
HEAD_ROWS = 4096
#: Largest data (bytes) that :meth:`OutOfCoreRows.all_rows` reads into memory.
MAX_IN_MEMORY_BYTES = 2**28
#: Scans of the inputs made in this process, by their placeholders' tokens: a second step
#: on the same likelihood reads the data's fingerprint and checks from here.
_SCANS: dict = {}


class OutOfCoreRows:
    r"""Rows of the out-of-core inputs of one likelihood: batches, data rows, full sums.

    At construction, one Dask pass over every chunk checks for missing values
    and takes the data's fingerprint (once per set of inputs in a process);
    with ``batches`` ``"blocks"`` or ``"windows"`` the row-permuted copy keyed
    on it is then written to the store, or found there from an earlier run.

    Parameters
    ----------
    data : sequence of TensorVariable
        The placeholders (:func:`~pymc_subsample.model.out_of_core.Data`).
    observed : sequence of str
        The observed variables (for messages).
    batches : {"blocks", "random", "windows"}
        The races' batch layout: positions of the permuted copy, or rows of the
        data (``"random"``: read from the source, which must then be a zarr array).
    seed : int
        Seed of the copy's permutation (a copy per seed and data).
    progress : bool
        Show progress bars for the one-time passes.

    Raises
    ------
    ModelSplitError
        For inputs of different lengths or row chunks, missing values, or
        ``"random"`` batches on a source that is not a zarr array.
    """

    def __init__(
        self,
        data: Sequence,
        observed: Sequence[str],
        batches: str,
        *,
        seed: int = 0,
        progress: bool = True,
    ):
        from .out_of_core_copy import ChunkReader, permuted_copy
        from .out_of_core_passes import scan

        self.sources = [source_of(d) for d in data]
        self.names = [s.name for s in self.sources]
        self.arrays = [s.array for s in self.sources]
        names = ", ".join(observed)
        lengths = {s.name: s.n_rows for s in self.sources}
        if len(set(lengths.values())) > 1:
            raise ModelSplitError(
                f"the out-of-core inputs of {names} have different numbers of rows "
                f"({lengths}): every per-observation input of one likelihood needs one row "
                "per observation"
            )
        chunks = {s.name: s.array.chunks[0] for s in self.sources}
        if len(set(chunks.values())) > 1:
            first = self.sources[0]
            raise ModelSplitError(
                f"the out-of-core inputs of {names} are chunked differently along rows "
                f"({ {k: v[:3] for k, v in chunks.items()} }...): the passes read one chunk of "
                "every input at a time. Write them with the same row chunks, or rechunk, e.g. "
                f"source.rechunk({{0: {first.name}.chunks[0]}})"
            )
        self.n_rows = self.sources[0].n_rows
        self._pid = os.getpid()  # the process whose Dask client runs the passes
        key = tuple(d.owner.op.token for d in data)
        self.scanned = _SCANS.get(key)
        if self.scanned is None:  # once per set of inputs: steps on one likelihood share it
            self.scanned = _SCANS[key] = scan(self.arrays, self.names, progress=progress)
        if self.scanned.nan_chunks:
            chunk, k = self.scanned.nan_chunks[0]
            start = int(sum(self.arrays[0].chunks[0][:chunk]))
            stop = start + int(self.arrays[0].chunks[0][chunk])
            raise ModelSplitError(
                f"the out-of-core input {self.names[k]!r} holds missing values (NaN), first in "
                f"rows {start}:{stop} (chunk {chunk}), which a subsampled likelihood cannot "
                "evaluate: drop those rows from every per-observation input (e.g. with Dask: "
                "keep = ~da.isnan(x).any(axis=1); x[keep], y[keep], then compute_chunk_sizes "
                "and write them to zarr) or model them apart"
            )
        self.fingerprint = self.scanned.fingerprint
        self.batches = batches
        if batches == "random":
            if any(s.zarr is None for s in self.sources):
                missing = [s.name for s in self.sources if s.zarr is None]
                raise ModelSplitError(
                    f"batches='random' reads scattered rows of the data itself, but {missing} "
                    "are Dask arrays not stored in zarr: use batches='blocks' or 'windows' "
                    "(a row-permuted copy in the store), or write them to zarr first "
                    "(dask.array.to_zarr)"
                )
            self.copy = None
            self.reader = ChunkReader([s.zarr for s in self.sources], self.names, self.scanned.crcs)
        else:
            self.copy = permuted_copy(
                self.arrays,
                self.names,
                self.sources[0].copy_store,
                self.fingerprint,
                seed=seed,
                progress=progress,
            )
            self.reader = ChunkReader(
                [self.copy[n] for n in self.names], self.names, self.copy.attrs["crcs"]
            )
        # rows of the data in their own order (scattered): from the source's zarr arrays
        self._data_reader = (
            self.reader
            if self.copy is None
            else (
                ChunkReader([s.zarr for s in self.sources], self.names, self.scanned.crcs)
                if all(s.zarr is not None for s in self.sources)
                else None
            )
        )

    def batch_rows(self, positions: slice | np.ndarray) -> list[np.ndarray]:
        """Return the rows at ``positions`` of the races' layout (the copy, else the data)."""
        if isinstance(positions, slice):
            start, stop, _ = positions.indices(self.n_rows)
            return self.reader.window(start, stop)
        return self.reader.take(np.asarray(positions, dtype=np.int64))

    def data_rows(self, idx: np.ndarray) -> list[np.ndarray]:
        """Return the rows ``idx`` of the data, in their own order (scattered reads)."""
        idx = np.asarray(idx, dtype=np.int64)
        if self._data_reader is not None:
            return self._data_reader.take(idx)
        import dask

        return list(dask.compute(*[a[idx] for a in self.arrays]))

    def head_rows(self, n: int = HEAD_ROWS) -> list[np.ndarray]:
        """Return the first ``n`` rows of the data (construction-time checks)."""
        import dask

        n = min(int(n), self.n_rows)
        return [np.ascontiguousarray(r) for r in dask.compute(*[a[:n] for a in self.arrays])]

    def all_rows(self) -> list[np.ndarray]:
        """Return every row in data order: only for data that fit in memory.

        Raises
        ------
        MemoryError
            Above :data:`MAX_IN_MEMORY_BYTES` of rows, naming what asked.
        """
        size = self.n_rows * sum(s.row_bytes for s in self.sources)
        if size > MAX_IN_MEMORY_BYTES:
            raise MemoryError(
                f"every row of {self.names} ({size} bytes) was asked for at once; out-of-core "
                "terms are summed by Dask passes instead: this use of the terms is not "
                "supported out of core"
            )
        return self.data_rows(np.arange(self.n_rows))

    def reduce(self, fn, combine: Sequence) -> list[np.ndarray]:
        """Return ``fn(*rows)`` (a list of arrays) over every row: a Dask pass, chunks combined.

        Parameters
        ----------
        fn : callable
            A picklable function of one chunk's rows (every input), returning
            a list of arrays (statistics of those rows).
        combine : sequence of callable
            One per array: the statistic of two disjoint sets of rows from theirs.
        """
        from .out_of_core_passes import row_sums

        self._check_process()
        return row_sums(fn, self.arrays, self.names, [], [], self.scanned.crcs, combine)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"the out-of-core terms of {self.names} were built in process {self._pid} and "
                f"are summed in process {os.getpid()} (a chain forked by pm.sample(cores>1)), "
                "where the Dask client does not run: sample with cores=1 (the passes run in "
                "parallel on the Dask cluster)"
            )

    def sums(self, fn, cands: Sequence[np.ndarray], others: Sequence[np.ndarray]) -> np.ndarray:
        """Return the sums of ``fn`` (a :class:`PassFunction` of rows) over every row (Dask).

        Raises
        ------
        RuntimeError
            In another process than the one that built the terms (a chain
            forked by ``pm.sample(cores>1)``), whose Dask client would not
            answer.
        """
        from .out_of_core_passes import row_sums

        self._check_process()
        return row_sums(fn, self.arrays, self.names, cands, others, self.scanned.crcs)

r"""The row-permuted copy of out-of-core inputs, written once into a zarr store, and its reader.

A race reads windows or blocks of positions of a row-permuted copy: any run
of positions is then a uniformly random subset of the :math:`N` rows.
Out of core the copy is written once, by Dask tasks over chunks, into a zarr
group keyed on the data's fingerprint, and reused by later runs on the same
data.

The permutation is drawn without an index array of :math:`N` entries: the
source's chunks of rows :math:`i` (sizes :math:`a_i`) are dealt to groups
:math:`j` of consecutive positions of the copy (sizes :math:`b_j`) by a
table :math:`T_{ij}` drawn from the multivariate hypergeometric law of a
uniform permutation (row :math:`i` deals its :math:`a_i` rows among the
places left in each group); each chunk shuffles its rows and cuts them into
pieces of :math:`T_{i\cdot}` rows (stage 1, written apart), each group
gathers its pieces and shuffles them (stage 2). The result is a uniformly
random permutation; every task holds one chunk or one group.

The copy's chunks are small (:data:`COPY_CHUNK_BYTES`: a race reads few rows
per decision, and a cache miss reads a whole chunk), stored in zarr shards of
one group each (one file per group, written whole by its task), uncompressed.
When the store is a local directory, :class:`ChunkReader` reads a chunk of the
copy with one ``pread`` of its bytes at the offset the shard's index gives
(:class:`LocalShards`), about a hundred times cheaper than a read through
zarr's codec pipeline; other stores are read through zarr. The copy is
written under a temporary name and renamed once complete (a "complete"
attribute marks it in stores that cannot rename): no partial copy is left or
reused. :class:`ChunkReader` reads rows at positions through a
small LRU cache of chunks, checking each chunk's CRC-32 as it loads it.
"""

from __future__ import annotations

import os
import shutil
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["ChunkReader", "CopyLayout", "LocalShards", "deal_table", "permuted_copy"]

#: Bytes of one chunk of the copy (all inputs together, about): what a cache miss reads.
#: The chunks are stored in shards of about a source chunk each (one file per shard).
COPY_CHUNK_BYTES = 2**16
#: Bytes of chunks the reader keeps.
CACHE_BYTES = 64 * 2**20


def deal_table(sizes_in: Sequence[int], sizes_out: Sequence[int], seed) -> np.ndarray:
    r"""Draw how many rows of each source chunk land in each group of the copy.

    Row :math:`i` of the table is a multivariate hypergeometric draw of
    :math:`a_i` among the places still free in each group: the counts a
    uniformly random permutation gives.
    """
    rng = np.random.default_rng([int(seed), 0x5EED])
    free = np.asarray(sizes_out, dtype=np.int64).copy()
    table = np.zeros((len(sizes_in), len(sizes_out)), dtype=np.int64)
    for i, a in enumerate(sizes_in):
        if free.sum() < HYPERGEOMETRIC_LIMIT:
            table[i] = rng.multivariate_hypergeometric(free, int(a))
        else:  # NumPy's marginals method stops below 10^9 places: one group at a time
            table[i] = _sequential_hypergeometric(rng, free, int(a))
        free -= table[i]
    return table


#: NumPy's multivariate hypergeometric (and each count of its univariate one) stays below.
HYPERGEOMETRIC_LIMIT = 10**9


def _sequential_hypergeometric(rng, free: np.ndarray, a: int) -> np.ndarray:
    r"""Draw a multivariate hypergeometric count of ``a`` among ``free`` one group at a time.

    Group :math:`j` gets a univariate hypergeometric draw of the rows left
    among its places and those of the groups after it: the same law as
    :meth:`numpy.random.Generator.multivariate_hypergeometric`, for totals
    of up to about :math:`2 \cdot 10^9` places.
    """
    out = np.zeros(len(free), dtype=np.int64)
    rest = int(free.sum())
    for j, places in enumerate(free):
        rest -= int(places)
        if a == 0:
            break
        if rest >= 10**9 or places >= 10**9:  # NumPy's univariate limits
            raise ValueError("the permuted copy deals at most about 2e9 rows")
        take = a if rest == 0 else int(rng.hypergeometric(int(places), rest, a))
        out[j] = take
        a -= take
    return out


class CopyLayout:
    """Positions of the copy: chunks of ``chunk`` rows, grouped ``per_group`` to a task.

    Parameters
    ----------
    n_rows : int
        :math:`N`.
    row_bytes : int
        Bytes of one row, every input together.
    source_chunk : int
        Rows of the largest source chunk (a group holds about as many).
    """

    def __init__(self, n_rows: int, row_bytes: int, source_chunk: int):
        self.n_rows = int(n_rows)
        self.chunk = int(max(256, min(self.n_rows, COPY_CHUNK_BYTES // max(row_bytes, 1))))
        self.per_group = max(1, int(source_chunk) // self.chunk)
        group = self.chunk * self.per_group
        self.group_sizes = [min(group, self.n_rows - s) for s in range(0, self.n_rows, group)]


def _stage_one(i, seed, table_row, stages, *blocks) -> int:
    """Shuffle chunk ``i`` and write its pieces, one per group, into the staging arrays."""
    rng = np.random.default_rng([int(seed), 1, i])
    perm = rng.permutation(len(blocks[0]))
    cuts = np.concatenate([[0], np.cumsum(table_row)])
    for block, stage in zip(blocks, stages, strict=True):
        rows = np.asarray(block)[perm]
        for j in range(len(table_row)):
            if table_row[j]:
                piece = rows[cuts[j] : cuts[j + 1]]
                stage[i, j, : len(piece)] = piece
    return i


def _stage_two(j, seed, table_col, start, chunk, stages, outs) -> list[list[int]]:
    """Gather group ``j``'s pieces, shuffle them, write them; return CRC-32 per chunk, input."""
    crcs = []
    rows_all = []
    nonzero = np.flatnonzero(table_col)
    files = [[_piece_file(stage, i, j) for i in nonzero] for stage in stages]
    for stage, paths in zip(stages, files, strict=True):
        gone = [p for p in paths if p is not None and not os.path.exists(p)]
        if gone:  # a retried task after its pieces were freed: never read them as fill values
            raise RuntimeError(
                f"staged rows of group {j} of the permuted copy are missing ({gone[0]}): the "
                "copy is removed; build the step again to write it anew"
            )
        parts = [stage[i, j, : table_col[i]] for i in nonzero]
        rows_all.append(np.concatenate(parts) if parts else stage[0, j, :0])
    rng = np.random.default_rng([int(seed), 2, j])
    perm = rng.permutation(len(rows_all[0]))
    for k, (rows, out) in enumerate(zip(rows_all, outs, strict=True)):
        rows = np.ascontiguousarray(rows[perm])
        out[start : start + len(rows)] = rows
        for a in range(0, len(rows), chunk):
            if k == 0:
                crcs.append([])
            crcs[a // chunk].append(zlib.crc32(memoryview(rows[a : a + chunk]).cast("B")))
    for paths in files:  # free the disk of the pieces read (local stores): the copy's peak
        for path in paths:  # disk is then about the copy's size, not twice it
            if path is not None:
                os.remove(path)
    return crcs


def _piece_file(stage, i: int, j: int) -> str | None:
    """Return the file of staging piece ``(i, j)`` in a local directory store, else None."""
    root = getattr(stage.store, "root", None)
    if root is None:
        return None
    key = stage.metadata.encode_chunk_key((int(i), int(j), *(0,) * (stage.ndim - 2)))
    return os.path.join(os.fspath(root), stage.path, key)


def _group_path(store: str, fingerprint: str) -> str:
    return f"pymc_subsample_permuted/{fingerprint}"


def _open_complete(store: str, path: str, names: Sequence[str]):
    """Return the complete copy at ``path`` of ``store``, or None."""
    import zarr

    try:
        group = zarr.open_group(store, path=path, mode="r")
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.GroupNotFoundError):
        return None
    if not group.attrs.get("complete") or any(n not in group for n in names):
        return None
    return group


def permuted_copy(
    arrays: Sequence,
    names: Sequence[str],
    store: str,
    fingerprint: str,
    seed: int = 0,
    progress: bool = True,
):
    """Return the zarr group of the row-permuted copy; write it first when none is complete.

    Parameters
    ----------
    arrays : sequence of dask.array.Array
        The inputs, sharing their row chunks.
    names : sequence of str
        Their names: the copy's arrays.
    store : str
        A directory or URL zarr opens.
    fingerprint : str
        The data's fingerprint (:func:`~pymc_subsample.model.out_of_core_passes.scan`):
        the copy's key in the store.
    seed : int
        Seed of the permutation.
    progress : bool
        Show the progress of the writing.

    Returns
    -------
    zarr.Group
        Arrays ``names`` (the permuted rows) and attributes ``complete``,
        ``crcs`` (per chunk and input) and ``seed``.
    """
    import zarr
    from dask import delayed

    from .out_of_core_passes import _compute

    path = _group_path(store, f"{fingerprint}-{seed}")
    found = _open_complete(store, path, names)
    if found is not None:
        return found
    n_rows = int(arrays[0].shape[0])
    row_bytes = sum(a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in arrays)
    sizes_in = [int(c) for c in arrays[0].chunks[0]]
    layout = CopyLayout(n_rows, row_bytes, max(sizes_in))
    table = deal_table(sizes_in, layout.group_sizes, seed)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    local = "://" not in store
    try:
        root = zarr.open_group(store, mode="a")
        group = root.require_group(tmp)
        piece = max(1, int(table.max()))
        stages, outs = [], []
        for a, name in zip(arrays, names, strict=True):
            tail = tuple(int(s) for s in a.shape[1:])
            stages.append(
                group.create_array(
                    f"stage_{name}",
                    shape=(len(sizes_in), len(layout.group_sizes), piece, *tail),
                    chunks=(1, 1, piece, *tail),
                    dtype=a.dtype,
                    # every piece written is stored (even all zeros): stage two checks it
                    config={"write_empty_chunks": True},
                )
            )
            outs.append(
                group.create_array(
                    name,
                    shape=a.shape,
                    chunks=(layout.chunk, *tail),
                    shards=(layout.chunk * layout.per_group, *tail),
                    dtype=a.dtype,
                    compressors=None,  # a chunk is then read as its bytes (LocalShards)
                )
            )
        blocks = [
            list(b)
            for b in zip(
                *[a.to_delayed().reshape(len(sizes_in), -1)[:, 0] for a in arrays], strict=True
            )
        ]
        first = [
            delayed(_stage_one, pure=False)(i, seed, table[i], stages, *blocks[i])
            for i in range(len(sizes_in))
        ]
        _compute(first, progress)
        starts = np.concatenate([[0], np.cumsum(layout.group_sizes)])
        second = [
            delayed(_stage_two, pure=False)(
                j, seed, table[:, j], int(starts[j]), layout.chunk, stages, outs
            )
            for j in range(len(layout.group_sizes))
        ]
        crcs = [c for group_crcs in _compute(second, progress) for c in group_crcs]
        for name in names:
            del group[f"stage_{name}"]
        group.attrs.update({"crcs": crcs, "seed": int(seed), "chunk": layout.chunk})
        if local:  # rename the complete copy into place: readers never see a partial one
            group.attrs["complete"] = True
            final = os.path.join(store, path)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            try:
                os.replace(os.path.join(store, tmp), final)
            except OSError:  # another run renamed its complete copy into place first
                if _open_complete(store, path, names) is None:
                    raise
                _remove(store, tmp, local)
        else:  # stores that cannot rename: the copy is written in place, marked last
            return _write_marked(store, path, tmp, names)
    except BaseException:
        _remove(store, tmp, local)
        raise
    return zarr.open_group(store, path=path, mode="r")


def _write_marked(store: str, path: str, tmp: str, names: Sequence[str]):
    """Copy the temporary group to ``path`` in a store without renames; mark it complete last."""
    import zarr

    src = zarr.open_group(store, path=tmp, mode="r")
    dst = zarr.open_group(store, path=path, mode="w")
    for name in names:
        a = src[name]
        out = dst.create_array(name, shape=a.shape, chunks=a.chunks, dtype=a.dtype)
        for s in range(0, a.shape[0], a.chunks[0]):
            out[s : s + a.chunks[0]] = a[s : s + a.chunks[0]]
    dst.attrs.update({k: v for k, v in src.attrs.items()})
    dst.attrs["complete"] = True
    _remove(store, tmp, local=False)
    return zarr.open_group(store, path=path, mode="r")


def _remove(store: str, path: str, local: bool) -> None:
    """Delete the group at ``path`` (a temporary copy), ignoring one already gone."""
    if local:
        shutil.rmtree(os.path.join(store, path), ignore_errors=True)
        return
    import zarr

    try:
        root = zarr.open_group(store, mode="a")
        del root[path]
    except Exception:  # noqa: BLE001 (cleanup after a failure: the original error is raised)
        pass


#: The shard index's entry of a chunk not written (zarr's sharding codec).
_MISSING = 2**64 - 1


class LocalShards:
    r"""Chunks of a zarr array read as bytes from its shard files, when zarr stores them so.

    Applies to an array of a local directory store, sharded along its first
    axis only (whole rows in a shard), whose chunks are stored uncompressed
    (the sharding codec's inner codecs a single little-endian ``bytes``)
    and whose shard index is at the end of each file (``bytes`` then
    ``crc32c``, zarr's default): a chunk is then ``nbytes`` at ``offset``
    of its shard file, both read from the shard's index (read once per
    shard and kept). :meth:`usable` says whether an array qualifies.

    Parameters
    ----------
    array : zarr.Array
        The array (:meth:`usable` true).
    """

    def __init__(self, array):
        codec = array.metadata.codecs[0]
        self.array = array
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        self.chunk_shape = tuple(int(c) for c in codec.chunk_shape)
        self.per_shard = int(array.shards[0]) // self.chunk_shape[0]
        self.root = os.path.join(os.fspath(array.store.root), array.path)
        self._index: dict[int, np.ndarray] = {}
        self._zeros = (0,) * (len(array.shape) - 1)
        self.chunk_bytes = self.dtype.itemsize * int(np.prod(self.chunk_shape, dtype=np.int64))

    @staticmethod
    def usable(array) -> bool:
        """Return whether ``array``'s chunks can be read as bytes from its shard files."""
        try:
            from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
            from zarr.storage import LocalStore

            codecs = array.metadata.codecs
            if not isinstance(array.store, LocalStore) or len(codecs) != 1:
                return False
            shard = codecs[0]
            if (
                not isinstance(shard, ShardingCodec)
                or getattr(shard.index_location, "value", shard.index_location) != "end"
            ):
                return False
            inner = [type(c) for c in shard.codecs]
            index = [type(c) for c in shard.index_codecs]
            if inner != [BytesCodec] or index != [BytesCodec, Crc32cCodec]:
                return False
            for c in (*shard.codecs, shard.index_codecs[0]):
                if getattr(c.endian, "value", c.endian) not in (None, "little"):
                    return False
            tail = tuple(array.shape[1:])
            return tuple(array.shards[1:]) == tail == tuple(shard.chunk_shape[1:])
        except (AttributeError, ImportError, TypeError, ValueError):
            return False

    def _shard_index(self, s: int, fd: int) -> np.ndarray:
        found = self._index.get(s)
        if found is None:
            size = os.fstat(fd).st_size
            n = 16 * self.per_shard
            raw = os.pread(fd, n, size - n - 4)
            found = self._index[s] = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        return found

    def read(self, c: int) -> np.ndarray | None:
        """Return chunk ``c`` (whole: the last one padded as stored), or None when not stored."""
        s, k = divmod(int(c), self.per_shard)
        key = self.array.metadata.encode_chunk_key((s, *self._zeros))
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            offset, nbytes = (int(v) for v in self._shard_index(s, fd)[k])
            if offset == _MISSING or nbytes != self.chunk_bytes:  # not stored as raw rows
                return None
            raw = bytearray(nbytes)  # writable, as the rows zarr returns
            if os.preadv(fd, [raw], offset) != nbytes:
                return None
        finally:
            os.close(fd)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.chunk_shape)


class ChunkReader:
    """Rows at positions of zarr arrays of equal row chunks, through an LRU cache of chunks.

    Parameters
    ----------
    arrays : sequence of zarr.Array
        One per input, the same number of rows and row chunks.
    names : sequence of str
        Their names (for messages).
    crcs : array-like, optional
        ``(n_chunks, n_inputs)`` CRC-32 of each chunk as written or scanned:
        a chunk that differs when loaded raises
        :class:`~pymc_subsample.model.out_of_core_passes.DataChangedError`.
    cache_bytes : int
        Bytes of chunks kept.
    """

    def __init__(self, arrays: Sequence, names: Sequence[str], crcs=None, cache_bytes=None):
        self.arrays = list(arrays)
        self.names = list(names)
        self.chunk = int(self.arrays[0].chunks[0])
        self.n_rows = int(self.arrays[0].shape[0])
        self.crcs = None if crcs is None else np.asarray(crcs, dtype=np.int64)
        budget = CACHE_BYTES if cache_bytes is None else int(cache_bytes)
        chunk_bytes = sum(
            a.dtype.itemsize * int(np.prod(a.chunks, dtype=np.int64)) for a in self.arrays
        )
        self.max_chunks = max(2, budget // max(chunk_bytes, 1))
        self._cache: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self.loads = 0
        self._shards = [LocalShards(a) if LocalShards.usable(a) else None for a in self.arrays]
        for k, shards in enumerate(self._shards):  # the bytes read so must be zarr's rows
            if shards is not None and not self._same_as_zarr(k, shards):
                self._shards[k] = None

    def _same_as_zarr(self, k: int, shards: LocalShards) -> bool:
        """Return whether the first chunk of input ``k`` read from its shard file is zarr's."""
        rows = min(self.chunk, self.n_rows)
        try:
            raw = shards.read(0)
        except OSError:
            return False
        if raw is None:
            return False
        expected = np.asarray(self.arrays[k][:rows])
        return np.array_equal(raw[:rows], expected) and raw.dtype.itemsize == expected.itemsize

    def _read(self, k: int, start: int) -> np.ndarray:
        """Return the rows of input ``k`` from ``start`` (a chunk's first): shard bytes or zarr."""
        shards = self._shards[k]
        if shards is not None:
            try:
                raw = shards.read(start // self.chunk)
            except OSError:
                raw = None
            if raw is not None:
                return raw[: min(self.chunk, self.n_rows - start)]
        return np.ascontiguousarray(self.arrays[k][start : start + self.chunk])

    def _load(self, c: int) -> list[np.ndarray]:
        found = self._cache.get(c)
        if found is not None:
            self._cache.move_to_end(c)
            return found
        from .out_of_core_passes import DataChangedError

        start = c * self.chunk
        rows = [self._read(k, start) for k in range(len(self.arrays))]
        if self.crcs is not None:
            for k, r in enumerate(rows):
                if zlib.crc32(memoryview(r).cast("B")) != self.crcs[c, k]:
                    raise DataChangedError(
                        f"the out-of-core rows of {self.names[k]!r} changed after they were "
                        f"checked (chunk {c} of {self.arrays[k].store_path}): the draws would "
                        "mix two data sets. Leave the store unchanged while sampling, or "
                        "build the step again"
                    )
        self.loads += 1
        self._cache[c] = rows
        while len(self._cache) > self.max_chunks:
            self._cache.popitem(last=False)
        return rows

    def take(self, positions: np.ndarray) -> list[np.ndarray]:
        """Return every input's rows at ``positions`` (int64), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        chunk_of = positions // self.chunk
        out = [np.empty((len(positions), *a.shape[1:]), dtype=a.dtype) for a in self.arrays]
        order = np.argsort(chunk_of, kind="stable")
        sorted_chunks = chunk_of[order]
        bounds = np.flatnonzero(np.diff(sorted_chunks)) + 1
        for part in np.split(order, bounds):
            if len(part) == 0:
                continue
            c = int(chunk_of[part[0]])
            local = positions[part] - c * self.chunk
            for o, rows in zip(out, self._load(c), strict=True):
                o[part] = rows[local]
        return out

    def window(self, start: int, stop: int) -> list[np.ndarray]:
        """Return every input's rows at positions ``start:stop`` (within ``N``)."""
        first, last = start // self.chunk, (stop - 1) // self.chunk
        parts = []
        for c in range(first, last + 1):
            a = max(start - c * self.chunk, 0)
            b = min(stop - c * self.chunk, self.chunk)
            parts.append([r[a:b] for r in self._load(c)])
        if len(parts) == 1:
            return [np.ascontiguousarray(p) for p in parts[0]]
        return [np.concatenate(cols) for cols in zip(*parts, strict=True)]

r"""Per-observation inputs held out of core: :func:`Data`, its placeholder in the graph, checks.

A ``pm.Data`` holds its value in memory (it copies even a memory-mapped
array), so rows that do not fit in memory cannot enter a model through it.
:func:`Data` stands in for it: the model's graph gets a *placeholder*, the
output of an :class:`OutOfCorePlaceholder` node with the source's dtype and
shape :math:`(N, \ldots)`, that holds no rows. Shapes (the number of
observations) are inferred without evaluating it; evaluating it raises
:class:`OutOfCoreReadError`, so that no PyMC step or function (NUTS,
``Metropolis``, ``model.compile_logp``) can read a placeholder in place of
the data. The steps of this package find the placeholders of a likelihood
(:func:`find_out_of_core`), look their sources up (:func:`source_of`) and read
rows from them (:mod:`~pymc_subsample.model.out_of_core_rows`).

Sources are a zarr array, a Dask array, or an xarray ``DataArray`` backed by
one: rows along the first axis, chunked along rows only, numeric. Dask and
zarr are imported only when a source is given.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.traversal import ancestors

from ..validation import ArgumentTypeError

__all__ = [
    "Data",
    "OutOfCorePlaceholder",
    "OutOfCoreReadError",
    "OutOfCoreSource",
    "find_out_of_core",
    "is_placeholder",
    "source_of",
]


class OutOfCoreReadError(RuntimeError, TypeError):
    """A placeholder of out-of-core data was evaluated outside this package's steps.

    Also a ``TypeError``: what PyMC raises for data it cannot extract, so that
    ``pm.sample`` leaves the rows out of ``observed_data`` (with a warning)
    instead of failing after the draws.
    """


@dataclass(frozen=True)
class OutOfCoreSource:
    """A validated out-of-core input: its rows as a Dask array, and where they are stored.

    Attributes
    ----------
    name : str
        The model variable's name.
    array : dask.array.Array
        The rows, chunked along the first axis only.
    zarr : zarr.Array or None
        The zarr array behind :attr:`array`, when the source is one (rows are
        then read from it directly).
    copy_store : str
        Where the row-permuted copy is written (a local directory or any
        store URL zarr opens).
    """

    name: str
    array: object
    zarr: object
    copy_store: str

    @property
    def n_rows(self) -> int:
        """Number of rows, :math:`N`."""
        return int(self.array.shape[0])

    @property
    def dtype(self) -> np.dtype:
        """The rows' dtype."""
        return np.dtype(self.array.dtype)

    @property
    def trailing(self) -> tuple[int, ...]:
        """The shape of one row."""
        return tuple(int(s) for s in self.array.shape[1:])

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return self.dtype.itemsize * int(np.prod(self.trailing, dtype=np.int64))


#: The sources of the placeholders made in this process, by the placeholder's token.
_SOURCES: dict[str, OutOfCoreSource] = {}


class OutOfCorePlaceholder(Op):
    r"""The graph node of an out-of-core input: static type, no rows; evaluating it raises.

    Parameters
    ----------
    name : str
        The variable's name (for messages).
    token : str
        Key of its :class:`OutOfCoreSource` in this process.
    dtype : str
        The rows' dtype.
    shape : tuple of int
        :math:`(N, \ldots)`.
    """

    __props__ = ("name", "token", "dtype", "shape")

    def __init__(self, name: str, token: str, dtype: str, shape: Sequence[int]):
        self.name = name
        self.token = token
        self.dtype = str(dtype)
        self.shape = tuple(int(s) for s in shape)

    def make_node(self, n_rows):
        """Return the node: input the number of rows, output of the source's dtype and row shape.

        The number of rows is left out of the static type and comes from a
        shared scalar (as a ``pm.Data``'s shape comes from its value), so
        that graphs where the rows are replaced by a subset stay valid: no
        constant :math:`N` is folded into them.
        """
        n_rows = pt.as_tensor_variable(n_rows)
        out = pt.tensor(dtype=self.dtype, shape=(None, *self.shape[1:]))
        return Apply(self, [n_rows], [out])

    def do_constant_folding(self, fgraph, node) -> bool:
        """Never fold: the placeholder has no value to fold."""
        return False

    def infer_shape(self, node, shapes):
        """Return the shape: the shared number of rows, then the row shape (no rows read)."""
        return [(node.inputs[0], *(pt.constant(s, dtype="int64") for s in self.shape[1:]))]

    def perform(self, node, inputs, output_storage):
        """Refuse: the rows are out of core, readable only through this package's steps."""
        raise OutOfCoreReadError(read_error_message(self.name, self.shape[0]))


def read_error_message(name: str, n_rows: int) -> str:
    """Return what to do when something other than our steps evaluates placeholder ``name``."""
    return (
        f"pymc_subsample.Data {name!r} holds {n_rows} rows out of core (zarr/Dask) that only "
        "pymc_subsample's steps read; a PyMC step or function (NUTS, Metropolis, "
        "CategoricalGibbsMetropolis, model.compile_logp, pm.sample_posterior_predictive, "
        "log_likelihood=True) evaluated it and would read no data. Assign every variable "
        f"whose likelihood reads {name!r} to RacingMetropolis, SubsampledCategoricalGibbs or "
        "PliableRejection in pm.sample(step=[...]), or load data that fit in memory with pm.Data"
    )


def _as_dask(name: str, source):
    """Return ``(dask_array, zarr_array_or_None)`` for a supported source; refuse others."""
    import dask.array as da
    import zarr

    if hasattr(source, "dims") and hasattr(source, "variable"):  # an xarray DataArray
        source = source.data
    if isinstance(source, zarr.Array):
        return da.from_zarr(source), source
    if isinstance(source, da.Array):
        return source, None
    if isinstance(source, np.ndarray):
        raise ArgumentTypeError(
            f"pymc_subsample.Data {name!r}: the source is a NumPy array, already in memory: "
            "use pm.Data for it, or write it to a zarr array (zarr.create_array) and pass that"
        )
    raise ArgumentTypeError(
        f"pymc_subsample.Data {name!r}: the source must be a zarr array, a Dask array or an "
        f"xarray DataArray backed by one, got {type(source).__name__}"
    )


def _check_source(name: str, array) -> None:
    """Refuse a source without rows, chunked along other axes, or not numeric."""
    if array.ndim < 1 or array.shape[0] < 1:
        raise ValueError(
            f"pymc_subsample.Data {name!r}: the source has shape {array.shape}; its first "
            "axis must index the observations (at least one row)"
        )
    if any(np.isnan(c) for axis in array.chunks for c in axis):
        raise ValueError(
            f"pymc_subsample.Data {name!r}: the source's chunk sizes are unknown (NaN); "
            "compute them first, e.g. source.compute_chunk_sizes() (or "
            "dask.dataframe's .to_dask_array(lengths=True))"
        )
    split = [k for k in range(1, array.ndim) if len(array.chunks[k]) > 1]
    if split:
        raise ValueError(
            f"pymc_subsample.Data {name!r}: the source is chunked along axis {split} "
            f"(chunks {tuple(tuple(c) for c in array.chunks)}); rows must be whole in a "
            "chunk, chunked along the first axis only: pass "
            f"source.rechunk({{{', '.join(f'{k}: -1' for k in split)}}}) (for a zarr array, "
            "da.from_zarr(array).rechunk(...), or rewrite the store chunked by rows)"
        )
    if np.dtype(array.dtype).kind not in "biuf":
        raise ValueError(
            f"pymc_subsample.Data {name!r}: the source has dtype {array.dtype}; only numeric "
            "(bool, integer, float) rows can enter a likelihood: convert it first"
        )


def _default_copy_store(zarr_array) -> str:
    """Return where the permuted copy goes: the source's local store, else the user cache."""
    import os

    root = getattr(getattr(zarr_array, "store", None), "root", None)
    if root is not None:
        return os.fspath(root)
    base = os.environ.get("PYMC_SUBSAMPLE_STORE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pymc_subsample", "permuted.zarr"
    )
    return base


def Data(name: str, source, dims: Sequence[str] | None = None, *, copy_store=None):  # noqa: N802
    r"""Register an out-of-core per-observation input with the model in context; no row is read.

    Stands in for ``pm.Data`` for rows held in a zarr array, a Dask array, or
    an xarray ``DataArray`` backed by one. The model's graph gets a
    placeholder of the source's dtype and shape :math:`(N, \ldots)`;
    the steps of this package read the rows themselves (a row-permuted copy
    for races, Dask passes over the chunks for sums over all rows), and any
    other evaluation of the placeholder raises :class:`OutOfCoreReadError`.

    Parameters
    ----------
    name : str
        Name of the variable in the model.
    source : zarr.Array, dask.array.Array or xarray.DataArray
        The rows: first axis the observations, chunked along it only,
        numeric dtype.
    dims : sequence of str, optional
        Dimension names, as ``pm.Data``'s; a name not yet a coordinate of the
        model is added with its length.
    copy_store : str, optional
        Where the row-permuted copy is written: a directory or any URL zarr
        opens. Default: the directory of the source's zarr store, else
        ``$PYMC_SUBSAMPLE_STORE`` or ``~/.cache/pymc_subsample/permuted.zarr``.

    Returns
    -------
    TensorVariable
        The placeholder, named ``name``, registered with the model.

    Raises
    ------
    ValueError
        For a source without rows, chunked along another axis than the
        first (the fix: ``rechunk``), of unknown chunk sizes or not numeric.
    """
    import pymc as pm

    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"name must be a non-empty string, got {name!r}")
    if copy_store is not None and not isinstance(copy_store, str):
        raise ArgumentTypeError(f"copy_store must be a path or URL string, got {copy_store!r}")
    array, zarr_array = _as_dask(name, source)
    _check_source(name, array)
    if dims is not None:
        if isinstance(dims, str):
            dims = (dims,)
        dims = tuple(dims)
        if len(dims) != array.ndim or not all(isinstance(d, str) for d in dims):
            raise ArgumentTypeError(
                f"pymc_subsample.Data {name!r}: dims must be {array.ndim} names (one per "
                f"axis of shape {array.shape}), got {dims!r}"
            )
    model = pm.modelcontext(None)
    token = uuid.uuid4().hex
    store = copy_store if copy_store is not None else _default_copy_store(zarr_array)
    _SOURCES[token] = OutOfCoreSource(name, array, zarr_array, store)
    op = OutOfCorePlaceholder(name, token, str(array.dtype), array.shape)
    var = op(pytensor.shared(np.int64(array.shape[0]), name=f"{name}_n_rows"))
    var.name = name
    if dims is not None:
        for dim, length in zip(dims, array.shape, strict=True):
            if dim not in model.coords:
                model.add_coord(dim, length=int(length))
            elif model.dim_lengths[dim].eval() != length:
                raise ValueError(
                    f"pymc_subsample.Data {name!r}: dimension {dim!r} has length "
                    f"{model.dim_lengths[dim].eval()} in the model, the source {length}"
                )
    model.add_named_variable(var, dims=dims)
    return var


def is_placeholder(var) -> bool:
    """Return True for the placeholder of an out-of-core input (:func:`Data`)."""
    owner = getattr(var, "owner", None)
    return owner is not None and isinstance(owner.op, OutOfCorePlaceholder)


def source_of(var) -> OutOfCoreSource:
    """Return the source of an out-of-core placeholder.

    Raises
    ------
    OutOfCoreReadError
        When this process holds no source for it (a model unpickled in
        another process: build the model there).
    """
    found = _SOURCES.get(var.owner.op.token)
    if found is None:
        raise OutOfCoreReadError(
            f"pymc_subsample.Data {var.name!r} was made in another process; its source is "
            "not known here: build the model (pymc_subsample.Data calls included) in this "
            "process, or sample with cores=1 or the fork start method"
        )
    return found


def find_out_of_core(graph) -> list:
    """Return the out-of-core placeholders ``graph`` reads, in the order first met."""
    return [v for v in ancestors([graph]) if is_placeholder(v)]

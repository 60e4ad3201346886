r"""The data of the per-observation terms: their ``pm.Data`` inputs, checks and permuted copy.

The terms are evaluated on subsets of rows, so every per-observation input
(observed values and covariates whose first dimension indexes the :math:`N`
observations) must be a ``pm.Data`` (a shared variable) that can be indexed:
this module finds those inputs (:func:`find_data`), refuses NumPy arrays baked
into the graph and missing values, watches the inputs for ``pm.set_data``
(:class:`DataWatch`), and keeps the row-permuted copy that races read in
blocks or windows (:class:`PermutedCopy`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs

from ..validation import ArgumentTypeError
from .blocks import ModelSplitError, depends_on, per_observation

__all__ = [
    "DataWatch",
    "PermutedCopy",
    "check_rows",
    "find_data",
    "has_missing",
    "missing_data_fix",
    "new_row_count",
    "observed_terms",
    "reject_numpy_inputs",
    "reject_numpy_observed",
    "slice_rows",
]


def slice_rows(positions: slice, n_obs: int) -> np.ndarray:
    """Return the int64 indices of a slice of ``n_obs`` positions."""
    return np.arange(*positions.indices(n_obs), dtype=np.int64)


def missing_data_fix(name: str) -> str:
    """Return what to do with missing values of a subsampled likelihood (``name``: where)."""
    return (
        f"{name} holds missing values (NaN or masked entries), which a subsampled likelihood "
        "cannot evaluate and pm.Data does not accept: drop those rows (from every "
        "per-observation input, observed values and covariates alike) before wrapping the "
        "data in pm.Data, or model the missing values outside the subsampled likelihood (a "
        "separate observed variable for the incomplete rows, updated by an exact step)"
    )


def has_missing(value) -> bool:
    """Return True for a masked array or a float array with a NaN (no N booleans made)."""
    if np.ma.isMaskedArray(value):
        return True
    value = np.asarray(value)
    if value.dtype.kind not in "fc" or value.size == 0:
        return False
    if not np.isnan(np.add.reduce(value, axis=None)):
        return False
    return bool(np.isnan(value).any())  # NaN sum: a NaN entry, or +inf and -inf


def reject_numpy_observed(model, rv) -> None:
    """Refuse observed data of ``rv`` that are a NumPy array (or hold missing values).

    Raises
    ------
    ModelSplitError
        Naming the fix: wrap the data in ``pm.Data``, drop the missing rows.
    """
    value = model.rvs_to_values[rv]
    base = rv.name.removesuffix("_observed")
    imputed = base != rv.name and f"{base}_unobserved" in model.named_vars
    if isinstance(value, Constant) and (imputed or has_missing(value.data)):
        raise ModelSplitError(
            missing_data_fix(f"the observed data of {base!r}")
            + (
                f" (PyMC split {base!r} into {rv.name!r} and the imputed '{base}_unobserved')"
                if imputed
                else ""
            )
        )
    if isinstance(value, Constant) and np.ndim(value.data) >= 1:
        raise ModelSplitError(
            f"the observed data of {rv.name!r} is a NumPy array baked into the graph, so its "
            f"terms cannot be evaluated on a subset: wrap it in pm.Data "
            f"(e.g. y = pm.Data('{rv.name}_data', values); "
            f"pm.Normal('{rv.name}', ..., observed=y))"
        )


def find_data(model, loglik, data, observed: Sequence[str], n_obs: int) -> list:
    """Return the per-observation ``pm.Data`` inputs of ``loglik``: ``data``, or found.

    Without ``data``, every shared variable of the graph whose first dimension
    has ``n_obs`` entries.

    Raises
    ------
    ModelSplitError
        For an entry of ``data`` that is not a ``pm.Data`` input of the
        likelihood with ``n_obs`` rows, or when none is found.
    """
    shared = [v for v in graph_inputs([loglik]) if isinstance(v, SharedVariable)]
    if data is not None:
        known = [n for n, v in model.named_vars.items() if isinstance(v, SharedVariable)]
        if isinstance(data, str) or not isinstance(data, Sequence):
            raise ArgumentTypeError(
                f"data must be a list of pm.Data variables or their names, got {data!r}; "
                f"e.g. data={known[:2]!r}"
            )
        found = []
        for d in data:
            if isinstance(d, str) and d not in model.named_vars:
                raise ModelSplitError(
                    f"data entry {d!r} is not a variable of the model; its pm.Data "
                    f"variables are {known}"
                )
            var = model[d] if isinstance(d, str) else d
            if not isinstance(var, SharedVariable):
                raise ModelSplitError(
                    f"data entry {d!r} is not a pm.Data variable; pass pm.Data variables "
                    f"or their names: {known}"
                )
            if var not in shared:
                raise ModelSplitError(
                    f"data entry {var.name!r} is not an input of the likelihood of "
                    f"{', '.join(observed)}"
                )
            if np.shape(var.get_value(borrow=True))[:1] != (n_obs,):
                raise ModelSplitError(
                    f"data entry {var.name!r} has shape {np.shape(var.get_value())}; "
                    f"its first dimension must index the {n_obs} observations"
                )
            found.append(var)
        return found
    found = [
        v
        for v in shared
        if np.ndim(v.get_value(borrow=True)) >= 1 and np.shape(v.get_value(borrow=True))[0] == n_obs
    ]
    if not found:
        raise ModelSplitError(
            f"no pm.Data input with {n_obs} rows was found in the likelihood of "
            f"{', '.join(observed)}: wrap the observed values (and per-observation "
            "covariates) in pm.Data, or pass data=[...]"
        )
    return found


def reject_numpy_inputs(loglik, observed: Sequence[str], n_obs: int) -> None:
    """Refuse a NumPy array with ``n_obs`` rows baked into ``loglik`` (it cannot be indexed).

    Raises
    ------
    ModelSplitError
        Naming the fix: wrap it in ``pm.Data``.
    """
    for v in graph_inputs([loglik]):
        if (
            isinstance(v, Constant)
            and np.ndim(v.data) >= 1
            and np.shape(v.data)[0] == n_obs
            and n_obs > 1
        ):
            raise ModelSplitError(
                f"a NumPy array with {n_obs} rows (shape {np.shape(v.data)}) is baked "
                f"into the likelihood of {', '.join(observed)}, e.g. covariates passed as "
                "a NumPy array: wrap it in pm.Data so that it can be indexed by observation"
            )


def check_rows(data: Sequence, observed: Sequence[str], n_obs: int) -> None:
    """Refuse data without observations, or with missing values (NaN or masked entries).

    At construction and whenever new data are taken up: the one place where
    both are checked.

    Raises
    ------
    ModelSplitError
        Naming the fix.
    """
    names = ", ".join(repr(o) for o in observed)
    if n_obs < 1:
        raise ModelSplitError(
            f"the likelihood of {names} has no observations (N = 0): there is nothing "
            "to subsample; give it at least one row (pm.set_data) or use an exact step"
        )
    for d in data:
        if has_missing(d.get_value(borrow=True)):
            raise ModelSplitError(missing_data_fix(f"the data input {d.name!r}"))


class DataWatch:
    """Which ``pm.Data`` inputs were given a new array (``pm.set_data``) since the last look.

    Parameters
    ----------
    watched : sequence of SharedVariable
        The inputs to watch.

    Notes
    -----
    ``pm.set_data`` (``set_value``) puts a new array behind the input, so an
    identity test per input sees it (a fraction of a microsecond); the arrays
    are held (an id could be reused). Writing into an array in place is not
    seen.
    """

    def __init__(self, watched: Sequence):
        self.watched = list(watched)
        self.remember()

    def remember(self) -> None:
        """Remember the array behind every watched input."""
        self._seen = tuple((v.container.storage, v.get_value(borrow=True)) for v in self.watched)

    def unchanged(self) -> bool:
        """Return True when every input still holds the array last remembered."""
        for storage, seen in self._seen:
            if storage[0] is not seen:
                return False
        return True

    def changed(self) -> list[str]:
        """Return the names of the inputs that hold another array than the one remembered."""
        return [
            v.name
            for v, (storage, seen) in zip(self.watched, self._seen, strict=True)
            if storage[0] is not seen
        ]


def _rows_view(buf: np.ndarray) -> np.ndarray:
    """Return ``buf`` (C-contiguous) as a 1-D array with one element per row, for shuffles."""
    if buf.ndim == 1 or len(buf) == 0 or buf[0].nbytes == 0:
        return buf
    return buf.reshape(len(buf), -1).view(np.dtype((np.void, buf[0].nbytes))).reshape(len(buf))


def _release_copies(shared: Sequence) -> None:
    """Give the permuted copies' shared variables empty arrays (their buffers are freed)."""
    for p in shared:
        value = p.get_value(borrow=True)
        p.set_value(np.empty((0, *np.shape(value)[1:]), dtype=value.dtype), borrow=True)


def _own_buffer(buf: np.ndarray, src: np.ndarray) -> bool:
    """Return True when ``buf`` can receive a copy of ``src`` in place (a buffer of its own)."""
    return (
        isinstance(buf, np.ndarray)
        and buf.shape == src.shape
        and buf.dtype == src.dtype
        and buf.flags.c_contiguous
        and buf.flags.writeable
        and not np.may_share_memory(buf, src)
    )


class PermutedCopy:
    r"""A row-permuted copy of the per-observation inputs, the permutation kept as an RNG state.

    A window of positions read from a uniformly random start is a uniformly
    random subset of observations drawn without replacement, and a window is
    a slice (no gather). The copy holds the data themselves (no copy) until
    the first :meth:`shuffle`, which gives it buffers of its own; no index
    array of :math:`N` entries is kept (:meth:`permutation` makes one when
    asked).

    Parameters
    ----------
    data : sequence of SharedVariable
        The per-observation inputs.

    Attributes
    ----------
    shared : list of SharedVariable
        The copies, one per input, as compiled functions read them.
    values : list of numpy.ndarray
        The arrays behind :attr:`shared`, read by every gather.
    """

    def __init__(self, data: Sequence):
        self.shared = [
            pytensor.shared(d.get_value(borrow=True), name=f"{d.name}_permuted", borrow=True)
            for d in data
        ]
        self.values = [p.get_value(borrow=True) for p in self.shared]
        self._state = None
        self._perm = None
        # compiled functions read the copies through the shared variables, and Numba keeps what
        # it compiled (and so them) after the copy is gone: free the buffers then
        weakref.finalize(self, _release_copies, list(self.shared))

    def take_up(self, data: Sequence) -> None:
        """Share the inputs' new arrays, in data order (the identity) until the next shuffle."""
        self._state = None
        self._perm = None
        for d, p in zip(data, self.shared, strict=True):
            p.set_value(d.get_value(borrow=True), borrow=True)
        self.values = [p.get_value(borrow=True) for p in self.shared]

    def shuffle(self, data: Sequence, rng: np.random.Generator) -> None:
        """Redraw the permutation: copy the inputs in and shuffle their rows, in place.

        Every input is shuffled by the same draws; the permutation is the one
        ``rng.permutation(N)`` would return, and ``rng`` ends in the same state.
        """
        state = rng.bit_generator.state
        for d, p in zip(data, self.shared, strict=True):
            src = d.get_value(borrow=True)
            buf = p.get_value(borrow=True)
            if not _own_buffer(buf, src):
                buf = np.empty_like(src, order="C")
                p.set_value(buf, borrow=True)
            np.copyto(buf, src)
            rng.bit_generator.state = state
            rng.shuffle(_rows_view(buf))
        self._state = (type(rng.bit_generator), state)
        self._perm = None
        self.values = [p.get_value(borrow=True) for p in self.shared]

    def permutation(self, n_obs: int) -> np.ndarray:
        """Return the permutation of ``n_obs`` rows: position ``i`` of the copy holds its row.

        Materialised on first call after a :meth:`shuffle` (int32 below
        :math:`2^{31}` rows) from the RNG state that drew it.
        """
        if self._perm is None:
            dtype = np.int32 if n_obs < 2**31 else np.int64
            perm = np.arange(n_obs, dtype=dtype)
            if self._state is not None:
                kind, state = self._state
                gen = np.random.Generator(kind())
                gen.bit_generator.state = state
                gen.shuffle(perm)
            self._perm = perm
        return self._perm


def reject_minibatch(rv) -> None:
    """Refuse an observed variable whose data come through ``pm.Minibatch``.

    ``pm.Minibatch`` draws a random batch of rows inside the graph at every
    evaluation (for variational inference, with ``total_size``); the steps
    choose their own batches from all the rows, which then must be in the
    graph whole.

    Raises
    ------
    ModelSplitError
        Naming the variable and the fix.
    """
    from pymc.data import MinibatchIndexRV, MinibatchOp

    ops = (MinibatchIndexRV, MinibatchOp)
    nodes = [rv.owner] if rv.owner is not None else []
    seen = set()
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node.op, ops):
            raise ModelSplitError(
                f"the observed values of {rv.name} come through pm.Minibatch, which draws "
                "random rows inside the graph at every evaluation; these steps choose their "
                "own mini-batches from all the rows: pass the whole data, e.g. "
                f"pm.Data('{rv.name}_data', y) as observed, without pm.Minibatch and "
                "total_size"
            )
        nodes.extend(i.owner for i in node.inputs if i.owner is not None)


def observed_terms(model, value_vars: Sequence) -> tuple[list, list, list]:
    """Return the observed variables whose log density involves the block, by kind.

    Returns ``(per_obs, rvs, scalar)``: the per-observation log densities
    (summed over trailing event dimensions) and their observed variables,
    and the scalar log densities of the others.

    Raises
    ------
    ModelSplitError
        When no observed variable with per-observation terms depends on the
        block, or observed data are a NumPy array or hold missing values
        (:func:`reject_numpy_observed`), or come through ``pm.Minibatch``
        (:func:`reject_minibatch`).
    """
    per_obs, rvs, scalar = [], [], []
    for rv in model.observed_RVs:
        [lp] = model.logp(vars=[rv], sum=False)
        if not depends_on(lp, value_vars):
            continue
        if lp.ndim == 0:
            scalar.append(lp)
            continue
        reject_minibatch(rv)
        reject_numpy_observed(model, rv)
        per_obs.append(per_observation(lp))
        rvs.append(rv)
    if not per_obs:
        names = ", ".join(v.name for v in value_vars)
        raise ModelSplitError(
            f"no observed variable with per-observation terms depends on {names}: "
            "there is nothing to subsample; use an exact PyMC step for it"
        )
    return per_obs, rvs, scalar


def new_row_count(
    data: Sequence, observed: Sequence[str], old_n: int, counts: Callable[[], list[int]]
) -> int:
    """Return the number of rows of new data; refuse inputs that disagree on it.

    ``counts()`` returns the observed variables' numbers of observations on
    the new data (the likelihood's shapes): they must be that number too.

    Raises
    ------
    ValueError
        When the per-observation inputs no longer have one number of rows,
        or the likelihood has another number of observations (fixed by a
        ``shape=`` or a ``dims`` length).
    """
    names = ", ".join(observed)
    rows = {d.name: int(np.shape(d.get_value(borrow=True))[0]) for d in data}
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"{name} has {n}" for name, n in rows.items())
        moved = [name for name, n in rows.items() if n != old_n]
        raise ValueError(
            f"the per-observation data inputs of {names} no longer have "
            f"one number of rows ({detail}; they had {old_n}): {moved} changed length "
            "alone. Set every one of them to the new number of observations, in one "
            "pm.set_data({...}) call, before sampling"
        )
    lengths = counts()
    new_n = next(iter(rows.values()))
    if any(int(n) != new_n for n in lengths):
        raise ValueError(
            f"the likelihood of {names} has {[int(n) for n in lengths]} "
            f"observations, but its per-observation data inputs "
            f"{[d.name for d in data]} have {new_n} rows: the number of observations "
            "is fixed somewhere else in the model (a shape= or dims length); the step "
            "cannot take up the new data"
        )
    return new_n

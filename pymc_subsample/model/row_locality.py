r"""Row-locality of per-observation terms: which models can be subsampled.

Subsampling evaluates :math:`\sum_n \log f_n` on a subset of rows, so term
:math:`n` must be a function of row :math:`n` of each per-observation data
input and of the parameters, nothing else. Two lines of defence check it:

* :func:`find_row_mixing`, structural: every per-observation input is traced
  through the log-likelihood graph, keeping the axis that indexes
  observations. Operations that read other rows of it (slices or shifts along
  that axis, ``concatenate`` along it, reductions and cumulative sums over it,
  sorts, scans, matrix products that contract it, gathers along it) are
  reported with the input they act on. Operations the rule does not know
  are reported as unverified, not as mixing.
* :func:`equivariance_failure`, numerical: row-local terms are
  permutation-equivariant, :math:`f(P D) = P f(D)` for every row permutation
  :math:`P`, and a subset's terms are the full terms on those rows. Checked
  at several parameter values (draws from the prior, never only the initial
  point, where a lag coefficient may be zero); it works from :math:`N = 2`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import graph_inputs, toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.scan.op import Scan
from pytensor.tensor.basic import Alloc, Join
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.extra_ops import CumOp
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Shape, Shape_i, SpecifyShape
from pytensor.tensor.sort import ArgSortOp, SortOp
from pytensor.tensor.subtensor import AdvancedSubtensor, Subtensor

from .blocks import ModelSplitError

__all__ = [
    "LAG_FIX",
    "LOCALITY_DRAWS",
    "LOCALITY_ROWS",
    "ROW_LATENT_DOC",
    "RowMixing",
    "check_row_locality",
    "equivariance_failure",
    "find_row_mixing",
    "not_local_error",
    "reject_row_mixing",
    "row_latent_error",
]

#: Draws from the prior at which :func:`check_row_locality` checks the terms (with the
#: initial point).
LOCALITY_DRAWS = 3

#: Rows of the data on which :func:`check_row_locality` checks the terms (all of them when
#: there are fewer).
LOCALITY_ROWS = 2**16

#: The fix named by every refusal of a model whose terms read other rows.
LAG_FIX = (
    "Subsampling needs term n to read row n of the data only. Put lagged or "
    "neighbouring values in pm.Data columns built outside the model, e.g. "
    "y_lag = pm.Data('y_lag', y[:-1]); pm.Normal('y', phi * y_lag, observed=pm.Data('y', y[1:])) "
    "(as the ARCH example does), or update this block with an exact PyMC step (NUTS, "
    "CategoricalGibbsMetropolis)"
)


#: Where the refusal of a per-observation latent block points for the snippets.
ROW_LATENT_DOC = "docs/howto/accepted_models.md, 'A per-observation latent as the block'"


def row_latent_error(names: Sequence[str], point: dict, observed: str) -> ModelSplitError:
    """Return the refusal of a block with one value per observation (a per-row latent).

    Such a block is not a parameter of the terms that a subset of rows can
    estimate: each row's term reads its own element. The fix named depends on
    the block's kind: :class:`~pymc_subsample.steps.row_latent.RowLatentGibbs`
    (PyMC's ``CategoricalGibbsMetropolis`` where that refuses) or marginalising
    it (discrete), NUTS (continuous).
    """
    shapes = ", ".join(f"{n} (shape {np.shape(point[n])})" for n in names)
    discrete = all(np.asarray(point[n]).dtype.kind in "iub" for n in names)
    if discrete:
        fix = (
            "Draw it with pymc_subsample.RowLatentGibbs([z]): exact, one pass over the rows "
            "per value of z, where each element's conditional reads its own row (else "
            "PyMC's pm.CategoricalGibbsMetropolis([z]), exact and far slower), and keep this "
            "package's steps for the parameters; or marginalise it out of the likelihood, e.g. "
            "pm.NormalMixture('y', w=w, mu=mu, sigma=sigma, observed=y) instead of "
            "z = pm.Categorical('z', w, shape=N); pm.Normal('y', mu[z], sigma, observed=y) "
            "(pm.Mixture for other components)"
        )
    else:
        fix = "Draw it with PyMC's NUTS and keep this package's steps for the parameters"
    return ModelSplitError(
        f"the block {shapes} is a per-observation latent variable: it has one value per "
        f"observation of {observed}, and term n reads element n of it. A subset of rows "
        "estimates a sum of terms over parameters shared by all rows, not a value per row, "
        f"so this block cannot be subsampled. {fix}. See {ROW_LATENT_DOC}"
    )


@dataclass(frozen=True)
class RowMixing:
    """An operation of the likelihood graph that reads across observations.

    Attributes
    ----------
    operation : str
        What it does, in words (e.g. ``"a slice along the observation axis (y[:-1], y[1:])"``).
    inputs : tuple of str
        The per-observation data inputs whose rows it mixes.
    definite : bool
        True when the operation certainly mixes rows; False when the rule
        does not know the operation (the numerical check then decides).
    """

    operation: str
    inputs: tuple[str, ...]
    definite: bool = True

    def describe(self) -> str:
        """One line naming the operation and the data inputs."""
        return f"{self.operation} on {', '.join(repr(n) for n in self.inputs)}"


@dataclass(frozen=True)
class _Row:
    """A variable whose axis ``axis`` indexes observations, reading rows of ``sources``."""

    axis: int
    sources: frozenset


_OPAQUE = {
    CumOp: "a cumulative sum or product over the observations (cumsum, a random walk)",
    SortOp: "a sort of the observations",
    ArgSortOp: "an argsort of the observations",
    Scan: "a scan over the observations (pm.AR, a random walk, a recursion written with scan)",
}


def _full_slice(entry) -> bool:
    return isinstance(entry, slice) and entry == slice(None, None, None)


def find_row_mixing(output: Variable, data: Sequence[Variable]) -> list[RowMixing]:
    """Trace the per-observation inputs ``data`` (axis 0) through ``output``'s graph.

    Parameters
    ----------
    output : TensorVariable
        The per-observation terms, a vector whose axis 0 indexes observations.
    data : sequence of TensorVariable
        The per-observation inputs, observations along axis 0.

    Returns
    -------
    list of RowMixing
        The operations that read across observations (``definite``) or that
        the rule cannot follow (not ``definite``); empty when every term
        provably reads its own row only.
    """
    state: dict = {d: _Row(0, frozenset([d.name or str(d)])) for d in data}
    found: dict = {}

    def report(text: str, sources, definite: bool = True) -> None:
        key = (text, definite)
        found[key] = found.get(key, frozenset()) | sources

    _propagate([output], state, report)
    final = state.get(output)
    if final is not None and final.axis != 0 and output.ndim > 0:
        report("a transpose that moves the observation axis", final.sources)
    return [
        RowMixing(text, tuple(sorted(srcs)), definite)
        for (text, definite), srcs in sorted(found.items(), key=lambda kv: not kv[0][1])
    ]


def reject_row_mixing(mixing: Sequence[RowMixing], observed: Sequence[str], block: str) -> None:
    """Refuse terms whose graph certainly reads other observations' rows.

    Parameters
    ----------
    mixing : sequence of RowMixing
        What :func:`find_row_mixing` found in the terms' graph; only the
        ``definite`` entries are refused (the others are checked numerically,
        :func:`check_row_locality`).
    observed : sequence of str
        The observed variables whose terms these are.
    block : str
        The block's variables, for the message.

    Raises
    ------
    ModelSplitError
        Naming every definite mixing and the fix (:data:`LAG_FIX`).
    """
    definite = [m for m in mixing if m.definite]
    if definite:
        found = "; ".join(m.describe() for m in definite)
        raise ModelSplitError(
            f"the likelihood terms of {', '.join(observed)} (for {block}) read other "
            f"observations' rows: {found}. {LAG_FIX}"
        )


def _value_nodes(outputs: Sequence[Variable]) -> set:
    """Return the nodes the outputs' values come from (not parameter-check conditions)."""
    seen, stack = set(), [o.owner for o in outputs if o.owner is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        inputs = node.inputs[:1] if isinstance(node.op, CheckAndRaise) else node.inputs
        stack.extend(v.owner for v in inputs if v.owner is not None and v.owner not in seen)
    return seen


def _propagate(outputs: Sequence[Variable], state: dict, report) -> None:
    """Set ``state`` (variable -> :class:`_Row`) over the graph of ``outputs``.

    Only the nodes that the values come from are followed: the conditions of
    parameter checks (e.g. ``all(0 <= p <= 1)`` over every row) gate the
    whole log density and mix no rows into a term.
    """
    value_nodes = _value_nodes(outputs)
    for node in toposort(outputs):
        if node not in value_nodes:
            continue
        ins = [state.get(v) for v in node.inputs]
        rows = [r for r in ins if r is not None]
        if not rows:
            continue
        sources = frozenset().union(*(r.sources for r in rows))
        if isinstance(node.op, OpFromGraph):
            inner = node.op.fgraph
            inner_state = {v: r for v, r in zip(inner.inputs, ins, strict=True) if r is not None}
            _propagate(inner.outputs, inner_state, report)
            for out, inner_out in zip(node.outputs, inner.outputs, strict=True):
                if inner_out in inner_state:
                    state[out] = inner_state[inner_out]
            continue
        result = _follow(node.op, node, ins, report, sources)
        if result is not None:
            state[node.outputs[0]] = result


def _follow(op, node, ins, report, sources) -> _Row | None:
    """Return the observation axis of ``node``'s first output (None: not row-indexed)."""
    if isinstance(op, Shape | Shape_i):
        return None  # the number of rows, not their values
    if isinstance(op, CheckAndRaise):  # parameter checks: the value passes through input 0
        return ins[0]
    if isinstance(op, SpecifyShape):
        return ins[0]
    for kind, text in _OPAQUE.items():
        if isinstance(op, kind):
            report(text, sources)
            return None
    if isinstance(op, Elemwise):
        axes = {r.axis for r in ins if r is not None}
        if len(axes) > 1:
            report("an outer operation of the observations against themselves", sources)
            return None
        return _Row(axes.pop(), sources)
    if isinstance(op, DimShuffle):
        row = ins[0]
        if row.axis not in op.new_order:
            report("a dimension drop of the observation axis", sources, definite=False)
            return None
        return _Row(list(op.new_order).index(row.axis), sources)
    if isinstance(op, CAReduce):
        row = ins[0]
        axes = range(node.inputs[0].ndim) if op.axis is None else op.axis
        if row.axis in axes:
            name = type(op.scalar_op).__name__.lower()
            report(f"a reduction ({name}) over the observations, e.g. a mean or total", sources)
            return None
        return _Row(row.axis - sum(a < row.axis for a in axes), sources)
    if isinstance(op, Subtensor):
        return _subtensor(op, ins, report, sources)
    if isinstance(op, AdvancedSubtensor):
        return _advanced_subtensor(op, ins, report, sources)
    if isinstance(op, Join):
        return _join(node, ins, report, sources)
    if isinstance(op, Alloc):
        row = ins[0]
        if row is None or any(r is not None for r in ins[1:]):
            report("an allocation shaped by the data", sources, definite=False)
            return None
        return _Row(row.axis + node.outputs[0].ndim - node.inputs[0].ndim, sources)
    if isinstance(op, Dot):
        return _dot(node.inputs[0].ndim, node.inputs[1].ndim, ins, report, sources)
    if isinstance(op, Blockwise):
        return _blockwise(op, node, ins, report, sources)
    report(f"an operation the rule does not follow ({op})", sources, definite=False)
    return None


def _subtensor(op, ins, report, sources) -> _Row | None:
    row = ins[0]
    if any(r is not None for r in ins[1:]):
        report("an index computed from the data", sources, definite=False)
        return None
    idx = list(op.idx_list)
    if row.axis < len(idx):
        entry = idx[row.axis]
        if not _full_slice(entry):
            what = "an index" if isinstance(entry, int) else "a slice"
            report(f"{what} along the observation axis (y[:-1], y[1:], y[0])", sources)
            return None
    dropped = sum(isinstance(e, int) for e in idx[: row.axis])
    return _Row(row.axis - dropped, sources)


def _advanced_subtensor(op, ins, report, sources) -> _Row | None:
    x, indices = ins[0], ins[1:]
    idx = list(op.idx_list)
    if x is not None:
        entry = idx[x.axis] if x.axis < len(idx) else slice(None)
        if not _full_slice(entry):
            report("a gather along the observation axis (y[index])", sources)
            return None
        if all(r is None for r in indices):
            if any(isinstance(e, int) for e in idx[: x.axis]):  # constant indices before it
                report("an advanced index before the observation axis", sources, definite=False)
                return None
            return _Row(x.axis, sources)
        report("a gather of observations by observation-indexed positions", sources)
        return None
    # a table (parameters, group-level values) gathered by per-observation indices
    positions = [k for k, e in enumerate(idx) if isinstance(e, int)]
    rows = [r for r in indices if r is not None]
    axes = {r.axis for r in rows}
    consecutive = positions == list(range(positions[0], positions[0] + len(positions)))
    if len(axes) != 1 or not consecutive:
        report("an advanced index the rule does not follow", sources, definite=False)
        return None
    return _Row(positions[0] + axes.pop(), sources)


def _join(node, ins, report, sources) -> _Row | None:
    axis_var, parts = node.inputs[0], ins[1:]
    try:
        axis = int(axis_var.data)  # a constant axis
    except AttributeError:
        report("a concatenation along a computed axis", sources, definite=False)
        return None
    ndim = node.outputs[0].ndim
    axis = axis % ndim
    rows = [r for r in parts if r is not None]
    if any(r.axis == axis for r in rows) or len({r.axis for r in rows}) > 1:
        report("a concatenation along the observation axis (a shift or roll)", sources)
        return None
    return _Row(rows[0].axis, sources)


def _dot(ndim_a: int, ndim_b: int, ins, report, sources) -> _Row | None:
    a, b = ins[0], ins[1]
    if a is not None and b is not None:
        report("a matrix product of the observations with themselves", sources)
        return None
    if a is not None:
        if a.axis == ndim_a - 1:
            report("a matrix product that sums over the observations", sources)
            return None
        return _Row(a.axis, sources)
    contracted = 0 if ndim_b == 1 else ndim_b - 2
    if b.axis == contracted:
        report("a matrix product that mixes the observations (A @ y)", sources)
        return None
    return _Row(ndim_a - 1 + b.axis - (b.axis > contracted), sources)


def _blockwise(op, node, ins, report, sources) -> _Row | None:
    out_batch = node.outputs[0].ndim - len(op.outputs_sig[0])
    axes = set()
    core_rows = []
    for var, row, sig in zip(node.inputs, ins, op.inputs_sig, strict=True):
        if row is None:
            continue
        batch = var.ndim - len(sig)
        if row.axis < batch:
            axes.add(row.axis + out_batch - batch)
        else:
            core_rows.append((var, row))
    if core_rows:
        if isinstance(op.core_op, Dot) and not axes and len(node.inputs) == 2:
            core = [
                None if r is None else _Row(r.axis - (v.ndim - len(s)), r.sources)
                for v, r, s in zip(node.inputs, ins, op.inputs_sig, strict=True)
            ]
            row = _dot(len(op.inputs_sig[0]), len(op.inputs_sig[1]), core, report, sources)
            return None if row is None else _Row(row.axis + out_batch, sources)
        report(f"an operation on whole columns of observations ({op})", sources, definite=False)
        return None
    if len(axes) > 1:
        report("an outer operation of the observations against themselves", sources)
        return None
    return _Row(axes.pop(), sources)


def equivariance_failure(
    terms: Callable[[Sequence[np.ndarray]], np.ndarray],
    rows: Sequence[np.ndarray],
    rng: np.random.Generator,
    *,
    subset: int = 64,
    permuted: int = 4096,
) -> str | None:
    """Check that ``terms(rows)`` is subset-consistent and permutation-equivariant in the rows.

    Parameters
    ----------
    terms : callable
        ``terms(rows) -> (K, n)``: the terms of ``K`` candidates on the given
        rows of every per-observation input (parameters held fixed).
    rows : sequence of numpy.ndarray
        Every row of each per-observation input (axis 0: the :math:`N`
        observations).
    rng : numpy.random.Generator
        Draws the subsets and the permutation.
    subset : int
        Size of the proper subset :math:`S` compared with the full terms.
    permuted : int
        At most this many rows :math:`R` are permuted (all when :math:`N` is smaller).

    Returns
    -------
    str or None
        What failed, in words, or None when :math:`f(D_S) = f(D)_S` and
        :math:`f(P D_R) = P f(D_R)` hold (NaN where NaN, to a relative 1e-7).
    """
    n_obs = len(rows[0])
    if n_obs < 2:
        return None
    full = np.asarray(terms(rows))

    def on(index):
        return np.asarray(terms([r.take(index, axis=0) for r in rows]))

    def differ(a, b) -> bool:
        return a.shape != b.shape or not np.allclose(a, b, rtol=1e-7, atol=1e-10, equal_nan=True)

    part = np.sort(rng.choice(n_obs, size=min(subset, n_obs - 1), replace=False))
    if differ(on(part), full[:, part]):
        return "the terms of a subset of the rows differ from the full terms on those rows"
    if n_obs <= permuted:
        index, base = np.arange(n_obs), full
    else:
        index = np.sort(rng.choice(n_obs, size=permuted, replace=False))
        base = on(index)
    perm = rng.permutation(len(index))
    if np.array_equal(perm, np.arange(len(index))):
        perm = np.roll(perm, 1)
    if differ(on(index[perm]), base[:, perm]):
        return "permuting the rows did not permute the terms"
    return None


def check_row_locality(
    rows_at: Callable[[dict], Callable], parts: list, points: Sequence[dict], refuse: Callable
) -> None:
    r"""Check numerically that the terms are row-local at each of ``points``.

    At each point (the initial point and draws from the prior: a lag
    coefficient at its initial value 0 hides the lag), the terms must be
    permutation-equivariant in the rows and a subset's terms the full terms on
    those rows (:func:`equivariance_failure`). This also catches what
    :func:`find_row_mixing` leaves unverified, and inputs with :math:`N` rows
    that are not indexed. Above :data:`LOCALITY_ROWS` rows the "full" data
    are those rows drawn at random (in their order): terms that read other
    rows (a lag, a statistic of the column) differ there too, and the check
    holds no array of :math:`N` terms.

    Parameters
    ----------
    rows_at : callable
        ``rows_at(point)`` returns the terms at ``point`` as a function of
        given rows (one array per per-observation input).
    parts : list
        The rows to check on, one list of arrays per group of observations
        (checked apart); restricted in place above :data:`LOCALITY_ROWS`.
    points : sequence of dict
        The points.
    refuse : callable
        ``refuse(point, failure)`` raises for a failure (a description).
    """
    rng = np.random.default_rng(0)
    for i, part in enumerate(parts):
        n_part = len(part[0]) if part else 0
        if n_part > LOCALITY_ROWS:  # the data restricted to random rows, kept in order
            keep = np.sort(rng.choice(n_part, size=LOCALITY_ROWS, replace=False))
            parts[i] = [r.take(keep, axis=0) for r in part]
    for at in points:
        evaluate = rows_at(at)
        for part in parts:
            try:
                failure = equivariance_failure(evaluate, part, rng)
            except Exception as err:  # the terms could not even be evaluated on a subset
                failure = f"evaluating them on a subset failed ({type(err).__name__}: {err})"
            if failure is not None:
                refuse(at, failure)


def not_local_error(
    failure: str,
    point: dict,
    *,
    observed: Sequence[str],
    block: str,
    input_names: Sequence[str],
    counts: Sequence[int],
    mixing: Sequence[RowMixing],
    graph: Variable,
    data: Sequence,
    indexed: Sequence[str],
    block_vars: Sequence[str] = (),
) -> ModelSplitError:
    """Return the refusal of terms that are not row-local, naming the likely cause and fix.

    A block with one value per observation (one of ``block_vars`` with one of
    ``counts`` rows: :func:`row_latent_error`) is named first; then other
    per-observation latent variables (an input of ``point`` with one of
    ``counts`` rows); else the graph's unverified operations
    (``mixing``) and the shared inputs of ``graph`` read whole (not in
    ``data``).
    """

    def per_row(n: str) -> bool:
        return np.ndim(point[n]) >= 1 and np.shape(point[n])[0] in counts

    names = ", ".join(observed)
    if any(per_row(n) for n in block_vars):
        return row_latent_error([n for n in block_vars if per_row(n)], point, names)
    latent = [n for n in input_names if per_row(n)]
    if latent:
        return ModelSplitError(
            f"the likelihood of {names} depends on per-observation "
            f"latent variable(s) {latent}: their terms are not functions of {block} and the "
            f"data alone ({failure}). Subsampling does not apply; marginalize them or use "
            "exact steps"
        )
    unverified = [m.describe() for m in mixing]
    detail = f" The graph has {'; '.join(unverified)}." if unverified else ""
    foreign = [
        f"{v.name!r} ({np.shape(v.get_value(borrow=True))[0]} rows)"
        for v in graph_inputs([graph])
        if isinstance(v, SharedVariable)
        and np.ndim(v.get_value(borrow=True)) >= 1
        and v not in data
    ]
    if foreign:
        detail += (
            f" Inputs read whole, not by observation: {', '.join(foreign)}; a slice of "
            "one of them aligned with the observations is a lag."
        )
    wide = [
        f"{v.name!r} has shape {np.shape(v.get_value(borrow=True))}"
        for v in data
        if np.ndim(v.get_value(borrow=True)) >= 2
        and np.shape(v.get_value(borrow=True))[0] < max(np.shape(v.get_value(borrow=True))[1:])
    ]
    if wide:
        detail += (
            f" The observations are the rows (first axis) of the data, and {', '.join(wide)}: "
            "if the observations lie along a later axis, put it first (e.g. pm.Data(name, "
            "Y.T), with the parameters broadcasting along the first axis)."
        )
    return ModelSplitError(
        f"the likelihood terms of {names} are not row-local: {failure} "
        "at a draw from the prior, so term n reads more than row n of the data "
        f"(indexed inputs: {list(indexed)}).{detail} If a per-observation "
        "pm.Data input is missing from the indexed ones, pass data=[...] listing every one. "
        + LAG_FIX
    )

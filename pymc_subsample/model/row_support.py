r"""Supports that depend on the drawn value: candidates that are impossible on a few rows.

A per-observation term can be :math:`-\infty` on some rows and not on others as
the block :math:`\theta` varies: a likelihood whose support is bounded by the
parameter (``DiscreteUniform(1, M)``, ``Uniform(0, theta)``, a truncation point, a
count capped by ``Binomial(n=M, ...)``). A race reads a few rows, rarely those,
while the other terms may favour the impossible value by hundreds of nats. So a
candidate may enter a race only once it is known to be finite on *every* row:

.. math:: \theta \text{ feasible} \iff \forall n:\ \neg B_n(\theta),

:math:`B_n(\theta)` the condition under which row :math:`n`'s term is
:math:`-\infty`. PyMC writes these conditions into the log density as
``switch(B, -inf, logp)`` (or ``switch(C, logp, -inf)``, :math:`B = \neg C`).
:func:`find_support_conditions` reads them from the graph of the terms, and
:func:`any_over_rows` rewrites :math:`\exists n: B_n(\theta)` into a function of
:math:`\theta` and a few statistics of the data computed once per data version:
a comparison of a data expression :math:`d_n` with a row-free one
:math:`p(\theta)` holds on some row iff it holds at :math:`\min_n d_n` or
:math:`\max_n d_n`,

.. math:: \exists n: d_n < p(\theta) \iff \min_n d_n < p(\theta), \qquad
          \exists n: d_n > p(\theta) \iff \max_n d_n > p(\theta),

and :math:`\exists n: (A_n \lor B_n) \iff (\exists n: A_n) \lor (\exists n: B_n)`
(negations pushed to the comparisons). :class:`RowSupport` holds the result:
``"none"`` (no such condition: every candidate is finite on all rows or on none),
``"bounds"`` (the check above, at a cost that does not grow with :math:`N`) or
``"unknown"`` (a condition that does not reduce, or one under another switch: the
steps then decide exactly, and say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.logprob.utils import CheckParameterValue
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import graph_inputs, io_toposort
from pytensor.scalar import basic as ps
from pytensor.tensor.basic import Alloc, get_underlying_scalar_constant_value
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.shape import Shape, Shape_i, SpecifyShape
from pytensor.tensor.subtensor import AdvancedSubtensor

from .batched import vectorize_per_point
from .function_cache import compile_cached
from .tiered import no_c_compilation

__all__ = [
    "SUPPORT_MODES",
    "RowSupport",
    "Statistic",
    "SupportCondition",
    "any_over_rows",
    "find_support_conditions",
]

#: What :class:`RowSupport` knows of a block's support: no candidate-dependent condition,
#: a check whose cost does not grow with N, or a condition that the steps cannot check
#: cheaply (they then decide exactly).
SUPPORT_MODES = ("none", "bounds", "unknown")


class _Unsupported(Exception):
    """A condition that does not reduce to statistics of the data."""


@dataclass(frozen=True)
class Statistic:
    r"""A statistic of the data that a placeholder stands for in a support check.

    ``outputs`` are graphs of the data alone; ``groups`` is None when the single
    output is the statistic itself (a minimum, maximum or "any" over rows, dims
    kept: ``how``), else the number :math:`G` of groups: the outputs are then a
    row expression :math:`d_n` and a group index :math:`g_n`, and the statistic
    is :math:`\max_{n: g_n = k} d_n` (``how="max"``) or the minimum, for
    :math:`k = 0..G-1` (:math:`\mp\infty` for an empty group). Statistics of
    disjoint sets of rows combine (:meth:`combine`) into that of their union:
    how they are computed chunk by chunk out of core.
    """

    holder: Variable
    outputs: tuple
    how: str = "max"
    groups: int | None = None

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Return the statistic of two disjoint sets of rows from theirs."""
        return np.minimum(a, b) if self.how == "min" else np.maximum(a, b)

    def value(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Return the statistic from the values of :attr:`outputs`."""
        if self.groups is None:
            return np.asarray(arrays[0])
        rows, index = (np.asarray(a) for a in arrays)
        big = np.inf if self.how == "min" else -np.inf
        out = np.full(self.groups, big)
        (np.minimum if self.how == "min" else np.maximum).at(out, index, rows)
        return out


@dataclass(frozen=True)
class SupportCondition:
    r"""A row condition :math:`B_n(\theta)` under which a term is :math:`-\infty`.

    ``condition`` is a boolean graph over the rows; ``negated``: the term is
    :math:`-\infty` where it is False (``switch(C, logp, -inf)``); ``direct``: the
    switch's :math:`-\infty` reaches the terms unmasked (through sums, fills and
    parameter checks only), so the condition is exact.
    """

    condition: Variable
    negated: bool
    direct: bool


def _is_neg_inf(var) -> bool:
    try:
        value = get_underlying_scalar_constant_value(var)
    except NotScalarConstantError:
        return False
    return bool(np.isneginf(value))


def _value_inputs(node) -> list:
    """Return the inputs of ``node`` its output's values read (not those giving only shapes)."""
    op = node.op
    if isinstance(op, Shape | Shape_i):
        return []
    if isinstance(op, Alloc | SpecifyShape):
        return [node.inputs[0]]
    if isinstance(_scalar_op(node), ps.Second):  # fill: x's shape, y's values
        return [node.inputs[1]]
    return list(node.inputs)


def _reads(var, which: set) -> bool:
    """Return True when the values of ``var`` depend on a variable of ``which``."""
    seen, stack = set(), [var]
    while stack:
        v = stack.pop()
        if v in which:
            return True
        if v in seen or v.owner is None:
            continue
        seen.add(v)
        stack.extend(_value_inputs(v.owner))
    return False


def _never(cond, negated: bool) -> bool:
    """Return True when ``cond`` (negated: its negation) is False whatever the inputs.

    A conjunction with a constant False part (e.g. ``log(p) == -inf`` for a constant
    ``p`` in a ``Binomial``'s ``xlogy``), or a constant condition.
    """
    inputs = list(graph_inputs([cond]))
    if all(isinstance(v, Constant) for v in inputs):
        value = np.asarray(cond.eval())
        return not (~value if negated else value).any()
    node = cond.owner
    scalar = None if node is None else _scalar_op(node)
    if isinstance(scalar, ps.AND) and not negated:
        return any(_never(c, False) for c in node.inputs)
    if isinstance(scalar, ps.OR) and negated:
        return any(_never(c, True) for c in node.inputs)
    if isinstance(scalar, ps.Invert):
        return _never(node.inputs[0], not negated)
    return False


def _scalar_op(node):
    return node.op.scalar_op if isinstance(node.op, Elemwise) else None


def _preserving_inputs(node) -> list:
    r"""Return the inputs of ``node`` whose :math:`-\infty` reaches its output unmasked."""
    op, scalar = node.op, _scalar_op(node)
    if isinstance(scalar, ps.Add):
        return list(node.inputs)
    if isinstance(scalar, ps.Sub):
        return [node.inputs[0]]
    if isinstance(scalar, ps.Second):  # fill: the value of its second input
        return [node.inputs[1]]
    if isinstance(scalar, ps.Identity | ps.Cast):
        return [node.inputs[0]]
    if isinstance(op, CheckParameterValue | Alloc | DimShuffle | SpecifyShape):
        return [node.inputs[0]]
    if isinstance(op, CAReduce) and isinstance(op.scalar_op, ps.Add):
        return [node.inputs[0]]
    return []


def find_support_conditions(graph, block: Sequence, data: Sequence) -> list[SupportCondition]:
    r"""Return the :math:`-\infty` switches of ``graph`` whose condition reads the block and data.

    Parameters
    ----------
    graph : TensorVariable
        The per-observation terms (shape ``(N,)``).
    block : sequence of TensorVariable
        The block's value variables.
    data : sequence of TensorVariable
        The per-observation inputs (their rows index the terms).

    Returns
    -------
    list of SupportCondition
        One per ``switch`` with a constant :math:`-\infty` branch whose condition
        depends on both the block and the per-row data: the conditions under
        which a row's term is :math:`-\infty` depending on the block's value.
    """
    block, data = set(block), set(data)
    nodes = io_toposort(list(graph_inputs([graph])), [graph])
    # from the output down: variables whose -inf reaches the output unmasked ("direct"), and
    # those that reach it at all ("live": not only through a switch branch never taken)
    direct, live = {graph}, {graph}
    for node in reversed(nodes):
        if not any(out in live for out in node.outputs):
            continue
        inputs = list(node.inputs)
        if isinstance(_scalar_op(node), ps.Switch):
            cond, if_true, if_false = inputs
            inputs = [cond] + [if_true] * (not _never(cond, False))
            inputs += [if_false] * (not _never(cond, True))
        live.update(inputs)
        if any(out in direct for out in node.outputs):
            direct.update(_preserving_inputs(node))
    found = []
    for node in nodes:
        if not isinstance(_scalar_op(node), ps.Switch) or node.outputs[0] not in live:
            continue
        cond, if_true, if_false = node.inputs
        if _is_neg_inf(if_true):
            negated = False
        elif _is_neg_inf(if_false):
            negated = True
        else:
            continue
        if _reads(cond, block) and _reads(cond, data) and not _never(cond, negated):
            found.append(SupportCondition(cond, negated, node.outputs[0] in direct))
    return found


_FLIP = {ps.LT: pt.ge, ps.LE: pt.gt, ps.GT: pt.le, ps.GE: pt.lt}
_SAME = {ps.LT: pt.lt, ps.LE: pt.le, ps.GT: pt.gt, ps.GE: pt.ge}
#: for ``d OP p`` with ``d`` the row side: the reduction over rows that decides "some row"
_ROW_SIDE_LEFT = {pt.lt: "min", pt.le: "min", pt.gt: "max", pt.ge: "max"}
_ROW_SIDE_RIGHT = {pt.lt: "max", pt.le: "max", pt.gt: "min", pt.ge: "min"}


def any_over_rows(
    condition, negated: bool, data: Sequence, values: Sequence
) -> tuple[Variable, list[Statistic]]:
    r"""Rewrite :math:`\exists n: B_n(\theta)` as a row-free graph and statistics of the data.

    Parameters
    ----------
    condition : TensorVariable
        A boolean graph over the rows (rows on axis 0).
    negated : bool
        Rewrite :math:`\exists n: \neg B_n` instead.
    data : sequence of TensorVariable
        The per-observation inputs.
    values : sequence of TensorVariable
        Every value variable of the model (what varies from draw to draw).

    Returns
    -------
    tuple
        ``(check, statistics)``: ``check`` a boolean graph, with the rows reduced
        (keeping the other axes), whose ``any()`` is :math:`\exists n: B_n(\theta)`;
        ``statistics`` the :class:`Statistic` records of the data that
        placeholders stand for in ``check``: a minimum, maximum or "any" over
        rows, or per group when the block enters a comparison as ``p[g_n]``,
        ``g`` a row's group index in the data
        (:math:`\exists n: d_n > p_{g_n} \iff \exists k: \max_{g_n = k} d_n > p_k`).

    Raises
    ------
    _Unsupported
        When the condition does not reduce (an equality between rows and the
        block, a conjunction of two row conditions, a comparison whose sides
        both mix the rows and the block).
    """
    data, values = set(data), set(values)
    statistics: list[Statistic] = []

    reads = _reads

    def statistic(expr, how):
        stat = {"min": pt.min, "max": pt.max, "any": pt.any}[how](expr, axis=0, keepdims=True)
        holder = stat.type()
        statistics.append(Statistic(holder, (stat,), how))
        return holder

    def grouped(expr, how, index, n_groups):
        holder = pt.vector(dtype="float64", shape=(n_groups,))
        statistics.append(Statistic(holder, (expr, index), how, n_groups))
        return holder

    def ungather(side):
        """``f(p)[g]`` with ``p`` the block's, ``g`` a row index, ``f`` elementwise: ``f(p), g``."""
        node = side.owner
        if node is None:
            return None
        if isinstance(node.op, AdvancedSubtensor) and len(node.inputs) == 2:
            base, index = node.inputs
            if (
                not reads(base, data)
                and index.ndim == 1
                and index.dtype.startswith(("int", "uint"))
                and not reads(index, values)
                and base.ndim == 1
                and base.type.shape[0] is not None
            ):
                return base, index
            return None
        if isinstance(node.op, Elemwise):
            mixed = [x for x in node.inputs if reads(x, data)]
            if len(mixed) != 1 or any(x.ndim > 1 for x in node.inputs):
                return None
            found = ungather(mixed[0])
            if found is None:
                return None
            base, index = found
            inputs = [base if x is mixed[0] else x for x in node.inputs]
            return node.op(*inputs), index
        return None

    def rewrite(var, neg):
        if not reads(var, data):  # the same on every row
            return pt.invert(var) if neg else var
        if not reads(var, values):  # the data alone: "some row" is a statistic
            return statistic(pt.invert(var) if neg else var, "any")
        node = var.owner
        scalar = None if node is None else _scalar_op(node)
        if isinstance(scalar, ps.Invert):
            return rewrite(node.inputs[0], not neg)
        if isinstance(scalar, ps.OR | ps.AND):
            a, b = node.inputs
            if isinstance(scalar, ps.OR) != neg:  # a disjunction: "some row" of each
                return pt.or_(rewrite(a, neg), rewrite(b, neg))
            # a conjunction: exact only when one side is the same on every row
            if not reads(a, data):
                return pt.and_(rewrite(a, neg), rewrite(b, neg))
            if not reads(b, data):
                return pt.and_(rewrite(a, neg), rewrite(b, neg))
            raise _Unsupported("a conjunction of two row conditions")
        if type(scalar) in _SAME:
            cmp = (_FLIP if neg else _SAME)[type(scalar)]
            left, right = node.inputs
            if not reads(left, values) and not reads(right, data):
                return cmp(statistic(left, _ROW_SIDE_LEFT[cmp]), right)
            if not reads(right, values) and not reads(left, data):
                return cmp(left, statistic(right, _ROW_SIDE_RIGHT[cmp]))
            # per group: d_n against p[g_n], decided by each group's extreme of d
            for rows, side, how in ((left, right, _ROW_SIDE_LEFT), (right, left, _ROW_SIDE_RIGHT)):
                found = None if reads(rows, values) or rows.ndim != 1 else ungather(side)
                if found is not None:
                    base, index = found
                    stat = grouped(rows, how[cmp], index, base.type.shape[0])
                    return cmp(stat, base) if rows is left else cmp(base, stat)
            raise _Unsupported("a comparison whose sides both mix the rows and the block")
        raise _Unsupported(f"{node.op if node is not None else var} on the rows and the block")

    return rewrite(condition, negated), statistics


class RowSupport:
    r"""Which candidates of a block are finite on every row (module docstring).

    Parameters
    ----------
    terms : ObservationTerms
        The block's terms (their graph, data, inputs and compiler).

    Attributes
    ----------
    mode : str
        One of :data:`SUPPORT_MODES`.
    reason : str
        Why the mode is ``"unknown"`` ("" otherwise).
    """

    def __init__(self, terms):
        self._terms = terms
        self.reason = ""
        self._check_fn = self._stats_fn = None
        self._stats: list[np.ndarray] | None = None
        conditions = find_support_conditions(terms.loglik_graph, terms.vars, terms.data)
        if not conditions:
            self.mode = "none"
            return
        if not all(c.direct for c in conditions):
            self._unknown("a -inf branch of the terms lies under another switch")
            return
        try:
            parts = [
                any_over_rows(c.condition, c.negated, terms.data, terms.model.value_vars)
                for c in conditions
            ]
        except _Unsupported as err:
            self._unknown(str(err))
            return
        checks = [pt.any(check) for check, _ in parts]
        bad = checks[0] if len(checks) == 1 else pt.any(pt.stack(checks))
        self._statistics = [st for _, stats in parts for st in stats]
        holders = [st.holder for st in self._statistics]
        stats = [out for st in self._statistics for out in st.outputs]
        batch = dict(zip(terms.vars, terms.candidate_vars, strict=True))
        vectorized = vectorize_per_point(pt.as_tensor(bad), batch)
        # small graphs, called on a few scalars, and a one-off pass over the data: Python's
        # linker compiles them at once (each op a NumPy call)
        kwargs = {**terms._compile_kwargs, "mode": "FAST_COMPILE"}
        inputs = [*terms.candidate_vars, *terms.inputs, *holders]
        with no_c_compilation():
            self._check_fn = compile_cached(terms.model, vectorized, inputs, **kwargs)
        self._out_of_core = getattr(terms, "out_of_core", False)
        if self._out_of_core:  # per chunk of rows, the rows as inputs (a Dask pass)
            self._stats_fn = out_of_core_statistics(terms, self._statistics, kwargs)
        else:
            with no_c_compilation():
                self._stats_fn = compile_cached(terms.model, stats, [], **kwargs) if stats else None
        self.mode = "bounds"

    def _unknown(self, reason: str) -> None:
        self.mode = "unknown"
        self.reason = reason

    @property
    def varies(self) -> bool:
        r"""True when some row's term can be :math:`-\infty` for some values of the block only."""
        return self.mode != "none"

    def take_up_data(self) -> None:
        """Forget the statistics of the data (recomputed at the next check)."""
        self._stats = None

    def infeasible(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Return, per candidate, whether some row's term is :math:`-\infty` (shape ``(K,)``).

        All False in mode ``"none"``; in mode ``"unknown"`` nothing is known
        (all False: the steps decide those blocks exactly).
        """
        n_cands = len(candidates[0])
        if self.mode != "bounds":
            return np.zeros(n_cands, dtype=bool)
        if self._stats is None and self._out_of_core:
            self._stats = self._stats_fn()
        elif self._stats is None:
            values = [] if self._stats_fn is None else list(self._stats_fn())
            self._stats = []
            for st in self._statistics:
                k = len(st.outputs)
                self._stats.append(st.value(values[:k]).astype(st.holder.dtype))
                values = values[k:]
        cands, others = self._terms._exact_arrays(candidates, point)
        out = np.asarray(self._check_fn(*cands, *others, *self._stats), dtype=bool)
        return np.broadcast_to(out, (n_cands,)).copy()


class ChunkStatistics:
    """The statistics of one chunk of rows (a task of a Dask pass): ``fn`` of the rows, reduced.

    Parameters
    ----------
    fn : PassFunction
        The statistics' outputs as a function of the rows.
    statistics : sequence of Statistic
        Their records (how each reduces, its groups).
    """

    def __init__(self, fn, statistics: Sequence[Statistic]):
        self.fn = fn
        self.kinds = [(st.how, st.groups, len(st.outputs)) for st in statistics]

    def __call__(self, *rows) -> list[np.ndarray]:
        """Return each statistic of the rows given, as float64."""
        values = list(self.fn(*rows))
        out = []
        for how, groups, k in self.kinds:
            part, values = values[:k], values[k:]
            if groups is None:
                out.append(np.asarray(part[0], dtype=np.float64))
                continue
            rows_, index = (np.asarray(a) for a in part)
            found = np.full(groups, np.inf if how == "min" else -np.inf)
            (np.minimum if how == "min" else np.maximum).at(found, index, rows_)
            out.append(found)
        return out


def out_of_core_statistics(terms, statistics: Sequence[Statistic], compile_kwargs: dict):
    """Return a function computing ``statistics`` by one Dask pass over the chunks of rows.

    The statistics' graphs read the placeholders of
    :func:`~pymc_subsample.Data`; each task evaluates them on one chunk's
    rows and the client combines the chunks' values (:meth:`Statistic.combine`).
    The values are kept per data fingerprint and graph in this process: a
    second step on the same likelihood reads them without a pass.
    """
    from pytensor.graph.replace import graph_replace
    from pytensor.printing import debugprint

    from .function_cache import compile_cached
    from .out_of_core_passes import PassFunction

    row_inputs = terms._row_inputs
    outputs = [out for st in statistics for out in st.outputs]
    outputs = [graph_replace(o, terms._data_map(o, row_inputs), strict=False) for o in outputs]
    fn = compile_cached(terms.model, outputs, list(row_inputs), **compile_kwargs)
    chunk = ChunkStatistics(PassFunction(fn, outputs, list(row_inputs), compile_kwargs), statistics)
    shared = any(
        isinstance(v, pytensor.compile.SharedVariable) for v in graph_inputs(outputs)
    )  # a pm.Data value may change: not kept
    key = (terms._ooc.fingerprint, debugprint(outputs, file="str"), tuple(chunk.kinds))

    def compute() -> list[np.ndarray]:
        found = None if shared else _OUT_OF_CORE_STATISTICS.get(key)
        if found is None:
            combine = [st.combine for st in statistics]
            found = terms._ooc.reduce(chunk, combine)
            if not shared:
                _OUT_OF_CORE_STATISTICS[key] = found
        return [
            np.asarray(v).astype(st.holder.dtype) for v, st in zip(found, statistics, strict=True)
        ]

    return compute


#: Statistics of out-of-core data computed in this process, by fingerprint and graph.
_OUT_OF_CORE_STATISTICS: dict = {}

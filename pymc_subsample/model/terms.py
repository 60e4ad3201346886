r"""Per-observation log-likelihood terms of a PyMC model, evaluated on index subsets.

For the value variables :math:`\theta` a step updates, the model's log density
splits as

.. math:: \log \tilde p(\theta) = \log f_0(\theta) + \sum_{n=1}^N \log f_n(\theta),

:math:`\log f_n` the log-likelihood of observation :math:`n` and :math:`\log f_0`
the rest of the Markov blanket. :class:`ObservationTerms` compiles both for a batch
of candidates, on any subset of observations at a cost that grows with the subset,
not with :math:`N` (Chen & Ghahramani 2016, Sec. 2). The block's split is in
:mod:`~pymc_subsample.model.blocks`, the data inputs in
:mod:`~pymc_subsample.model.data`, the rows taken up and their permutation in
:mod:`~pymc_subsample.model.term_rows`, the expansions in
:mod:`~pymc_subsample.model.expansion`; the details: :ref:`observation-terms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs

from ..racing.compiled import CompiledRewards
from ..racing.config import BATCH_LAYOUTS
from ..validation import check_choice
from .batched import vectorize_per_point
from .blocks import (
    ModelSplitError,
    as_value_vars,
    block_terms,
    per_observation,
    prior_points,
)
from .chunked_sum import ChunkedSum
from .data import (
    find_data,
    observed_terms,
    reject_numpy_inputs,
    slice_rows,
)
from .function_cache import compile_cached
from .out_of_core import find_out_of_core
from .row_locality import (
    LOCALITY_DRAWS,
    check_row_locality,
    find_row_mixing,
    not_local_error,
    reject_row_mixing,
)
from .term_rows import TermRows
from .tiered import TieredFunction
from .union import UnionIndex

__all__ = [
    "BatchGraphs",
    "ModelSplitError",
    "ObservationTerms",
]


class BatchGraphs(NamedTuple):
    """A graph of the terms on batches of positions (:meth:`ObservationTerms.batch_graphs`)."""

    #: The int64 positions gathered by :attr:`subset`.
    idx: object
    #: The graph on the rows at positions ``idx``: of the permuted copy, else of the data.
    subset: object
    #: ``(start, stop, graph)`` on a window of the permuted copy, with ``batches="windows"``.
    window: tuple | None
    #: ``(start, stop, graph)`` on the first positions: of the permuted copy, else of the data.
    first: tuple
    #: One input per per-observation input, the arrays the graphs index: compiled functions
    #: take :meth:`ObservationTerms.batch_sources` there (after the positions or bounds).
    sources: list


class ObservationTerms(TermRows):
    r"""Per-observation log-likelihood terms of a block of variables, on index subsets.

    For candidates :math:`\theta_1..\theta_K` (a leading batch dimension):
    :meth:`loglik_subset` gives :math:`\log f_n(\theta_k)` on observations ``idx``
    (each per-observation ``pm.Data`` input gathered as ``D[idx]``), shape
    ``(K, len(idx))``; :meth:`loglik_batch` the same on positions of a row-permuted
    copy of the data; :meth:`loglik_full` on all :math:`N`; :meth:`loglik_sum`
    :math:`\sum_n \log f_n(\theta_k)` in one fused pass; :meth:`log_f0`
    :math:`\log f_0(\theta_k)`. The other value variables come from a point.
    Batch layouts, observed variables of different lengths, refusals:
    :ref:`observation-terms`.

    Parameters
    ----------
    model : pymc.Model
        The model.
    vars : sequence of variables
        The block (random variables or their value variables).
    data : sequence of pm.Data variables or names, optional
        The per-observation data inputs (observed values and covariates whose
        first dimension indexes observations). Default: every ``pm.Data``
        (shared variable) in the likelihood whose first dimension equals
        :math:`N`.
    initial_point : dict, optional
        Point used to find :math:`N` and to check the subset graph.
    compile_kwargs : dict, optional
        Passed to ``model.compile_fn``.
    batches : {"blocks", "random", "windows"}
        How :meth:`loglik_batch` reads the data
        (:data:`~pymc_subsample.racing.config.BATCH_LAYOUTS`): blocks of rows
        (default) or contiguous windows of a row-permuted copy of the data, or
        scattered rows of the data itself (no copy).

    Attributes
    ----------
    vars : list
        The block's value variables.
    n_obs : int
        :math:`N`.
    observed : list of str
        Names of the observed variables whose terms are raced.
    data : list
        The per-observation data inputs that are indexed.
    inputs : list
        The other value variables the terms depend on (read from the point).
    input_names : list of str
        Their names.
    model : pymc.Model
        The model.
    loglik_graph : TensorVariable
        The per-observation terms as a graph of the value variables and the
        data, shape ``(N,)``: what :meth:`batch_graphs` and the expansions
        (:class:`~pymc_subsample.model.expansion.Expansion`) rewrite.
    candidate_vars : list
        One placeholder per block variable with a leading batch dimension:
        the candidates' inputs of the compiled functions.
    watched : list
        Every ``pm.Data`` input of the terms (:meth:`data_unchanged`).

    Raises
    ------
    ModelSplitError
        When the block's terms cannot be raced: no observed variable depends on
        it, no observations, missing values, data baked into the graph as NumPy
        arrays, a subset graph that disagrees with the full one (see
        :ref:`observation-terms`).
    """

    def __init__(
        self,
        model,
        vars: Sequence,
        *,
        data: Sequence | None = None,
        initial_point: dict | None = None,
        compile_kwargs: dict | None = None,
        batches: str = "blocks",
    ):
        check_choice("batches", batches, BATCH_LAYOUTS)
        self.batches = batches
        self.model = model
        self.vars = as_value_vars(model, vars)
        point = model.initial_point() if initial_point is None else initial_point
        compile_kwargs = dict(compile_kwargs or {})
        compile_kwargs.setdefault("on_unused_input", "ignore")
        self._compile_kwargs = compile_kwargs
        names = ", ".join(v.name for v in self.vars)
        loglik, log_f0 = self._split(model, point, data)
        self.loglik_graph = loglik
        self._find_inputs(model, loglik, data)
        self._check_rows(self.n_obs)
        reject_row_mixing(self._mixing, self.observed, names)
        self._init_rows()
        self._compile_terms(model.value_vars, loglik, log_f0)
        if self._union is not None:
            self._union.check_padding(
                [point, *prior_points(model, LOCALITY_DRAWS, seed=0)],
                model.value_vars,
                compile_kwargs,
            )
        self._check_row_locality(point, names)

    # -- construction -------------------------------------------------------------------

    def _split(self, model, point: dict, data) -> tuple:
        r"""Find the observed variables that depend on the block; return the graphs of the terms.

        Returns ``(loglik, log_f0)``: the per-observation terms (over the union
        of rows when the observed variables have different lengths) and
        :math:`\log f_0`; sets :attr:`observed` and :attr:`n_obs`.
        """
        per_obs, per_obs_rvs, scalar_obs = observed_terms(model, self.vars)
        self.observed = observed = [rv.name for rv in per_obs_rvs]
        self._observed_rvs = per_obs_rvs
        lengths = self._lengths(model, per_obs, point)
        #: observed variables of different lengths: one index over the union of their rows
        self._union: UnionIndex | None = None
        if len(set(lengths)) > 1:
            self._union = UnionIndex(model, per_obs, observed, lengths, data)
            self.n_obs = self._union.n_obs
            loglik = self._union.loglik
        else:
            self.n_obs = int(lengths[0])
            loglik = per_obs[0]
            for lp in per_obs[1:]:
                loglik = loglik + lp
        exact_terms = block_terms(model, self.vars, model.free_RVs) + scalar_obs
        log_f0 = pt.add(*exact_terms) if len(exact_terms) > 1 else exact_terms[0]
        return loglik, log_f0

    def _lengths(self, model, per_obs, point) -> list[int]:
        """Return the observed variables' numbers of observations (kept: data may change)."""
        self._lengths_fn = compile_cached(
            model, [lp.shape[0] for lp in per_obs], model.value_vars, **self._compile_kwargs
        )
        return [int(n) for n in self._lengths_fn(*[point[v.name] for v in model.value_vars])]

    def _find_inputs(self, model, loglik, data) -> None:
        """Find the per-observation inputs (:attr:`data`) and every watched ``pm.Data`` input."""
        shared = [v for v in graph_inputs([loglik]) if isinstance(v, SharedVariable)]
        #: the rows of out-of-core inputs (pymc_subsample.Data), None in memory
        self._ooc = None
        placeholders = find_out_of_core(loglik)
        if placeholders:
            self._find_out_of_core(loglik, data, shared, placeholders)
            return
        if self._union is None:
            self.data = find_data(model, loglik, data, self.observed, self.n_obs)
            reject_numpy_inputs(loglik, self.observed, self.n_obs)
            self._mixing = find_row_mixing(loglik, self.data)
            own = self.data
        else:  # the union's label and padded inputs; checks on each group's own graph
            self.data = self._union.data
            for lp, names_g, n in zip(
                self._union.group_lps, self._union.names, self._union.lengths, strict=True
            ):
                reject_numpy_inputs(lp, names_g, n)
            self._mixing = self._union.row_mixing()
            own = self._union.watched()
            shared = [v for v in shared if v not in self.data]
        #: every pm.Data input of the terms, the per-observation ones first (:meth:`data_unchanged`)
        self.watched = own + [v for v in shared if v not in own]

    def _find_out_of_core(self, loglik, data, shared, placeholders) -> None:
        """Take the out-of-core inputs as the per-observation data; refuse what cannot mix."""
        from .out_of_core_rows import OutOfCoreRows

        names = ", ".join(self.observed)
        if self._union is not None:
            raise ModelSplitError(
                f"the observed variables {names} have different numbers of observations and "
                "read out-of-core data (pymc_subsample.Data): not supported out of core; give "
                "each likelihood its own step"
            )
        if data is not None:
            raise ModelSplitError(
                f"data= was given for {names}, whose likelihood reads out-of-core inputs "
                f"({[p.name for p in placeholders]}): those are the per-observation data; "
                "leave data= out"
            )
        in_memory = [
            v.name
            for v in shared
            if np.ndim(v.get_value(borrow=True)) >= 1
            and np.shape(v.get_value(borrow=True))[0] == self.n_obs
        ]
        if in_memory:
            raise ModelSplitError(
                f"the likelihood of {names} reads out-of-core inputs "
                f"({[p.name for p in placeholders]}) and pm.Data inputs with one row per "
                f"observation ({in_memory}): put every per-observation input out of core "
                "(pymc_subsample.Data on a zarr or Dask array with the same row chunks)"
            )
        bad = [p.name for p in placeholders if p.owner.op.shape[0] != self.n_obs]
        if bad:
            raise ModelSplitError(
                f"the out-of-core inputs {bad} do not have one row per observation of "
                f"{names} (N = {self.n_obs}): every pymc_subsample.Data of a likelihood "
                "holds one row per observation"
            )
        reject_numpy_inputs(loglik, self.observed, self.n_obs)
        self.data = list(placeholders)
        self._mixing = find_row_mixing(loglik, self.data)
        self._ooc = OutOfCoreRows(self.data, self.observed, self.batches)
        #: every pm.Data input of the terms (the out-of-core inputs do not change)
        self.watched = list(shared)

    @property
    def out_of_core(self) -> bool:
        """Whether the per-observation inputs are out of core (``pymc_subsample.Data``)."""
        return self._ooc is not None

    def _compile_terms(self, value_vars, loglik, log_f0) -> None:
        """Compile the terms on given rows, their fused sum, log f0 (and windows)."""
        idx = pt.lvector("idx")
        subset = graph_replace(loglik, {d: d[idx] for d in self.data}, strict=False)
        self._graphs = (idx, subset, log_f0)
        #: the arrays batch graphs index (the permuted copies, else the data), as inputs
        self._batch_sources = [
            pt.tensor(name=f"{d.name}_source", dtype=d.dtype, shape=(None, *d.type.shape[1:]))
            for d in self.data
        ]
        self._grad_fn = None
        self._f0_grad_fn = None
        #: one placeholder per block variable, with a leading batch dimension
        self.candidate_vars = [
            pt.tensor(name=f"{v.name}_candidates", dtype=v.dtype, shape=(None, *v.type.shape))
            for v in self.vars
        ]
        batch = dict(zip(self.vars, self.candidate_vars, strict=True))
        # a race's gathered rows enter as inputs: numpy gathers them, and the compiled
        # function only evaluates
        row_inputs = [
            pt.tensor(name=f"{d.name}_rows", dtype=d.dtype, shape=(None, *d.type.shape[1:]))
            for d in self.data
        ]
        rows = graph_replace(loglik, self._data_map(loglik, row_inputs))
        self._row_inputs = row_inputs
        self._rows_graph = rows
        # out of core, windows are read as rows (the window function indexes whole arrays)
        window = None if self._ooc is not None else self.batch_graphs(loglik).window
        # the fused sum of the rows it is given: with a permuted copy, loglik_sum passes it
        # (the same sum), so that a race that ends in an exact pass touches one copy of the
        # data, not two
        graphs = [rows, loglik, log_f0, rows.sum(axis=-1)] + ([window[2]] if window else [])
        outs = [vectorize_per_point(g, batch) for g in graphs]
        used = set()
        for g in outs:
            used |= set(graph_inputs([g]))
        #: the other value variables the terms read
        self.inputs = [v for v in value_vars if v in used and v not in self.vars]
        self.input_names = [v.name for v in self.inputs]
        f0_inputs = set(graph_inputs([outs[2]]))
        cands = self.candidate_vars
        #: True when log f0 depends on the candidates alone (no other value variable and no
        #: shared variable such as a pm.Data prior): the same at every point.
        self.log_f0_is_constant = not any(
            isinstance(v, SharedVariable) or v in value_vars for v in f0_inputs - set(cands)
        )
        self._rows_fn = self.compile(outs[0], [*cands, *row_inputs, *self.inputs])
        self._exact_fn = self.compile(outs[2], [*cands, *self.inputs])
        totals_fn = self.compile(outs[3], [*cands, *row_inputs, *self.inputs])
        self._sum_rows = ChunkedSum(totals_fn, len(cands), len(self.data), len(self.inputs))
        if self._ooc is not None:  # summed by Dask tasks, which may compile it in their process
            from .out_of_core_passes import PassFunction

            self._pass_sum = PassFunction(
                totals_fn, outs[3], [*cands, *row_inputs, *self.inputs], self._compile_kwargs
            )
        self._window_fn = None
        if window:
            start, stop, _ = window
            sources = self._batch_sources
            self._window_fn = self.compile(outs[4], [*cands, start, stop, *sources, *self.inputs])
        self._cand_dtypes = [v.dtype for v in self.vars]
        self._input_dtypes = [v.dtype for v in self.inputs]

    def _check_row_locality(self, point: dict, names: str) -> None:
        """Check numerically that the terms are row-local (at ``point`` and prior draws).

        :func:`~pymc_subsample.model.row_locality.check_row_locality`, on the
        rows of each group of observations apart.
        """
        rows = self._data_rows() if self._ooc is None else self._ooc.head_rows()
        # over the union of rows of different lengths: each group's own rows, checked apart
        parts = [rows] if self._union is None else self._union.group_rows(rows)

        def rows_at(at):
            cands = [np.asarray(at[v.name], dtype=v.dtype)[None] for v in self.vars]
            others = self.other_arrays(at)
            return lambda r: self._rows_fn(*cands, *r, *others)

        def refuse(at, failure):
            raise not_local_error(
                failure,
                at,
                observed=self.observed,
                block=names,
                input_names=self.input_names,
                counts=[self.n_obs] if self._union is None else self._union.lengths,
                mixing=self._mixing,
                graph=self.loglik_graph,
                data=self.data,
                indexed=[d.name for d in (self._union.watched() if self._union else self.data)],
                block_vars=[v.name for v in self.vars],
            )

        points = [point, *prior_points(self.model, LOCALITY_DRAWS, seed=0)]
        check_row_locality(rows_at, parts, points, refuse)

    # -- compiling and the graphs others compile ----------------------------------------

    def compile(self, outputs, inputs: Sequence, trust: bool = True):
        """Compile ``outputs`` as a function of ``inputs`` (positional, no point function).

        Once for equal graphs: a step built on the same model (or on a model
        of the same structure) gets the same function
        (:func:`~pymc_subsample.model.function_cache.compile_cached`), so
        callers must not change its attributes. With ``trust``, without
        PyTensor's checks of the inputs (microseconds per input and call):
        every caller passes ndarrays of the compiled dtypes
        (:meth:`candidate_arrays`, :meth:`other_arrays`).
        """
        return compile_cached(self.model, outputs, inputs, trust=trust, **self._compile_kwargs)

    @property
    def continuous_inputs(self) -> list:
        """The continuous value variables among :attr:`inputs` (what an expansion reads)."""
        return [v for v in self.inputs if v.dtype.startswith("float")]

    def loglik_with(self, replace: dict):
        """Per-observation log-likelihood with model variables replaced (before ``logp``).

        The replacement is made in the observed variables' graphs, where the
        Deterministics still stand as they were written; ``model.logp``
        rewrites them on its way to the log density.
        """
        from pymc import logp
        from pymc.logprob.utils import replace_rvs_by_values

        model = self.model
        lps = []
        for rv in self._observed_rvs:
            mapping = {k: v for k, v in model.rvs_to_values.items() if k is not rv} | replace
            [new_rv] = replace_rvs_by_values(
                [rv], rvs_to_values=mapping, rvs_to_transforms=model.rvs_to_transforms
            )
            lps.append(per_observation(logp(new_rv, model.rvs_to_values[rv])))
        if self._union is not None:
            return self._union.combine(lps)
        total = lps[0]
        for lp in lps[1:]:
            total = total + lp
        return total

    def batch_graphs(self, graph) -> BatchGraphs:
        """Return ``graph`` (a graph of the data, as :attr:`loglik_graph`) on batches of positions.

        The positions are those of :meth:`loglik_batch`: of the permuted copy
        when there is one, else rows of the data; the window only with
        ``batches="windows"``. The arrays indexed enter as inputs
        (:attr:`BatchGraphs.sources`, given :meth:`batch_sources`): the graph
        reads no variable of this step's own, so that steps built on the
        same model share its compiled function
        (:func:`~pymc_subsample.model.function_cache.compile_cached`).
        """
        idx = pt.lvector("idx")
        source = self._batch_sources
        subset = graph_replace(graph, self._data_map(graph, [s[idx] for s in source]), strict=False)
        start, stop = pt.lscalar("start"), pt.lscalar("stop")
        views = self._data_map(graph, [s[start:stop] for s in source])
        first = (start, stop, graph_replace(graph, views, strict=False))
        window = first if self.batches == "windows" else None
        return BatchGraphs(idx, subset, window, first, list(source))

    def _data_map(self, graph, new: Sequence) -> dict:
        """Return the replacements of the per-observation inputs of ``graph`` by ``new``.

        An out-of-core placeholder is the output of a node, which a clone of
        the graph (PyMC's log density rewrites) copies: every copy in
        ``graph`` is replaced.
        """
        mapping = dict(zip(self.data, new, strict=True))
        if self._ooc is not None:
            by_op = {d.owner.op: n for d, n in mapping.items()}
            for v in find_out_of_core(graph):
                if v.owner.op in by_op:
                    mapping[v] = by_op[v.owner.op]
        return mapping

    # -- evaluation -----------------------------------------------------------------------

    def candidate_arrays(self, candidates: Sequence) -> list:
        """Return one array per block variable, of the compiled dtypes (the candidates' inputs)."""
        return [np.asarray(c, dtype=d) for c, d in zip(candidates, self._cand_dtypes, strict=True)]

    def other_arrays(self, point: dict) -> list:
        """Return the other value variables' values as arrays of the compiled dtypes."""
        return [
            np.asarray(point[n], dtype=d)
            for n, d in zip(self.input_names, self._input_dtypes, strict=True)
        ]

    def _exact_arrays(self, candidates, point) -> tuple[list, list]:
        """Return the candidates' and the other inputs' arrays, of the compiled dtypes."""
        return self.candidate_arrays(candidates), self.other_arrays(point)

    def loglik_subset(
        self, candidates: Sequence[np.ndarray], idx: np.ndarray, point: dict
    ) -> np.ndarray:
        r"""Terms :math:`\log f_n(\theta_k)` on observations ``idx`` (rows of the data).

        Through the full function when ``idx`` covers a third of :math:`N`
        (gathering most rows costs more than evaluating all of them).

        Parameters
        ----------
        candidates : sequence of numpy.ndarray
            One array per block variable, shape ``(K, *var.shape)``.
        idx : numpy.ndarray
            int64 observation indices.
        point : dict
            Values of the other value variables.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, len(idx))``.
        """
        if self._ooc is not None:
            cands, others = self._exact_arrays(candidates, point)
            return self._rows_fn(*cands, *self._ooc.data_rows(idx), *others)
        if 3 * len(idx) >= self.n_obs:
            return self.loglik_full(candidates, point)[:, idx]
        cands, others = self._exact_arrays(candidates, point)
        idx = np.asarray(idx, dtype=np.int64)
        # ndarray.take gathers rows of a matrix about five times faster than fancy indexing
        rows = [d.get_value(borrow=True).take(idx, axis=0) for d in self.data]
        return self._rows_fn(*cands, *rows, *others)

    def loglik_batch(
        self, candidates: Sequence[np.ndarray], positions: slice | np.ndarray, point: dict
    ) -> np.ndarray:
        r"""Terms on the observations at ``positions`` of the current row permutation.

        Parameters
        ----------
        candidates : sequence of numpy.ndarray
            One array per block variable, shape ``(K, *var.shape)``.
        positions : slice or numpy.ndarray
            A contiguous window (read from the permuted copy, no gather) or
            int64 positions (gathered, e.g. a window that wraps around).
        point : dict
            Values of the other value variables.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, n)`` for ``n`` positions.
        """
        if self._ooc is not None:  # rows read from the store (the permuted copy, else the data)
            cands, others = self._exact_arrays(candidates, point)
            return self._rows_fn(*cands, *self._ooc.batch_rows(positions), *others)
        if isinstance(positions, slice):
            if self._copy is None:  # positions are rows
                return self.loglik_subset(candidates, slice_rows(positions, self.n_obs), point)
            if self._window_fn is None:  # a slice of the copies: views, no gather
                cands, others = self._exact_arrays(candidates, point)
                rows = [p[positions] for p in self._copy.values]
                return self._rows_fn(*cands, *rows, *others)
            cands, others = self._exact_arrays(candidates, point)
            start = np.asarray(positions.start, dtype=np.int64)
            stop = np.asarray(positions.stop, dtype=np.int64)
            return self._window_fn(*cands, start, stop, *self._copy.values, *others)
        if self._copy is not None:  # whole blocks (or a window across the end) of the permuted copy
            positions = np.asarray(positions, dtype=np.int64)
            rows = [p.take(positions, axis=0) for p in self._copy.values]
            cands, others = self._exact_arrays(candidates, point)
            return self._rows_fn(*cands, *rows, *others)
        return self.loglik_subset(candidates, positions, point)

    def promote(self, loop: bool = True, compiled_only: bool = False) -> None:
        r"""Compile the terms' functions in their final tier now (Numba), not when they have paid.

        The rows, the sums, :math:`\log f_0` and the windows
        (:class:`~pymc_subsample.model.tiered.TieredFunction`); functions
        compiled with a given ``mode`` are left as they are. With ``loop``, the
        sums' chunk loop too (:meth:`ChunkedSum.promote
        <pymc_subsample.model.chunked_sum.ChunkedSum.promote>`), else it is
        compiled once it has paid. With ``compiled_only``, only the functions
        whose machine code this machine holds move
        (:meth:`~pymc_subsample.model.tiered.TieredFunction.promote_if_compiled`).
        """
        for fn in (self._rows_fn, self._exact_fn, self._sum_rows.fn, self._window_fn):
            if isinstance(fn, TieredFunction):
                if compiled_only:
                    fn.promote_if_compiled()
                else:
                    fn.promote()
        if loop:
            self._sum_rows.promote()

    def compiled_rows(self) -> CompiledRewards | None:
        """Return the rows function's Numba kernel on the permuted copies (random blocks).

        For :func:`~pymc_subsample.racing.compiled.race_compiled`: None without
        a row-permuted copy read as blocks, or when the rows function was not
        compiled by Numba, or when the kernel reads more than the candidates,
        the gathered rows of every per-observation input and :meth:`other_arrays`
        (e.g. a ``dims`` length or another ``pm.Data`` that PyTensor passes as an
        input of its own): the Python race serves those.
        """
        jit_fn = getattr(getattr(self._rows_fn, "vm", None), "jit_fn", None)
        if jit_fn is None or self.batches != "blocks" or self._copy is None or self._ooc:
            return None
        expected = len(self.candidate_vars) + len(self.data) + len(self.inputs)
        fgraph = getattr(getattr(self._rows_fn, "maker", None), "fgraph", None)
        if fgraph is None or len(fgraph.inputs) != expected:  # shared inputs of its own
            return None
        return CompiledRewards(jit_fn, self._copy.values)

    def loglik_full(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Terms :math:`\log f_n(\theta_k)` on all observations, shape ``(K, N)``."""
        cands, others = self._exact_arrays(candidates, point)
        if self._ooc is not None:
            return self._rows_fn(*cands, *self._ooc.all_rows(), *others)
        return self._rows_fn(*cands, *self._data_rows(), *others)

    def loglik_sum(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Return :math:`\sum_{n=1}^N \log f_n(\theta_k)`, shape ``(K,)``.

        A fused pass (terms summed in the compiled graph), over chunks of rows
        that stay in cache (:class:`~pymc_subsample.model.chunked_sum.ChunkedSum`).
        """
        cands, others = self._exact_arrays(candidates, point)
        if self._ooc is not None:  # a Dask pass over every chunk of the data
            return np.asarray(self._ooc.sums(self._pass_sum, cands, others), dtype=np.float64)
        rows = (
            self._copy.values if self._copy is not None else self._data_rows()
        )  # the same sum in any order
        return np.asarray(self._sum_rows(cands, rows, others), dtype=np.float64)

    def log_f0(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Non-per-observation terms :math:`\log f_0(\theta_k)`, shape ``(K,)``."""
        cands, others = self._exact_arrays(candidates, point)
        return np.asarray(self._exact_fn(*cands, *others), dtype=np.float64)

    def gradient(
        self, values: Sequence[np.ndarray], idx: np.ndarray, point: dict
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        r"""Gradients of :math:`\sum_{n \in \mathrm{idx}} \log f_n` and of :math:`\log f_0`.

        Compiled on first use (only gradient-based proposals need it).

        Parameters
        ----------
        values : sequence of numpy.ndarray
            One value per block variable (not batched).
        idx : numpy.ndarray
            Observation indices of the mini-batch.
        point : dict
            Values of the other value variables.

        Returns
        -------
        tuple of list of numpy.ndarray
            ``(grad_loglik, grad_f0)``, one array per block variable.
        """
        if self._grad_fn is None:
            import pytensor

            idx_var, subset, log_f0 = self._graphs
            if self._ooc is not None:  # the rows enter as inputs, read from the store
                subset, idx_var = self._rows_graph, self._row_inputs
            grads = pytensor.grad(subset.sum(), self.vars) + pytensor.grad(log_f0, self.vars)
            idx_in = idx_var if self._ooc is not None else [idx_var]
            self._grad_fn = self.compile(grads, [*self.vars, *idx_in, *self.inputs])
        values, others = self._exact_arrays(values, point)
        if self._ooc is not None:
            out = self._grad_fn(*values, *self._ooc.data_rows(idx), *others)
        else:
            out = self._grad_fn(*values, np.asarray(idx, dtype=np.int64), *others)
        k = len(self.vars)
        return [np.asarray(g) for g in out[:k]], [np.asarray(g) for g in out[k:]]

    def log_f0_grad(self, values: Sequence[np.ndarray], point: dict) -> list[np.ndarray]:
        r"""Gradient of :math:`\log f_0` (prior, Jacobian, other blanket terms); no data read.

        Compiled on first use.

        Parameters
        ----------
        values : sequence of numpy.ndarray
            One value per block variable (not batched).
        point : dict
            Values of the other value variables.

        Returns
        -------
        list of numpy.ndarray
            One array per block variable.
        """
        if self._f0_grad_fn is None:
            import pytensor

            log_f0 = self._graphs[2]
            self._f0_grad_fn = self.compile(
                pytensor.grad(log_f0, self.vars), [*self.vars, *self.inputs]
            )
        values, others = self._exact_arrays(values, point)
        out = self._f0_grad_fn(*values, *others)
        return [np.asarray(g) for g in out]

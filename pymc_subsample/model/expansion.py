r"""Second-order expansions of the per-observation terms: residuals on batches, exact sums.

A control variate of a race expands the terms :math:`\log f_n` to second
order in flat coordinates :math:`x` around a reference :math:`\hat x`,
:math:`\Delta = x - \hat x`:

.. math:: h_n(x) = \log f_n(\hat x) + D\log f_n(\hat x)[\Delta]
          + \tfrac12 D^2\log f_n(\hat x)[\Delta, \Delta],

races on the residuals :math:`r_n = \log f_n(x) - h_n(x)` of a batch (the
directional derivatives by forward mode, on the batch: nothing per
observation is stored and the cost does not grow with the dimension), and
adds back the exact sums :math:`\sum_n h_n = S + G^\top\Delta +
\tfrac12\Delta^\top H\Delta` (one pass over the data, reverse mode)
(Bardenet, Doucet & Holmes 2017; Cornish et al. 2019). :class:`Expansion`
compiles both for one of two choices of :math:`x`:

* ``over="block"`` (:class:`~pymc_subsample.RacingMetropolis`): the block's
  own values :math:`\theta`, flattened; the candidates are flat values;
* ``over="inputs"`` (:class:`~pymc_subsample.SubsampledCategoricalGibbs`,
  after Chen & Ghahramani 2016): the other continuous value variables
  :math:`\psi` the terms read, from the point; the candidates are the block's
  (discrete) values.

Either can be made in model Deterministics :math:`\phi` of those variables
instead (``coordinates``). The sums are functions of the reference, the
candidates and every input the terms read that is not expanded in;
:meth:`Expansion.cached_sums` keeps the last few, keyed on all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs

from ..validation import check_choice
from .batched import vectorize_per_point
from .blocks import model_deterministics
from .data import slice_rows
from .expansion_cache import ExpansionCache, inputs_key

__all__ = [
    "EXPANSION_OVER",
    "MAX_SECOND_ORDER_INPUTS",
    "TAYLOR_CHUNK_ROWS",
    "Expansion",
    "flat_graph",
    "taylor_residual",
]

#: What an :class:`Expansion` expands in: the block, or the other continuous inputs.
EXPANSION_OVER = ("block", "inputs")

#: Largest number of coordinates of the other inputs for which an expansion with
#: ``over="inputs"`` is of second order (its sums keep a Hessian per candidate).
MAX_SECOND_ORDER_INPUTS = 400

#: Rows per call of the exact sums (:meth:`Expansion.sums`): their gradient and Hessian
#: graphs hold arrays of the rows they read, a few per coordinate.
TAYLOR_CHUNK_ROWS = 2**16


def flat_graph(values: Sequence):
    """Return the graphs ``values`` raveled and concatenated as one float64 vector."""
    return pt.concatenate([pt.cast(v, "float64").ravel() for v in values])


def taylor_residual(at_x, at_ref, ref, step, second_order: bool, disconnected: str = "raise"):
    r"""Return ``at_x`` minus the expansion of ``at_ref`` in ``ref`` along ``step``.

    :math:`r = f(x) - f(\hat x) - Df(\hat x)[\Delta] - \tfrac12 D^2 f(\hat x)[\Delta, \Delta]`
    with :math:`\Delta` = ``step`` (a graph), the directional derivatives by
    forward mode (the second-order term only with ``second_order``);
    ``disconnected`` is PyTensor's ``disconnected_outputs``.
    """
    direction = pt.dvector("direction")
    first = pytensor.gradient.pushforward(at_ref, ref, direction, disconnected_outputs=disconnected)
    expansion = at_ref + first
    if second_order:
        second = pytensor.gradient.pushforward(
            first, ref, direction, disconnected_outputs=disconnected
        )
        expansion = expansion + 0.5 * second
    return graph_replace(at_x - expansion, {direction: step}, strict=False)


def _unflatten(flat, variables: Sequence, shapes: Sequence[tuple]) -> dict:
    """Map each of ``variables`` to its slice of the flat vector ``flat``, reshaped."""
    bounds = np.cumsum([0, *[int(np.prod(s, dtype=int)) for s in shapes]])
    return {
        v: flat[a:b].reshape(shape).astype(v.dtype)
        for v, a, b, shape in zip(variables, bounds[:-1], bounds[1:], shapes, strict=True)
    }


class Expansion:
    r"""A second-order expansion of the terms, its residuals on batches and its exact sums.

    Parameters
    ----------
    terms : ObservationTerms
        The terms expanded.
    over : {"block", "inputs"}
        ``"block"``: in the flat values of the block (candidates of
        :meth:`residual_batch` are flat values, shape ``(K, d)``);
        ``"inputs"``: in the other continuous value variables the terms read
        (:attr:`names`, from the point; candidates are block values, one
        array per block variable, shape ``(K, *var.shape)``).
    coordinates : sequence of str or TensorVariable, optional
        Deterministics of the model to expand in instead (of the block with
        ``"block"``, of the other inputs with ``"inputs"``). Pays when the
        terms are nearly quadratic in :math:`\phi` but not in the value
        variables: a coefficient :math:`\alpha = \mathrm{softplus}(z)` at its
        boundary is far from linear in :math:`z`, while a variance linear in
        :math:`\alpha` keeps the terms smooth in it.
    point : dict, optional
        A point of the model: the coordinates' shapes with ``"block"``
        (without ``shapes``, or with ``coordinates``).
    shapes : sequence of tuple, optional
        With ``"block"`` and no ``coordinates``: the block variables' shapes.

    Attributes
    ----------
    names : list of str
        The value variables the coordinates are read from: the block's, or
        the other continuous inputs'.
    shapes : list of tuple or None
        The coordinates' shapes (with ``"inputs"``, known once compiled).
    second_order : bool
        Whether the expansion is of second order: always with ``"block"``;
        with ``"inputs"``, at most :data:`MAX_SECOND_ORDER_INPUTS` coordinates.
    cache : ExpansionCache
        The sums of :meth:`cached_sums`.

    Raises
    ------
    ValueError
        When the terms do not depend on ``coordinates`` (``"inputs"``), or
        ``coordinates`` are not Deterministics of the model.
    """

    def __init__(
        self,
        terms,
        over: str = "block",
        coordinates: Sequence = (),
        *,
        point: dict | None = None,
        shapes: Sequence[tuple] | None = None,
    ):
        check_choice("over", over, EXPANSION_OVER)
        self.terms = terms
        self.over = over
        self.coordinates = model_deterministics(terms.model, coordinates) if coordinates else []
        self.cache = ExpansionCache()
        self.second_order = True
        self._fns: tuple | None = None  # (gather or None, window or None, sums)
        self._build_gather = None
        self._build_value_grad = None
        self._value_grad = None  # value and gradient of the sums alone, compiled when asked
        self._to_flat = None  # the coordinates' flat values as a function of the value variables
        self._memo: tuple = (None, None)
        # with "block" the sums are at the reference; else the expanded inputs are not read
        self._disconnected = "raise" if over == "block" else "ignore"
        if over == "block":
            self.names = [v.name for v in terms.vars]
            self._fixed = list(terms.input_names)
            self.shapes = None if shapes is None else [tuple(s) for s in shapes]
            if self.coordinates:
                self._compile_coordinates(point)
            elif self.shapes is None:
                self.shapes = [tuple(np.shape(point[n])) for n in self.names]
        else:
            self.names = [v.name for v in terms.continuous_inputs]
            self._fixed = [n for n in terms.input_names if n not in self.names]
            self.shapes = None
            if self.coordinates:
                self._graph()  # raises if the terms do not depend on them

    # -- graphs -------------------------------------------------------------------------

    def _graph(self) -> tuple:
        r"""Return ``(loglik, coords, values)``: the terms with every coordinate an input.

        ``coords`` are the variables expanded in (the value variables, or a
        stand-in per Deterministic), ``values`` their graphs in the value
        variables.
        """
        terms = self.terms
        base = list(terms.vars) if self.over == "block" else list(terms.continuous_inputs)
        if not self.coordinates:
            return terms.loglik_graph, base, base
        dets = self.coordinates
        phis = [d.type(name=f"{d.name}_coordinate") for d in dets]
        loglik = terms.loglik_with(dict(zip(dets, phis, strict=True)))
        used = set(graph_inputs([loglik]))
        values = terms.model.replace_rvs_by_values(dets)
        if self.over == "block":
            direct = [v.name for v in terms.vars if v in used]
            if direct:
                raise ValueError(
                    f"expand_in: the likelihood terms depend on {direct} directly, not only "
                    f"through {[d.name for d in dets]}; give Deterministics that carry "
                    "all of the block's influence on the terms"
                )
            return loglik, phis, values
        unused = [d.name for d, f in zip(dets, phis, strict=True) if f not in used]
        if unused:
            raise ValueError(
                f"expand_in: the likelihood terms of {', '.join(terms.observed)} do not "
                f"depend on {unused}; give the Deterministics the terms are computed from"
            )
        rest = [v for v in base if v in used]
        return loglik, [*phis, *rest], [*values, *rest]

    def _flat_values(self, values: Sequence, inputs: Sequence, point: dict) -> tuple:
        """Compile ``values`` (graphs of ``inputs``) as one flat float64 vector.

        Returns ``(fn, shapes)``: ``fn(*inputs)`` returns ``[flat, *shapes]``;
        ``shapes`` are the values' shapes at ``point``.
        """
        fn = self.terms.compile([flat_graph(values), *[v.shape for v in values]], inputs)
        out = fn(*[np.asarray(point[v.name], dtype=v.dtype) for v in inputs])
        return fn, [tuple(int(n) for n in sh) for sh in out[1:]]

    def _compile_coordinates(self, point: dict) -> None:
        r"""Compile :math:`\phi(\theta)` and its pullback (``"block"`` with coordinates)."""
        terms = self.terms
        values = terms.model.replace_rvs_by_values(self.coordinates)
        inputs = [*terms.vars, *terms.inputs]
        self._to_flat, self.shapes = self._flat_values(values, inputs, point)
        v_in = pt.dvector("cotangent")
        pull = pytensor.grad((flat_graph(values) * v_in).sum(), terms.vars)
        self._pull_fn = terms.compile(pull, [*inputs, v_in])

    def compile(self, point: dict | None = None, gather: bool = True) -> None:
        """Compile the residual and sum functions (the gathered residuals now with ``gather``).

        ``point`` gives the coordinates' shapes with ``"inputs"`` (a reference).

        Raises
        ------
        ValueError
            With ``"inputs"`` when the terms read no other continuous input
            (nothing to expand in); PyTensor's errors when the terms cannot be
            differentiated twice.
        """
        terms = self.terms
        if self.over == "inputs" and not self.names:
            raise ValueError(
                "control variates expand the terms in the continuous variables they depend "
                f"on besides {', '.join(v.name for v in terms.vars)}, and there are none: the "
                "terms depend on the block and the data only, so there is nothing to expand"
            )
        loglik, coords, values = self._graph()
        if self.over == "block":
            shapes = self.shapes
            theta, flat_cands = pt.dvector("theta"), pt.dmatrix("theta_candidates")
            at_x = graph_replace(loglik, _unflatten(theta, coords, shapes), strict=False)
            x, batch, heads, per_candidate = theta, {theta: flat_cands}, [flat_cands], []
        else:
            to_values = {c: v for c, v in zip(coords, values, strict=True) if c is not v}
            if to_values:  # Deterministics among the coordinates: phi(psi) is compiled
                self._to_flat, shapes = self._flat_values(values, terms.continuous_inputs, point)
            else:
                self._to_flat, shapes = None, [tuple(np.shape(point[v.name])) for v in values]
            self.second_order = sum(int(np.prod(s, dtype=int)) for s in shapes) <= (
                MAX_SECOND_ORDER_INPUTS
            )
            at_x = graph_replace(loglik, to_values, strict=False) if to_values else loglik
            x = flat_graph(values)
            batch = dict(zip(terms.vars, terms.candidate_vars, strict=True))
            heads, per_candidate = list(terms.candidate_vars), list(terms.vars)
        self.shapes = shapes
        ref = pt.dvector("reference")
        at_ref = graph_replace(loglik, _unflatten(ref, coords, shapes), strict=False)
        residual = taylor_residual(
            at_x, at_ref, ref, x - ref, self.second_order, self._disconnected
        )
        graphs = terms.batch_graphs(residual)
        others = list(terms.inputs)
        sources = graphs.sources  # the same inputs in every batch graph of the terms

        def build_gather():
            res = vectorize_per_point(graphs.subset, batch)
            return terms.compile(res, [*heads, ref, graphs.idx, *sources, *others])

        window = None
        if graphs.window is not None:
            start, stop, win = graphs.window
            window = terms.compile(
                vectorize_per_point(win, batch), [*heads, ref, start, stop, *sources, *others]
            )
        start, stop, first = terms.batch_graphs(at_ref).first
        total = first.sum()
        grad = pytensor.grad(total, ref, disconnected_inputs=self._disconnected)
        outputs = [total, grad]
        if self.second_order:
            outputs.append(pytensor.gradient.jacobian(grad, ref, vectorize=True))
        sums_inputs = [*per_candidate, ref, start, stop, *sources, *others]
        sums = terms.compile(outputs, sums_inputs, trust=False)
        #: graphs of the sums functions (full, value and gradient), for Dask workers
        self._pass_graphs = {True: (outputs, sums_inputs), False: ([total, grad], sums_inputs)}
        self._pass_fns: dict = {}
        # value and gradient alone (no Hessian: O(d) per row, not O(d^2)), compiled when asked
        self._build_value_grad = lambda: terms.compile([total, grad], sums_inputs, trust=False)
        self._value_grad = None
        self._build_gather = build_gather
        self._fns = (build_gather() if gather else None, window, sums)

    def compile_gather(self):
        """Return the gathered residuals function, compiled on first use."""
        gather, window, sums = self._fns
        if gather is None:
            gather = self._build_gather()
            self._fns = (gather, window, sums)
        return gather

    def _ready(self, reference) -> None:
        if self._fns is None:
            self.compile(reference if isinstance(reference, dict) else None)

    # -- coordinates --------------------------------------------------------------------

    def flat(self, point: dict, memo: bool = False) -> np.ndarray:
        r"""Return the flat coordinates :math:`\psi` or :math:`\phi(\psi)` at ``point`` (inputs).

        ``memo``: the point is a reference, never changed in place, read again
        on every look (its coordinates are computed once).
        """
        if self._to_flat is None:
            return np.concatenate(
                [np.ravel(np.asarray(point[n], dtype=np.float64)) for n in self.names]
            )
        if memo and self._memo[0] is point:
            return self._memo[1]
        inputs = self.terms.continuous_inputs
        flat = np.asarray(
            self._to_flat(*[np.asarray(point[v.name], dtype=v.dtype) for v in inputs])[0],
            dtype=np.float64,
        )
        if memo:
            self._memo = (point, flat)
        return flat

    def _reference(self, reference) -> np.ndarray:
        if isinstance(reference, dict):
            return self.flat(reference, memo=True)
        return np.asarray(reference, dtype=np.float64)

    def delta(self, point: dict, reference: dict) -> np.ndarray:
        r"""Return the flat :math:`\Delta = x - \hat x` of ``point`` from ``reference`` (inputs)."""
        self._ready(reference)
        return self.flat(point) - self._reference(reference)

    def coordinates_of(self, values: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Return the flat coordinates :math:`\phi(\theta)` of block values (``"block"``).

        ``values``: one value per block variable; ``point`` gives the other
        inputs. Reads no data.
        """
        values = self.terms.candidate_arrays(values)
        if not self.coordinates:
            return np.concatenate([np.ravel(v).astype(np.float64) for v in values])
        out = self._to_flat(*values, *self.terms.other_arrays(point))
        return np.asarray(out[0], dtype=np.float64)

    def pullback(self, values: Sequence[np.ndarray], v: np.ndarray, point: dict) -> list:
        r"""Return :math:`J_\phi(\theta)^\top v`, one array per block variable (``"block"``)."""
        values = self.terms.candidate_arrays(values)
        cotangent = np.asarray(v, dtype=np.float64)
        out = self._pull_fn(*values, *self.terms.other_arrays(point), cotangent)
        return [np.asarray(g) for g in out]

    # -- residuals and sums -------------------------------------------------------------

    def _heads(self, candidates) -> list:
        if self.over == "block":
            return [np.asarray(candidates, dtype=np.float64)]
        return self.terms.candidate_arrays(candidates)

    def residual_batch(
        self,
        candidates,
        positions: slice | np.ndarray,
        point: dict,
        reference: dict | np.ndarray,
    ) -> np.ndarray:
        r"""Residuals :math:`r_n` of the candidates on the observations at ``positions``.

        Parameters
        ----------
        candidates : numpy.ndarray or sequence of numpy.ndarray
            Flat coordinates, shape ``(K, d)`` (``"block"``), or block values,
            one array per block variable of shape ``(K, *var.shape)``
            (``"inputs"``: the coordinates are read from ``point``).
        positions : slice or numpy.ndarray
            Positions in the current row permutation, as
            :meth:`~pymc_subsample.ObservationTerms.loglik_batch`.
        point : dict
            Values of the other value variables.
        reference : dict or numpy.ndarray
            :math:`\hat x`: flat, or a point the coordinates are read from.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, n)``.
        """
        self._ready(reference)
        _, window, _ = self._fns
        head = [*self._heads(candidates), self._reference(reference)]
        others = self.terms.other_arrays(point)
        if self.terms.out_of_core:  # the rows read from the store, gathered in order
            rows = self.terms.batch_rows(positions)
            local = np.arange(len(rows[0]), dtype=np.int64)
            return self.compile_gather()(*head, local, *rows, *others)
        if isinstance(positions, slice):
            if window is not None:
                start = np.asarray(positions.start, dtype=np.int64)
                stop = np.asarray(positions.stop, dtype=np.int64)
                return window(*head, start, stop, *self.terms.batch_sources(), *others)
            positions = slice_rows(positions, self.terms.n_obs)
        gather = self.compile_gather()
        sources = self.terms.batch_sources()
        return gather(*head, np.asarray(positions, dtype=np.int64), *sources, *others)

    def _chunked_sums(
        self, per_candidate: list, ref: np.ndarray, stop: int, others: list, sums=None
    ):
        """Sum the sums function over chunks of :data:`TAYLOR_CHUNK_ROWS` first positions."""
        sums = self._fns[2] if sums is None else sums
        if self.terms.out_of_core:
            return self._out_of_core_sums(per_candidate, ref, stop, others, sums)
        sources = self.terms.batch_sources()
        total = None
        for a in range(0, stop, TAYLOR_CHUNK_ROWS):
            b = min(a + TAYLOR_CHUNK_ROWS, stop)
            bounds = (np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
            out = [
                np.asarray(o, dtype=np.float64)
                for o in sums(*per_candidate, ref, *bounds, *sources, *others)
            ]
            total = out if total is None else [t + o for t, o in zip(total, out, strict=True)]
        return total

    def _out_of_core_sums(self, per_candidate: list, ref, stop: int, others: list, sums):
        """Return the sums out of core: a Dask pass over every row, or the first ``stop``."""
        from .out_of_core_passes import PassFunction, WindowFunction

        terms = self.terms
        heads = [*per_candidate, ref]
        if stop < terms.n_obs:  # a random subset: the copy's first positions, read here
            rows = terms.batch_rows(slice(0, stop))
            bounds = (np.asarray(0, dtype=np.int64), np.asarray(stop, dtype=np.int64))
            return [np.asarray(o, dtype=np.float64) for o in sums(*heads, *bounds, *rows, *others)]
        key = id(sums)
        found = self._pass_fns.get(key)
        if found is None or found[0] is not sums:
            outputs, inputs = self._pass_graphs[sums is self._fns[2]]
            wrapped = PassFunction(sums, outputs, inputs, terms._compile_kwargs)
            window = WindowFunction(wrapped, len(heads), len(terms.data))
            found = self._pass_fns[key] = (sums, window)
        return terms._ooc.sums(found[1], heads, others)

    def sums(
        self,
        reference: dict | np.ndarray,
        point: dict,
        candidates: Sequence[np.ndarray] | None = None,
        window: int | None = None,
        hessian: bool = True,
    ) -> tuple:
        r"""Exact value, gradient and Hessian of :math:`\sum_n \log f_n` at the reference.

        Reverse mode, over all :math:`N` observations, or (``"block"``) over
        the first ``window`` positions of the row permutation (a uniformly
        random subset) scaled by :math:`N/\mathrm{window}`. ``hessian=False``
        (``"block"`` only): the value and gradient alone, a pass whose cost per
        row grows as :math:`d`, not :math:`d^2` (for a Newton step's gradient).

        Returns
        -------
        tuple
            ``"block"``: ``(L, g, H)``, a float, shape ``(d,)``, shape ``(d, d)``
            (``H`` None with ``hessian=False``).
            ``"inputs"``: per candidate, ``(S, G, H)`` of shapes ``(K,)``,
            ``(K, D)``, ``(K, D, D)`` (``H`` None for a first-order expansion).
        """
        self._ready(reference)
        terms = self.terms
        ref = self._reference(reference)
        others = terms.other_arrays(point)
        n_obs = terms.n_obs
        if self.over == "block":
            stop = n_obs
            if terms.has_permuted_copy and window is not None:  # a random subset
                stop = min(window, n_obs)
            scale = n_obs / stop
            if not hessian:
                if self._value_grad is None:
                    self._value_grad = self._build_value_grad()
                value, grad = self._chunked_sums([], ref, stop, others, self._value_grad)
                return float(value) * scale, grad * scale, None
            value, grad, hess = self._chunked_sums([], ref, stop, others)
            return float(value) * scale, grad * scale, hess * scale
        cands = terms.candidate_arrays(candidates)
        outs = [
            self._chunked_sums([c[k] for c in cands], ref, n_obs, others)
            for k in range(len(cands[0]))
        ]
        values = np.array([float(o[0]) for o in outs])
        grads = np.stack([o[1] for o in outs])
        hess = np.stack([o[2] for o in outs]) if self.second_order else None
        return values, grads, hess

    def key(self, reference, point: dict, candidates: Sequence[np.ndarray] | None = None) -> tuple:
        """Return the key of the sums: the values of every input they read.

        The reference, the candidates (``"inputs"``) and the inputs not
        expanded in (with ``"block"`` every other input; with ``"inputs"`` the
        discrete ones).
        """
        self._ready(reference)
        cands = [] if candidates is None else self.terms.candidate_arrays(candidates)
        fixed = [np.asarray(point[n]) for n in self._fixed]
        shapes = tuple(np.shape(c) for c in cands)
        return inputs_key([self._reference(reference), *cands, *fixed], shapes)

    def cached_sums(
        self,
        reference: dict | np.ndarray,
        point: dict,
        candidates: Sequence[np.ndarray] | None = None,
    ) -> tuple:
        """Return :meth:`sums` over all observations, from :attr:`cache` when seen lately.

        Keyed on :meth:`key`; clear the cache when the data change
        (:meth:`clear`).
        """
        return self.cache.get(
            self.key(reference, point, candidates),
            lambda: self.sums(reference, point, candidates),
        )

    def clear(self) -> None:
        """Drop the cached sums (new data, or a reference that will not come back)."""
        self.cache.clear()

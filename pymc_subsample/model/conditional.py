r"""The full conditional log density of a block of variables, at many points in one call.

For value variables :math:`\theta` (a block of total size :math:`d`),

.. math:: \log p(\theta \mid \text{rest}) = \sum_{v:\ \log p(v) \text{ involves } \theta}
          \log p(v) + \text{const},

the sum over every free and observed variable whose log density (Jacobian
included) depends on :math:`\theta`. :class:`BlockConditional` compiles it
vectorized over a batch of :math:`k` points given as one ``(k, d)`` array,
and checks at construction that the batched graph gives, row by row, what it
gives for each point alone (PyTensor cannot vectorize every graph).
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.logprob.utils import ParameterValueError
from pytensor.graph.replace import vectorize_graph
from pytensor.graph.traversal import graph_inputs

from .batched import checks_to_switch
from .blocks import as_value_vars, block_terms
from .function_cache import compile_cached

__all__ = ["BlockConditional"]


class BlockConditional:
    """Vectorized full conditional of a block of continuous value variables.

    Parameters
    ----------
    model : pymc.Model
    vars : sequence
        Random or value variables of the block (continuous).
    initial_point : dict
        A point of the model, for shapes.
    compile_kwargs : dict, optional
        Passed to ``model.compile_fn``.

    Attributes
    ----------
    vars : list
        The block's value variables.
    dim : int
        Total size :math:`d` of the block.
    """

    def __init__(self, model, vars, initial_point, compile_kwargs=None):
        self.vars = as_value_vars(model, vars)
        self.shapes = [np.shape(initial_point[v.name]) for v in self.vars]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.sizes)
        terms = block_terms(model, self.vars, model.free_RVs + model.observed_RVs)
        self._info = DictToArrayBijection.map(
            {v.name: np.asarray(initial_point[v.name]) for v in self.vars}
        ).point_map_info
        logp = checks_to_switch(pt.add(*terms) if len(terms) > 1 else terms[0])
        flat = pt.matrix("block_points", dtype="float64")
        replace, start = {}, 0
        for v, shape, size in zip(self.vars, self.shapes, self.sizes, strict=True):
            part = flat[:, start : start + size].reshape((flat.shape[0], *shape))
            replace[v] = pt.cast(part, v.dtype)
            start += size
        try:
            batched = vectorize_graph(logp, replace=replace)
        except (NotImplementedError, TypeError, ValueError) as err:
            self._refuse(model, f"{type(err).__name__}: {str(err).splitlines()[0]}")
        used = set(graph_inputs([batched]))
        self.inputs = [v for v in model.value_vars if v in used and v not in self.vars]
        self._names = [v.name for v in self.inputs]
        self._dtypes = [v.dtype for v in self.inputs]
        self._fn = compile_cached(model, batched, [flat, *self.inputs], **(compile_kwargs or {}))
        self._check_batched(model, initial_point)  # compiles now, too

    def _check_batched(self, model, initial_point: dict) -> None:
        """Raise ``ValueError`` unless three points in one call equal three single calls."""
        x0 = self.flatten(initial_point)
        others = [
            np.asarray(initial_point[n], dtype=d)
            for n, d in zip(self._names, self._dtypes, strict=True)
        ]
        self._fn(x0[None, :], *others)  # a parameter check that fails here is raised
        probe = x0 + np.array([0.0, 0.3, -0.2])[:, None] * np.maximum(1.0, np.abs(x0))
        single = np.concatenate([self(p[None, :], initial_point) for p in probe])
        try:
            batched = self(probe, initial_point)
            error = None if np.allclose(batched, single, rtol=1e-9, atol=1e-9) else "wrong values"
        except ValueError as exc:  # PyTensor's vectorized Elemwise rejects the shapes
            error = str(exc).splitlines()[0]
        if error is not None:
            self._refuse(model, error)

    def _refuse(self, model, error: str) -> None:
        """Raise the ``ValueError`` that says the block's conditional cannot be batched, and why."""
        names = [v.name for v in self.vars]
        series = [
            rv.name
            for rv in model.free_RVs + model.observed_RVs
            if "timeseries" in type(rv.owner.op).__module__
        ]
        feature = (
            f"the time-series variable(s) {series} (lagged terms such as pm.AR's)"
            if series
            else "a term of the model"
        )
        raise ValueError(
            f"PliableRejection cannot evaluate the conditional of {names} at many points in "
            f"one call: PyTensor's vectorized graph of {feature} fails for a batch of "
            f"points ({error}). Use pm.NUTS for that block"
        )

    def flatten(self, point: dict) -> np.ndarray:
        """Return the block's values in ``point`` as one flat float64 vector."""
        raveled = DictToArrayBijection.map({v.name: np.asarray(point[v.name]) for v in self.vars})
        return raveled.data.astype(np.float64)

    def unflatten(self, flat: np.ndarray) -> dict:
        """Return ``{name: value}`` for a flat vector of the block."""
        return DictToArrayBijection.rmap(RaveledVars(flat, self._info))

    def __call__(self, x: np.ndarray, point: dict) -> np.ndarray:
        r"""Return :math:`\log p(\theta_i \mid \text{rest})` for rows ``x`` of shape ``(k, d)``.

        The other variables are read from ``point``. ``nan`` is returned as ``-inf``.
        A parameter check that raises (one inside a ``Scan``, which
        :func:`~pymc_subsample.model.batched.checks_to_switch` cannot reach) is
        evaluated row by row: ``-inf`` at the rows that fail it, outside the
        support (construction evaluates the initial point strictly: a check
        that fails there is raised).
        """
        others = [
            np.asarray(point[n], dtype=d) for n, d in zip(self._names, self._dtypes, strict=True)
        ]
        x = np.ascontiguousarray(x, dtype=np.float64)
        try:
            out = np.asarray(self._fn(x, *others), float)
        except ParameterValueError:
            out = np.full(len(x), -np.inf)
            for i in range(len(x) if len(x) > 1 else 0):
                try:
                    out[i] = self._fn(x[i : i + 1], *others)[0]
                except ParameterValueError:
                    pass
        return np.where(np.isnan(out), -np.inf, out)

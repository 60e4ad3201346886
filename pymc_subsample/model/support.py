r"""The enumerated support of a bounded discrete variable, read from its distribution.

:class:`~pymc_subsample.steps.gibbs.SubsampledCategoricalGibbs` draws a discrete
variable from its full conditional over a finite list of candidate values
:math:`\{l, l+1, \dots, u\}`, fixed when the step is built. That list is
known for these distributions (PyMC's parametrisations):

* ``Bernoulli(p)``: :math:`0..1`;
* ``Categorical(p)``: :math:`0..K-1`, :math:`K` the length of :math:`p`
  (``OrderedLogistic`` and ``OrderedProbit`` are Categoricals);
* ``DiscreteUniform(lower, upper)``: :math:`l..u`;
* ``Binomial(n, p)`` and ``BetaBinomial(alpha, beta, n)``: :math:`0..n`;
* ``HyperGeometric(N, k, n)``: :math:`\max(0, n - N + k)..\min(k, n)`;
* ``Truncated(dist, lower, upper)`` of a discrete ``dist``: :math:`l..u`, with
  :math:`l = 0` when a ``Poisson`` or ``NegativeBinomial`` has no lower bound.

The bounds must not depend on another free variable: the support would then
change from draw to draw, and a list fixed at construction would leave out
values the conditional gives mass to. They may depend on ``pm.Data``, read
when the step is built (its ``data_changed`` refuses new values that change
them). For a vector variable whose elements have different
bounds, the list is their union: a value outside an element's own support has
prior density zero and is never drawn for it.
"""

from __future__ import annotations

import numpy as np
import pytensor
from pymc.distributions.discrete import DiscreteUniformRV
from pymc.distributions.truncated import TruncatedRV
from pytensor.tensor.random.basic import (
    BernoulliRV,
    BetaBinomialRV,
    BinomialRV,
    CategoricalRV,
    HyperGeometricRV,
    NegBinomialRV,
    PoissonRV,
)

from .blocks import depends_on
from .tiered import START_MODE, no_c_compilation

__all__ = ["MAX_CATEGORIES", "discrete_support"]

#: Most candidate values :math:`D` a variable may have. A draw holds arrays of
#: :math:`D` entries (per-candidate race state, Gumbel noise for
#: :data:`~pymc_subsample.steps.gibbs.DRAW_BUFFER` draws at a time), and an exact pass
#: evaluates every candidate on chunks of at least 1,024 rows, with intermediates of
#: :math:`D \times 1024` floats (80 MB at this bound); its time grows as :math:`D N`.
MAX_CATEGORIES = 10_000

#: Lower end of the support of discrete distributions unbounded above, for a ``Truncated``
#: one given only an upper bound.
_LOWEST = {PoissonRV: 0, NegBinomialRV: 0}


def discrete_support(model, value_var, initial_point: dict) -> np.ndarray:
    r"""Return the candidate values of a bounded discrete variable, in increasing order.

    Parameters
    ----------
    model : pymc.Model
        The model.
    value_var : TensorVariable
        The variable's value variable.
    initial_point : dict
        A point of the model (a Categorical's number of categories is read there).

    Returns
    -------
    numpy.ndarray
        :math:`l, l+1, \dots, u`, of the value variable's dtype.

    Raises
    ------
    ValueError
        The variable is continuous, unbounded or of a distribution whose
        support is not listed (module docstring), its bounds depend on another
        free variable, or it has more than :data:`MAX_CATEGORIES` values.
    """
    rv = model.values_to_rvs[value_var]
    op = getattr(rv.owner, "op", None)
    kind = type(op).__name__ if op is not None else "unknown"
    if not value_var.dtype.startswith(("int", "uint", "bool")):
        raise ValueError(
            f"SubsampledCategoricalGibbs updates discrete variables; {rv.name!r} is "
            f"continuous ({kind}, dtype {value_var.dtype}): use RacingMetropolis or NUTS for it"
        )
    if isinstance(op, BernoulliRV):
        lower, upper = 0, 1
    elif isinstance(op, CategoricalRV):
        (k_graph,) = model.replace_rvs_by_values((rv.owner.inputs[-1].shape[-1],))
        # called once: PyTensor's Python VM, no machine code to compile
        with no_c_compilation():
            fn = model.compile_fn(
                k_graph, inputs=model.value_vars, on_unused_input="ignore", mode=START_MODE
            )
        lower, upper = 0, int(fn(initial_point)) - 1
    else:
        lower, upper = _bounds(model, rv, op, kind)
    size = upper - lower + 1
    if size > MAX_CATEGORIES:
        raise ValueError(
            f"SubsampledCategoricalGibbs enumerates the support of {rv.name!r}, "
            f"{lower}..{upper}: {size} values, more than MAX_CATEGORIES = {MAX_CATEGORIES} "
            f"(pymc_subsample.model.support). Use {_other_step(op)} for it"
        )
    if size < 1:
        raise ValueError(f"the support of {rv.name!r}, {lower}..{upper}, is empty")
    return np.arange(lower, upper + 1, dtype=value_var.dtype)


def _bounds(model, rv, op, kind: str) -> tuple[int, int]:
    """Lowest and highest value of ``rv``'s support (the union over its elements)."""
    if isinstance(op, TruncatedRV):
        return _truncated_bounds(model, rv, op)
    if isinstance(op, DiscreteUniformRV):
        lower, upper = op.dist_params(rv.owner)
        graphs, names = (lower, upper), ("lower", "upper")
    elif isinstance(op, BinomialRV | BetaBinomialRV):
        graphs, names = (op.dist_params(rv.owner)[0],), ("n",)
    elif isinstance(op, HyperGeometricRV):  # (k, N - k, n) in PyMC's parametrisation
        graphs, names = tuple(op.dist_params(rv.owner)), ("k", "N", "n")
    else:
        raise ValueError(
            f"SubsampledCategoricalGibbs updates discrete variables whose support it can "
            f"enumerate (Bernoulli, Categorical, DiscreteUniform, Binomial, BetaBinomial, "
            f"HyperGeometric, Truncated with an upper bound); {rv.name!r} is discrete but of "
            f"kind {kind}, unbounded or not enumerated. Use pm.Metropolis for it, or bound it "
            f"(pm.Truncated(..., upper=...)) or write it as a Categorical over its support"
        )
    arrays = _constant_bounds(model, rv, graphs, names)
    if isinstance(op, DiscreteUniformRV):
        lower, upper = arrays
    elif isinstance(op, HyperGeometricRV):
        good, bad, n = np.broadcast_arrays(*arrays)
        lower, upper = np.maximum(0, n - bad), np.minimum(good, n)
    else:  # Binomial, BetaBinomial
        lower, upper = 0, arrays[0]
    return _integer(rv, np.min(lower)), _integer(rv, np.max(upper))


def _truncated_bounds(model, rv, op) -> tuple[int, int]:
    """Bounds of a ``Truncated`` discrete variable (its two last inputs)."""
    base = type(op.base_rv_op)
    lower, upper = _constant_bounds(model, rv, rv.owner.inputs[-2:], ("lower", "upper"))
    if not np.isfinite(upper).all():
        raise ValueError(
            f"{rv.name!r} is a Truncated {base.__name__} without an upper bound: its support is "
            "unbounded, so SubsampledCategoricalGibbs cannot enumerate it. Give it an upper "
            "bound (pm.Truncated(..., upper=...)) or use pm.Metropolis for it"
        )
    if not np.isfinite(lower).all():
        if base not in _LOWEST:
            raise ValueError(
                f"{rv.name!r} is a Truncated {base.__name__} without a lower bound, whose "
                "lowest value SubsampledCategoricalGibbs does not know: give it a lower bound "
                "(pm.Truncated(..., lower=...)) or use pm.Metropolis for it"
            )
        lower = np.where(np.isfinite(lower), lower, _LOWEST[base])
    return _integer(rv, np.min(lower)), _integer(rv, np.max(upper))


def _constant_bounds(model, rv, graphs, names: tuple[str, ...]) -> list[np.ndarray]:
    """Evaluate the graphs of ``rv``'s bounds; refuse bounds that depend on free variables."""
    in_values = model.replace_rvs_by_values(list(graphs))
    free = [n for n, g in zip(names, in_values, strict=True) if depends_on(g, model.value_vars)]
    if free:
        raise ValueError(
            f"the support of {rv.name!r} depends on another free variable (through its "
            f"{' and '.join(free)}): its set of values would change from draw to draw, and "
            "SubsampledCategoricalGibbs enumerates a support fixed when the step is built. "
            f"Use pm.Metropolis for {rv.name!r}, or make its bounds constants or pm.Data"
        )
    with no_c_compilation():
        fn = pytensor.function([], in_values, mode="FAST_COMPILE")
    return [np.asarray(a) for a in fn()]


def _other_step(op) -> str:
    """PyMC steps for a variable whose support is too large to enumerate."""
    if isinstance(op, BernoulliRV | CategoricalRV):
        return "pm.CategoricalGibbsMetropolis or pm.Metropolis"
    return "pm.Metropolis"


def _integer(rv, bound) -> int:
    """``bound`` as an int; refuse a bound that is not a finite integer."""
    if not (np.isfinite(bound) and float(bound) == np.floor(bound)):
        raise ValueError(f"a bound of the support of {rv.name!r} is not an integer: {bound!r}")
    return int(bound)

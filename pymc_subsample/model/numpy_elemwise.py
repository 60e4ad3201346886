r"""NumPy functions for the elementwise operations PyTensor's Python VM would loop over.

PyTensor's Python VM evaluates an ``Elemwise`` with the NumPy function named
by its ``nfunc_spec``; an operation without one (softplus, log1mexp, ...) runs
its scalar Python ``impl`` per element through ``np.frompyfunc``, about a
microsecond an element. The first tier of a
:class:`~pymc_subsample.model.tiered.TieredFunction` includes the rewrite
:data:`REWRITE_TAG`, which gives such nodes a vectorised NumPy function of the
same value (to rounding): :func:`softplus` is
:math:`\log(1 + e^x) = \mathrm{logaddexp}(0, x)`, :func:`log1mexp` is
:math:`\log(1 - e^x)` (Mächler 2012's two branches), and so on. The graph and
its compiled tier are unchanged; only the first tier's ``perform`` differs.

A ``Composite`` (a fused scalar graph, which PyTensor's rewrites make even
with fusion excluded: ``x ** 3`` becomes ``Composite{sqr(i0) * i0}``) has no
NumPy function either; the first tier runs its inner graph as one ``Elemwise``
per scalar operation instead (:func:`unfuse_composite`), each with its NumPy
function, so that it too is vectorised.
"""

from __future__ import annotations

import numpy as np
from pytensor.compile import optdb
from pytensor.graph.basic import Constant
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.scalar import basic as ps
from pytensor.scalar import math as psm
from pytensor.tensor.elemwise import Elemwise

__all__ = [
    "REWRITE_TAG",
    "clip",
    "identity",
    "log1mexp",
    "round_half_away_from_zero",
    "second",
    "softplus",
    "tri_gamma",
    "unfuse_composite",
]

#: The rewrite database tag the first tier's mode includes.
REWRITE_TAG = "pymc_subsample_numpy_elemwise"


def softplus(x):
    r"""Return :math:`\log(1 + e^x)`, elementwise, as ``np.logaddexp(0, x)``."""
    return np.logaddexp(0.0, x)


def log1mexp(x):
    r"""Return :math:`\log(1 - e^x)` for :math:`x \le 0`, elementwise (Mächler 2012).

    :math:`\log(-\mathrm{expm1}(x))` for :math:`x > -\log 2`, else
    :math:`\mathrm{log1p}(-e^x)`.
    """
    x = np.asarray(x, dtype=float)
    with np.errstate(all="ignore"):
        return np.where(x < -np.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def tri_gamma(x):
    """Return the trigamma function, the second derivative of ``log Γ``, elementwise."""
    from scipy.special import polygamma

    return polygamma(1, x)


def clip(x, low, high):
    """Return ``x`` clipped to ``[low, high]``, elementwise."""
    return np.clip(x, low, high)


def second(x, y):
    """Return ``y`` broadcast to the shape of ``x`` and ``y`` (PyTensor's ``fill``)."""
    return np.array(np.broadcast_to(y, np.broadcast_shapes(np.shape(x), np.shape(y))))


def identity(x):
    """Return a copy of ``x``."""
    return np.array(x)


def round_half_away_from_zero(x):
    """Return ``x`` rounded to the nearest integer, halves away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


#: Scalar operation type → (the function's import path, inputs) for the first tier.
_FUNCTIONS = {
    psm.Softplus: ("softplus", 1),
    psm.Log1mexp: ("log1mexp", 1),
    psm.TriGamma: ("tri_gamma", 1),
    ps.Clip: ("clip", 3),
    ps.Second: ("second", 2),
    ps.Identity: ("identity", 1),
    ps.RoundHalfAwayFromZero: ("round_half_away_from_zero", 1),
}


@node_rewriter([Elemwise])
def _numpy_function(fgraph, node):
    op = node.op
    if getattr(op, "nfunc_spec", None) is not None:
        return None
    entry = _FUNCTIONS.get(type(op.scalar_op))
    if entry is None or len(node.inputs) != entry[1] or len(node.outputs) != 1:
        return None
    spec = (f"{__name__}.{entry[0]}", entry[1], 1)
    new = Elemwise(op.scalar_op, inplace_pattern=op.inplace_pattern, nfunc_spec=spec)
    return new.make_node(*node.inputs).outputs


def unfuse_composite(node) -> list | None:
    """Return the outputs of an ``Elemwise`` of a ``Composite`` built one scalar operation each.

    The value is the same (the same scalar operations in the same order); the
    first tier then evaluates each with its NumPy function instead of the
    composite's Python ``impl`` per element. None for any other node, or when
    the rebuilt outputs' types differ from the node's.
    """
    from pytensor.tensor.basic import as_tensor_variable

    composite = node.op.scalar_op
    if not isinstance(composite, ps.Composite):
        return None
    inner = composite.fgraph
    values = dict(zip(inner.inputs, node.inputs, strict=True))
    for apply in inner.toposort():
        args = []
        for var in apply.inputs:
            if isinstance(var, Constant):
                args.append(as_tensor_variable(var.data, dtype=var.type.dtype))
            else:
                args.append(values[var])
        outs = Elemwise(apply.op)(*args, return_list=True)
        values.update(zip(apply.outputs, outs, strict=True))
    new = [values[out] for out in inner.outputs]
    for old, var in zip(node.outputs, new, strict=True):
        if var.type.dtype != old.type.dtype or var.type.ndim != old.type.ndim:
            return None  # the composite's broadcasting or casting differs: keep it
    return new


@node_rewriter([Elemwise])
def _unfuse(fgraph, node):
    return unfuse_composite(node)


# after the in-place rewrites, which make new operations without the function; the
# composites are unfused first, so that the operations inside get their function too
optdb.register("pymc_subsample_unfuse_composites", in2out(_unfuse), REWRITE_TAG, position=50.65)
optdb.register(
    "pymc_subsample_numpy_functions", in2out(_numpy_function), REWRITE_TAG, position=50.7
)

r"""Whether a block reaches its terms along a differentiable path: the gradient rule.

A continuous parameter :math:`\theta` that enters the per-observation terms
:math:`l_n` only through a comparison (``t < tau``), the condition of a
``switch``, ``floor``, ``ceil``, ``round``, ``trunc``, ``sign`` or an integer
division has :math:`\nabla_\theta \sum_n l_n = 0` wherever it is defined
(almost everywhere): the terms are piecewise constant in :math:`\theta`. A
gradient method (NUTS, HMC, Langevin proposals, Taylor control variates and
the Laplace fit they are built on) then sees a flat density and wanders
(or stays in one step of the staircase).

:func:`gradient_path` decides it from the graph, by a rule: a variable is
*differentiably reached* when it is one of the block's value variables, or
the float output of an operation one of whose differentiably reached inputs
enters it along an edge that carries a derivative. Edges that carry none:

- into an operation whose output is discrete (integer or boolean: every
  comparison, ``argmax``, casts to integers) — the output is not reached;
- the condition of a ``switch`` (boolean anyway) and the conditions of
  parameter checks;
- into ``floor``, ``ceil``, ``round``, ``trunc``, ``sign`` and integer division;
- edges a ``connection_pattern`` declares disconnected.

The block has no useful gradient when the terms are not reached. Operations
the rule does not open (scans, ``OpFromGraph``) count as differentiable and
are listed (:attr:`GradientPath.opaque`); for those graphs the numerical check
decides: a gradient of the terms that is exactly zero at the initial point and
at draws from the prior (:func:`zero_gradient`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytensor.scalar.basic as ps
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.traversal import toposort
from pytensor.raise_op import CheckAndRaise
from pytensor.scan.op import Scan
from pytensor.tensor.elemwise import Elemwise

__all__ = [
    "GradientPath",
    "block_names",
    "gradient_path",
    "no_gradient_message",
    "refuse_gradient_features",
    "zero_gradient",
]

#: Scalar operations whose derivative is zero wherever it is defined, by what they do.
_STEP_OPS: dict[type, str] = {
    ps.Floor: "floor",
    ps.Ceil: "ceil",
    ps.Trunc: "trunc",
    ps.RoundHalfToEven: "round",
    ps.RoundHalfAwayFromZero: "round",
    ps.Sign: "sign",
    ps.IntDiv: "an integer division (//)",
}


@dataclass(frozen=True)
class GradientPath:
    """Whether a block's values reach its terms along a differentiable path.

    Attributes
    ----------
    connected : bool
        True when some differentiable path joins the block to the terms (the
        gradient can be non-zero).
    cuts : tuple of str
        Where the block's paths lost their derivative, in words (e.g.
        ``"a comparison (lt)"``, ``"floor"``), without repeats.
    opaque : tuple of str
        Operations on the reached paths that the rule does not open (a scan,
        an ``OpFromGraph``): there a derivative is assumed, and
        :func:`zero_gradient` decides.
    """

    connected: bool
    cuts: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()

    def describe(self) -> str:
        """Return the cuts in words, for a message."""
        return ", ".join(self.cuts) if self.cuts else "no differentiable operation"


def _cut(node, index: int) -> str | None:
    """Return why the edge into input ``index`` of ``node`` has no derivative (None: it has)."""
    op = node.op
    if isinstance(op, CheckAndRaise) and index > 0:
        return "a parameter check's condition"
    if isinstance(op, Elemwise):
        scalar = op.scalar_op
        if isinstance(scalar, ps.Switch) and index == 0:
            return "the condition of a switch"
        if isinstance(scalar, ps.LogicalComparison):
            return f"a comparison ({type(scalar).__name__.lower()})"
        for kind, text in _STEP_OPS.items():
            if isinstance(scalar, kind):
                return text
    try:
        pattern = op.connection_pattern(node)
    except (AttributeError, NotImplementedError, TypeError):
        pattern = None
    if pattern is not None and not any(pattern[index]):
        return f"an input the operation does not differentiate ({op})"
    return None


def _discrete(var) -> bool:
    dtype = getattr(var, "dtype", "float64")
    return not (dtype.startswith("float") or dtype.startswith("complex"))


def gradient_path(output, wrt: Sequence) -> GradientPath:
    """Decide whether ``wrt`` reach ``output`` along a differentiable path (the module's rule).

    Parameters
    ----------
    output : TensorVariable
        The terms (any shape).
    wrt : sequence of TensorVariable
        The block's value variables.

    Returns
    -------
    GradientPath
        ``connected`` and the operations where the paths were cut.
    """
    reached = set(wrt)
    cuts: dict[str, None] = {}
    opaque: dict[str, None] = {}
    for node in toposort([output]):
        hits = [i for i, v in enumerate(node.inputs) if v in reached]
        if not hits:
            continue
        if isinstance(node.op, OpFromGraph | Scan):
            opaque.setdefault(type(node.op).__name__)
        live = []
        for i in hits:
            why = _cut(node, i)
            if why is None:
                live.append(i)
            else:
                cuts.setdefault(why)
        for out in node.outputs:
            if not live:
                break
            if _discrete(out):
                name = getattr(node.op, "scalar_op", node.op)
                cuts.setdefault(f"an operation with a discrete output ({name})")
                continue
            reached.add(out)
    return GradientPath(output in reached, tuple(cuts), tuple(opaque))


def zero_gradient(gradient: Callable[[dict], Sequence[np.ndarray]], points: Sequence[dict]) -> bool:
    """Return True when the terms' gradient is zero (and finite) at every one of ``points``.

    Parameters
    ----------
    gradient : callable
        ``gradient(point)``: the gradient of the terms' sum in the block, one
        array per block variable.
    points : sequence of dict
        Where it is evaluated (the initial point and draws from the prior).
    """
    for point in points:
        parts = [np.asarray(g) for g in gradient(point)]
        if not all(np.all(np.isfinite(g)) for g in parts):
            return False
        if any(np.any(g != 0) for g in parts):
            return False
    return True


def no_gradient_message(names: str, path: GradientPath, feature: str, fix: str) -> str:
    """Return the refusal of a gradient feature on a block without a useful gradient.

    Parameters
    ----------
    names : str
        The block's variables.
    path : GradientPath
        What the rule found.
    feature : str
        What was asked for (e.g. ``"proposal='hmc'"``).
    fix : str
        What to do instead.
    """
    verb = "reach" if "," in names else "reaches"
    return (
        f"RacingMetropolis: {feature} needs the gradient of the likelihood terms in {names}, "
        f"but {names} {verb} them only through {path.describe()}: the terms are piecewise "
        f"constant in {names} and their gradient is zero almost everywhere (a threshold, a "
        f"continuous change point). {fix}"
    )


def block_names(model, value_vars: Sequence) -> str:
    """Return the block's random variables' names (``tau``, not ``tau_interval__``)."""
    to_rv = model.values_to_rvs
    return ", ".join(getattr(to_rv.get(v), "name", None) or v.name for v in value_vars)


def refuse_gradient_features(names: str, path: GradientPath, asked: dict) -> None:
    """Refuse the gradient features a user asked for on a block without a useful gradient.

    Parameters
    ----------
    names : str
        The block's variables.
    path : GradientPath
        What the rule found (not ``connected``).
    asked : dict
        RacingMetropolis's ``proposal``, ``control_variates`` and ``expand_in``
        as the user passed them (None: not passed).

    Raises
    ------
    ValueError
        Naming the block, the feature and the fix.
    """
    fix = (
        "Leave proposal, control_variates and expand_in unset (or pass proposal='normal'): "
        f"the step then draws {names} with a tuned random walk, no gradient and no control "
        "variates"
    )
    proposal = asked.get("proposal")
    if proposal in ("hmc", "langevin"):
        raise ValueError(no_gradient_message(names, path, f"proposal={proposal!r}", fix))
    if asked.get("control_variates"):
        feature = "control_variates=True (a Taylor expansion of the terms)"
        raise ValueError(no_gradient_message(names, path, feature, fix))
    if asked.get("expand_in"):
        feature = "expand_in (a Taylor expansion of the terms)"
        raise ValueError(no_gradient_message(names, path, feature, fix))

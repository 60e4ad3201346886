r"""Graphs evaluated at a batch of points, each point checked on its own.

PyMC's parameter checks (``CheckParameterValue``) reduce their condition to
one scalar; vectorized over a batch of points, that scalar covers the whole
batch, so one invalid point would make every point ``-inf``.
:func:`vectorize_per_point` replaces the checks by per-point switches first.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pymc.logprob.utils import CheckParameterValue
from pytensor.graph.replace import graph_replace, vectorize_graph
from pytensor.graph.traversal import applys_between, graph_inputs

__all__ = ["checks_to_switch", "vectorize_per_point"]


def checks_to_switch(graph):
    r"""Replace PyMC's parameter checks by :math:`\mathrm{switch}(c, \ell, -\infty)`, per point.

    PyTensor vectorizes a ``CheckParameterValue`` by reducing its condition over
    the whole batch, so one point with an invalid parameter (a scale that
    underflowed to 0, say) would make every point of the batch ``-inf``. Applied
    before vectorizing, the switch keeps each point's condition its own; nested
    checks are replaced from the outside in.
    """
    while True:
        nodes = [
            n
            for n in applys_between(list(graph_inputs([graph])), [graph])
            if isinstance(n.op, CheckParameterValue) and n.op.can_be_replaced_by_ninf
        ]
        if not nodes:
            return graph
        replace = {}
        for n in nodes:
            expr, *conds = n.inputs
            cond = pt.all(pt.stack([pt.all(c) for c in conds])) if len(conds) > 1 else conds[0]
            replace[n.outputs[0]] = pt.cast(pt.switch(cond, expr, -np.inf), n.outputs[0].dtype)
        graph = graph_replace(graph, replace, strict=False)


def vectorize_per_point(graph, replace: dict):
    """Return ``vectorize_graph(graph, replace)`` with each point's parameter checks its own."""
    return vectorize_graph(checks_to_switch(graph), replace=replace)

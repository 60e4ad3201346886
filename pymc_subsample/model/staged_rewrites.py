r"""Graph rewrites in two stages, so that a function's final tier reuses its first tier's work.

PyTensor rewrites a graph before it links it, with the rewrites of a mode run
in order of their position in its database. Those before fusion
(:data:`SHARED_BEFORE`: canonicalization, stabilization, specialization) do
most of the work, and the two tiers of a
:class:`~pymc_subsample.model.tiered.TieredFunction` need not differ there;
they differ after (fusion, in-place operations and the linker's own rewrites,
for Numba; each operation's NumPy function, for the first tier). A staged
compilation (:func:`compile_staged`) therefore runs the final mode's rewrites
before :data:`SHARED_BEFORE` on a copy of the graph and keeps the result
(:class:`SharedStage`); each tier grafts a copy of it into its own graph and
runs its own rewrites from there. The first tier keeps the shared stage, and
the final tier, built later (when the function moves), starts from it: its
compilation then pays only the rewrites after fusion. Built from scratch (a
graph compiled before, another process's compilation), the final tier runs
the shared stage itself and grafts it the same way, so that either way its
rewritten graph, and thus its Numba cache key, is the same. The kept stage
travels with the function, without the inputs' values: the helper process that
compiles a final tier (:mod:`~pymc_subsample.model.background`) starts from it too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytensor
from pytensor.compile import optdb
from pytensor.compile.mode import Mode, get_mode
from pytensor.graph.basic import clone_get_equiv
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import GraphRewriter, SequentialGraphRewriter

__all__ = ["SHARED_BEFORE", "SharedStage", "compile_staged", "staged_mode"]

#: Position in PyTensor's rewrite database before which both tiers run the same
#: rewrites (the final mode's): the first of the fusion rewrites, ``add_mul_fusion``.
SHARED_BEFORE = float(optdb.__position__.get("add_mul_fusion", 48.0))


@dataclass(frozen=True)
class SharedStage:
    """A graph after the rewrites before :data:`SHARED_BEFORE`: its own inputs and outputs."""

    inputs: tuple
    outputs: tuple

    @classmethod
    def of(cls, inputs, outputs) -> SharedStage:
        """Return the stage of a rewritten graph, its inputs replaced by new ones of their types.

        The stage then holds no input's value (a ``pm.Data``'s rows), and travels
        light to another process (a pickled function, a helper's job).
        """
        holders = [v.type() for v in inputs]
        memo = dict(zip(inputs, holders, strict=True))
        equiv = clone_get_equiv(inputs, outputs, copy_inputs=False, memo=memo)
        return cls(tuple(holders), tuple(equiv[v] for v in outputs))

    def graft(self, fgraph: FunctionGraph) -> bool:
        """Make ``fgraph`` compute a copy of this stage's graph; return False if it cannot.

        ``fgraph`` must have inputs of the same types, in the same order, as the
        graph this stage was rewritten from (the same function's graph); its
        outputs are replaced by the copy's, and its old nodes fall away.
        """
        if len(self.inputs) != len(fgraph.inputs) or len(self.outputs) != len(fgraph.outputs):
            return False
        if any(a.type != b.type for a, b in zip(self.inputs, fgraph.inputs, strict=True)):
            return False
        memo = dict(zip(self.inputs, fgraph.inputs, strict=True))
        equiv = clone_get_equiv(self.inputs, self.outputs, copy_inputs=False, memo=memo)
        new = [equiv[v] for v in self.outputs]
        for old, replacement in zip(list(fgraph.outputs), new, strict=True):
            if old is not replacement:
                fgraph.replace(old, replacement, reason="pymc_subsample_shared_stage")
        return list(fgraph.outputs) == new


def _rewriters(mode: Mode) -> list:
    """Return the rewriters ``mode`` runs, in order (its query on PyTensor's database)."""
    return list(optdb.query(mode._optimizer))


class _StagedRewriter(GraphRewriter):
    """Rewrite as ``mode`` would, with ``final``'s rewriters before :data:`SHARED_BEFORE`.

    The shared stage is ``stage`` if given; else those rewriters run on a copy
    of the graph. Either way it is grafted into the graph and appended to
    ``sink``, then ``mode``'s own rewriters from :data:`SHARED_BEFORE` on run.
    ``including`` names rewrites both modes add. Pickled as its recipe (a
    function shipped to another process rewrites its graph anew there).
    """

    def __init__(self, mode: Mode, final: Mode, including: tuple = (), stage=None, sink=None):
        self._recipe = (mode, final, tuple(including))
        final = Mode(final.linker, final.provided_optimizer.including(*including))
        mode = Mode(mode.linker, mode.provided_optimizer.including(*including))
        position = optdb.__position__
        shared = [r for r in _rewriters(final) if position[r.name] < SHARED_BEFORE]
        own = [r for r in _rewriters(mode) if position[r.name] >= SHARED_BEFORE]
        self.shared = SequentialGraphRewriter(shared)
        self.own = SequentialGraphRewriter(own)
        self.shared_mode, self.own_mode = final, mode  # what rewrites of inner graphs read
        self.stage = stage
        self.sink = [] if sink is None else sink

    def __reduce__(self):
        return (type(self), self._recipe)

    def add_requirements(self, fgraph):
        """Add nothing: the shared stage's requirements go to its copy, the own ones in apply."""

    def apply(self, fgraph):
        """Graft the shared stage (run here if not kept), then run the mode's own rewriters."""
        stage = self.stage
        if stage is None or not stage.graft(fgraph):  # a kept stage that does not fit: anew
            stage = self._shared_stage(fgraph)
            if not stage.graft(fgraph):
                raise ValueError("the shared stage does not fit the graph it came from")
        self.sink.append(stage)
        before = getattr(fgraph, "_compile_mode", None)
        fgraph._compile_mode = self.own_mode
        try:
            return self.own.rewrite(fgraph)
        finally:
            fgraph._compile_mode = before

    def _shared_stage(self, fgraph) -> SharedStage:
        """Run the shared rewriters on a copy of ``fgraph``; return the result."""
        copy = FunctionGraph(fgraph.inputs, fgraph.outputs, clone=True)
        copy._compile_mode = self.shared_mode  # the final mode's, whichever tier asks
        self.shared.rewrite(copy)
        return SharedStage.of(copy.inputs, copy.outputs)

    def print_summary(self, stream=sys.stdout, level=0, depth=-1):
        """Print the two stages' rewriters."""
        self.shared.print_summary(stream, level, depth)
        self.own.print_summary(stream, level, depth)


def staged_mode(
    mode: Mode, final: Mode, stage: SharedStage | None, sink: list, including: tuple = ()
) -> Mode:
    """Return ``mode`` whose rewrites before :data:`SHARED_BEFORE` are those of ``final``.

    ``including`` names rewrites both modes add (PyMC's ``random_make_inplace``
    and its bounds check). The shared stage is ``stage`` if given, else run
    anew; either way it is appended to ``sink``.
    """
    return Mode(mode.linker, _StagedRewriter(mode, final, including, stage, sink))


def compile_staged(
    inputs,
    outputs,
    mode: Mode | None,
    stage: SharedStage | None,
    check_bounds: bool,
    **kwargs,
):
    """Compile ``outputs`` of ``inputs`` in ``mode`` (None: the default) on the shared stage.

    As PyMC's ``Model.compile_fn(..., point_fn=False)`` does (its bounds check
    by ``check_bounds``), with the rewrites staged (:func:`staged_mode`). Returns
    the function and its shared stage (``stage`` if given), or None in place of
    both for a graph with random variables, which PyMC's compilation serves
    (their generators' updates).
    """
    from pymc.pytensorf import collect_default_updates

    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    if collect_default_updates(inputs=list(inputs), outputs=outs):
        return None, None
    check = (
        "local_check_parameter_to_ninf_switch" if check_bounds else "local_remove_check_parameter"
    )
    final = get_mode(None)
    sink: list = []
    staged = staged_mode(
        get_mode(mode) if mode is not None else final,
        final,
        stage,
        sink,
        including=("random_make_inplace", check),
    )
    kwargs.setdefault("allow_input_downcast", True)
    kwargs.setdefault("accept_inplace", True)
    fn = pytensor.function(list(inputs), outputs, mode=staged, **kwargs)
    return fn, sink[-1]

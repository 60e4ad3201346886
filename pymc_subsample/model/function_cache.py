"""Compiled functions shared by the steps built on the same graphs.

Every step compiles its functions (terms on rows, sums, expansions, ...) from
graphs that it builds anew, and Numba keeps the machine code of every function
it compiles, with no API to free it: a loop that builds and drops many steps
(simulation-based calibration, cross-validation, one step per model order)
would grow with their number. Graphs of the same structure compile to the same
code, so :func:`compile_cached` compiles a graph once and hands the same
:class:`~pytensor.compile.executor.Function` to every later step that asks for
an equal graph.

Two graphs are equal (:func:`graph_key`) when they apply the same operations,
in the same order, to inputs of the same types at the same positions,
constants of the same values and the same shared variables. Functions that
read no shared variable (the per-observation data enter them as inputs) are
kept in one bounded cache, shared across models of the same structure;
functions that read shared variables (``pm.Data`` inputs, read in place, so
that ``pm.set_data`` reaches them) are kept per model, for as long as the
model lives, so that a cache never keeps a dropped model's data alive.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import io_toposort

from .staged_rewrites import SHARED_BEFORE, compile_staged
from .tiered import TieredFunction

__all__ = ["FUNCTION_CACHE_SIZE", "clear_function_cache", "compile_cached", "graph_key"]

#: Compiled functions kept by each cache (least recently used dropped first): a step
#: compiles about ten, so steps of several kinds built in turn all find theirs.
FUNCTION_CACHE_SIZE = 64

_SHARED_FREE: OrderedDict = OrderedDict()
_PER_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _constant_key(data) -> tuple:
    value = np.asarray(data)
    if value.dtype == object:
        return ("object", id(data))
    digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
    return (value.dtype.str, value.shape, digest)


def _kwargs_key(kwargs: dict) -> tuple | None:
    try:
        key = tuple(sorted(kwargs.items()))
        hash(key)
    except TypeError:
        return None
    return key


def graph_key(outputs, inputs: Sequence) -> tuple[tuple, list] | None:
    """Return a key of the graph of ``outputs`` in ``inputs``, and the shared variables it reads.

    The key holds the graph's operations, the inputs' types by position, the
    constants' values (hashed) and the shared variables themselves (so that
    a key keeps them alive and no other variable can take their identity).
    None when the graph has another root (nothing to key it on): it is then
    compiled as usual.
    """
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    inputs = list(inputs)
    coords: dict = {v: ("in", i, v.type) for i, v in enumerate(inputs)}
    parts: list = []
    shared: list = []
    for node in io_toposort(inputs, outs):
        args = []
        for v in node.inputs:
            if v not in coords:
                if isinstance(v, SharedVariable):
                    coords[v] = ("shared", v, v.type)
                    shared.append(v)
                elif isinstance(v, Constant):
                    coords[v] = ("const", v.type, _constant_key(v.data))
                else:
                    return None
            args.append(coords[v])
        parts.append((node.op, tuple(args)))
        for j, out in enumerate(node.outputs):
            coords[out] = ("node", len(parts) - 1, j)
    heads = []
    for v in outs:
        if v not in coords:  # an input or a root returned as it is
            if isinstance(v, SharedVariable):
                coords[v] = ("shared", v, v.type)
                shared.append(v)
            elif isinstance(v, Constant):
                coords[v] = ("const", v.type, _constant_key(v.data))
            else:
                return None
        heads.append(coords[v])
    shape = isinstance(outputs, list | tuple)
    return (tuple(parts), tuple(heads), shape, tuple(v.type for v in inputs)), shared


def _model_shared(model) -> set:
    """Return the model's own shared variables: its ``pm.Data`` and its dimensions' lengths."""
    found = set(getattr(model, "dim_lengths", {}).values())
    found |= {v for v in model.named_vars.values() if isinstance(v, SharedVariable)}
    return {v for v in found if isinstance(v, SharedVariable)}


class _Compiler:
    """``compiler(mode)`` compiles the graph in ``mode`` (None: the given keywords' or default).

    Holds the model weakly (a function kept across models must not keep a
    dropped model alive), and not at all once pickled: a model with the same
    bounds checks then compiles the graph.
    """

    def __init__(self, model, outputs, inputs, trust: bool, kwargs: dict, key=None):
        self._model = weakref.ref(model)
        self.key = key  # graph_key(outputs, inputs), when the caller has it
        self.check_bounds = bool(getattr(model, "check_bounds", True))
        self.outputs, self.inputs = outputs, list(inputs)
        self.trust, self.kwargs = trust, kwargs
        self._stage = None  # the first tier's shared rewrites, for the final tier

    def __getstate__(self):
        return {**self.__dict__, "_model": None, "key": None}  # the stage holds no data

    def source_digest(self) -> str | None:
        """Return a digest of the graph before rewrites, for the record of compiled graphs.

        Its operations in order, the inputs' types by position, the constants'
        values (hashed; object constants by type only), the shared variables'
        names and types, the keywords, the model's bounds checks and PyTensor's
        version (:func:`graph_key`); None for a graph that has no such key.
        """
        import pytensor

        found = self.key if self.key is not None else graph_key(self.outputs, self.inputs)
        if found is None:
            return None
        (parts, heads, shape, types), _ = found

        def coord(c):
            return (c[0], getattr(c[1], "name", None), str(c[2])) if c[0] == "shared" else c

        text = repr(
            (
                [(str(op), [str(coord(a)) for a in args]) for op, args in parts],
                [str(coord(h)) for h in heads],
                shape,
                [str(t) for t in types],
                sorted((k, repr(v)) for k, v in self.kwargs.items()),
                self.check_bounds,
                self.trust,
                pytensor.__version__,
                SHARED_BEFORE,  # the final tier's rewrites are staged there
            )
        )
        # the same in every process: no addresses, no ids of object constants (None, slices)
        text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
        text = re.sub(r"\('object', \d+\)", "('object',)", text)
        return "src-" + hashlib.sha256(text.encode()).hexdigest()

    def __call__(self, mode=None):
        if "mode" not in self.kwargs:  # a tier: rewrites staged, the final reusing the first's
            fn, stage = compile_staged(
                self.inputs,
                self.outputs,
                mode,
                self._stage if mode is None else None,
                self.check_bounds,
                **self.kwargs,
            )
            if fn is not None:
                self._stage = stage if mode is not None else None
                fn.trust_input = self.trust
                return fn
        kw = self.kwargs if mode is None else {**self.kwargs, "mode": mode}
        owner = None if self._model is None else self._model()
        if owner is None:
            import pymc as pm

            owner = pm.Model(check_bounds=self.check_bounds)
        fn = owner.compile_fn(self.outputs, inputs=self.inputs, point_fn=False, **kw)
        fn.trust_input = self.trust
        return fn


def compile_cached(model, outputs, inputs: Sequence, trust: bool = False, **kwargs):
    """Return ``model.compile_fn(outputs, inputs=inputs, point_fn=False, **kwargs)``, compiled once.

    Without a ``mode`` among ``kwargs``, a
    :class:`~pymc_subsample.model.tiered.TieredFunction`: evaluated by PyTensor's
    Python VM first, compiled with the default mode (Numba) once its calls have
    cost a fraction of a second, so that a function called a few times is never
    compiled. With ``mode``, that mode from the start.

    A function compiled for an equal graph (:func:`graph_key`) with the same
    keyword arguments and ``trust`` (PyTensor's ``trust_input``) is returned
    instead of a new one. Callers share it, so they must not set attributes
    on it; a call keeps none of its inputs (PyTensor clears them). A graph
    that reads a shared variable of a step's own (not the model's) is
    compiled anew, and not kept.
    """
    found = graph_key(outputs, inputs)
    compile_in = _Compiler(model, outputs, inputs, trust, kwargs, key=found)

    def compile_new():
        if "mode" in kwargs:
            return compile_in(None)
        return TieredFunction(compile_in)

    kw = _kwargs_key(kwargs)
    if found is None or kw is None:
        return compile_new()
    graph, shared = found
    if shared and not set(shared) <= _model_shared(model):
        return compile_new()
    key = (graph, kw, bool(trust), bool(getattr(model, "check_bounds", True)))
    if shared:
        cache = _PER_MODEL.get(model)
        if cache is None:
            cache = _PER_MODEL[model] = OrderedDict()
    else:
        cache = _SHARED_FREE
    try:
        fn = cache.get(key)
    except TypeError:  # an operation that cannot be hashed
        return compile_new()
    if fn is not None:
        cache.move_to_end(key)
        return fn
    fn = compile_new()
    cache[key] = fn
    while len(cache) > FUNCTION_CACHE_SIZE:
        cache.popitem(last=False)
    return fn


def clear_function_cache() -> None:
    """Drop every cached function (their machine code stays with Numba until the process ends)."""
    _SHARED_FREE.clear()
    _PER_MODEL.clear()

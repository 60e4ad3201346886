"""Where a step's start-up seconds go: PyTensor compilations, their first calls, Numba kernels.

:class:`CompileTrace` patches PyTensor's function maker and compiled functions
and Numba's dispatcher while it is active, and records, for every PyTensor
function compiled: which source line asked for it (the first frame in
``pymc_subsample``, else in ``pymc``), the seconds of its graph rewrites, of its
construction (rewrites and linking) and of its first call (where the Numba
backend compiles the graph to machine code). Numba compilations of functions
that are not PyTensor graphs (the library's own kernels: loaded from the disk
cache or compiled) are timed by module. Named sections (the probe, the
expansion, the mode) are timed inclusively. Used by ``first_draw.py`` only.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections import defaultdict

__all__ = ["SECTIONS", "CompileTrace"]

#: Sections timed inclusively: (label, module, qualified name of the function).
SECTIONS = [
    (
        "observation terms (ObservationTerms)",
        "pymc_subsample.model.terms",
        "ObservationTerms.__init__",
    ),
    ("race plan (timing the model)", "pymc_subsample.steps.base", "RacingStep._plan_races"),
    ("expansion build (Expansion)", "pymc_subsample.model.expansion", "Expansion.__init__"),
    ("expansion sums", "pymc_subsample.model.expansion", "Expansion.sums"),
    ("mode (find_mode)", "pymc_subsample.mcmc.mode", "find_mode"),
    ("surrogate fit (LaplaceFit.fit)", "pymc_subsample.mcmc.laplace", "LaplaceFit.fit"),
    ("probe (probe_laplace_fit)", "pymc_subsample.mcmc.regime", "probe_laplace_fit"),
    ("audit joint log density", "pymc_subsample.steps.base", "RacingStep._compile_joint"),
]


def _caller() -> str:
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if "pymc_subsample" in name and "function_cache" not in name and "tiered" not in name:
            short = name.split("pymc_subsample/")[-1]
            return f"{short}:{frame.f_code.co_name}"
        if fallback is None and "/pymc/" in name and "pytensorf" not in name:
            fallback = f"pymc/{name.split('/pymc/')[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return fallback or "other"


def _timed(original, record):
    """Wrap ``original`` so that each call's duration in seconds goes to ``record``."""

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record(time.perf_counter() - t0)

    return wrapped


class CompileTrace:
    """Record compilations while active (a context manager); :meth:`summary` reads them."""

    def __init__(self):
        self.functions: list[dict] = []
        self.kernels: dict[str, float] = defaultdict(float)
        self.sections: dict[str, float] = defaultdict(float)
        self._undo: list = []

    def _patch(self, owner, name, wrapper_factory):
        original = getattr(owner, name)
        raw = owner.__dict__.get(name, original) if isinstance(owner, type) else original
        setattr(owner, name, wrapper_factory(original))
        self._undo.append((owner, name, raw))

    def __enter__(self):
        from numba.core import dispatcher
        from pytensor.compile import executor, maker

        trace = self

        def maker_init(original):
            @functools.wraps(original)
            def init(self, *args, **kwargs):
                t0 = time.perf_counter()
                original(self, *args, **kwargs)
                self._trace = {
                    "caller": _caller(),
                    "construct_s": time.perf_counter() - t0,
                    "rewrite_s": trace._last_rewrite,
                    "first_call_s": None,
                    "calls": 0,
                    "all_calls_s": 0.0,
                    "first_call_cpu_s": 0.0,
                    "n_nodes": len(self.fgraph.apply_nodes),
                    "linker": type(self.linker).__name__,
                }
                trace.functions.append(self._trace)

            return init

        def prepare(original):
            def record(seconds):
                trace._last_rewrite = seconds

            return staticmethod(_timed(original, record))

        def call(original):
            @functools.wraps(original)
            def wrapped(self, *args, **kwargs):
                record = getattr(self.maker, "_trace", None)
                if record is None:
                    return original(self, *args, **kwargs)
                record["calls"] += 1
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    seconds = time.perf_counter() - t0
                    record["all_calls_s"] += seconds
                    if record["first_call_s"] is None:
                        record["first_call_s"] = seconds
                        record["first_call_cpu_s"] = time.process_time() - c0

            return wrapped

        depth = [0]

        def compile_for_args(original):
            @functools.wraps(original)
            def wrapped(self, *args, **kwargs):
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    depth[0] -= 1
                    module = getattr(self.py_func, "__module__", "") or ""
                    if depth[0] == 0 and "pytensor" not in module:
                        trace.kernels[module] += time.perf_counter() - t0

            return wrapped

        self._last_rewrite = 0.0
        self._patch(maker.FunctionMaker, "prepare_fgraph", prepare)
        self._patch(maker.FunctionMaker, "__init__", maker_init)
        self._patch(executor.Function, "__call__", call)
        self._patch(dispatcher.Dispatcher, "_compile_for_args", compile_for_args)
        for label, module, qualname in SECTIONS:
            try:
                owner = importlib.import_module(module)
            except ImportError:
                continue
            *path, attr = qualname.split(".")
            target = owner
            for part in path:
                target = getattr(target, part, None)
            if target is None or not hasattr(target, attr):
                continue
            original = getattr(target, attr)
            self._patch(target, attr, self._section(label))
            if not path:  # a module function: also where other modules imported it
                wrapped = getattr(target, attr)
                for name, mod in list(sys.modules.items()):
                    if name.startswith("pymc_subsample") and getattr(mod, attr, None) is original:
                        setattr(mod, attr, wrapped)
                        self._undo.append((mod, attr, original))
        return self

    def _section(self, label):
        trace = self

        def factory(original):
            def record(seconds):
                trace.sections[label] += seconds

            return _timed(original, record)

        return factory

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        return False

    def summary(self) -> dict:
        """Return the functions (by caller), kernels (by module) and sections, in seconds."""
        by_caller: dict[str, dict] = {}
        for f in self.functions:
            row = by_caller.setdefault(
                f["caller"],
                {
                    "n": 0,
                    "rewrite_s": 0.0,
                    "construct_s": 0.0,
                    "first_call_s": 0.0,
                    "first_call_cpu_s": 0.0,
                    "calls": 0,
                },
            )
            row["calls"] += f["calls"]
            row["n"] += 1
            row["rewrite_s"] += f.get("rewrite_s", 0.0)
            row["construct_s"] += f["construct_s"]
            row["first_call_s"] += f["first_call_s"] or 0.0
            row["first_call_cpu_s"] += f["first_call_cpu_s"]
        return {
            "n_functions": len(self.functions),
            "rewrite_s": sum(f.get("rewrite_s", 0.0) for f in self.functions),
            "construct_s": sum(f["construct_s"] for f in self.functions),
            "first_call_s": sum(f["first_call_s"] or 0.0 for f in self.functions),
            "functions": by_caller,
            "detail": [
                {
                    k: f.get(k)
                    for k in (
                        "caller",
                        "construct_s",
                        "first_call_s",
                        "first_call_cpu_s",
                        "calls",
                        "all_calls_s",
                        "n_nodes",
                        "linker",
                    )
                }
                for f in self.functions
            ],
            "kernels": dict(self.kernels),
            "sections": dict(self.sections),
        }

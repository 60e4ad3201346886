"""Steps built and dropped are freed: nothing of theirs stays in a module-level cache.

A loop that builds many steps (simulation-based calibration, cross-validation,
one step per model order) must not grow with their number. Measured two ways:
weak references to a dropped step, its terms and its compiled reward function
(which a module-level cache of race drivers used to keep) must die, and the
memory that ``tracemalloc`` traces to this package's own code must not grow
from one batch of built-and-dropped steps to the next. Memory that Numba keeps
for every function it compiles (machine code and typing records, freed by no
API) is outside this package and not measured here.
"""

import gc
import tracemalloc
import weakref

import numpy as np
import pymc as pm
import pytest

import pymc_subsample
from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.steps.gibbs import COMPILED_MIN_OBS

PACKAGE = pymc_subsample.__path__[0]
#: Bytes of traced growth attributed to the package per built-and-dropped step above
#: which it counts as a leak (the compiled-race entry of a module-level cache was ~10 kB of
#: Python objects in the package's frames, besides the step's functions it kept alive).
TOLERANCE_PER_STEP = 512


def _model(n_obs: int):
    rng = np.random.default_rng(0)
    with pm.Model() as model:
        y = pm.Data("y_data", rng.normal(size=n_obs))
        q = pm.Categorical("q", p=np.full(5, 0.2))
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", pm.math.constant(np.linspace(0.0, 1.0, 5))[q] + mu, 1.0, observed=y)
    return model


@pytest.fixture(scope="module")
def small():
    return _model(200)


@pytest.fixture(scope="module")
def large():
    return _model(2 * COMPILED_MIN_OBS)


def _build(model, kind: str, draws: int = 2):
    with model:
        if kind == "racing":
            step = RacingMetropolis([model["mu"]], rng=0)
        else:
            step = SubsampledCategoricalGibbs(
                [model["q"]],
                rng=0,
                race=RaceOptions(batch_size=400, exact_fraction=0.1),
                audit=AuditOptions(every=0),
            )
    point = model.initial_point()
    for _ in range(draws):
        point, _ = step.step(point)
    return step


def _package_bytes(snapshot) -> int:
    """Traced bytes allocated in this package's own frames."""
    ours = snapshot.filter_traces([tracemalloc.Filter(True, f"{PACKAGE}/*")])
    return sum(s.size for s in ours.statistics("filename"))


def _growth(model, kind: str, first: int, second: int) -> tuple[int, int]:
    """Package-traced growth over ``first`` built-and-dropped steps, then over ``second`` more."""
    _build(model, kind)  # warm: module imports, first compilations
    gc.collect()
    tracemalloc.start(1)
    try:
        sizes = [_package_bytes(tracemalloc.take_snapshot())]
        for count in (first, second):
            for _ in range(count):
                _build(model, kind)
            gc.collect()
            sizes.append(_package_bytes(tracemalloc.take_snapshot()))
    finally:
        tracemalloc.stop()
    return sizes[1] - sizes[0], sizes[2] - sizes[1]


def test_compiled_gibbs_steps_and_their_functions_are_freed(large):
    """At most the last compiled race driver is cached strongly (RECENT_DRIVERS = 1)."""
    refs = []
    for _ in range(2):
        step = _build(large, "gibbs")
        assert step._compiled, "the compiled race should apply at this N"
        refs.append([weakref.ref(x) for x in (step, step.terms, step.terms.compiled_rows().fn)])
        del step
        gc.collect()
    assert [r() is None for r in refs[0]] == [True, True, True]
    assert [r() is None for r in refs[1][:2]] == [True, True]


@pytest.mark.parametrize("kind", ["gibbs", "racing"])
def test_dropped_steps_are_freed(small, kind):
    """The step, its terms and its permuted copies of the data are freed.

    Numba keeps what it compiled, and with it the shared variables the compiled
    functions read: the copies' buffers are released when the terms go.
    """
    step = _build(small, kind)
    refs = [weakref.ref(step), weakref.ref(step.terms)]
    refs += [weakref.ref(c) for c in step.terms.permuted_rows()]
    assert len(refs) == 3
    del step
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]


@pytest.mark.slow  # tracemalloc slows the compilations down several times (about 4 min)
@pytest.mark.parametrize("kind", ["gibbs", "racing"])
def test_memory_does_not_grow_with_the_number_of_steps(small, kind):
    first, second = _growth(small, kind, 5, 10)
    assert second <= TOLERANCE_PER_STEP * 10, (first, second)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gibbs", "racing"])
def test_fifty_steps_do_not_grow(small, large, kind):
    first, second = _growth(small, kind, 10, 40)
    assert second <= TOLERANCE_PER_STEP * 40, (first, second)
    first, second = _growth(large, "gibbs", 3, 7)  # compiled races
    assert second <= TOLERANCE_PER_STEP * 7, (first, second)

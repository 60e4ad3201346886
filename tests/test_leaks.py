"""Steps built and dropped are freed, and leave no more memory behind than PyMC's steps.

A loop that builds many steps (simulation-based calibration, cross-validation,
one step per model order) must not grow with their number. Measured three ways:
weak references to a dropped step and its terms (which a module-level cache of
race drivers used to keep) must die, the
memory that ``tracemalloc`` traces to this package's own code must not grow
from one batch of built-and-dropped steps to the next. Numba keeps the machine
code of every function it compiles (freed by no API), so steps built on equal
graphs share their compiled functions
(:mod:`pymc_subsample.model.function_cache`): the resident memory a
built-and-dropped step leaves behind is measured against PyMC's own steps'.
"""

import ctypes
import gc
import os
import tracemalloc
import weakref

import numpy as np
import pymc as pm
import pytest

import pymc_subsample
from pymc_subsample import ObservationTerms, RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.model.function_cache import compile_cached, graph_key
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.steps.gibbs import COMPILED_MIN_OBS

PACKAGE = pymc_subsample.__path__[0]
#: Bytes of traced growth attributed to the package per built-and-dropped step above
#: which it counts as a leak (the compiled-race entry of a module-level cache was ~10 kB of
#: Python objects in the package's frames, besides the step's functions it kept alive).
TOLERANCE_PER_STEP = 512
#: Resident memory (MB) a built-and-dropped step may leave per step beyond twice what PyMC's
#: own step on the same model leaves (the figures are small and noisy). Before the compiled
#: functions were shared, each step compiled ten or more of its own and left ten to twenty
#: times PyMC's figure.
RSS_MARGIN_MB = 0.5
#: Steps built and dropped before the measure: the first few fill bounded caches (PyMC's,
#: PyTensor's, the allocator's), after which the growth per step is steady.
RSS_WARM_STEPS = 8


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
        elif kind == "pm_metropolis":
            step = pm.Metropolis([model["mu"]], rng=0)
        elif kind == "pm_gibbs":
            step = pm.CategoricalGibbsMetropolis([model["q"]], rng=0)
        else:
            step = SubsampledCategoricalGibbs(
                [model["q"]],
                rng=0,
                race=RaceOptions(batch_size=400, exact_fraction=0.1),
                audit=AuditOptions(every=0),
            )
            step.finish_compiling()  # the compiled race (and its driver) a long chain reaches
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


def test_compiled_gibbs_steps_are_freed_and_share_their_functions(large):
    """The steps and terms are freed; the next step reuses the compiled rows function.

    The function (and the race driver compiled for it) stays in a bounded
    cache instead of being compiled anew, and so kept again by Numba, for every step.
    """
    refs, fns = [], []
    for _ in range(2):
        step = _build(large, "gibbs")
        assert step.compiled, "the compiled race should apply at this N"
        refs.append([weakref.ref(x) for x in (step, step.terms)])
        fns.append(id(step.terms.compiled_rows().fn))
        del step
        gc.collect()
    assert [r() is None for pair in refs for r in pair] == [True] * 4
    assert fns[0] == fns[1]


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


def _resident_mb() -> float:
    """Resident memory (MB), freed heap memory handed back first (glibc's malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # another C library: the figure is noisier
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _rss_per_step(model, kind: str, count: int) -> float:
    """Resident memory (MB) left per built-and-dropped step, over ``count`` after warm ones.

    The warm steps end with every shared function in its final tier: a function that
    moves to Numba while the steps are counted keeps its machine code once, not per step.
    """
    for _ in range(RSS_WARM_STEPS):
        step = _build(model, kind)
    if hasattr(step, "finish_compiling"):
        step.finish_compiling()
    del step
    before = _resident_mb()
    for _ in range(count):
        _build(model, kind)
    gc.collect()
    return (_resident_mb() - before) / count


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
@pytest.mark.parametrize(
    ("kind", "baseline", "size"),
    [("racing", "pm_metropolis", "small"), ("gibbs", "pm_gibbs", "large")],
)
def test_resident_memory_per_dropped_step_near_pymc(kind, baseline, size, request):
    """A built-and-dropped step leaves about what PyMC's step leaves (compiled code kept by Numba).

    The compiled race of the Gibbs step applies on the large model.
    """
    model = request.getfixturevalue(size)
    ours = _rss_per_step(model, kind, 8)
    theirs = _rss_per_step(model, baseline, 8)
    assert ours <= 2 * max(theirs, 0.0) + RSS_MARGIN_MB, (ours, theirs)


def test_steps_on_one_model_share_their_compiled_functions(small):
    """A second step (and a step on an equal model) compiles none of the terms' functions anew."""
    first, second = _build(small, "racing"), _build(small, "racing")
    assert second.terms._rows_fn is first.terms._rows_fn
    assert second.terms._exact_fn is first.terms._exact_fn
    twin = _model(200)
    with twin:
        terms = ObservationTerms(twin, [twin["mu"]])
    assert terms._rows_fn is first.terms._rows_fn  # no shared variable: across models
    # a graph that reads a model's pm.Data is kept for that model only
    data = small["y_data"]
    key_small, shared = graph_key(data.sum() + small["mu"], [small["mu"]])
    key_twin, _ = graph_key(twin["y_data"].sum() + twin["mu"], [twin["mu"]])
    assert shared == [data] and key_small != key_twin
    fn = compile_cached(small, data.sum() + small["mu"], [small["mu"]])
    assert compile_cached(small, data.sum() + small["mu"], [small["mu"]]) is fn
    assert compile_cached(twin, twin["y_data"].sum() + twin["mu"], [twin["mu"]]) is not fn


def test_shared_functions_read_each_steps_own_data():
    """Two live steps on one model share functions, each reading its own copy and new data."""
    model = _model(300)
    steps = [_build(model, "racing"), _build(model, "racing", draws=3)]
    assert steps[0].terms._rows_fn is steps[1].terms._rows_fn
    y = model["y_data"].get_value()
    point = model.initial_point()
    cands = [np.array([0.3, -0.2])]

    def exact(values):
        mean = np.linspace(0.0, 1.0, 5)[point["q"]] + cands[0][:, None]
        return -0.5 * (values[None, :] - mean) ** 2 - 0.5 * np.log(2 * np.pi)

    for step in steps:
        perm = step.terms.permutation()
        got = step.terms.loglik_batch(cands, slice(0, 300), point)
        np.testing.assert_allclose(got, exact(y[perm]), rtol=1e-12)
    new = np.random.default_rng(5).normal(size=120)
    with model:
        pm.set_data({"y_data": new})
    for step in steps:
        step.terms.take_up_data(model.initial_point())
        assert step.terms.n_obs == 120
        np.testing.assert_allclose(step.terms.loglik_full(cands, point), exact(new), rtol=1e-12)
        np.testing.assert_allclose(
            step.terms.loglik_sum(cands, point), exact(new).sum(axis=1), rtol=1e-10
        )


@pytest.mark.parametrize("kind", ["gibbs", "racing"])
def test_cached_functions_do_not_keep_a_dropped_models_data(kind):
    """Functions that read a model's pm.Data are cached for as long as the model lives only."""
    model = _model(300)
    step = _build(model, kind)
    refs = [weakref.ref(model), weakref.ref(model["y_data"])]
    del step, model
    gc.collect()
    gc.collect()  # the model's cache goes in the first collection, its functions in the next
    assert [r() is None for r in refs] == [True, True]


def test_steps_that_share_a_function_share_its_chunk_loop():
    """The chunked sums' compiled loop is compiled once per shared function, not per step."""
    model = _model(2 * COMPILED_MIN_OBS * 10)
    sums = []
    for _ in range(2):
        step = _build(model, "racing", draws=0)
        step.terms.promote()  # the Numba tier, whose kernel the chunk loop calls
        step.terms.loglik_sum([np.array([0.1, 0.2])], model.initial_point())
        sums.append(step.terms._sum_rows)
    assert sums[0].fn is sums[1].fn
    assert sums[0]._driver is not None and sums[1]._driver is sums[0]._driver

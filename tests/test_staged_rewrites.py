"""The final tier built on the first tier's shared rewrites is the graph built from scratch."""

import cloudpickle
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.model.function_cache import _Compiler
from pymc_subsample.model.staged_rewrites import compile_staged
from pymc_subsample.model.tiered import START_MODE, TieredFunction, graph_digest


def _tiered(obj, found=None, seen=None) -> list:
    """Every TieredFunction reachable from ``obj`` through attributes, lists and dicts."""
    found = [] if found is None else found
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, np.ndarray | str | bytes | int | float):
        return found
    seen.add(id(obj))
    if isinstance(obj, TieredFunction):
        found.append(obj)
        return found
    module = type(obj).__module__ or ""
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, list | tuple | set):
        children = list(obj)
    elif module.startswith("pymc_subsample") and hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    else:
        return found
    for child in children:
        _tiered(child, found, seen)
    return found


def _zoo_steps():
    """Steps of three shapes: softplus terms, a Student-t block, a Categorical's terms."""
    rng = np.random.default_rng(0)
    n = 2_000
    x = rng.normal(size=n)
    y_bin = rng.random(n) < 1 / (1 + np.exp(-(0.5 + x)))
    y_t = 1.0 + 2.0 * x + rng.standard_t(4, size=n)
    steps = []
    with pm.Model() as logistic:
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3)
        logit_p = a + b * pm.Data("x", x)
        pm.Bernoulli("obs", logit_p=logit_p, observed=pm.Data("y", y_bin.astype(float)))
        steps.append((logistic, RacingMetropolis([a, b], rng=0)))
    with pm.Model() as student:
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3)
        nu = pm.Gamma("nu", 2, 0.1)
        sigma = pm.HalfNormal("sigma", 2)
        mu = a + b * pm.Data("x", x)
        pm.StudentT("obs", nu=nu, mu=mu, sigma=sigma, observed=pm.Data("y", y_t))
        steps.append((student, RacingMetropolis([a, b, nu, sigma], rng=0)))
    with pm.Model() as choice:
        k = pm.Categorical("k", p=np.ones(3) / 3)
        scale = pt.as_tensor(np.array([0.5, 1.0, 2.0]))[k]
        pm.Normal("obs", 0.0, scale, observed=pm.Data("y", rng.normal(size=n)))
        steps.append((choice, SubsampledCategoricalGibbs([k], rng=0)))
    return steps


def test_final_tier_from_the_shared_stage_is_the_graph_built_from_scratch():
    """For every function of the zoo's steps: the same rewritten graph, the same values."""
    checked = differ = 0
    for model, step in _zoo_steps():
        with model:
            step.step(model.initial_point())  # the functions the first draw calls
        for fn in _tiered(step):
            compiler = fn._compile
            if not isinstance(compiler, _Compiler) or "mode" in compiler.kwargs:
                continue
            compiler._stage = None
            first = compiler(START_MODE)  # keeps its shared stage
            assert compiler._stage is not None
            moved = compiler(None)  # starts from it, and drops it
            assert compiler._stage is None
            fresh = compiler(None)  # runs the shared stage itself
            assert graph_digest(moved) == graph_digest(fresh)
            differ += graph_digest(first) != graph_digest(moved)
            checked += 1
    assert checked >= 10
    assert differ >= 3  # the tiers' own rewrites (fusion, NumPy functions) changed graphs


def test_the_kept_stage_travels_without_data():
    """A pickled compiler keeps its shared stage, whose inputs hold no values (no pm.Data
    rows), and builds from it the final tier the first process would build."""
    from pytensor.compile.sharedvalue import SharedVariable

    x = pt.dvector("x")
    with pm.Model() as model:
        rows = pm.Data("rows", np.arange(50_000.0))
    compiler = _Compiler(model, [(pt.softplus(x).sum() * rows).sum()], [x], False, {})
    first = compiler(START_MODE)
    assert compiler._stage is not None
    assert not any(isinstance(v, SharedVariable) for v in compiler._stage.inputs)
    payload = cloudpickle.dumps(compiler)
    assert len(payload) < 1.5 * 50_000 * 8  # the rows (400 kB) travel once, with the graph
    copy = cloudpickle.loads(payload)
    assert copy._stage is not None
    value = np.linspace(-3, 3, 7)
    there = copy(None)
    here = compiler(None)
    assert graph_digest(there) == graph_digest(here)
    np.testing.assert_allclose(there(value), first(value), rtol=1e-12)
    function = cloudpickle.loads(cloudpickle.dumps(first))  # a pickled first tier
    np.testing.assert_allclose(function(value), first(value), rtol=1e-12)


def test_graphs_with_random_variables_go_to_pymc():
    """PyMC's compilation updates their generators: no staged compilation for them."""
    x = pt.dscalar("x")
    draw = pm.Normal.dist(0.0, 1.0)
    fn, stage = compile_staged([x], [x + draw], None, None, check_bounds=True)
    assert fn is None and stage is None


@pytest.mark.parametrize("check_bounds", [True, False])
def test_bounds_checks_as_pymc_compiles_them(check_bounds):
    """Outside the support: -inf with bounds checks, as PyMC's compile_fn gives."""
    sigma = pt.dscalar("sigma")
    with pm.Model(check_bounds=check_bounds) as model:
        pass
    logp = pm.logp(pm.Normal.dist(0.0, sigma), 0.5)
    staged, _ = compile_staged([sigma], [logp], None, None, check_bounds=check_bounds)
    expected = model.compile_fn([logp], inputs=[sigma], point_fn=False)
    for value in (1.0, 2.0):
        np.testing.assert_allclose(staged(value), expected(value), rtol=1e-12)
    if check_bounds:
        assert np.isneginf(staged(-1.0)[0]) and np.isneginf(expected(-1.0)[0])


def test_a_stage_that_does_not_fit_is_built_anew():
    """A kept stage of another graph (other inputs) is not grafted: the stage is run anew."""
    x = pt.dvector("x")
    y = pt.dscalar("y")
    _, other = compile_staged([x], [pt.exp(x).sum()], None, None, check_bounds=True)
    fn, stage = compile_staged([x, y], [pt.exp(x).sum() * y], None, other, check_bounds=True)
    assert stage is not other
    value = np.arange(3.0)
    np.testing.assert_allclose(fn(value, 2.0)[0], 2.0 * np.exp(value).sum(), rtol=1e-12)

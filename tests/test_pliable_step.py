"""PliableRejection inside pm.sample: exact posteriors, Tierney invariance, bad input."""

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_subsample import PliableRejection

P_MIN = 1e-3
SAMPLE = {"chains": 1, "progressbar": False, "compute_convergence_checks": False}


def conjugate_model(y):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y)
    return model


def conjugate_posterior(y):
    var = 1 / (1 / 100 + len(y))
    return stats.norm(var * y.sum(), np.sqrt(var))


@pytest.mark.parametrize("refine", [False, True])
def test_conjugate_posterior_is_exact_and_iid(refine):
    """Normal mean with known variance: draws pass KS against the exact posterior."""
    y = np.random.default_rng(0).normal(1.5, 1, 40)
    with conjugate_model(y) as model:
        step = [PliableRejection([model["mu"]], refine=refine)]
        idata = pm.sample(draws=3000, tune=100, step=step, random_seed=1, **SAMPLE)
    draws = idata.posterior["mu"].values.ravel()
    assert stats.kstest(draws, conjugate_posterior(y).cdf).pvalue > P_MIN
    st = idata.sample_stats
    # the fixed conditional is bounded by the envelope: every move accepted (i.i.d. draws)
    assert float(st["accept"].min()) == 1.0
    assert int(st["envelope_violations"].sum()) == 0
    assert float(st["accepted_first"].mean()) > 0.5
    assert abs(np.corrcoef(draws[:-1], draws[1:])[0, 1]) < 0.06


def test_block_with_moving_rest_agrees_with_nuts():
    """(mu, sigma) by PliableRejection, nu by NUTS, against NUTS on everything."""
    y = np.random.default_rng(1).standard_t(3, 30) * 2 + 1

    def model():
        with pm.Model() as m:
            mu = pm.Normal("mu", 0, 10)
            s = pm.HalfNormal("s", 5)
            nu = pm.Exponential("nu", 0.1)
            pm.StudentT("y", nu=nu, mu=mu, sigma=s, observed=y)
        return m

    with model() as m:
        step = [PliableRejection([m["mu"], m["s"]]), pm.NUTS([m["nu"]])]
        a = pm.sample(draws=2000, tune=300, step=step, random_seed=2, **SAMPLE)
        b = pm.sample(draws=2000, tune=1000, random_seed=3, **SAMPLE)
    import arviz as az

    for v in ("mu", "s"):
        xa, xb = a.posterior[v].values.ravel(), b.posterior[v].values.ravel()
        se = np.hypot(float(az.mcse(a, var_names=[v])[v]), float(az.mcse(b, var_names=[v])[v]))
        assert abs(xa.mean() - xb.mean()) < 4 * se, v
        assert abs(xa.std() / xb.std() - 1) < 0.1, v


def test_tierney_correction_keeps_the_conditional_with_a_wrong_envelope():
    """An envelope built for other data is far from bounding the conditional.

    Without the Metropolized correction the chain would sample min(pi, E); with it
    the chain still targets pi (mean and sd within Monte Carlo error).
    """
    rng = np.random.default_rng(4)
    y_build, y_true = rng.normal(0.0, 1, 40), rng.normal(0.6, 1, 40)
    with pm.Model() as model:
        data = pm.Data("y_data", y_build)
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=data)
        step = PliableRejection([mu], rng=5)
        point = model.initial_point()
        step.tune = False
        step.step(point)  # builds the envelope for y_build
        pm.set_data({"y_data": y_true})
    step._rebuild_due = False
    draws, accepts = [], []
    for _ in range(4000):
        point, (st,) = step.step(point)
        draws.append(float(point["mu"]))
        accepts.append(st["accept"])
    draws = np.array(draws)
    post = conjugate_posterior(y_true)
    import arviz as az

    ess = float(az.ess(draws[None, :]))
    se = post.std() / np.sqrt(ess)
    assert abs(draws.mean() - post.mean()) < 4 * se
    assert abs(draws.std() / post.std() - 1) < 4 / np.sqrt(ess) + 0.02
    assert np.mean(accepts) < 0.9  # the envelope is really wrong for the new conditional


def test_reproducible_and_multicore():
    y = np.random.default_rng(6).normal(1.5, 1, 20)
    with conjugate_model(y) as model:
        kw = {"draws": 100, "tune": 50, "random_seed": 7, "progressbar": False}
        a = pm.sample(step=[PliableRejection([model["mu"]])], chains=2, cores=1, **kw)
        b = pm.sample(step=[PliableRejection([model["mu"]])], chains=2, cores=2, **kw)
    np.testing.assert_array_equal(a.posterior["mu"].values, b.posterior["mu"].values)


def test_bad_input_raises():
    with pm.Model() as model:
        k = pm.Categorical("k", p=[0.5, 0.5])
        x = pm.Normal("x", 0, 1, shape=4)
        z = pm.Normal("z", 0, 1)
    with model:
        with pytest.raises(ValueError, match="discrete"):
            PliableRejection([k])
        with pytest.raises(ValueError, match="4 dimensions"):
            PliableRejection([x])
        with pytest.raises(ValueError, match="rebuild"):
            PliableRejection([z], rebuild="never")
        with pytest.raises(ValueError, match="envelope_error"):
            PliableRejection([z], envelope_error=0.0)
        with pytest.raises(ValueError, match="max_proposals"):
            PliableRejection([z], max_proposals=0)


def test_bimodal_posterior_mode_weights():
    """2-D clutter posterior with two modes: the share of draws in each matches quadrature.

    NUTS chains stay in the mode they start in; the step's proposal learns both
    modes during tuning and its draws are i.i.d. across them.
    """
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.uniform(-4, -2, (10, 2)), rng.uniform(2, 4, (10, 2))])
    with pm.Model():
        theta = pm.Normal("theta", 0.0, 10.0, shape=2)
        comps = [
            pm.MvNormal.dist(theta, cov=np.eye(2)),
            pm.MvNormal.dist(np.zeros(2), cov=10.0 * np.eye(2)),
        ]
        pm.Mixture("x", w=[0.5, 0.5], comp_dists=comps, observed=x)
        idata = pm.sample(
            draws=3000, tune=200, step=[PliableRejection([theta])], random_seed=9, **SAMPLE
        )
    grid = np.linspace(-10, 10, 401)
    t0, t1 = np.meshgrid(grid, grid, indexing="ij")
    pts = np.column_stack([t0.ravel(), t1.ravel()])
    log_post = stats.norm.logpdf(pts, 0, 10).sum(axis=1)
    clutter = stats.multivariate_normal.logpdf(x, np.zeros(2), 10 * np.eye(2))
    for xi, ci in zip(x, clutter, strict=True):
        signal = stats.norm.logpdf(xi, pts, 1).sum(axis=1)
        log_post += np.logaddexp(np.log(0.5) + signal, np.log(0.5) + ci)
    post = np.exp(log_post - log_post.max())
    p_exact = post[pts[:, 0] > 0].sum() / post.sum()
    assert 0.1 < p_exact < 0.9  # two modes with real weight
    draws = idata.posterior["theta"].values.reshape(-1, 2)
    p_hat = np.mean(draws[:, 0] > 0)
    assert abs(p_hat - p_exact) < 4 * np.sqrt(p_exact * (1 - p_exact) / len(draws))


def test_step_pickles_after_building_its_envelope():
    """spawn/forkserver start methods cloudpickle the step."""
    import cloudpickle

    y = np.random.default_rng(10).normal(1.5, 1, 20)
    with conjugate_model(y) as model:
        step = PliableRejection([model["mu"]], rng=11)
    point = model.initial_point()
    point, _ = step.step(point)
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    new, (st,) = clone.step(point)
    assert st["accept"] == 1.0 and np.isfinite(new["mu"])

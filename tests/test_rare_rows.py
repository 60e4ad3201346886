"""Control variates that miss a few rows entirely, and the races' error at low acceptance."""

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import RacingMetropolis
from pymc_subsample.mcmc.surrogate import MISFIT_RARE, misfit_share


def test_misfit_share_tells_piecewise_linear_terms_from_smooth_ones():
    rng = np.random.default_rng(0)
    y = rng.laplace(size=4000)
    x0, x1, ref = 0.0, 0.05, 0.01

    def laplace(mu):
        return -np.abs(y - mu)

    def taylor(mu):  # exact gradient of |y - mu| at ref, no curvature
        return laplace(ref) + np.sign(y - ref) * (mu - ref)

    raw = laplace(x1) - laplace(x0)
    residual = (laplace(x1) - taylor(x1)) - (laplace(x0) - taylor(x0))
    share = misfit_share(residual, raw)
    # the rows between the points (and the reference) are missed: a few percent
    between = np.mean((y > min(x0, ref)) & (y < max(x1, ref)))
    assert 0.0 < share <= MISFIT_RARE
    assert share == pytest.approx(between, rel=0.2)

    def normal(mu):
        return -0.5 * (y - mu) ** 2

    def quadratic(mu):  # exact: residuals are rounding
        return normal(ref) + (y - ref) * (mu - ref) - 0.5 * (mu - ref) ** 2

    raw = normal(x1) - normal(x0)
    residual = (normal(x1) - quadratic(x1)) - (normal(x0) - quadratic(x0))
    assert misfit_share(residual, raw) == 0.0

    def logistic(b):  # smooth: third-order residuals on every row
        return -np.log1p(np.exp(-b * y))

    def logistic_taylor(b):
        p = 1.0 / (1.0 + np.exp(ref * y))
        return logistic(ref) + y * p * (b - ref) - 0.5 * y**2 * p * (1 - p) * (b - ref) ** 2

    raw = logistic(x1) - logistic(x0)
    residual = (logistic(x1) - logistic_taylor(x1)) - (logistic(x0) - logistic_taylor(x0))
    assert misfit_share(residual, raw) == 0.0
    assert misfit_share(np.array([np.nan]), np.array([1.0])) == 0.0


def _laplace_model(n, seed=3):
    rng = np.random.default_rng(seed)

    def logp(value, mu):
        return -pt.abs(value - mu) - pt.log(2.0)

    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.CustomDist("y", mu, logp=logp, observed=pm.Data("yd", rng.laplace(0.2, 1.0, n)))
    return model


def _normal_model(n, seed=3):
    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 1, observed=pm.Data("yd", rng.normal(0.2, 1.0, n)))
    return model


def _tune(model, n_tune):
    with model:
        step = RacingMetropolis([model["mu"]], proposal="hmc", rng=1)
    step.setup_chain(np.random.default_rng(2), tune=n_tune, draws=10)
    point = model.initial_point()
    for _ in range(n_tune):
        point, _ = step.step(point)
    step.stop_tuning()
    return step


def test_a_piecewise_linear_likelihood_races_on_the_raw_terms_and_says_so():
    with pytest.warns(UserWarning, match="miss the terms' differences entirely"):
        step = _tune(_laplace_model(3000), 5)
    assert step.fit.raw_races
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no such warning for a smooth model
        step = _tune(_normal_model(3000), 5)
    assert not step.fit.raw_races


def test_race_delta_follows_the_acceptance_of_tuning():
    step = _tune(_normal_model(2000), 60)
    assert step.race_delta == step.race_config.delta
    rate = float(np.mean(step.tuning_accepts))
    expected = step.delta * min(1.0, max(rate, 0.01) / (1 - max(rate, 0.01)))
    assert step.race_delta == pytest.approx(expected)
    # a new chain starts its tuning at delta again
    step.setup_chain(np.random.default_rng(3), tune=10, draws=10)
    assert step.race_delta == step.delta == step.race_config.delta
    step._tuning_accepts.extend([0.0] * 50)
    step.stop_tuning()
    assert step.race_delta == pytest.approx(step.delta * 0.01 / 0.99)


@pytest.mark.slow
def test_laplace_location_at_scale_matches_the_exact_conditional():
    """RacingMetropolis racing HMC on a Laplace location, N = 20,000: the chain's
    quantiles match the exact conditional on a grid (a race that misses the rows between
    two points gave a chain twice as wide)."""
    model = _laplace_model(20_000, seed=11)
    point = model.initial_point()
    logp = model.compile_logp()
    grid = np.linspace(0.1, 0.35, 2001)
    lps = np.array([logp(point | {"mu": np.asarray(g)}) for g in grid])
    w = np.exp(lps - lps.max())
    w /= w.sum()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        idata = pm.sample(
            step=[RacingMetropolis([model["mu"]], proposal="hmc")],
            tune=1000, draws=3000, chains=2, cores=1,
            random_seed=4, progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    draws = idata.posterior["mu"].values.ravel()
    mean = float(grid @ w)
    sd = float(np.sqrt(grid**2 @ w - mean**2))
    import arviz as az

    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(ess)
    assert abs(draws.std() / sd - 1) < 4 / np.sqrt(2 * ess) + 0.05

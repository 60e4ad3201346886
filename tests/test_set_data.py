"""Data set anew with ``pm.set_data`` are taken up at the next draw, never stale rows.

Each posterior is compared with the exact answer on the new data (conjugate
regression, or enumeration of a categorical conditional). The new data of a
new length keep their first rows apart from the others, so that a step that
still reads only the first :math:`N_{old}` rows lands far from the answer.
"""

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import RaceOptions

SAMPLE = {"chains": 1, "cores": 1, "compute_convergence_checks": False, "progressbar": False}
PRIOR_SD = 10.0
GRID = np.round(np.arange(1.40, 1.8001, 0.02), 2)  # the selector's means


def regression_data(n_obs, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n_obs)
    return x, alpha + beta * x + rng.normal(size=n_obs)


def regression_model(x, y):
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        alpha = pm.Normal("alpha", 0.0, PRIOR_SD)
        beta = pm.Normal("beta", 0.0, PRIOR_SD)
        pm.Normal("y", alpha + beta * x_data, 1.0, observed=y_data)
    return model


def conjugate(x, y):
    """Exact posterior mean and sd of (alpha, beta): unit noise, Normal(0, 10) priors."""
    design = np.column_stack([np.ones_like(x), x])
    precision = design.T @ design + np.eye(2) / PRIOR_SD**2
    cov = np.linalg.inv(precision)
    return cov @ design.T @ y, np.sqrt(np.diag(cov))


def assert_regression_posterior(idata, x, y):
    mean, sd = conjugate(x, y)
    for k, name in enumerate(["alpha", "beta"]):
        draws = idata.posterior[name].values.ravel()
        se = sd[k] / np.sqrt(float(az.ess(draws[None, :])))
        assert abs(draws.mean() - mean[k]) < 4 * se, (name, draws.mean(), mean[k], se)


def data_warnings(record):
    return [w for w in record if "the data changed" in str(w.message)]


def sample_recording(step, **kwargs):
    """``pm.sample`` with ``step``; return the draws and the data-change warnings."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        idata = pm.sample(step=[step], **kwargs, **SAMPLE)
    return idata, data_warnings(record)


def test_metropolis_takes_up_new_values_of_the_same_length():
    x, y = regression_data(2000, 0.2, 0.5, seed=0)
    x_new, y_new = regression_data(2000, -0.3, -0.5, seed=1)
    model = regression_model(x, y)
    with model:
        step = RacingMetropolis([model["alpha"], model["beta"]], proposal="hmc", rng=0)
        first = pm.sample(step=[step], tune=300, draws=500, random_seed=1, **SAMPLE)
        assert_regression_posterior(first, x, y)
        pm.set_data({"x": x_new, "y_data": y_new})
        second, seen = sample_recording(step, tune=300, draws=500, random_seed=2)
    assert_regression_posterior(second, x_new, y_new)
    assert len(seen) == 1 and "2000 -> 2000" in str(seen[0].message)


def test_metropolis_takes_up_new_data_of_a_new_length():
    x, y = regression_data(2000, 0.2, 0.5, seed=0)
    # the first 2000 new rows have beta = -0.5, the last 1000 beta = 1.5: all of them give
    # about 0.17, the first 2000 alone -0.5
    x_a, y_a = regression_data(2000, 0.2, -0.5, seed=2)
    x_b, y_b = regression_data(1000, 0.2, 1.5, seed=3)
    x_new, y_new = np.concatenate([x_a, x_b]), np.concatenate([y_a, y_b])
    model = regression_model(x, y)
    with model:
        step = RacingMetropolis([model["alpha"], model["beta"]], proposal="hmc", rng=0)
        pm.sample(step=[step], tune=200, draws=100, random_seed=1, **SAMPLE)
        pm.set_data({"x": x_new, "y_data": y_new})
        idata, seen = sample_recording(step, tune=300, draws=500, random_seed=2)
    assert_regression_posterior(idata, x_new, y_new)
    assert len(seen) == 1 and "2000 -> 3000" in str(seen[0].message)
    assert step.terms.n_obs == 3000


def selector_model(y):
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.full(len(GRID), 1.0 / len(GRID)))
        pm.Normal("y", pt.as_tensor(GRID)[q], 1.0, observed=y_data)
    return model


def exact_selector(y):
    """Exact conditional of q (uniform prior) by enumeration."""
    log_p = stats.norm.logpdf(y[None, :], GRID[:, None], 1.0).sum(axis=1)
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def assert_selector_frequencies(draws, y, delta):
    """Each value's frequency within 4 binomial standard errors (and delta) of the exact."""
    p = exact_selector(y)
    freq = np.bincount(draws, minlength=len(GRID)) / len(draws)
    tol = 4 * np.sqrt(p * (1 - p) / len(draws)) + delta
    assert (np.abs(freq - p) < tol).all(), (freq.round(3), p.round(3))


def test_gibbs_takes_up_new_data_of_a_new_length():
    rng = np.random.default_rng(4)
    y = rng.normal(1.5, 1.0, size=2000)
    # all 3000 rows centre the conditional at about 1.7, the first 2000 at 1.5
    y_new = np.concatenate([rng.normal(1.5, 1.0, size=2000), rng.normal(2.1, 1.0, size=1000)])
    model = selector_model(y)
    with model:
        step = SubsampledCategoricalGibbs([model["q"]], rng=0)
        first = pm.sample(step=[step], tune=50, draws=1000, random_seed=1, **SAMPLE)
        assert_selector_frequencies(first.posterior["q"].values.ravel(), y, step.delta)
        pm.set_data({"y_data": y_new})
        second, seen = sample_recording(step, tune=50, draws=1000, random_seed=2)
    assert_selector_frequencies(second.posterior["q"].values.ravel(), y_new, step.delta)
    assert len(seen) == 1 and "2000 -> 3000" in str(seen[0].message)


def test_one_warning_per_change_and_none_without():
    x, y = regression_data(2000, 0.2, 0.5, seed=0)
    model = regression_model(x, y)
    with model:
        step = RacingMetropolis([model["alpha"], model["beta"]], proposal="hmc", rng=0)
    point = model.initial_point()

    def draws(n):
        nonlocal point
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for _ in range(n):
                point, _ = step.step(point)
        return data_warnings(record)

    assert draws(5) == []
    with model:
        pm.set_data({"y_data": regression_data(2000, 0.2, -0.5, seed=1)[1]})
    [only] = draws(5)
    assert "y_data" in str(only.message) and "2000 -> 2000" in str(only.message)
    assert draws(5) == []
    x_new, y_new = regression_data(2500, 0.2, 0.5, seed=2)
    with model:
        pm.set_data({"x": x_new, "y_data": y_new})
    [only] = draws(5)
    assert all(name in str(only.message) for name in ("x", "y_data", "2000 -> 2500"))
    assert step.terms.n_obs == 2500
    assert draws(5) == []


def test_data_inputs_of_different_lengths_are_refused():
    x, y = regression_data(2000, 0.2, 0.5, seed=0)
    model = regression_model(x, y)
    with model:
        step = RacingMetropolis([model["alpha"], model["beta"]], proposal="hmc", rng=0)
    point = model.initial_point()
    x_new, y_new = regression_data(3000, 0.2, 0.5, seed=1)
    with model:
        pm.set_data({"x": x_new})
    for _ in range(2):  # refused at every draw, not only the first
        with pytest.raises(ValueError, match=r"\['x'\] changed length alone"):
            step.step(point)
    with model:
        pm.set_data({"y_data": y_new})
    with pytest.warns(UserWarning, match="2000 -> 3000"):
        step.step(point)
    assert step.terms.n_obs == 3000


def test_data_changed_takes_up_new_data_at_once():
    x, y = regression_data(2000, 0.2, 0.5, seed=0)
    model = regression_model(x, y)
    with model:
        step = RacingMetropolis([model["alpha"], model["beta"]], proposal="hmc", rng=0)
        point, _ = step.step(model.initial_point())
        x_new, y_new = regression_data(3000, 0.2, -0.5, seed=1)
        pm.set_data({"x": x_new, "y_data": y_new})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step.data_changed()
        assert step.terms.n_obs == 3000
        assert step.surrogate is None  # fitted to the old data: refitted at the next draw
        permuted_y = step.terms.permuted_rows()[[d.name for d in step.terms.data].index("y_data")]
        np.testing.assert_array_equal(np.sort(permuted_y), np.sort(y_new))
        point, _ = step.step(point)
    assert data_warnings(record) == []  # taken up already: nothing left to warn about
    assert step.surrogate is not None


def test_compiled_gibbs_race_takes_up_new_data_of_a_new_length():
    """A lone scalar at N >= 10^4 races in one compiled call, built for N: rebuilt for the new."""
    rng = np.random.default_rng(5)
    y = rng.normal(1.5, 1.0, size=10_000)
    y_new = np.concatenate([rng.normal(1.5, 1.0, size=10_000), rng.normal(2.1, 1.0, size=5_000)])
    model = selector_model(y)
    with model:
        # a fixed plan that races (the "auto" one decides these cheap terms exactly)
        step = SubsampledCategoricalGibbs(
            [model["q"]], rng=0, race=RaceOptions(exact_fraction=0.25, batch_size=500), delta=0.01
        )
        step.finish_compiling()  # the compiled tier a long chain reaches
        assert step.compiled
        pm.sample(step=[step], tune=0, draws=50, random_seed=1, **SAMPLE)
        pm.set_data({"y_data": y_new})
        idata, seen = sample_recording(step, tune=0, draws=1000, random_seed=2)
    assert_selector_frequencies(idata.posterior["q"].values.ravel(), y_new, step.delta)
    assert len(seen) == 1 and "10000 -> 15000" in str(seen[0].message)
    assert step.compiled and step.compiled_race.n_obs == 15_000
    assert idata.sample_stats["n_raced"].values.sum() > 0  # the compiled race ran


def test_gibbs_control_variates_drop_their_sums_on_new_values():
    """The expansion's cached sums at the reference were of the old data: new values, same N."""
    rng = np.random.default_rng(6)
    y, y_new = rng.normal(1.5, 1.0, size=2000), rng.normal(1.7, 1.0, size=2000)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        sigma = pm.HalfNormal("sigma", 2.0)
        q = pm.Categorical("q", p=np.full(len(GRID), 1.0 / len(GRID)))
        pm.Normal("y", pt.as_tensor(GRID)[q], sigma, observed=y_data)
        # races on the whole schedule, so that the control variates are read
        step = SubsampledCategoricalGibbs(
            [q],
            rng=0,
            control_variates=True,
            race=RaceOptions(exact_fraction=1.0, batch_size=100),
            delta=0.01,
        )
    point = model.initial_point()
    point["sigma_log__"] = np.array(0.0)  # sigma = 1, held: draws from the conditional of q
    for _ in range(20):
        point, _ = step.step(point)
    with model:
        pm.set_data({"y_data": y_new})
    draws = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(400):
            point, _ = step.step(point)
            draws.append(int(point["q"]))
    assert_selector_frequencies(np.array(draws), y_new, step.delta)
    assert len(data_warnings(record)) == 1

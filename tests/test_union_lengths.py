"""Observed variables of different lengths sharing a parameter: raced over the union of rows.

Each posterior is compared with the exact answer (conjugate Normal models, or
enumeration of a categorical conditional) within Monte Carlo error; new data
of a new length set with ``pm.set_data`` are taken up at the next draw. A lag
inside one of the likelihoods is still refused.
"""

import warnings
from dataclasses import replace

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats

from pymc_subsample import ModelSplitError, RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import RaceOptions

SAMPLE = {"chains": 1, "cores": 1, "compute_convergence_checks": False, "progressbar": False}
FAST = RaceOptions(batch_size=25, exact_fraction=0.5)  # races run at a few hundred rows
#: the Gibbs step races every draw (its back-off would decide most of them exactly here)
GIBBS = replace(FAST, backoff=False)
PRIOR_SD = 10.0
SIGMAS = (1.0, 2.0)  # noise of y1 and of y2


def two_regressions(n1, n2, seed, slope=0.7, intercepts=(0.3, -0.4)):
    """Rows of y1 = a1 + b x1 + e (sd 1) and y2 = a2 + b x2 + e (sd 2)."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n1), rng.normal(size=n2)
    y1 = intercepts[0] + slope * x1 + SIGMAS[0] * rng.normal(size=n1)
    y2 = intercepts[1] + slope * x2 + SIGMAS[1] * rng.normal(size=n2)
    return x1, y1, x2, y2


def regression_model(x1, y1, x2, y2):
    with pm.Model() as model:
        a1 = pm.Normal("a1", 0.0, PRIOR_SD)
        a2 = pm.Normal("a2", 0.0, PRIOR_SD)
        b = pm.Normal("b", 0.0, PRIOR_SD)
        pm.Normal("y1", a1 + b * pm.Data("x1", x1), SIGMAS[0], observed=pm.Data("y1d", y1))
        pm.Normal("y2", a2 + b * pm.Data("x2", x2), SIGMAS[1], observed=pm.Data("y2d", y2))
    return model


def regression_posterior(x1, y1, x2, y2):
    """Exact posterior mean and sd of (a1, a2, b): known noise, Normal(0, 10) priors."""
    n1, n2 = len(x1), len(x2)
    design = np.zeros((n1 + n2, 3))
    design[:n1, 0], design[n1:, 1] = 1.0, 1.0
    design[:, 2] = np.concatenate([x1, x2])
    weights = np.concatenate([np.full(n1, SIGMAS[0] ** -2), np.full(n2, SIGMAS[1] ** -2)])
    precision = design.T @ (weights[:, None] * design) + np.eye(3) / PRIOR_SD**2
    cov = np.linalg.inv(precision)
    mean = cov @ design.T @ (weights * np.concatenate([y1, y2]))
    return mean, np.sqrt(np.diag(cov))


def mean_model(y1, y2):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, PRIOR_SD)
        pm.Normal("y1", mu, SIGMAS[0], observed=pm.Data("y1d", y1))
        pm.Normal("y2", mu, SIGMAS[1], observed=pm.Data("y2d", y2))
    return model


def mean_posterior(y1, y2):
    precision = PRIOR_SD**-2 + len(y1) / SIGMAS[0] ** 2 + len(y2) / SIGMAS[1] ** 2
    mean = (y1.sum() / SIGMAS[0] ** 2 + y2.sum() / SIGMAS[1] ** 2) / precision
    return mean, precision**-0.5


def batch_se(values, n_batches=25):
    """Monte Carlo standard error of the mean of a chain's ``values``, from batch means."""
    means = np.array([b.mean() for b in np.array_split(values, n_batches)])
    return means.std(ddof=1) / np.sqrt(n_batches)


def assert_posterior(idata, names, mean, sd):
    """Mean and variance within 4 Monte Carlo standard errors (batch means) of the exact ones."""
    for k, name in enumerate(names):
        draws = idata.posterior[name].values.ravel()
        assert abs(draws.mean() - mean[k]) < 4 * batch_se(draws), (name, draws.mean(), mean[k])
        squares = (draws - mean[k]) ** 2
        assert abs(squares.mean() - sd[k] ** 2) < 4 * batch_se(squares), (name, draws.std(), sd[k])


def sample_recording(step, **kwargs):
    """``pm.sample`` with ``step``; return the draws and the data-change warnings."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        idata = pm.sample(step=[step], **kwargs, **SAMPLE)
    return idata, [w for w in record if "the data changed" in str(w.message)]


def test_metropolis_on_a_mean_shared_by_two_lengths():
    rng = np.random.default_rng(0)
    y1, y2 = 0.5 + rng.normal(size=300), 0.5 + SIGMAS[1] * rng.normal(size=200)
    model = mean_model(y1, y2)
    with model:
        step = RacingMetropolis([model["mu"]], rng=0, race=FAST)
        assert step.terms.n_obs == 500
        idata = pm.sample(step=[step], tune=300, draws=1500, random_seed=1, **SAMPLE)
    mean, sd = mean_posterior(y1, y2)
    assert_posterior(idata, ["mu"], [mean], [sd])


def test_metropolis_on_two_regressions_sharing_a_slope():
    x1, y1, x2, y2 = two_regressions(300, 200, seed=1)
    model = regression_model(x1, y1, x2, y2)
    with model:
        step = RacingMetropolis([model["a1"], model["a2"], model["b"]], rng=0, race=FAST)
        idata = pm.sample(step=[step], tune=500, draws=2000, random_seed=2, **SAMPLE)
    mean, sd = regression_posterior(x1, y1, x2, y2)
    assert_posterior(idata, ["a1", "a2", "b"], mean, sd)


GRID = np.round(np.arange(0.20, 0.8001, 0.03), 2)  # the selector's values of the shared mean


def grid_model(y1, x2, y2):
    """``q`` selects the mean of y1 and the slope of y2 on its covariate x2."""
    with pm.Model() as model:
        q = pm.Categorical("q", np.ones(len(GRID)) / len(GRID))
        theta = pt.as_tensor(GRID)[q]
        pm.Normal("y1", theta, SIGMAS[0], observed=pm.Data("y1d", y1))
        pm.Normal("y2", theta * pm.Data("x2", x2), SIGMAS[1], observed=pm.Data("y2d", y2))
    return model


def grid_data(n1, n2, theta, seed):
    rng = np.random.default_rng(seed)
    x2 = rng.normal(size=n2)
    return theta + rng.normal(size=n1), x2, theta * x2 + SIGMAS[1] * rng.normal(size=n2)


def exact_conditional(model):
    logp = model.compile_logp()
    lps = np.array([logp({"q": np.asarray(k, dtype="int64")}) for k in range(len(GRID))])
    probs = np.exp(lps - lps.max())
    return probs / probs.sum()


def assert_matches_enumeration(draws, probs, delta):
    """Total variation within the 99.9% quantile of as many i.i.d. exact draws', plus delta."""
    n_draws = len(draws)
    freq = np.bincount(draws, minlength=len(probs)) / n_draws
    tv = 0.5 * np.abs(freq - probs).sum()
    iid = np.random.default_rng(0).multinomial(n_draws, probs, size=1000) / n_draws
    bound = np.quantile(0.5 * np.abs(iid - probs).sum(axis=1), 0.999) + delta
    assert tv <= bound, (tv, bound)


def test_gibbs_chooses_a_shared_value_over_two_lengths():
    y1, x2, y2 = grid_data(300, 200, 0.5, seed=3)
    model = grid_model(y1, x2, y2)
    probs = exact_conditional(model)
    assert probs.max() < 0.6  # the draws spread over several values
    with model:
        step = SubsampledCategoricalGibbs([model["q"]], rng=0, race=GIBBS)
        idata = pm.sample(step=[step], tune=0, draws=1000, random_seed=4, **SAMPLE)
    assert_matches_enumeration(idata.posterior["q"].values.ravel(), probs, step.delta)


def test_gibbs_takes_up_a_new_length_right_after_set_data():
    y1, x2, y2 = grid_data(300, 200, 0.5, seed=5)
    model = grid_model(y1, x2, y2)
    # new rows of y2: the first 200 as before, then 300 more of a larger slope, so that a
    # step reading stale rows (or only the first 200) lands far from the answer
    _, x_more, y_more = grid_data(1, 300, 0.75, seed=6)
    x2_new, y2_new = np.concatenate([x2, x_more]), np.concatenate([y2, y_more])
    with model:
        step = SubsampledCategoricalGibbs([model["q"]], rng=0, race=GIBBS)
        pm.sample(step=[step], tune=0, draws=200, random_seed=7, **SAMPLE)
        pm.set_data({"x2": x2_new, "y2d": y2_new})
        probs = exact_conditional(model)
        idata, seen = sample_recording(step, tune=0, draws=1000, random_seed=8)
    assert len(seen) == 1 and "N = 500 -> 800" in str(seen[0].message)
    assert step.terms.n_obs == 800
    assert_matches_enumeration(idata.posterior["q"].values.ravel(), probs, step.delta)


def test_metropolis_takes_up_a_new_length_right_after_set_data():
    x1, y1, x2, y2 = two_regressions(300, 200, seed=9)
    _, _, x_more, y_more = two_regressions(1, 300, seed=10, slope=1.2, intercepts=(0, 0.6))
    x2_new, y2_new = np.concatenate([x2, x_more]), np.concatenate([y2, y_more])
    model = regression_model(x1, y1, x2, y2)
    with model:
        step = RacingMetropolis([model["a1"], model["a2"], model["b"]], rng=0, race=FAST)
        pm.sample(step=[step], tune=200, draws=200, random_seed=11, **SAMPLE)
        pm.set_data({"x2": x2_new, "y2d": y2_new})
        idata, seen = sample_recording(step, tune=500, draws=2000, random_seed=12)
    assert len(seen) == 1 and "N = 500 -> 800" in str(seen[0].message)
    mean, sd = regression_posterior(x1, y1, x2_new, y2_new)
    assert_posterior(idata, ["a1", "a2", "b"], mean, sd)


def test_new_data_of_one_group_at_two_lengths_are_refused():
    x1, y1, x2, y2 = two_regressions(30, 20, seed=13)
    model = regression_model(x1, y1, x2, y2)
    with model:
        step = RacingMetropolis([model["b"]], rng=0)
        pm.set_data({"y2d": np.zeros(25)})  # x2 left at 20 rows
        with pytest.raises(ValueError, match=r"y2d has 25.*x2 has 20|x2 has 20.*y2d has 25"):
            step.data_changed()


def test_a_lag_inside_one_group_is_still_refused():
    rng = np.random.default_rng(14)
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        q = pm.Categorical("q", np.ones(3) / 3)
        shift = pt.as_tensor([0.0, 0.1, 0.2])[q]
        pm.Normal("y1", mu + shift, 1, observed=pm.Data("y1d", rng.normal(size=50)))
        y2 = pm.Data("y2d", rng.normal(size=30))
        lagged = pt.concatenate([pt.zeros(1), 0.5 * y2[:-1]])
        pm.Normal("y2", mu - shift + lagged, 1, observed=y2)
        refusal = r"terms of y1, y2 .* slice along the observation axis .* on 'y2d'"
        with pytest.raises(ModelSplitError, match=refusal):
            RacingMetropolis([mu])
        with pytest.raises(ModelSplitError, match=refusal):
            SubsampledCategoricalGibbs([q])


def test_a_number_of_observations_fixed_by_shape_is_refused():
    """Padded rows cannot enter a likelihood whose length is a constant: a clear refusal."""
    rng = np.random.default_rng(15)
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y1", mu, 1, observed=pm.Data("y1d", rng.normal(size=50)))
        pm.Normal("y2", mu, 1, observed=pm.Data("y2d", rng.normal(size=30)), shape=30)
        with pytest.raises(ModelSplitError, match=r"union of their rows.*shape="):
            RacingMetropolis([mu])


@pytest.mark.slow
def test_both_steps_at_fifty_and_thirty_thousand_rows_with_defaults():
    rng = np.random.default_rng(16)
    y1, y2 = 0.5 + rng.normal(size=50_000), 0.5 + SIGMAS[1] * rng.normal(size=30_000)
    model = mean_model(y1, y2)
    with model:
        step = RacingMetropolis([model["mu"]], rng=0)
        idata = pm.sample(step=[step], tune=500, draws=3000, random_seed=17, **SAMPLE)
    mean, sd = mean_posterior(y1, y2)
    assert_posterior(idata, ["mu"], [mean], [sd])

    theta = 0.5 + 0.005 * np.arange(-10, 11)  # posterior sd about 0.004: several values
    y1, x2, y2 = (0.5 + rng.normal(size=50_000), rng.normal(size=30_000), None)
    y2 = 0.5 * x2 + SIGMAS[1] * rng.normal(size=30_000)
    with pm.Model() as grid:
        q = pm.Categorical("q", np.ones(len(theta)) / len(theta))
        value = pt.as_tensor(theta)[q]
        pm.Normal("y1", value, SIGMAS[0], observed=pm.Data("y1d", y1))
        pm.Normal("y2", value * pm.Data("x2", x2), SIGMAS[1], observed=pm.Data("y2d", y2))
        step = SubsampledCategoricalGibbs([q], rng=0)
        draws = pm.sample(step=[step], tune=0, draws=2000, random_seed=18, **SAMPLE)
    logp = grid.compile_logp()
    lps = np.array([logp({"q": np.asarray(k, dtype="int64")}) for k in range(len(theta))])
    probs = np.exp(lps - lps.max())
    assert_matches_enumeration(draws.posterior["q"].values.ravel(), probs / probs.sum(), step.delta)


def test_an_expansion_in_a_deterministic_adds_up_over_two_lengths():
    """expand_in rebuilds the terms from the observed variables: the union's rewrite applies."""
    rng = np.random.default_rng(19)
    y1, x2 = 0.5 + 1.3 * rng.normal(size=300), rng.normal(size=200)
    y2 = 0.5 * x2 + 2.6 * rng.normal(size=200)
    with pm.Model() as model:
        z = pm.Normal("z", 0.0, 1.0)
        scale = pm.Deterministic("scale", pt.exp(z))
        pm.Normal("y1", 0.5, scale, observed=pm.Data("y1d", y1))
        pm.Normal("y2", 0.5 * pm.Data("x2", x2), 2 * scale, observed=pm.Data("y2d", y2))
        step = RacingMetropolis([z], expand_in=["scale"], proposal="normal", rng=4)
    point = model.initial_point()
    x = step.block.flatten([point["z"]])
    step.fit.fit(x.copy(), point)
    surrogate = step.coordinate_surrogate
    assert surrogate is not None
    theta = x + 0.2
    rows = step.fit.coordinates_at(theta, point)[None]
    terms = step.terms
    residuals = step.coordinate_expansion.residual_batch(
        rows, slice(0, terms.n_obs), point, surrogate.theta_ref
    )
    exact = terms.loglik_sum(step.block.candidates(theta[None]), point)
    s = np.exp(theta[0])
    by_hand = stats.norm.logpdf(y1, 0.5, s).sum() + stats.norm.logpdf(y2, 0.5 * x2, 2 * s).sum()
    np.testing.assert_allclose(exact, [by_hand], rtol=1e-7)  # PyMC's float32 constants
    np.testing.assert_allclose(residuals.sum() + surrogate.total(rows), exact, rtol=1e-10)


def test_data_listed_by_hand_are_assigned_to_their_groups():
    x1, y1, x2, y2 = two_regressions(30, 20, seed=20)
    model = regression_model(x1, y1, x2, y2)
    with model:
        step = RacingMetropolis([model["b"]], data=["y1d", "x1", "y2d", "x2"], rng=0)
        assert [d.name for d in step.terms.watched[:4]] == ["y1d", "x1", "y2d", "x2"]
        assert step.terms.n_obs == 50
        pm.Data("unused", np.zeros(7))
        with pytest.raises(ModelSplitError, match=r"'unused' is not a per-observation input"):
            RacingMetropolis([model["b"]], data=["y1d", "x1", "y2d", "x2", "unused"])
        with pytest.raises(ModelSplitError, match=r"no pm.Data input with 20 rows .* y2"):
            RacingMetropolis([model["b"]], data=["y1d", "x1"])

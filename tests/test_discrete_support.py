"""Bounded discrete variables beyond Categorical/Bernoulli: supports, draws against enumeration,
refusals."""

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.model.support import MAX_CATEGORIES, discrete_support
from pymc_subsample.options import RaceOptions

# the paper's race on every draw (these models are small: the default plan would decide
# most draws exactly)
RACE = RaceOptions(exact_fraction=1.0, batch_size=50, backoff=False)
N_OBS = 2000


def enumerate_posterior(model, name, values):
    """p(name = v | data) for each v, by the model's joint log density (the only free variable)."""
    logp = model.compile_logp()
    point = model.initial_point()
    lps = np.array([logp({**point, name: np.asarray(v, dtype=point[name].dtype)}) for v in values])
    p = np.exp(lps - lps.max())
    return p / p.sum()


def assert_frequencies(draws, values, probs):
    """Every draw among ``values``; a chi-square test of the counts against ``probs``.

    Cells expected to hold fewer than 5 draws are pooled (the test's validity);
    p-value above 1e-3.
    """
    assert np.isin(draws, values).all(), np.setdiff1d(draws, values)
    counts = np.array([(draws == v).sum() for v in values])
    expected = len(draws) * probs
    assert counts[expected == 0].sum() == 0, "drew a value of probability zero"
    order = np.argsort(expected)
    small = order[np.cumsum(expected[order]) < 5]
    small = order[: len(small) + 1] if len(small) else small
    keep = np.setdiff1d(np.arange(len(values)), small)
    obs = np.append(counts[keep], counts[small].sum()) if len(small) else counts[keep]
    exp = np.append(expected[keep], expected[small].sum()) if len(small) else expected[keep]
    assert len(obs) > 2, (counts, expected)  # a real spread, not a point mass
    assert stats.chisquare(obs, exp).pvalue > 1e-3, (counts, expected)


def sample(step, draws=1500, seed=1):
    idata = pm.sample(
        draws=draws,
        tune=100,
        step=[step],
        chains=1,
        cores=1,
        random_seed=seed,
        progressbar=False,
        compute_convergence_checks=False,
    )
    return idata.posterior


def test_supports_are_enumerated_from_the_distribution():
    with pm.Model() as model:
        y_data = pm.Data("y_data", np.zeros(10))
        t = pm.Data("t", 12)
        variables = {
            "du": (pm.DiscreteUniform("du", 3, 9), np.arange(3, 10)),
            "du_data": (pm.DiscreteUniform("du_data", 0, t), np.arange(0, 13)),
            "du_vector": (pm.DiscreteUniform("du_vector", [0, 2], [4, 7]), np.arange(0, 8)),
            "bin": (pm.Binomial("bin", 5, 0.4), np.arange(0, 6)),
            "bin_free_p": (pm.Binomial("bin_free_p", 5, pm.Beta("p", 1, 1)), np.arange(6)),
            "bb": (pm.BetaBinomial("bb", 1.0, 2.0, 6), np.arange(0, 7)),
            "hyper": (pm.HyperGeometric("hyper", N=10, k=8, n=5), np.arange(3, 6)),
            "ologit": (pm.OrderedLogistic("ologit", 0.0, [-1.0, 0.0, 1.0]), np.arange(4)),
            "oprobit": (pm.OrderedProbit("oprobit", 0.0, [-1.0, 1.0]), np.arange(3)),
            "trunc": (pm.Truncated("trunc", pm.Poisson.dist(3.0), lower=1, upper=7), np.r_[1:8]),
            "trunc_up": (pm.Truncated("trunc_up", pm.Poisson.dist(3.0), upper=4), np.r_[0:5]),
        }
        pm.Normal("y", 0.0, 1.0, observed=y_data)
    point = model.initial_point()
    for name, (rv, expected) in variables.items():
        values = discrete_support(model, model.rvs_to_values[rv], point)
        assert np.array_equal(values, expected), name
        assert values.dtype == model.rvs_to_values[rv].dtype, name


def test_discrete_uniform_offset_matches_enumeration():
    rng = np.random.default_rng(3)
    y = rng.normal(0.06, 1.0, size=N_OBS)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        s = pm.DiscreteUniform("s", 3, 9)
        pm.Normal("y", 0.01 * s, 1.0, observed=y_data)
        values = np.arange(3, 10)
        probs = enumerate_posterior(model, "s", values)
        draws = sample(SubsampledCategoricalGibbs([s], race=RACE))["s"].values.ravel()
    assert_frequencies(draws, values, probs)


def test_binomial_scale_matches_enumeration():
    rng = np.random.default_rng(4)
    y = rng.normal(0.0, 1.02, size=N_OBS)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        b = pm.Binomial("b", n=5, p=0.4)
        pm.Normal("y", 0.0, 1.0 + 0.01 * b, observed=y_data)
        values = np.arange(6)
        probs = enumerate_posterior(model, "b", values)
        draws = sample(SubsampledCategoricalGibbs([b], race=RACE))["b"].values.ravel()
    assert_frequencies(draws, values, probs)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("beta_binomial", marks=pytest.mark.slow),
        pytest.param("hypergeometric", marks=pytest.mark.slow),
        "ordered_logistic",
        "truncated_poisson",
    ],
)
def test_other_supports_match_enumeration(kind):
    rng = np.random.default_rng(5)
    y = rng.normal(0.05, 1.0, size=N_OBS)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        if kind == "beta_binomial":
            q, values = pm.BetaBinomial("q", 2.0, 3.0, 8), np.arange(9)
        elif kind == "hypergeometric":
            q, values = pm.HyperGeometric("q", N=12, k=9, n=6), np.arange(3, 7)
        elif kind == "ordered_logistic":
            q, values = pm.OrderedLogistic("q", 0.5, [-1.0, 0.0, 2.0]), np.arange(4)
        else:
            q, values = pm.Truncated("q", pm.Poisson.dist(3.0), upper=8), np.arange(9)
        pm.Normal("y", 0.02 * q, 1.0, observed=y_data)
        probs = enumerate_posterior(model, "q", values)
        draws = sample(SubsampledCategoricalGibbs([q], race=RaceOptions(bound="exact")), draws=1000)
    assert_frequencies(draws["q"].values.ravel(), values, probs)


def test_change_point_matches_enumeration():
    # s = DiscreteUniform(0, T): observations before s have mean 0, from s on mean 0.4
    n_obs = 400
    rng = np.random.default_rng(9)
    y = rng.normal(np.where(np.arange(n_obs) < 200, 0.0, 0.4), 1.0)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        t = pm.Data("t", np.arange(n_obs))
        s = pm.DiscreteUniform("s", 0, n_obs)
        pm.Normal("y", pm.math.where(t < s, 0.0, 0.4), 1.0, observed=y_data)
        values = np.arange(n_obs + 1)
        probs = enumerate_posterior(model, "s", values)
        draws = sample(SubsampledCategoricalGibbs([s], race=RACE), draws=1000)["s"].values.ravel()
    assert_frequencies(draws, values, probs)


def test_vector_with_different_bounds_draws_each_element_in_its_support():
    # two elements with independent posteriors (each its own observed variable), so that
    # the element-by-element Gibbs draws are independent draws of each marginal; their
    # candidates are the union 2..9 of the supports 2..6 and 4..9
    rng = np.random.default_rng(6)
    with pm.Model() as model:
        y0 = pm.Data("y0", rng.normal(0.04, 1.0, size=N_OBS))
        y1 = pm.Data("y1", rng.normal(0.07, 1.0, size=N_OBS))
        s = pm.DiscreteUniform("s", [2, 4], [6, 9], shape=2)
        pm.Normal("obs0", 0.01 * s[0], 1.0, observed=y0)
        pm.Normal("obs1", 0.01 * s[1], 1.0, observed=y1)
        step = SubsampledCategoricalGibbs([s], data=[y0, y1], race=RACE)
        draws = sample(step, draws=1000)["s"].values.reshape(-1, 2)
        logp = model.compile_logp()
        values = np.arange(2, 10)
        grid = np.array([[logp({"s": np.array([i, j])}) for j in values] for i in values])
    joint = np.exp(grid - grid.max())  # zero outside the supports
    joint /= joint.sum()
    assert_frequencies(draws[:, 0], values, joint.sum(axis=1))
    assert_frequencies(draws[:, 1], values, joint.sum(axis=0))


def test_compiled_race_draws_values_not_indices():
    # N >= COMPILED_MIN_OBS with an exact switch before half of the data: the lean path
    # races compiled and writes the winner's value
    rng = np.random.default_rng(8)
    n_obs = 10_000
    y = rng.normal(0.05, 1.0, size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        s = pm.DiscreteUniform("s", 5, 12)
        pm.Normal("y", 0.005 * (s - 5), 1.0, observed=y_data)
        values = np.arange(5, 13)
        probs = enumerate_posterior(model, "s", values)
        step = SubsampledCategoricalGibbs([s], race=RaceOptions(exact_fraction=0.25, batch_size=50))
        step.finish_compiling()  # the compiled tier a long chain reaches
        assert step.compiled
        draws = sample(step, draws=1000)["s"].values.ravel()
    assert_frequencies(draws, values, probs)


def test_bounds_depending_on_a_free_variable_are_refused():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(10))
        t = pm.DiscreteUniform("t", 5, 10)
        s = pm.DiscreteUniform("s", 0, t)
        pm.Normal("y", 0.01 * s, 1.0, observed=y_data)
        with pytest.raises(ValueError, match=r"'s' depends on another free variable.*upper"):
            SubsampledCategoricalGibbs([s])
        with pytest.raises(ValueError, match="change from draw to draw.*pm.Metropolis"):
            SubsampledCategoricalGibbs([s])


def test_unbounded_and_oversized_supports_are_refused_naming_the_fix():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(10))
        k = pm.Poisson("k", 3.0)
        big = pm.DiscreteUniform("big", 0, MAX_CATEGORIES)
        pm.Normal("y", 0.01 * k + 0.001 * big, 1.0, observed=y_data)
        with pytest.raises(ValueError, match=r"'k'.*PoissonRV.*pm\.Metropolis.*pm\.Truncated"):
            SubsampledCategoricalGibbs([k])
        with pytest.raises(
            ValueError, match=rf"'big'.*{MAX_CATEGORIES + 1} values.*MAX_CATEGORIES"
        ):
            SubsampledCategoricalGibbs([big])


def test_new_data_that_change_the_support_are_refused():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(10))
        t = pm.Data("t", 12)
        s = pm.DiscreteUniform("s", 0, t)
        pm.Normal("y", 0.01 * s, 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([s])
        assert step.n_categories == [13]
        pm.set_data({"y_data": np.ones(10)})
        step.data_changed()  # the same support
        pm.set_data({"t": 20})
        with pytest.raises(ValueError, match=r"support of 's' from 0..12 to 0..20.*new step"):
            step.data_changed()

"""Supports that depend on the drawn value: the rule, its fallbacks and the audits' backstop.

The rule (``RowSupport``) is checked against brute force on a zoo of likelihoods: a
candidate is reported impossible exactly when one of its N terms is -inf. The steps'
draws are checked in tests/test_model_zoo.py (SUPPORT) at N = 20,000 with no audits.
"""

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.mcmc.audit import impossible_choice
from pymc_subsample.model.row_support import RowSupport
from pymc_subsample.model.terms import ObservationTerms
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.steps.base import FIRST_AUDIT_BY

RNG = np.random.default_rng(3)
N = 400


def discrete_uniform():
    y = RNG.integers(1, 13, N)
    y[5] = 30
    m = pm.DiscreteUniform("m", 1, 60)
    pm.DiscreteUniform("y", 1, m, observed=pm.Data("yd", y))
    return "m", np.arange(1, 61)


def uniform_upper():
    y = RNG.uniform(0, 1, N)
    y[7] = 1.7
    th = pm.Uniform("th", 0, 5)
    pm.Uniform("y", 0, th, observed=pm.Data("yd", y))
    return "th", None


def uniform_window():
    y = RNG.uniform(-1, 1, N)
    y[3], y[9] = 4.9, -4.2
    mu = pm.Normal("mu", 0, 1)
    pm.Uniform("y", mu - 5, mu + 5, observed=pm.Data("yd", y))
    return "mu", None


def binomial_capped():
    y = RNG.binomial(10, 0.3, N)
    y[11] = 17
    m = pm.DiscreteUniform("m", 1, 40)
    pm.Binomial("y", n=m, p=0.3, observed=pm.Data("yd", y))
    return "m", np.arange(1, 41)


def truncated_lower():
    y = RNG.normal(size=N)
    lo = pm.Normal("lo", -2, 1)
    pm.Truncated("y", pm.Normal.dist(0, 1), lower=lo, observed=pm.Data("yd", y))
    return "lo", None


def truncated_both_with_covariate():
    """Bounds on both sides, the mean reading a covariate (the support does not)."""
    x = RNG.normal(size=N)
    y = np.clip(0.5 * x + RNG.normal(size=N), -2.5, 2.5)
    up = pm.Normal("up", 3, 1)
    b = pm.Normal("b", 0, 1)
    dist = pm.Normal.dist(b * pm.Data("x", x), 1)
    pm.Truncated("y", dist, lower=-3.0, upper=up, observed=pm.Data("yd", y))
    return "up", None


def regression():
    x = RNG.normal(size=N)
    b = pm.Normal("b", 0, 1)
    pm.Normal("y", b * pm.Data("x", x), 1, observed=pm.Data("yd", x + RNG.normal(size=N)))
    return "b", None


def bound_times_covariate():
    """The bound reads the rows and the block on one side: no statistic decides it."""
    x = RNG.uniform(0.5, 2.0, N)
    y = RNG.uniform(0, 1, N) * x
    th = pm.Uniform("th", 0.5, 3)
    pm.Uniform("y", 0, th * pm.Data("x", x), observed=pm.Data("yd", y))
    return "th", None


def truncated_poisson_upper():
    y = RNG.poisson(3, N)
    y[5] = 14
    m = pm.DiscreteUniform("m", 5, 30)
    pm.Truncated("y", pm.Poisson.dist(3.0), upper=m, observed=pm.Data("yd", y))
    return "m", np.arange(5, 31)


def censored_moving_upper():
    """-inf under the switch that picks the censored rows: no exact statistic."""
    y = np.clip(RNG.normal(size=N), -9, 1.0)
    c = pm.Normal("c", 1.5, 1)
    pm.Censored("y", pm.Normal.dist(0, 1), lower=None, upper=c, observed=pm.Data("yd", y))
    return "c", None


def pareto_scale():
    m = pm.Uniform("m", 0, 3)
    pm.Pareto("y", 3.0, m=m, observed=pm.Data("yd", 1 + RNG.pareto(3, N)))
    return "m", None


def custom_shifted_exponential():
    loc = pm.Normal("loc", 0, 3)

    def logp(value, loc):
        return pt.switch(value < loc, -np.inf, -(value - loc))

    pm.CustomDist("y", loc, logp=logp, observed=pm.Data("yd", 2 + RNG.exponential(size=N)))
    return "loc", None


def beta_binomial_trials():
    y = RNG.poisson(3, N)
    y[5] = 14
    n = pm.DiscreteUniform("n", 1, 40)
    pm.BetaBinomial("y", alpha=2, beta=3, n=n, observed=pm.Data("yd", y))
    return "n", np.arange(1, 41)


def categorical_picks_the_bound():
    y = RNG.poisson(3, N)
    y[5] = 14
    k = pm.Categorical("k", np.ones(4) / 4)
    pm.DiscreteUniform("y", 0, pt.as_tensor([5, 10, 15, 20])[k], observed=pm.Data("yd", y))
    return "k", np.arange(4)


def group_bounds():
    """One bound per group, read through the row's group index: per-group extremes."""
    g = RNG.integers(0, 3, N)
    y = RNG.integers(1, 10, N)
    y[[3, 4]], g[[3, 4]] = [20, 14], [1, 2]
    m = pm.DiscreteUniform("m", 1, 30, shape=3)
    pm.DiscreteUniform("y", 1, m[pm.Data("g", g)], observed=pm.Data("yd", y))
    return "m", np.array([[a, b, c] for a in (5, 9, 12) for b in (15, 19, 20) for c in (9, 14)])


EXPECTED = {
    group_bounds: "bounds",
    truncated_poisson_upper: "bounds",
    censored_moving_upper: "unknown",
    pareto_scale: "bounds",
    custom_shifted_exponential: "bounds",
    beta_binomial_trials: "bounds",
    categorical_picks_the_bound: "bounds",
    discrete_uniform: "bounds",
    uniform_upper: "bounds",
    uniform_window: "bounds",
    binomial_capped: "bounds",
    truncated_lower: "bounds",
    truncated_both_with_covariate: "bounds",
    regression: "none",
    bound_times_covariate: "unknown",
}


def _terms(builder):
    with pm.Model() as model:
        name, values = builder()
    var = model[name]
    value_var = model.rvs_to_values[var]
    return model, ObservationTerms(model, [var]), value_var, values


@pytest.mark.parametrize("builder", list(EXPECTED), ids=lambda f: f.__name__)
def test_rule_matches_brute_force_over_every_row(builder):
    model, terms, value_var, values = _terms(builder)
    support = RowSupport(terms)
    assert support.mode == EXPECTED[builder]
    point = model.initial_point()
    if values is None:  # continuous: values of the value variable around the initial point
        base = float(point[value_var.name])
        values = base + np.linspace(-3, 3, 61)
    cands = [np.asarray(values, dtype=value_var.dtype)]
    brute = np.isneginf(terms.loglik_full(cands, point)).any(axis=1)
    got = support.infeasible(cands, point)
    if support.mode == "bounds":
        np.testing.assert_array_equal(got, brute)
        assert brute.any() and not brute.all()  # the zoo exercises both kinds
    else:
        assert not got.any()  # nothing claimed: the steps decide exactly


def test_statistics_follow_new_data():
    with pm.Model() as model:
        yd = pm.Data("yd", np.array([1.0, 2.0, 3.0]))
        th = pm.Uniform("th", 0, 10)
        pm.Uniform("y", 0, th, observed=yd)
    terms = ObservationTerms(model, [th])
    support = RowSupport(terms)
    point = model.initial_point()
    cands = [np.log(np.array([2.5, 3.5]) / (10 - np.array([2.5, 3.5])))]  # interval transform
    np.testing.assert_array_equal(support.infeasible(cands, point), [True, False])
    with model:
        pm.set_data({"yd": np.array([1.0, 2.0])})
    support.take_up_data()
    np.testing.assert_array_equal(support.infeasible(cands, point), [False, False])


def test_impossible_choice():
    assert impossible_choice(np.array([0.0, -np.inf]), 1)
    assert impossible_choice(np.array([0.0, -40.0]), 1)
    assert not impossible_choice(np.array([0.0, -20.0]), 1)
    assert not impossible_choice(np.array([0.0, -40.0]), 0)


def _exact_probs(model, name, values, point):
    logp = model.compile_logp()
    lps = np.array([logp(point | {name: np.asarray(v, dtype=point[name].dtype)}) for v in values])
    p = np.exp(lps - lps.max())
    return p / p.sum()


def _draw(step, point, name, n):
    draws, current = [], dict(point)
    for _ in range(n):
        current, _ = step.step(current)
        draws.append(int(current[name]))
    return np.array(draws)


def test_unreducible_support_decides_exactly_and_says_so():
    """Uniform(0, c[q] * x): the bound mixes rows and block; every draw is exact and right."""
    x = RNG.uniform(0.5, 2.0, 3000)
    y = RNG.uniform(0, 1, 3000) * 1.3 * x
    with pm.Model() as model:
        q = pm.Categorical("q", np.ones(4) / 4)
        scale = pt.as_tensor([1.0, 1.2, 1.4, 1.6])[q]
        pm.Uniform("y", 0, scale * pm.Data("x", x), observed=pm.Data("yd", y))
        with pytest.warns(UserWarning, match=r"q.*-inf on some rows.*every decision.*exact"):
            step = SubsampledCategoricalGibbs([q], rng=0)
    assert step.row_support.mode == "unknown" and step.decides_exactly
    point = model.initial_point()
    probs = _exact_probs(model, "q", range(4), point)
    draws = _draw(step, point, "q", 300)
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert 0.5 * np.abs(freq - probs).sum() < 0.08
    assert (freq[:2] == 0).all()  # 1.0 and 1.2 are impossible on some rows


def test_a_minus_infinity_the_graph_hides_is_found_numerically():
    """log(max(M - y, 0)): no switch in the graph, -inf on the rows with y >= M."""
    y = RNG.integers(0, 10, 5000).astype(float)
    y[17] = 25.0

    def logp(value, m):
        return pt.log(pt.maximum(m - value, 0.0)) - pt.log(m)

    with pm.Model() as model:
        m = pm.DiscreteUniform("m", 1, 40)
        pm.CustomDist("y", m, logp=logp, observed=pm.Data("yd", y))
        with pytest.warns(UserWarning, match="found numerically"):
            step = SubsampledCategoricalGibbs([m], rng=0)
    assert step.row_support.mode == "none" and step.decides_exactly
    point = model.initial_point()
    draws = _draw(step, point, "m", 50)
    assert (draws >= 26).all()


@pytest.fixture
def blind_rule(monkeypatch):
    """The rule and the numeric check blinded: only the audits stand between race and error."""
    original = RowSupport.__init__

    def blind(self, terms):
        original(self, terms)
        self.mode = "none"

    monkeypatch.setattr(RowSupport, "__init__", blind)
    monkeypatch.setattr(SubsampledCategoricalGibbs, "_check_support_numerically", lambda self: None)


#: A plan that races (the "auto" one may decide these cheap terms exactly, e.g. when an
#: earlier step compiled the shared rows function): the audits have races to check.
RACING = RaceOptions(batch_size=800, exact_fraction=0.5)


def _discrete_uniform_model(n):
    rng = np.random.default_rng(0)
    y = rng.integers(1, 13, n)
    y[[n // 5, n // 2, n - 2]] = [40, 45, 50]
    with pm.Model() as model:
        m = pm.DiscreteUniform("m", 1, 60)
        pm.DiscreteUniform("y", 1, m, observed=pm.Data("yd", y))
    return model


def test_an_audit_that_finds_an_impossible_value_acts_at_once(blind_rule):
    model = _discrete_uniform_model(20_000)
    with model:
        step = SubsampledCategoricalGibbs(
            [model["m"]], rng=1, race=RACING, audit=AuditOptions(every=10)
        )
    point = model.initial_point()
    with pytest.warns(UserWarning, match="makes impossible"):
        draws = _draw(step, point, "m", 40)
    assert step.audit_exact and step.audit_cause == "support"
    assert step.n_disagreements == 1  # one audit sufficed
    assert (draws[10:] == 50).all()  # exact from the first audit (draw 10) on


def test_every_chain_audits_within_its_first_draws(blind_rule):
    """An audit schedule that would first audit at draw 1,000 audits by draw FIRST_AUDIT_BY."""
    model = _discrete_uniform_model(20_000)
    with model:
        step = SubsampledCategoricalGibbs(
            [model["m"]], rng=1, race=RACING, audit=AuditOptions(every=1000)
        )
    step.setup_chain(np.random.default_rng(0), tune=0, draws=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        draws = _draw(step, model.initial_point(), "m", FIRST_AUDIT_BY + 1)
    assert step.n_audits == 1 and step.audit_exact
    assert draws[-1] == 50  # the draw after the audited one is exact


def test_racing_metropolis_rejects_every_proposal_outside_the_support():
    """Uniform(0, theta) at N = 100,000, no audits: no draw below max(y); the exact posterior
    is Pareto(N + alpha, max(y)) for a Pareto(alpha, 1) prior."""
    n = 100_000
    rng = np.random.default_rng(0)
    y = rng.uniform(0, 1, n)
    y[[n // 3, n // 2, n - 1]] = [1.5, 1.6, 1.7]
    with pm.Model():
        th = pm.Pareto("th", alpha=1.0, m=1.0)
        pm.Uniform("y", 0, th, observed=pm.Data("yd", y))
        step = RacingMetropolis([th], rng=1, audit=AuditOptions(every=0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            idata = pm.sample(
                draws=1000, tune=500, step=[step], chains=2, cores=1, random_seed=1,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
    draws = idata.posterior["th"].values.ravel()
    assert step.row_support.mode == "bounds"
    assert draws.min() >= 1.7
    scale = 1.7 / (n + 1.0)  # the exact posterior's sd, about its excess over 1.7
    excess = draws - 1.7
    assert abs(excess.mean() - scale) < 0.5 * scale


def test_gibbs_on_group_bounds_never_draws_an_impossible_value():
    """M[k] bounds the rows of group k: every element drawn at its group's largest count
    (the exact conditional is all but a point mass there at N = 20,000), no audits."""
    rng = np.random.default_rng(1)
    n = 20_000
    g = rng.integers(0, 3, n)
    y = rng.integers(1, 10, n)
    y[[5, 6, 7]], g[[5, 6, 7]] = [20, 14, 25], [0, 1, 2]
    with pm.Model() as model:
        m = pm.DiscreteUniform("m", 1, 30, shape=3)
        pm.DiscreteUniform("y", 1, m[pm.Data("g", g)], observed=pm.Data("yd", y))
        step = SubsampledCategoricalGibbs([m], rng=0, audit=AuditOptions(every=0))
    current = model.initial_point() | {"m": np.array([20, 14, 25])}
    for _ in range(30):
        current, _ = step.step(current)
        np.testing.assert_array_equal(current["m"], [20, 14, 25])
    assert step.row_support.mode == "bounds" and not step.decides_exactly

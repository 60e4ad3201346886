"""Blocks without a useful gradient: the graph rule, RacingMetropolis's random walk, the refusals.

A continuous parameter that reaches the terms only through a comparison, a
switch's condition, floor, round or sign has a zero gradient almost
everywhere: RacingMetropolis must never hand it to a gradient method (it did:
NUTS at N <= 20,000). Its draws are checked against the exact posterior
(:func:`~tests.support.models.step_posterior`, moments of a mixture of
uniforms) with tolerances from the Monte Carlo error: the mean within four
MCSE, the sd within four standard errors of an sd estimated from ESS draws.
"""

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import RacingMetropolis
from pymc_subsample.mcmc.regime import REGIME_REASONS
from pymc_subsample.model.blocks import prior_points
from pymc_subsample.model.gradient_path import gradient_path, zero_gradient
from pymc_subsample.model.terms import ObservationTerms
from support.models import change_point_model, step_posterior, threshold_model


def _terms(mean_of):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-2, 2, 50), rng.normal(size=50)
    with pm.Model() as model:
        tau = pm.Uniform("tau", -2, 2)
        pm.Normal("y", mean_of(tau, pm.Data("x", x)), 1, observed=pm.Data("yd", y))
    return ObservationTerms(model, [model.rvs_to_values[tau]])


@pytest.mark.parametrize(
    ("mean_of", "cut"),
    [
        (lambda tau, x: pt.switch(x < tau, -0.5, 0.5), "comparison (lt)"),
        (lambda tau, x: pt.floor(tau) * x, "floor"),
        (lambda tau, x: pt.round(3 * tau) * x + pt.sign(tau), "round"),
        (lambda tau, x: x * pt.cast(tau > 0, "float64"), "comparison (gt)"),
        (lambda tau, x: (tau // 0.5) * x, "integer division"),
    ],
    ids=["switch", "floor", "round_sign", "cast_of_comparison", "intdiv"],
)
def test_the_rule_finds_a_cut_gradient_path(mean_of, cut):
    terms = _terms(mean_of)
    path = gradient_path(terms.loglik_graph, terms.vars)
    assert not path.connected and cut in path.describe()
    # the numerical check agrees: a zero gradient at the initial point and prior draws
    points = [terms.model.initial_point(), *prior_points(terms.model, 3, seed=0)]
    idx = np.arange(terms.n_obs)
    assert zero_gradient(lambda p: terms.gradient([p["tau_interval__"]], idx, p)[0], points)


@pytest.mark.parametrize(
    "mean_of",
    [
        lambda tau, x: tau * x,
        lambda tau, x: pt.switch(x < tau, tau, 0.5),  # the switch's branch carries tau
        lambda tau, x: pt.sigmoid(10 * (x - tau)),  # a smooth threshold
    ],
    ids=["linear", "switch_branch", "smooth_threshold"],
)
def test_the_rule_keeps_a_differentiable_path(mean_of):
    terms = _terms(mean_of)
    assert gradient_path(terms.loglik_graph, terms.vars).connected


def _run(model, reference, n_chains=4, tune=500, draws=1000, **kwargs):
    """Draws of tau (chains, draws) by RacingMetropolis, each chain from its own start."""
    value = model.rvs_to_values[model["tau"]]
    lower, upper = reference["lower"], reference["upper"]
    with model:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step = RacingMetropolis([model["tau"]], rng=1, **kwargs)
    out = np.empty((n_chains, draws))
    stats = []
    for c in range(n_chains):
        step.setup_chain(np.random.default_rng(10 + c), tune=tune, draws=draws)
        point = model.initial_point()
        point[value.name] = np.asarray(np.random.default_rng(c).normal(), dtype=value.dtype)
        for i in range(tune + draws):
            if i == tune:
                step.stop_tuning()
            point, (st,) = step.step(point)
            if i >= tune:
                # the interval transform's inverse
                out[c, i - tune] = lower + (upper - lower) / (1 + np.exp(-point[value.name]))
                stats.append(st)
    exact = step_posterior(**reference)
    return step, out, stats, exact, caught


def _check(draws, exact):
    """Mean within 4 MCSE of the exact one; sd within 4 standard errors from the ESS."""
    mean, sd, kurtosis = exact
    ess = float(az.ess(draws))
    mcse = float(az.mcse(draws))
    sd_ratio = draws.std() / sd
    sd_tol = 4 * np.sqrt((kurtosis - 1) / (4 * ess))  # se of an sd from ESS draws
    assert abs(draws.mean() - mean) < 4 * mcse, (draws.mean(), mean, mcse)
    assert abs(sd_ratio - 1) < sd_tol, (sd_ratio, sd_tol, ess)
    assert float(az.rhat(draws)) < 1.05
    return mcse, sd_ratio, ess


def test_threshold_is_drawn_right_without_a_gradient_method():
    model, reference = threshold_model(2_000)
    step, draws, stats, exact, caught = _run(model, reference)
    assert step.regime.reason == "no_gradient" and step.nuts is None
    assert step.bound == "exact" and not step.control_variates
    assert {s["regime"] for s in stats} == {REGIME_REASONS.index("no_gradient")}
    notes = [str(w.message) for w in caught if "zero almost everywhere" in str(w.message)]
    assert len(notes) == 1 and "tau" in notes[0] and "comparison" in notes[0]
    _check(draws, exact)


def test_continuous_change_point_is_drawn_right_without_a_gradient_method():
    model, reference = change_point_model(5_000)
    step, draws, _, exact, _ = _run(model, reference)
    assert step.regime.reason == "no_gradient" and step.nuts is None
    _check(draws, exact)


@pytest.mark.slow
def test_threshold_races_right_above_the_exact_size():
    """At N = 40,000 the random walk races on the raw terms (no control variates)."""
    model, reference = threshold_model(40_000)
    step, draws, stats, exact, _ = _run(model, reference)
    assert step.bound != "exact" and sum(s["n_raced"] for s in stats) > 0
    _check(draws, exact)


@pytest.mark.parametrize(
    ("kwargs", "feature"),
    [
        ({"proposal": "hmc"}, "proposal='hmc'"),
        ({"proposal": "langevin"}, "proposal='langevin'"),
        ({"control_variates": True}, "control_variates=True"),
    ],
)
def test_a_gradient_feature_on_a_block_without_a_gradient_is_refused(kwargs, feature):
    model, _ = threshold_model(200)
    with model, pytest.raises(ValueError) as err:
        RacingMetropolis([model["tau"]], **kwargs)
    message = str(err.value)
    assert feature in message and "tau" in message and "comparison (lt)" in message
    assert "proposal='normal'" in message  # the fix


def test_proposal_normal_on_a_block_without_a_gradient_is_quiet():
    model, _ = threshold_model(200)
    with model, warnings.catch_warnings():
        warnings.simplefilter("error")
        step = RacingMetropolis([model["tau"]], proposal="normal")
    assert step.regime.reason == "no_gradient" and not step.preconditioned


def test_an_opaque_threshold_is_found_by_its_zero_gradient():
    """A threshold inside an OpFromGraph, which the rule does not open: the gradient,
    zero at the initial point and at prior draws, decides."""
    from pytensor.compile.builders import OpFromGraph

    a, b = pt.dscalar("a"), pt.dvector("b")
    step_fn = OpFromGraph([a, b], [pt.switch(b < a, -0.5, 0.5)])
    model, _ = threshold_model(200)
    with pm.Model() as opaque:
        tau = pm.Uniform("tau", -2, 2)
        x = pm.Data("x", model["x"].get_value())
        pm.Normal("y", step_fn(tau, x), 1, observed=pm.Data("yd", model["yd"].get_value()))
    with opaque, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        step = RacingMetropolis([tau])
    assert step.gradient_path.opaque == ("OpFromGraph",)
    assert step.regime.reason == "no_gradient" and "zero at the initial point" in (
        step.gradient_path.describe()
    )


def test_no_fit_is_made_for_a_block_without_a_gradient():
    """Not with the default proposal nor with elemwise: no Taylor expansion, no Laplace fit."""
    from pymc_subsample.options import ProposalOptions

    model, _ = threshold_model(200)
    for options in (None, ProposalOptions(elemwise=True)):
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            step = RacingMetropolis([model["tau"]], proposal_options=options, rng=2)
        point = model.initial_point()
        for _ in range(30):
            point, _ = step.step(point)
        assert step.expansion is None and step.surrogate is None and not step.fit.failed

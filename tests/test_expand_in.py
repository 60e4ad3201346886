"""Control variates of the discrete race expanded in model Deterministics (``expand_in``)."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats
from test_gibbs import RACE, assert_matches, draw_many, exact_conditional

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.steps.nuts_regime import NutsRegime

C = 0.01  # the scaled softplus of the ARCH example: alpha = C softplus(z / C)


def to_z(alpha):
    return alpha + C * np.log(-np.expm1(-np.asarray(alpha) / C))


def arch_one_data(n_obs, seed):
    """Returns with variance 0.6 + 0.3 x_1 (t innovations) and two squared-lag columns."""
    rng = np.random.default_rng(seed)
    lags = rng.chisquare(1, size=(n_obs, 2))
    return rng.standard_t(7, size=n_obs) * np.sqrt(0.6 + 0.3 * lags[:, 0]), lags


@pytest.fixture(scope="module")
def arch_like():
    """Two ARCH-like orders on 4,000 observations: the second's extra coefficient is zero.

    Order ``j`` has coefficients ``alpha_j = C softplus(z_j / C)`` (a Deterministic)
    and variance ``alpha_j[0] + lags @ alpha_j[1:]``; the data come from the first
    order, so the second's last coefficient sits at its boundary, where the terms
    are far from quadratic in ``z`` and linear-in-variance in ``alpha``.
    """
    r, lags = arch_one_data(4000, seed=11)
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        tilt = pm.Data("tilt", 0.0)
        q = pm.Categorical("q", p=[0.5, 0.5])
        pm.Potential("prior_q", pt.switch(pt.eq(q, 0), tilt, 0.0))
        a0s, rows = [], []
        for j, size in enumerate((2, 3)):
            z = pm.Normal(f"z_{j}", 0.0, 1.0, shape=size)
            alpha = pm.Deterministic(f"alpha_{j}", C * pt.softplus(z / C))
            a0s.append(alpha[0])
            rows.append(pt.concatenate([alpha[1:], pt.zeros(3 - size)]))
        sigma2 = pt.stack(a0s)[q] + (lag_data * pt.stack(rows)[q]).sum(axis=1)
        pm.StudentT("obs", nu=7.0, sigma=pt.sqrt(sigma2), observed=r_data)
    reference = {"z_0": to_z([0.6, 0.3]), "z_1": to_z([0.6, 0.3, 0.002])}
    # a point off the reference, the boundary coefficient a few widths in z away
    point = model.initial_point() | {
        "z_0": to_z([0.62, 0.29]),
        "z_1": to_z([0.59, 0.31, 0.0004]),
        "q": np.asarray(0, dtype=model.initial_point()["q"].dtype),
    }
    gap = np.log(exact_conditional(model, "q", 2, point))
    tilt.set_value(gap[1] - gap[0])  # balance the two orders: p(q | rest) near 1/2
    return model, q, reference, point


@pytest.fixture(scope="module")
def steps(arch_like):
    """Steps built once: expanded in z (the default), in the coefficients, and raw."""
    model, q, reference, _ = arch_like
    settings = {"delta": 0.01, "rng": 3, "race": RACE}
    with model:
        return {
            "z": SubsampledCategoricalGibbs([q], control_variates=reference, **settings),
            "alpha": SubsampledCategoricalGibbs(
                [q], control_variates=reference, expand_in=["alpha_0", "alpha_1"], **settings
            ),
            "raw": SubsampledCategoricalGibbs([q], **settings),
        }


def residual_parts(step, point):
    """Residuals on every observation and the shift that the race adds back, per candidate."""
    expansion, n_obs = step.expansion, step.terms.n_obs
    cands = [step.candidate_values[0]]
    res = expansion.residual_batch(cands, slice(0, n_obs), point, step.reference)
    values, grads, hess = expansion.sums(step.reference, point, cands)
    delta = expansion.delta(point, step.reference)
    shift = values + grads @ delta + 0.5 * np.einsum("kij,i,j->k", hess, delta, delta)
    return res, shift


def softplus_coefficients(point):
    return np.concatenate([C * np.logaddexp(0, point[f"z_{j}"] / C) for j in (0, 1)])


def test_residuals_in_the_deterministics_add_up_to_the_exact_sum(arch_like, steps):
    _, _, reference, point = arch_like
    step = steps["alpha"]
    res, shift = residual_parts(step, point)
    exact = step.terms.loglik_sum([step.candidate_values[0]], point)
    np.testing.assert_allclose(res.sum(axis=1) + shift, exact, rtol=1e-10)
    # the public views: the fixed reference as given, none without control variates
    assert set(step.reference) == set(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(step.reference[name], value)
    assert steps["raw"].reference is None
    np.testing.assert_array_equal(step.candidate_values[0], np.arange(step.n_categories[0]))
    # the coordinates are the coefficients, not z
    np.testing.assert_allclose(
        step.expansion.delta(point, step.reference),
        softplus_coefficients(point) - softplus_coefficients(reference),
    )


def test_expansion_in_the_coefficients_cuts_the_residuals_at_the_boundary(arch_like, steps):
    point = arch_like[3]
    # the second order's residuals: measured 7.9e-4 in z against 2.3e-6 in alpha
    spread_z = residual_parts(steps["z"], point)[0][1].std()
    spread_alpha = residual_parts(steps["alpha"], point)[0][1].std()
    assert spread_alpha < 0.01 * spread_z, (spread_alpha, spread_z)


def test_draws_expanded_in_the_deterministics_match_enumeration(arch_like, steps):
    model, _, _, point = arch_like
    probs = exact_conditional(model, "q", 2, point)
    assert 0.3 < probs[0] < 0.7
    draws, st = draw_many(steps["alpha"], point, 1500, "q")
    assert_matches(draws, probs, 2)
    _, st_raw = draw_many(steps["raw"], point, 200, "q")
    used = np.mean([s["n_evals"] for s in st])
    used_raw = np.mean([s["n_evals"] for s in st_raw])
    assert used < 0.25 * used_raw, (used, used_raw)


def test_expand_in_rejects_what_it_cannot_expand_in(arch_like):
    model, q, reference, _ = arch_like
    with model:
        with pytest.raises(ValueError, match="control_variates is off"):
            SubsampledCategoricalGibbs([q], expand_in=["alpha_0"])
        with pytest.raises(ValueError, match="give Deterministics"):
            SubsampledCategoricalGibbs([q], control_variates=reference, expand_in=["z_0"])
    with pm.Model():
        y = pm.Data("y", np.zeros(300))
        k = pm.Categorical("k", p=[0.5, 0.5])
        mu = pm.Normal("mu", 0.0, 1.0, shape=2)
        pm.Deterministic("unused", 2 * mu)
        pm.Normal("obs", mu[k], 1.0, observed=y)
        with pytest.raises(ValueError, match="do not depend on"):
            SubsampledCategoricalGibbs([k], control_variates=True, expand_in=["unused"])


# -- RacingMetropolis(expand_in=...) ---------------------------------------------------


@pytest.fixture(scope="module")
def arch_block():
    """One ARCH-like order on 20,000 observations, its last coefficient zero in the data."""
    r, lags = arch_one_data(20_000, seed=12)
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        z = pm.Normal("z", 0.0, 1.0, shape=3, initval=to_z([0.6, 0.3, 0.002]))
        alpha = pm.Deterministic("alpha", C * pt.softplus(z / C))
        sigma2 = alpha[0] + (lag_data * alpha[1:]).sum(axis=1)
        pm.StudentT("obs", nu=7.0, sigma=pt.sqrt(sigma2), observed=r_data)
    return model, z


def mh_chain(step, model, n_draws):
    point = model.initial_point()
    stats_list = []
    for i in range(n_draws):
        step.tune = i < 100
        point, [st] = step.step(point)
        stats_list.append(st)
    return point, stats_list[100:]


@pytest.fixture(scope="module")
def mh_steps(arch_block):
    model, z = arch_block
    settings = {"proposal": "normal", "audit": AuditOptions(every=1), "rng": 4}
    with model:
        return {
            "alpha": RacingMetropolis([z], expand_in=["alpha"], **settings),
            "z": RacingMetropolis([z], **settings),
        }


def test_mh_residuals_in_the_deterministics_add_up_to_the_exact_sum(arch_block, mh_steps):
    model, _ = arch_block
    step = mh_steps["alpha"]
    point = model.initial_point()
    x = step.block.flatten([point["z"]])
    step.fit.fit(x.copy(), point)
    cv = step.coordinate_surrogate
    assert cv is not None
    theta = x + np.array([0.01, -0.005, -0.004])  # the last coefficient towards its boundary
    rows = step.fit.coordinates_at(theta, point)[None]
    terms = step.terms
    res = step.coordinate_expansion.residual_batch(rows, slice(0, terms.n_obs), point, cv.theta_ref)
    exact = terms.loglik_sum(step.block.candidates(theta[None]), point)
    np.testing.assert_allclose(res.sum() + cv.total(rows), exact, rtol=1e-10)
    np.testing.assert_allclose(rows[0], C * np.logaddexp(0, theta / C))


def test_mh_expanded_in_the_deterministics_keeps_decisions_and_cuts_terms(arch_block, mh_steps):
    model, _ = arch_block
    _, st = mh_chain(mh_steps["alpha"], model, 400)
    wrong = sum(s["n_wrong"] for s in st)
    audited = sum(s["n_audited"] for s in st)
    assert audited == 300
    assert stats.binom.sf(wrong - 1, audited, 0.05) > 1e-3, wrong  # error <= delta
    _, st_z = mh_chain(mh_steps["z"], model, 400)
    used = np.mean([s["frac_evals"] for s in st])
    used_z = np.mean([s["frac_evals"] for s in st_z])
    assert used < 0.5 * used_z, (used, used_z)


def test_mh_expand_in_needs_control_variates(arch_block):
    model, z = arch_block
    with model:
        with pytest.raises(ValueError, match="control_variates is off"):
            RacingMetropolis([z], expand_in=["alpha"], control_variates=False)
        with pytest.raises(ValueError, match="give Deterministics"):
            RacingMetropolis([z], expand_in=["z"])


def test_hmc_on_the_expansion_in_the_deterministics_is_accepted_and_exact(arch_block, monkeypatch):
    model, z = arch_block
    with model:
        in_alpha = RacingMetropolis([z], expand_in=["alpha"], audit=AuditOptions(every=1), rng=4)
        # at N = 20,000 the Laplace fit in z is scored when the step is built, and found poor
        with pytest.warns(UserWarning, match="at construction"):
            probed = RacingMetropolis([z], proposal="hmc", rng=4)
        assert probed.regime.reason == "poor_fit" and probed.fit is None
        # without that score, the tuning decisions find it too
        monkeypatch.setattr(NutsRegime, "_probes_fit", property(lambda self: False))
        in_z = RacingMetropolis([z], audit=AuditOptions(every=1), rng=4)
    gather, _, _ = in_alpha._coordinate_expansion._fns
    assert gather is not None  # the races' residuals compiled with the step, not in a race
    _, st = mh_chain(in_alpha, model, 400)
    _, st_z = mh_chain(in_z, model, 400)
    accepted = np.mean([s["accepted"] for s in st])
    # the expansion in z misfits the boundary coefficient, on few enough rows that the step
    # races on the raw terms: in tuning the step measures the misfit and leaves the
    # surrogate for PyMC's NUTS (mcmc.regime.FitCheck); in alpha it keeps racing
    assert accepted > 0.85, accepted
    assert in_alpha.regime.reason == "chosen" and in_z.regime.reason == "poor_fit"
    assert in_z.fit_check.accept_rate < 0.7, in_z.fit_check.describe()
    assert in_z.fit.raw_races and not in_alpha.fit.raw_races
    wrong = sum(s["n_wrong"] for s in st)
    assert stats.binom.sf(wrong - 1, 300, 0.05) > 1e-3, wrong
    # the leapfrog's gradient is that of the surrogate it integrates
    point = model.initial_point()
    sur = in_alpha.fit.proposal_surrogate(point)
    x = in_alpha._flatten([point["z"]]) + np.array([0.003, -0.002, -0.01])
    eye = 1e-6 * np.eye(3)
    fd = [(sur.total(x + e)[0] - sur.total(x - e)[0]) / 2e-6 for e in eye]
    np.testing.assert_allclose(sur.gradient(x), fd, rtol=1e-5)


def test_mh_expansion_not_finite_at_the_reference_falls_back_to_the_value_variables(
    arch_block,
):
    """An expansion in expand_in that cannot be fitted is dropped with a warning, still exact."""
    model, z = arch_block
    with model:
        step = RacingMetropolis(  # every decision raced (and audited): no back-off
            [z],
            expand_in=["alpha"],
            proposal="normal",
            race=RaceOptions(backoff=False),
            audit=AuditOptions(every=1),
            rng=4,
        )

    def not_finite(mode, point):  # as a Deterministic's expansion with a NaN Hessian would
        raise FloatingPointError("the log-likelihood is not finite at the reference")

    step.fit.fit_coordinate_surrogate = not_finite
    with pytest.warns(UserWarning, match="expand_in dropped"):
        _, st = mh_chain(step, model, 400)
    assert step.coordinate_surrogate is None and step.surrogate is not None
    point = model.initial_point()
    assert step.fit.proposal_surrogate(point) is step.surrogate  # the expansion in z
    wrong = sum(s["n_wrong"] for s in st)
    assert sum(s["n_audited"] for s in st) == 300
    assert stats.binom.sf(wrong - 1, 300, 0.05) > 1e-3, wrong  # error <= delta

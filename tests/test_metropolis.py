"""RacingMetropolis: posteriors against NUTS, exact decisions against plain MH, bad input."""

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_subsample import RacingMetropolis
from pymc_subsample.mcmc.regime import REGIME_REASONS, Regime
from pymc_subsample.options import AuditOptions, ProposalOptions, RaceOptions
from pymc_subsample.steps.metropolis import RacingMetropolisState
from pymc_subsample.steps.nuts_regime import NutsRegime
from support.models import logistic_data, logistic_model

# race on the whole schedule (the default exact_fraction would go exact at once for
# these small, cheap models); a small delta and a large first batch remove the bias
# of loose Racing-Normal tests (see the racing explanation in the docs)
RACE = RaceOptions(exact_fraction=1.0, batch_size=500)


def summary(idata, names):
    return az.summary(idata, var_names=names, kind="all")


def assert_posteriors_agree(test, ref, names, sd_rel=0.25):
    a, b = summary(test, names), summary(ref, names)
    for row in a.index:
        se = np.sqrt(float(a.loc[row, "mcse_mean"]) ** 2 + float(b.loc[row, "mcse_mean"]) ** 2)
        diff = abs(float(a.loc[row, "mean"]) - float(b.loc[row, "mean"]))
        assert diff < 4 * se, (row, diff, se)
        assert abs(float(a.loc[row, "sd"]) / float(b.loc[row, "sd"]) - 1) < sd_rel, row


@pytest.fixture(scope="module")
def linear():
    rng = np.random.default_rng(0)
    n_obs = 20_000
    x = rng.normal(size=(n_obs, 2))
    y = 0.2 + x @ np.array([0.5, -0.3]) + rng.normal(size=n_obs)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        b = pm.Normal("b", 0, 5, shape=2)
        a = pm.Normal("a", 0, 5)
        pm.Normal("y", a + x_data @ b, 1.0, observed=y_data)
        nuts = pm.sample(
            500,
            tune=500,
            chains=2,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return model, nuts


def test_linear_regression_matches_nuts(linear):
    model, nuts = linear
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]], proposal="normal", scaling=0.01, delta=0.01, race=RACE
        )
        idata = pm.sample(
            1500,
            tune=1000,
            step=[step],
            chains=2,
            random_seed=2,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert_posteriors_agree(idata, nuts, ["a", "b"])
    ss = idata.sample_stats
    assert float(ss["frac_evals"].mean()) < 0.9  # the race saved work
    assert 0.1 < float(ss["accepted"].mean()) < 0.7


def test_elementwise_random_walk_matches_nuts(linear):
    model, nuts = linear
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]],
            scaling=0.01,
            race=RACE,
            proposal_options=ProposalOptions(elemwise=True),
            delta=0.01,
        )
        idata = pm.sample(
            600,
            tune=400,
            step=[step],
            chains=2,
            random_seed=8,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert_posteriors_agree(idata, nuts, ["a", "b"])
    assert step.scaling.shape == (3,)


@pytest.fixture(scope="module")
def logistic():
    x, y = logistic_data(20_000, seed=3, a=0.3, beta=np.array([1.0, -0.5]))
    model = logistic_model(x, y)
    with model:
        nuts = pm.sample(
            500,
            tune=500,
            chains=2,
            random_seed=4,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return model, nuts


@pytest.mark.parametrize("control_variates", [False, True])
def test_logistic_regression_matches_nuts(logistic, control_variates):
    model, nuts = logistic
    a, b = model["a"], model["b"]
    with model:
        step = RacingMetropolis(
            [b, a],
            scaling=0.01,
            race=RACE,
            audit=AuditOptions(every=10),
            control_variates=control_variates,
            delta=0.01,
        )
        idata = pm.sample(
            1000,
            tune=700,
            step=[step],
            chains=2,
            random_seed=5,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert_posteriors_agree(idata, nuts, ["a", "b"])
    audits = idata.sample_stats["audit_agree"].values
    done = audits >= 0
    # every 10th draw is audited when its decision was raced (not made exactly by the back-off)
    assert done.sum() == idata.sample_stats["n_audited"].values.sum()
    assert 0 < done.sum() <= 2 * 100
    assert (audits[done] == 0).mean() < 0.05
    frac = float(idata.sample_stats["frac_evals"].mean())
    if control_variates:  # residuals of the Taylor expansion decide races early
        # (each look evaluates the 13-point stencil too: at N = 2e4 one look of 500 is 0.19)
        assert frac < 0.35, frac
    else:
        assert frac > 0.5, frac


def test_quadratic_surrogate_is_exact_on_quadratics_and_sums_consistently():
    """h sums exactly to its stencil sums; for quadratic terms the residuals vanish."""
    from pymc_subsample.mcmc.surrogate import QuadraticSurrogate, stencil_points

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 3))
    c = rng.normal(size=1000)

    def terms(thetas):  # l_n(theta) = c_n + x_n . theta - (x_n . theta)^2 / 2
        z = thetas @ x.T
        return c[None, :] + z - 0.5 * z**2

    ref, eps = np.array([0.1, -0.2, 0.3]), np.array([1e-2, 2e-2, 5e-3])
    stencil = stencil_points(ref, eps)
    assert stencil.shape == (1 + 3 + 9, 3)  # 1 + d + d^2
    values = terms(stencil)
    sur = QuadraticSurrogate(ref, eps, values.sum(axis=1))
    thetas = rng.normal(size=(4, 3))
    h = sur.weights(thetas) @ values  # per observation
    np.testing.assert_allclose(h, terms(thetas), atol=1e-7)
    np.testing.assert_allclose(h.sum(axis=1), sur.total(thetas), rtol=1e-10)
    np.testing.assert_allclose(sur.hess, -(x.T @ x), rtol=1e-6)
    diag = QuadraticSurrogate(ref, eps, terms(stencil_points(ref, eps, False)).sum(1), False)
    assert diag.n_points == 7 and np.count_nonzero(diag.hess - np.diag(np.diag(diag.hess))) == 0
    with pytest.raises(ValueError, match="stencil sums"):
        QuadraticSurrogate(ref, eps, np.zeros(5))


def test_defaults_from_the_initial_point_match_nuts(logistic):
    """A new user's call: no scaling, no initvals; HMC on the surrogate, racing accept test."""
    model, nuts = logistic
    with model:
        step = RacingMetropolis([model["b"], model["a"]], audit=AuditOptions(every=5))
        idata = pm.sample(
            1000,
            tune=500,
            step=[step],
            chains=2,
            random_seed=11,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert_posteriors_agree(idata, nuts, ["a", "b"])
    ess = az.ess(idata, var_names=["a", "b"])
    assert min(float(ess[v].min()) for v in ("a", "b")) > 600  # nearly independent draws
    ss = idata.sample_stats
    assert float(ss["accepted"].mean()) > 0.6
    wrong, audited = int(ss["n_wrong"].sum()), int(ss["n_audited"].sum())
    assert audited == 2 * 200
    assert stats.binom.sf(wrong - 1, audited, step.delta) > 1e-3, wrong


def test_langevin_with_full_gradient_is_mala_and_matches_nuts(linear):
    model, nuts = linear
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]],
            proposal="langevin",
            scaling=0.005,
            race=RaceOptions(bound="exact"),
            proposal_options=ProposalOptions(gradient_batch=20_000, target_accept=0.574),
        )
        idata = pm.sample(
            800,
            tune=800,
            step=[step],
            chains=2,
            random_seed=6,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert_posteriors_agree(idata, nuts, ["a", "b"])
    assert 0.35 < float(idata.sample_stats["accepted"].mean()) < 0.85


def test_langevin_racing_runs_and_tunes(linear):
    model, _ = linear
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]],
            proposal="langevin",
            scaling=0.005,
            race=RACE,
            proposal_options=ProposalOptions(gradient_batch=2000),
            delta=0.01,
        )
        idata = pm.sample(
            200,
            tune=600,
            step=[step],
            chains=1,
            random_seed=7,
            progressbar=False,
            compute_convergence_checks=False,
        )
    acc = float(idata.sample_stats["accepted"].mean())
    assert 0.15 < acc < 0.6  # tuned towards 0.36
    assert np.isfinite(idata.posterior["a"].values).all()


def test_exact_bound_makes_plain_mh_decisions(linear):
    model, _ = linear
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]],
            race=RaceOptions(bound="exact"),
            proposal="normal",
            scaling=0.01,
            control_variates=False,
        )
    logp = model.compile_logp()
    point = model.initial_point()
    point["b"] = np.array([0.5, -0.3])
    point["a"] = np.array(0.2)
    step.tune = False
    for seed in range(40):
        step.rng = np.random.default_rng(seed)
        mirror = np.random.default_rng(seed)
        z = mirror.standard_normal(3)  # proposal first (b then a), then u
        log_u = np.log(mirror.random())
        prop = dict(point)
        prop["b"] = point["b"] + 0.01 * z[:2]
        prop["a"] = np.array(point["a"] + 0.01 * z[2])
        expected = log_u < logp(prop) - logp(point)
        new, st = step.step(point)
        assert st[0]["accepted"] == expected
        assert np.allclose(new["b"], prop["b"] if expected else point["b"])
        assert st[0]["frac_evals"] == 1.0


def test_setup_chain_resets_tuning(linear):
    model, _ = linear
    with model:
        # a scale far above the posterior sd (0.007): every proposal is rejected,
        # so PyMC's rule shrinks the scale tenfold after each interval
        step = RacingMetropolis(
            [model["a"]],
            proposal="normal",
            scaling=5.0,
            race=RACE,
            proposal_options=ProposalOptions(tune_interval=5),
            rng=0,
            delta=0.01,
        )
    point = model.initial_point()
    point["a"] = np.array(0.2)
    for _ in range(12):
        point, _ = step.step(point)
    assert step.scaling < 5.0
    step.setup_chain(np.random.default_rng(0), tune=10, draws=10)
    assert step.scaling == 5.0 and step.tune and step.n_steps == 0


def test_discrete_variable_is_rejected():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(20))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("y", q, 1.0, observed=y_data)
        with pytest.raises(ValueError, match="SubsampledCategoricalGibbs"):
            RacingMetropolis([q])


def test_control_variates_fall_back_with_a_warning_at_a_support_boundary(monkeypatch):
    """Uniform(0, theta) terms are -inf just below max(y): the expansion cannot be built.

    At N = 500 the step scores the Laplace fit when built, finds it poor by hundreds
    of nats and starts in NUTS; without that score, the expansion's failure is met.
    """
    y = np.random.default_rng(0).uniform(0, 2, 500)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        theta = pm.HalfNormal("theta", 5)
        pm.Uniform("y", 0, theta, observed=y_data)
        with pytest.warns(UserWarning, match="at construction"):
            probed = RacingMetropolis([theta], scaling=0.5, delta=0.01, race=RACE)
        assert probed.regime.reason == "poor_fit" and probed.fit is None
        monkeypatch.setattr(NutsRegime, "_probes_fit", property(lambda self: False))
        step = RacingMetropolis([theta], scaling=0.5, delta=0.01, race=RACE)
        point = model.initial_point()
        point["theta_log__"] = np.log(y.max() + 1e-9)
        with pytest.warns(UserWarning, match="control variates turned off"):
            point, _ = step.step(point)
        point, (st,) = step.step(point)  # carries on without them
    assert np.isfinite(point["theta_log__"])
    # the proposal chosen stays readable; the one in use says why it differs
    assert step.proposal == "hmc" and step.regime == Regime("normal", False, "no_surrogate")
    assert st["regime"] == REGIME_REASONS.index("no_surrogate") and step.scaling == 0.5


def test_default_settings_keep_the_audited_error_within_delta(logistic):
    """Defaults (delta=0.05, first batch 50, control variates): audited error <= delta.

    Every draw is audited (one decision: a joint proposal); the error rate must
    stay below delta plus three binomial standard errors.
    """
    model, _ = logistic
    with model:
        step = RacingMetropolis(
            [model["b"], model["a"]], scaling=0.01, audit=AuditOptions(every=1), rng=7
        )
    point = model.initial_point()
    point["b"] = np.array([1.0, -0.5])
    point["a"] = np.array(0.3)
    wrong, n = 0, 300
    step.tune = False
    for _ in range(n):
        point, (st,) = step.step(point)
        wrong += st["audit_agree"] == 0
    bound = step.delta
    assert wrong / n <= bound + 3 * np.sqrt(bound * (1 - bound) / n), wrong
    assert step.n_audits == n


@pytest.fixture(scope="module")
def wide_regression():
    """Bayesian linear regression with 14 correlated coefficients (exact Gaussian posterior)."""
    rng = np.random.default_rng(3)
    n_obs, d = 3_000, 14
    x = rng.normal(size=(n_obs, d)) + 0.8 * rng.normal(size=(n_obs, 1))  # correlated columns
    beta = rng.normal(0, 0.5, size=d)
    y = x @ beta + rng.normal(size=n_obs)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        b = pm.Normal("b", 0, 2, shape=d)
        pm.Normal("y", x_data @ b, 1.0, observed=y_data)
    precision = x.T @ x + np.eye(d) / 4
    cov = np.linalg.inv(precision)
    return model, cov @ (x.T @ y), cov


def test_taylor_residuals_sum_to_the_exact_remainder(wide_regression):
    model, mean, _ = wide_regression
    step = RacingMetropolis([model["b"]], proposal="hmc", model=model)
    terms = step.terms
    expansion = step.expansion  # the step's, compiled with it
    rng = np.random.default_rng(0)
    ref = mean + 0.01 * rng.normal(size=len(mean))
    thetas = ref + 0.05 * rng.normal(size=(3, len(mean)))
    point = model.initial_point()
    value, grad, hess = expansion.sums(ref, point)
    residuals = expansion.residual_batch(thetas, slice(0, terms.n_obs), point, ref)
    delta = thetas - ref
    taylor = value + delta @ grad + 0.5 * np.einsum("ki,ij,kj->k", delta, hess, delta)
    full = terms.loglik_sum([thetas], point)
    np.testing.assert_allclose(residuals.sum(axis=1), full - taylor, atol=1e-6)
    # gathered positions and a window read the same observations of the permutation
    window = expansion.residual_batch(thetas, slice(10, 60), point, ref)
    gathered = expansion.residual_batch(thetas, np.arange(10, 60), point, ref)
    np.testing.assert_allclose(window, gathered, atol=1e-10)
    # Gaussian terms are quadratic: the expansion is exact and every residual vanishes
    np.testing.assert_allclose(residuals, 0.0, atol=1e-8)


def test_large_block_defaults_sample_the_exact_posterior(wide_regression):
    """Above 12 coordinates the expansion comes from exact derivatives; draws match."""
    model, mean, cov = wide_regression
    with model:
        step = RacingMetropolis([model["b"]], proposal="hmc")
        idata = pm.sample(
            500, tune=500, chains=2, cores=1, step=step, random_seed=4,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    assert type(step.surrogate).__name__ == "TaylorSurrogate"
    draws = idata.posterior["b"].values.reshape(-1, len(mean))
    ess = az.ess(idata, var_names=["b"])["b"].values
    assert ess.min() > 200
    z = (draws.mean(axis=0) - mean) / np.sqrt(np.diag(cov) / ess)
    assert np.abs(z).max() < 4, z
    sd_ratio = draws.std(axis=0) / np.sqrt(np.diag(cov))
    assert np.all(np.abs(sd_ratio - 1) < 0.2), sd_ratio


def test_hmc_that_is_never_accepted_falls_back_to_a_random_walk(logistic):
    model, _ = logistic
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=4)
    point = model.initial_point()
    point, (st,) = step.step(point)  # fits the surrogate: the HMC proposal is ready
    assert step.regime == Regime("hmc", True) and st["regime"] == 0
    with pytest.warns(UserWarning, match="falls back to a random walk") as caught:
        for _ in range(100):  # a hundred rejections in tuning
            step._tune_step(np.array([False]), np.array([0.0]))
    assert len(caught) == 1  # one warning
    # the chosen proposal stays readable; the one in use is recorded with its reason
    assert step.proposal == "hmc"
    assert step.regime == Regime("normal", True, "hmc_rejected")
    moved = 0
    for _ in range(50):  # the preconditioned random walk moves and keeps tuning
        new, (st,) = step.step(point)
        assert st["regime"] == REGIME_REASONS.index("hmc_rejected")
        moved += not np.array_equal(new["b"], point["b"])
        point = new
    assert moved > 5
    step.setup_chain(np.random.default_rng(1), tune=10, draws=10)  # kept in the next chain
    assert step.regime.reason == "hmc_rejected" and step.scaling == 2.38 / np.sqrt(step.dim)


def test_a_given_covariance_preconditions_the_random_walk_and_draws_match(wide_regression):
    """covariance= replaces the Laplace covariance; the chain still targets the posterior."""
    model, mean, cov = wide_regression
    given = cov * np.diag([1.5] * 7 + [0.7] * 7)  # an estimate, not the exact covariance
    given = 0.5 * (given + given.T) + 1e-3 * np.diag(np.diag(cov))
    with model:
        step = RacingMetropolis(
            [model["b"]], proposal="normal", proposal_options=ProposalOptions(covariance=given)
        )
        idata = pm.sample(
            4000, tune=1000, chains=2, cores=1, step=step, random_seed=5,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    np.testing.assert_allclose(step.fit.chol_cov @ step.fit.chol_cov.T, 0.5 * (given + given.T))
    draws = idata.posterior["b"].values.reshape(-1, len(mean))
    ess = az.ess(idata, var_names=["b"])["b"].values
    assert ess.min() > 50
    z = (draws.mean(axis=0) - mean) / np.sqrt(np.diag(cov) / ess)
    assert np.abs(z).max() < 4, z
    sd_ratio = draws.std(axis=0) / np.sqrt(np.diag(cov))
    assert np.all(np.abs(sd_ratio - 1) < 0.25), sd_ratio
    with pytest.raises(ValueError, match="covariance must be"):
        RacingMetropolis(
            [model["b"]], proposal_options=ProposalOptions(covariance=np.eye(3)), model=model
        )


def test_backoff_makes_decisions_exactly_where_races_give_up_and_keeps_the_law(linear):
    """Raw-term races of a random walk at N = 20,000 mostly end in exact passes.

    The step then backs off to exact decisions: far fewer are raced, with no
    race's looks before them (which cost more time than their terms say), a
    decision reads about what plain MH's reads, and the draws still match NUTS.
    """
    model, nuts = linear
    settings = {
        "proposal": "normal", "control_variates": False, "audit": AuditOptions(every=0),
        "rng": 3,
    }  # fmt: skip
    blocks = [model["b"], model["a"]]
    runs = {}
    for backoff in (True, False):
        with model:
            race = RaceOptions(exact_fraction=0.2, batch_size=50, backoff=backoff)
            step = RacingMetropolis(blocks, race=race, **settings)
            runs[backoff] = pm.sample(
                1000, tune=500, chains=2, step=step, random_seed=5, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
    racing = runs[False].sample_stats
    assert (racing["n_raced"] == 1).all()
    assert (racing["frac_evals"].values >= 0.5).mean() > 0.8  # most races give up here
    backing = runs[True].sample_stats
    assert backing["n_raced"].values.mean() < 0.3  # most decisions exact, without a race
    assert backing["frac_evals"].values.mean() < 1.05
    assert_posteriors_agree(runs[True], nuts, ["b", "a"])


@pytest.mark.parametrize("proposal", ["hmc", "normal"])
def test_a_restored_sampling_state_gives_the_same_next_draws(proposal):
    """sampling_state holds everything a draw changes: restored, the next draws repeat."""
    x, y = logistic_data(5_000, seed=1, a=0.3, beta=np.array([1.0, -0.5]))
    model = logistic_model(x, y)
    with model:
        step = RacingMetropolis([model["b"], model["a"]], proposal=proposal, rng=3)
    step.setup_chain(np.random.default_rng(5), tune=100, draws=10)
    start = model.initial_point()
    for _ in range(30):  # into tuning: scale, step size, path length have moved
        start, _ = step.step(start)
    state = step.sampling_state
    assert isinstance(state, RacingMetropolisState)

    def run(n):
        point, out = start, []
        for _ in range(n):
            point, (st,) = step.step(point)
            out.append((point["b"].copy(), float(point["a"]), st["scaling"], st["n_evals"]))
        return out

    first = run(25)
    assert len({tuple(b) for b, *_ in first}) > 3  # the chain moves
    assert step.sampling_state.n_steps == state.n_steps + 25
    step.sampling_state = state
    for (b1, *rest1), (b2, *rest2) in zip(first, run(25), strict=True):
        np.testing.assert_array_equal(b1, b2)
        assert rest1 == rest2
    if proposal == "hmc":  # the tuned step size and path length are in the state
        assert state.hmc_adaptation.accept_n == 30
        assert type(state.hmc_adaptation.step_size).__name__ == "DualAveragingState"
        assert 0.05 <= state.hmc_adaptation.path <= step.path_length
    else:
        assert state.steps_until_tune == step.tune_interval - 30

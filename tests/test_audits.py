"""Audits that are independent of the race's machinery, and that act on what they find.

A fault in the race's own terms (here: its row-permuted copy of the data
shifted, as a stale copy or a hand-written coupling of rows would make it) is
invisible to an audit that recomputes the exact decision from the same terms;
the audits compare with the model's joint log density on the original data,
find the races wrong, name the cause, and the step decides exactly from the
joint density from then on.
"""

import warnings
from dataclasses import replace

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats
from test_gibbs import assert_matches, draw_many, exact_conditional

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.mcmc.audit import (
    SPARSE_SHARE,
    diagnose,
    error_rate_exceeds,
    explain,
    scores_differ,
    zero_difference_share,
)
from pymc_subsample.options import AuditOptions, RaceOptions

RACE = RaceOptions(exact_fraction=1.0, batch_size=50, backoff=False)
MEANS = np.linspace(0.0, 0.2, 5)


def selector_model(n_obs: int, seed: int = 0, means: np.ndarray = MEANS):
    """y_n ~ Normal(means[q], 1): a selector whose conditional spreads over a few values."""
    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(means.mean(), 1.0, size=n_obs))
        q = pm.Categorical("q", p=np.full(len(means), 1 / len(means)))
        pm.Normal("y", pt.as_tensor(means)[q], 1.0, observed=y_data)
    return model, q


def corrupt(step, shift: float = 0.1) -> None:
    """Shift the race's row-permuted copy of the data (as a stale copy would differ).

    The model's data (the pm.Data variable) stay as they are: only what the
    race and its own exact sums read is wrong.
    """
    copy = step.terms._copy  # the PermutedCopy whose arrays the race and its sums read
    copy.values = [np.ascontiguousarray(v + shift) for v in copy.values]


def first_exact(stats_list) -> int:
    """Index of the first draw whose stats say it was exact after the audits' switch."""
    return next(i for i, s in enumerate(stats_list) if s["audit_exact"])


def test_gibbs_audits_find_wrong_terms_and_switch_to_the_joint_density():
    """Python race (N = 2,000): the fault is flagged as structural; later draws are exact.

    On the old code the audits compared with the race's own (equally wrong)
    sums: no audit disagreed, and the draws followed the shifted data.
    """
    model, q = selector_model(2000)
    point = model.initial_point()
    probs = exact_conditional(model, "q", len(MEANS), point)
    assert probs.max() < 0.9
    with model:
        step = SubsampledCategoricalGibbs(
            [q], rng=1, race=replace(RACE, shuffle_every=10**9), audit=AuditOptions(every=1)
        )
    corrupt(step)
    with pytest.warns(UserWarning, match="audited decisions differed") as record:
        draws, st = draw_many(step, point, 600, "q")
    message = next(str(w.message) for w in record if "audited" in str(w.message))
    assert "structural or stale" in message
    assert step.audit_exact and step.audit_cause == "structural" and step._exact_independent
    switched = first_exact(st)
    assert 3 <= switched <= 40, switched  # three wrong audits suffice at delta = 0.05
    assert sum(s["audit_agree"] == 0 for s in st[:switched]) >= 3
    after = st[switched:]
    assert all(s["audit_exact"] and s["n_raced"] == 0 and s["audit_agree"] == -1 for s in after)
    assert_matches(draws[switched:], probs, len(MEANS))


def test_compiled_lean_path_audits_against_the_joint_density():
    """Compiled races (N = 50,000): the audits no longer reuse the race's own sums."""
    model, q = selector_model(50_000, seed=1, means=np.linspace(0.07, 0.11, 5))
    point = model.initial_point()
    probs = exact_conditional(model, "q", len(MEANS), point)
    with model:
        step = SubsampledCategoricalGibbs(
            [q],
            rng=3,
            race=RaceOptions(
                backoff=False, batch_size=400, exact_fraction=0.1, shuffle_every=10**9
            ),
            audit=AuditOptions(every=1),
        )
    step.finish_compiling()  # the compiled tier a long chain reaches
    assert step.compiled
    corrupt(step, 0.02)  # about 4.5 sd of the data's mean
    with pytest.warns(UserWarning, match="structural or stale"):
        draws, st = draw_many(step, point, 300, "q")
    switched = first_exact(st)
    assert switched <= 40 and all(s["n_raced"] == 0 for s in st[switched:])
    assert_matches(draws[switched:], probs, len(MEANS))


def test_change_point_races_keep_sparse_values_to_the_exact_pass_and_audits_agree():
    """A change point on a grid of 11 positions 2 rows apart, N = 2,000.

    Candidates differ on at most 20 rows: batches of 50 rarely see them. On the
    old code the races went wrong and the audits blamed heavy tails; the races
    now keep values with sparse differences to their exact pass
    (``racing.state.sparse_arms``), so every audit agrees, nothing switches, and
    the draws match enumeration. (The audits' "sparse" diagnosis, for races
    that go wrong some other way, is tested on the classifier.)
    """
    rng = np.random.default_rng(0)
    n_obs, grid = 2000, np.arange(990, 1011, 2).astype(float)
    y = np.where(np.arange(n_obs) < 1000, 0.0, 1.0) + rng.normal(size=n_obs)
    with pm.Model() as model:
        index = pm.Data("index", np.arange(n_obs, dtype=float))
        y_data = pm.Data("y_data", y)
        k = pm.Categorical("k", p=np.full(len(grid), 1 / len(grid)))
        tau = pt.as_tensor(grid)[k]
        pm.Normal("y", pt.switch(index < tau, 0.0, 1.0), 1.0, observed=y_data)
        step = SubsampledCategoricalGibbs([k], rng=1, race=RACE, audit=AuditOptions(every=1))
    point = model.initial_point()
    probs = exact_conditional(model, "k", len(grid), point)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draws, st = draw_many(step, point, 500, "k")
    assert not step.audit_exact and step.n_disagreements == 0
    assert_matches(draws, probs, len(grid))


def test_audits_off_never_switch():
    """``audit_every=0``: the same fault goes unseen (no warning, no switch, no stat)."""
    model, q = selector_model(2000)
    with model:
        step = SubsampledCategoricalGibbs(
            [q], rng=1, race=replace(RACE, shuffle_every=10**9), audit=AuditOptions(every=0)
        )
    corrupt(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, st = draw_many(step, model.initial_point(), 200, "q")
    assert not step.audit_exact and step.n_audits == 0
    assert not any(s["audit_exact"] for s in st) and all(s["n_raced"] == 1 for s in st)


def test_audits_that_do_not_act_warn_once_and_keep_racing():
    """``AuditOptions(act=False)``: the fault is found and named, the races go on."""
    model, q = selector_model(2000)
    with model:
        step = SubsampledCategoricalGibbs(
            [q],
            rng=1,
            race=replace(RACE, shuffle_every=10**9),
            audit=AuditOptions(every=1, act=False),
        )
    corrupt(step)
    with pytest.warns(UserWarning, match="audited decisions differed") as record:
        _, st = draw_many(step, model.initial_point(), 300, "q")
    warned = [str(w.message) for w in record if "audited" in str(w.message)]
    assert len(warned) == 1 and "keeps racing" in warned[0] and "structural" in warned[0]
    assert step.audit_cause == "structural"
    assert not step.audit_exact and not step._exact_independent
    assert not any(s["audit_exact"] for s in st) and all(s["n_raced"] == 1 for s in st)
    assert sum(s["audit_agree"] == 0 for s in st) > 3  # still audited, still wrong


def test_exact_mode_is_kept_across_chains():
    """A fault found in one chain holds in the next: ``setup_chain`` keeps the exact mode."""
    model, q = selector_model(2000)
    with model:
        step = SubsampledCategoricalGibbs(
            [q], rng=1, race=replace(RACE, shuffle_every=10**9), audit=AuditOptions(every=1)
        )
    corrupt(step)
    with pytest.warns(UserWarning, match="structural"):
        draw_many(step, model.initial_point(), 60, "q")
    assert step.audit_exact
    step.setup_chain(np.random.default_rng(2), 0, 10)
    assert step.audit_exact and step._exact_independent and step.n_audits == 0
    _, st = draw_many(step, model.initial_point(), 10, "q")
    assert all(s["audit_exact"] and s["n_raced"] == 0 for s in st)


def test_metropolis_audits_find_wrong_terms_and_switch_to_the_joint_density():
    """RacingMetropolis on a Normal mean: after the switch, draws match the analytic posterior.

    The race's copy of the data is shifted by 0.1 (about 4.5 posterior sd at
    N = 2,000); on the old code the audits compared with the same shifted sums.
    The race reads the raw terms (without control variates, whose residuals
    are gathered from the original rows and would not see the shifted copy).
    """
    rng = np.random.default_rng(4)
    n_obs, prior_sd = 2000, 10.0
    y = rng.normal(0.3, 1.0, size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("y", mu, 1.0, observed=y_data)
        step = RacingMetropolis(
            [mu],
            rng=5,
            race=RaceOptions(shuffle_every=10**9, backoff=False),
            audit=AuditOptions(every=1),
            proposal="normal",
            control_variates=False,
        )
    corrupt(step)
    post_prec = n_obs + prior_sd**-2
    post_mean, post_sd = y.sum() / post_prec, post_prec**-0.5
    point = dict(model.initial_point(), mu=np.asarray(post_mean))
    step.tune = True
    with pytest.warns(UserWarning, match="audited decisions differed") as record:
        draws, st = [], []
        for i in range(1500):
            if i == 300:
                step.stop_tuning()
            point, (s,) = step.step(point)
            draws.append(float(point["mu"]))
            st.append(s)
    message = next(str(w.message) for w in record if "audited" in str(w.message))
    assert "structural or stale" in message
    assert step.audit_exact and step.audit_cause == "structural"
    switched = first_exact(st)
    assert switched < 300, switched
    after = st[switched:]
    assert all(s["audit_exact"] and s["n_raced"] == 0 and s["audit_agree"] == -1 for s in after)
    kept = np.array(draws[300:])
    # batch means: 20 batches of 60 draws of a random walk, their spread gives the MCSE
    batches = kept.reshape(20, -1).mean(axis=1)
    mcse = batches.std(ddof=1) / np.sqrt(len(batches))
    assert abs(kept.mean() - post_mean) < 4 * mcse + 0.05 * post_sd, (kept.mean(), post_mean)
    assert abs(kept.std() / post_sd - 1) < 0.35
    assert mcse < 0.5 * post_sd  # the test can tell the shifted posterior (4.5 sd away)


# -- the classifier ----------------------------------------------------------------------


def test_error_rate_test():
    assert not error_rate_exceeds(0, 100, 0.05)
    assert not error_rate_exceeds(5, 100, 0.05)  # about delta
    assert error_rate_exceeds(3, 3, 0.05)  # 0.05**3 < 1e-3
    assert error_rate_exceeds(20, 100, 0.05)
    assert stats.binom.sf(2 - 1, 2, 0.05) > 1e-3 and not error_rate_exceeds(2, 2, 0.05)


def test_scores_differ_by_more_than_a_constant():
    joint = np.array([-1500.2, -1498.0, -np.inf, -1503.1])
    assert not scores_differ(joint - 812.5, joint)  # terms that do not involve the candidates
    assert not scores_differ(joint * (1 + 1e-13), joint)  # rounding of long sums
    assert scores_differ(joint + np.array([0.0, 0.5, 0.0, 0.0]), joint)
    assert scores_differ(np.array([-1500.2, -1498.0, -7.0, -1503.1]), joint)  # -inf pattern
    assert scores_differ(np.array([np.nan, 1.0, -np.inf, 0.0]), joint)


def test_sparse_differences_are_told_apart():
    """A change point: candidates differ on a few rows of the batch -> "sparse"."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=400)
    terms = np.tile(base, (4, 1))
    for k in range(4):  # candidate k moves rows [100 k, 100 k + 8)
        terms[k, 100 * k : 100 * k + 8] += 1.0
    share = zero_difference_share(terms)
    assert share > SPARSE_SHARE
    assert diagnose(0, share) == "sparse"
    assert "sparse differences" in explain("sparse", "Step", 5, 20, 0.05)


def test_heavy_tails_are_told_apart():
    """Terms that differ on every row (e.g. Student-t against Normal) -> "heavy tails"."""
    rng = np.random.default_rng(1)
    x = rng.standard_t(2, size=300)
    terms = np.stack([stats.norm.logpdf(x), stats.t.logpdf(x, 5), stats.laplace.logpdf(x)])
    share = zero_difference_share(terms)
    assert share == 0.0
    assert diagnose(0, share) == "heavy_tails" and diagnose(0, None) == "heavy_tails"
    message = explain("heavy_tails", "Step", 5, 20, 0.05)
    assert "heavy tails" in message and "batch_size" in message and "bound='exact'" in message


def test_structural_wins_over_the_other_causes():
    assert diagnose(1, 0.9) == "structural" and diagnose(2, 0.0) == "structural"
    assert "structural or stale" in explain("structural", "Step", 3, 3, 0.05)


def test_zero_difference_share_ignores_infeasible_candidates():
    terms = np.array([[0.0, 1.0, 2.0], [0.0, 1.5, 2.0], [-np.inf, -np.inf, -np.inf]])
    assert zero_difference_share(terms) == pytest.approx(2 / 3)
    assert zero_difference_share(terms[:1]) == 0.0

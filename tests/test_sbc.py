"""Simulation-based calibration (Talts et al. 2018) of the steps inside pm.sample.

The fast tests run few replications with a loose threshold; each is paired with
a deliberately wrong step (support.sbc.OffsetGibbs, OffsetMetropolis) that the
same test, with the same replications and seed, must reject. The slow tests are
the study's size (benchmarks/sbc.py).
"""

import numpy as np
import pytest

from pymc_subsample.options import RaceOptions
from support.sbc import (
    bimodal_problem,
    logistic_problem,
    rank_uniformity,
    run_sbc,
    sbc_rank,
    selector_problem,
)

P_MIN = 1e-3  # calibrated steps: every quantity's p-value above P_MIN / (number of quantities)
# the race on its whole schedule, no timing
RACING = {"race": RaceOptions(exact_fraction=1.0, batch_size=50)}


def smallest_p(res):
    return min(res.pvalues.values()) * len(res.pvalues)  # Bonferroni over the quantities


def test_rank_is_uniform_for_exact_draws_with_ties():
    """sbc_rank on exact i.i.d. draws of a discrete law (many ties) gives uniform ranks."""
    rng = np.random.default_rng(3)
    n_draws = 9
    ranks = [sbc_rank(rng.integers(3), rng.integers(3, size=n_draws), rng) for _ in range(4000)]
    assert rank_uniformity(np.array(ranks), n_draws, 10)[1] > P_MIN
    # without the random tie-breaking, the same draws are far from uniform
    rng = np.random.default_rng(3)
    below = [int(np.sum(rng.integers(3, size=n_draws) < rng.integers(3))) for _ in range(4000)]
    assert rank_uniformity(np.array(below), n_draws, 10)[1] < 1e-6


@pytest.fixture(scope="module")
def selector():
    return selector_problem()


@pytest.fixture(scope="module")
def logistic():
    problem = logistic_problem(n_obs=1000)
    problem.tune = 50
    return problem


def fast_sbc(problem, step, reps):
    return run_sbc(problem, step, reps, n_draws=9, n_bins=5, seed=11, driver="loop")


def test_gibbs_race_is_calibrated_and_a_wrong_conditional_is_not(selector):
    """SubsampledCategoricalGibbs racing on N = 2000: uniform ranks; one nat per value off: not."""
    good = fast_sbc(selector, selector.make_step(selector.model, **RACING), 300)
    assert good.audits > 0  # the race ran (audited decisions only come from races)
    assert smallest_p(good) > P_MIN, good.pvalues
    bad = fast_sbc(selector, selector.make_step(selector.model, broken=1.0, **RACING), 300)
    assert bad.pvalues["k"] < P_MIN, bad.pvalues


def test_racing_metropolis_is_calibrated_and_a_wrong_ratio_is_not(logistic):
    """RacingMetropolis (racing HMC) on a logistic regression; a tilted log ratio is rejected.

    At this N the step's defaults draw with NUTS (regime "small_n"): the race is asked for.
    """
    good = fast_sbc(logistic, logistic.make_step(logistic.model, **logistic.settings["racing"]), 60)
    assert good.audits > 0
    assert smallest_p(good) > P_MIN, good.pvalues
    bad = fast_sbc(logistic, logistic.make_step(logistic.model, broken=10.0), 60)
    assert bad.pvalues["w[0]"] < P_MIN, bad.pvalues


# -- the study's size ---------------------------------------------------------------------


def full_sbc(problem, step, reps):
    return run_sbc(problem, step, reps, n_draws=19, n_bins=10, seed=5)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["defaults", "racing", "exact"])
def test_gibbs_sbc_full(selector, setting):
    res = full_sbc(selector, selector.make_step(selector.model, **selector.settings[setting]), 1000)
    assert smallest_p(res) > P_MIN, res.pvalues


@pytest.mark.slow
def test_gibbs_sbc_full_rejects_wrong_conditional(selector):
    step = selector.make_step(selector.model, **selector.settings["broken"])
    assert full_sbc(selector, step, 1000).pvalues["k"] < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["racing", "exact"])
def test_metropolis_sbc_full(setting):
    problem = logistic_problem()
    res = full_sbc(problem, problem.make_step(problem.model, **problem.settings[setting]), 400)
    assert smallest_p(res) > P_MIN, res.pvalues


@pytest.mark.slow
def test_metropolis_sbc_full_rejects_wrong_ratio():
    problem = logistic_problem()
    step = problem.make_step(problem.model, **problem.settings["broken"])
    assert full_sbc(problem, step, 400).pvalues["w[0]"] < 1e-6


@pytest.mark.slow
def test_pliable_rejection_sbc_full():
    """PliableRejection (defaults) on the bimodal block: 100 replications, uniform ranks."""
    problem = bimodal_problem()
    res = full_sbc(problem, problem.make_step(problem.model), 100)
    assert smallest_p(res) > P_MIN, res.pvalues

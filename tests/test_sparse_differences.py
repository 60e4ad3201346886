"""Sparse differences: values whose terms differ on a few rows go to an exact pass."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.racing import RaceConfig, race_exact, race_shared
from pymc_subsample.racing.state import SPARSE_SHARE, sparse_arms


def test_sparse_arms_flags_arms_equal_to_the_leader_on_most_rows():
    batch = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 9.0], [0.0, 0.0, 3.0, 4.0]])
    assert sparse_arms(batch, 0).tolist() == [False, True, False]
    assert sparse_arms(batch, 1).tolist() == [True, False, False]
    assert SPARSE_SHARE == 0.5  # the threshold the docs state


def _rare_rewards(n_obs, rare, rng):
    """Arms equal but on ``rare`` rows, where arm 0 gains 2."""
    table = np.zeros((2, n_obs))
    table[0, rng.choice(n_obs, size=rare, replace=False)] += 2.0
    return table


def test_race_keeps_arms_with_sparse_differences_to_the_exact_pass():
    n_obs, rng = 20_000, np.random.default_rng(0)
    table = _rare_rewards(n_obs, 150, rng)
    offsets = np.array([0.0, 0.01])  # arm 1 ahead by 0.01 a row; arm 0 by 300 / 20,000 in all
    truth = race_exact(lambda arms, idx: table[arms][:, idx], 2, n_obs, offsets).winner
    assert truth == 0
    config = RaceConfig(delta=0.05, batch_size=100)
    winners = [
        race_shared(
            lambda arms, idx: table[arms][:, idx], 2, n_obs, config,
            rng=np.random.default_rng(seed), offsets=offsets,
            totals=lambda arms: table[arms].sum(axis=1),
        ).winner
        for seed in range(100)
    ]  # fmt: skip
    # without the guard a batch that misses the rare rows sees arm 1 ahead with no spread
    # and drops arm 0: wrong in most races; with it every race ends in the exact pass
    assert winners.count(truth) == 100


def _change_point_model(n_obs, n_values, width, rng):
    t = np.arange(n_obs)
    change = n_obs // 2
    y = np.where(t < change, rng.poisson(3.0, n_obs), rng.poisson(6.0, n_obs))
    with pm.Model() as model:
        s = pm.Categorical("s", np.ones(n_values) / n_values)
        rate = pt.switch(pm.Data("t", t) < s * width, 3.0, 6.0)
        pm.Poisson("obs", rate, observed=pm.Data("y", y))
    log_post = np.array(
        [stats.poisson.logpmf(y, np.where(t < k * width, 3.0, 6.0)).sum() for k in range(n_values)]
    )
    p = np.exp(log_post - log_post.max())
    return model, s, p / p.sum()


def _tv_bound(p, n_draws, rng, level=0.99):
    """The ``level`` quantile of the TV of ``n_draws`` i.i.d. exact draws (Monte Carlo error)."""
    tvs = [
        0.5
        * np.abs(
            np.bincount(rng.choice(len(p), n_draws, p=p), minlength=len(p)) / n_draws - p
        ).sum()
        for _ in range(300)
    ]
    return float(np.quantile(tvs, level))


@pytest.mark.parametrize(("n_obs", "n_values", "width"), [(1000, 1000, 1), (10_000, 20, 500)])
def test_change_point_draws_match_the_exact_conditional(n_obs, n_values, width):
    model, s, p = _change_point_model(n_obs, n_values, width, np.random.default_rng(2))
    with model:
        step = SubsampledCategoricalGibbs([s])
        assert not step.compiled  # the compiled race has no sparse guard
        assert step.compiled_race is None
        idata = pm.sample(
            step=[step], draws=600, tune=10, chains=1, cores=1, random_seed=3,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    draws = idata.posterior["s"].values.ravel()
    emp = np.bincount(draws, minlength=n_values) / len(draws)
    tv = 0.5 * np.abs(emp - p).sum()
    # Gibbs draws of s alone are i.i.d. from its conditional: compare with i.i.d. exact draws
    assert tv <= _tv_bound(p, len(draws), np.random.default_rng(0)) + 0.05  # + delta


def test_rewards_equal_up_to_rounding_count_as_equal():
    """Taylor residuals of a term linear in the parameter differ by rounding, not by zero."""
    rng = np.random.default_rng(0)
    batch = np.zeros((2, 100))
    batch[:, :5] = rng.normal(size=(2, 5)) * 0.01  # rows where the arms really differ
    batch[:, 5:] = rng.normal(size=(2, 95)) * 1e-17  # rounding of an exact expansion
    assert sparse_arms(batch, 0).tolist() == [False, True]
    batch[1, 5:] += 1e-6  # a dense, if small, difference
    assert sparse_arms(batch, 0).tolist() == [False, False]

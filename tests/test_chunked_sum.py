"""Sums over every row computed chunk by chunk (:class:`ChunkedSum`) against one whole sum."""

import numpy as np
import pymc as pm
import pytest

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.model import chunked_sum
from pymc_subsample.options import RaceOptions


@pytest.fixture
def regression():
    """A categorical intercept beside a continuous slope, two data inputs (one a matrix)."""
    rng = np.random.default_rng(3)
    n = 10_007  # not a multiple of the chunk
    x = rng.normal(size=(n, 3))
    y = x @ np.array([0.5, -1.0, 2.0]) + rng.normal(size=n)
    with pm.Model() as model:
        x_data = pm.Data("x_data", x)
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.full(4, 0.25))
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal("y", pm.math.constant([-1.0, 0.0, 1.0, 2.0])[q] + x_data @ beta, 1.0,
                  observed=y_data)  # fmt: skip
    return model, q


@pytest.mark.parametrize("batches", ["blocks", "random"])
def test_chunked_sums_equal_the_sums_of_all_terms(regression, batches, monkeypatch):
    monkeypatch.setattr(chunked_sum, "CHUNK_BYTES", 2048)  # chunks of 1,024 rows
    model, q = regression
    with model:
        step = SubsampledCategoricalGibbs([q], race=RaceOptions(batches=batches))
    terms = step.terms
    terms.promote()  # the Numba tier, whose kernel the chunk loop calls
    point = model.initial_point() | {"beta": np.array([0.3, -0.2, 1.0])}
    cands = [np.arange(4)]
    sums = terms.loglik_sum(cands, point)
    assert terms._sum_rows._driver is not None  # summed in chunks
    np.testing.assert_allclose(sums, terms.loglik_full(cands, point).sum(axis=1), rtol=1e-12)
    # a subset of the candidates, in another order
    np.testing.assert_allclose(terms.loglik_sum([np.array([3, 1])], point), sums[[3, 1]])


def test_a_small_population_is_summed_in_one_call(regression):
    model, q = regression
    with model:
        step = SubsampledCategoricalGibbs([q])
    point = model.initial_point()
    sums = step.terms.loglik_sum([np.arange(4)], point)
    assert step.terms._sum_rows._driver is None
    np.testing.assert_allclose(
        sums, step.terms.loglik_full([np.arange(4)], point).sum(axis=1), rtol=1e-12
    )


def test_the_first_tier_sums_in_one_call_and_the_loop_comes_with_numba(regression, monkeypatch):
    """Before its function moves to Numba the sum is one call; after, the chunk loop."""
    monkeypatch.setattr(chunked_sum, "CHUNK_BYTES", 2048)
    model, q = regression
    with model:
        step = SubsampledCategoricalGibbs([q])
    terms, point = step.terms, model.initial_point()
    if terms._sum_rows.fn.promoted:  # shared with a step of another test that promoted it
        return
    first = terms.loglik_sum([np.arange(4)], point)
    assert terms._sum_rows._driver is None
    terms.promote()
    np.testing.assert_allclose(terms.loglik_sum([np.arange(4)], point), first, rtol=1e-12)
    assert terms._sum_rows._driver is not None


def test_chunk_rows_follow_the_bytes_of_a_row():
    summer = chunked_sum.ChunkedSum(None, 1, 2, 0)
    rows = [np.zeros((10, 3)), np.zeros(10, dtype=np.float32)]  # 28 bytes a row
    assert summer.chunk_rows(rows) == max(1024, chunked_sum.CHUNK_BYTES // 28)


def test_a_minus_inf_term_in_one_chunk_makes_that_sum_minus_inf(monkeypatch):
    monkeypatch.setattr(chunked_sum, "CHUNK_BYTES", 2048)  # chunks of 1,024 rows
    y = np.random.default_rng(4).uniform(1.0, 2.0, size=6_000)
    y[4_321] = 0.5  # outside the support of the first candidate only
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.full(3, 1 / 3))
        lower = pm.math.constant([0.9, 0.0, -1.0])[q]
        pm.Uniform("y", lower, lower + 5.0, observed=y_data)
        step = SubsampledCategoricalGibbs([q])
    step.terms.promote()  # the Numba tier, whose kernel the chunk loop calls
    point = model.initial_point()
    sums = step.terms.loglik_sum([np.arange(3)], point)
    assert step.terms._sum_rows._driver is not None
    assert sums[0] == -np.inf and np.isfinite(sums[1:]).all()
    np.testing.assert_allclose(sums[1:], -6_000 * np.log(5.0))

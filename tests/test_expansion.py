"""The one expansion component (model/expansion.py), in the block and in the other inputs."""

import numpy as np
import pymc as pm
import pytest

from pymc_subsample.mcmc.laplace import _residual_pieces
from pymc_subsample.model.expansion import Expansion
from pymc_subsample.model.terms import ObservationTerms


@pytest.fixture(scope="module")
def model():
    """y_n ~ Normal(mu[k] + shift[j], sigma): k and j discrete, mu and sigma continuous."""
    rng = np.random.default_rng(0)
    with pm.Model() as m:
        y = pm.Data("y", rng.normal(0.5, 1.3, size=500))
        k = pm.Categorical("k", p=[0.5, 0.5])
        j = pm.Categorical("j", p=[0.5, 0.5])
        mu = pm.Normal("mu", 0.0, 1.0, shape=2)
        sigma = pm.HalfNormal("sigma", 2.0)
        shift = pm.math.stack([0.0, 0.3])
        pm.Normal("obs", mu[k] + shift[j], sigma, observed=y)
    return m


def moved(point, **values):
    return {**point, **{n: np.asarray(v, dtype=point[n].dtype) for n, v in values.items()}}


def test_the_expansion_in_the_other_inputs_adds_up_and_caches_by_what_its_sums_read(model):
    terms = ObservationTerms(model, [model["k"]], batches="blocks")
    terms.shuffle(np.random.default_rng(1))
    expansion = Expansion(terms, "inputs")
    assert expansion.names == ["mu", "sigma_log__"] and "j" in terms.input_names
    reference = moved(model.initial_point(), mu=[0.4, 0.6], sigma_log__=0.2)
    point = moved(reference, mu=[0.45, 0.5], sigma_log__=0.25, j=1)
    cands = [np.array([0, 1])]
    res = expansion.residual_batch(cands, slice(0, terms.n_obs), point, reference)
    values, grads, hess = expansion.sums(reference, point, cands)
    delta = expansion.delta(point, reference)
    shift = values + grads @ delta + 0.5 * np.einsum("kij,i,j->k", hess, delta, delta)
    exact = terms.loglik_sum(cands, point)
    np.testing.assert_allclose(res.sum(axis=1) + shift, exact, rtol=1e-10)
    # gathered positions and a window read the same rows of the permutation
    np.testing.assert_allclose(
        expansion.residual_batch(cands, np.arange(10, 60), point, reference),
        res[:, 10:60],
        atol=1e-10,
    )
    # the sums read the reference, the candidates and j; not mu and sigma (expanded in)
    expansion.cached_sums(reference, point, cands)
    expansion.cached_sums(reference, moved(point, mu=[1.0, -1.0], sigma_log__=0.0), cands)
    assert expansion.cache.n_refits == 1
    expansion.cached_sums(reference, moved(point, j=0), cands)
    expansion.cached_sums(reference, point, [np.array([1, 0])])
    expansion.cached_sums(moved(reference, mu=[0.0, 0.0]), point, cands)
    assert expansion.cache.n_refits == 4
    np.testing.assert_allclose(expansion.cached_sums(reference, point, cands)[0], values)


def test_the_expansion_in_the_block_adds_up_and_caches_by_the_other_inputs(model):
    terms = ObservationTerms(model, [model["mu"]], batches="windows")
    point = moved(model.initial_point(), k=1, sigma_log__=0.3)
    expansion = Expansion(terms, "block", point=point)
    assert expansion.shapes == [(2,)] and expansion.names == ["mu"]
    ref = np.array([0.2, 0.5])
    thetas = ref + np.array([[0.05, -0.1], [-0.2, 0.3]])
    value, grad, hess = expansion.sums(ref, point)
    # the value and gradient alone (no Hessian pass) are the same numbers
    value1, grad1, none = expansion.sums(ref, point, hessian=False)
    assert none is None and value1 == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(grad1, grad, rtol=1e-12)
    res = expansion.residual_batch(thetas, slice(0, terms.n_obs), point, ref)
    delta = thetas - ref
    taylor = value + delta @ grad + 0.5 * np.einsum("ki,ij,kj->k", delta, hess, delta)
    # Gaussian terms are quadratic in mu: the expansion is exact, every residual vanishes
    np.testing.assert_allclose(res, 0.0, atol=1e-8)
    np.testing.assert_allclose(taylor, terms.loglik_sum([thetas], point), rtol=1e-10)
    expansion.cached_sums(ref, point)
    expansion.cached_sums(ref, point)
    assert expansion.cache.n_refits == 1
    expansion.cached_sums(ref, moved(point, sigma_log__=0.0))  # another outside input
    expansion.cached_sums(ref, moved(point, j=1))
    assert expansion.cache.n_refits == 3


def test_the_expansion_refuses_what_it_cannot_expand_in(model):
    terms = ObservationTerms(model, [model["k"]], batches="random")
    with pytest.raises(ValueError, match="over"):
        Expansion(terms, "data")
    with pytest.raises(ValueError, match="give Deterministics"):
        Expansion(terms, "inputs", ["mu"])


def test_a_batch_in_pieces_has_the_residuals_of_one_call(model):
    """A race's large batch of a wide block is computed in pieces: the same residuals."""
    terms = ObservationTerms(model, [model["sigma"]], batches="windows")
    point = moved(model.initial_point(), mu=[0.3, 0.6])
    expansion = Expansion(terms, "block", point=point)
    ref, thetas = np.array([0.2]), np.array([[0.5], [-0.3]])
    for idx in (slice(3, terms.n_obs), np.arange(7, 400, 3)):
        whole = expansion.residual_batch(thetas, idx, point, ref)
        assert np.abs(whole).max() > 1e-3  # not quadratic in log sigma: residuals
        np.testing.assert_allclose(
            _residual_pieces(expansion, thetas, idx, point, ref, chunk=64), whole, rtol=1e-12
        )

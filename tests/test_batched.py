"""One invalid candidate does not make the others' terms -inf (per-point parameter checks)."""

import numpy as np
import pymc as pm

from pymc_subsample.model.terms import ObservationTerms


def test_an_underflowing_candidate_leaves_the_others_finite():
    y = np.random.default_rng(0).normal(size=20)
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("obs", 0.0, sigma, observed=pm.Data("y", y))
    terms = ObservationTerms(model, [sigma])
    log_sigma = np.array([0.0, -800.0, 1.0])  # exp(-800) underflows to a zero scale
    point = model.initial_point()
    together = terms.loglik_sum([log_sigma], point)
    alone = np.concatenate([terms.loglik_sum([log_sigma[k : k + 1]], point) for k in range(3)])
    np.testing.assert_array_equal(together, alone)
    assert np.isfinite(together[[0, 2]]).all() and together[1] == -np.inf
    full = terms.loglik_full([log_sigma], point)
    assert np.isfinite(full[[0, 2]]).all() and np.isneginf(full[1]).all()

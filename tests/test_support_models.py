"""The benchmark models of tests/support/models.py: data as documented, variables in order."""

import numpy as np

from support import models


def test_correlated_columns_are_standard_normal_with_ar_correlation():
    x, y = models.correlated_logistic_data(20_000, 6, rho=0.5)
    assert x.shape == (20_000, 6) and set(np.unique(y)) == {0, 1}
    np.testing.assert_allclose(x.std(axis=0), 1.0, atol=0.03)
    corr = np.corrcoef(x.T)
    lags = np.abs(np.subtract.outer(np.arange(6), np.arange(6)))
    np.testing.assert_allclose(corr, 0.5**lags, atol=0.03)


def test_hierarchical_and_robust_models_have_their_variables_in_the_documented_order():
    x, g, y = models.hierarchical_data(500, groups=7)
    assert g.min() >= 0 and g.max() < 7 and x.shape == (500, 4) and y.shape == (500,)
    model = models.hierarchical_model(x, g, y, groups=7)
    assert [v.name for v in model.free_RVs] == ["mu_a", "tau", "alpha", "b", "sigma"]
    assert model["alpha"].shape.eval().tolist() == [7]
    x, y = models.studentt_data(200)
    model = models.studentt_nu_model(x, y)
    assert [v.name for v in model.free_RVs] == ["a", "b", "sigma", "nu"]
    assert np.isfinite(model.compile_logp()(model.initial_point()))

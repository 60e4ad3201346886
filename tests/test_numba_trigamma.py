"""The Numba lowering of trigamma that keeps Student-t Taylor expansions compiled and cached."""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from scipy import special

import pymc_subsample  # noqa: F401 (registers the lowering)
from pymc_subsample._numba_trigamma import trigamma


def test_trigamma_matches_scipy_on_both_sides_of_zero():
    xs = np.concatenate([np.geomspace(1e-4, 1e4, 300), [-0.5, -1.5, -2.3, -7.9, -0.01]])
    mine = np.array([trigamma(x) for x in xs])
    np.testing.assert_allclose(mine, special.polygamma(1, xs), rtol=1e-12)
    assert trigamma(0.0) == np.inf and trigamma(-3.0) == np.inf and np.isnan(trigamma(np.nan))


def test_pytensor_trigamma_runs_compiled_not_in_object_mode():
    x = pt.dvector("x")
    with warnings.catch_warnings():
        # without the lowering PyTensor warns that it runs the op in object mode
        warnings.filterwarnings("error", message=".*object mode.*")
        fn = pytensor.function([x], pt.tri_gamma(x), mode="NUMBA")
        out = fn(np.array([0.3, 2.0, 25.0]))
    np.testing.assert_allclose(out, special.polygamma(1, [0.3, 2.0, 25.0]), rtol=1e-12)

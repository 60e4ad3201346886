"""The pure pieces behind RacingMetropolis: Newton's mode, the HMC proposal, its tuning."""

import numpy as np
import pytest

from pymc_subsample.mcmc.adaptation import FALLBACK_AFTER, HMCAdaptation
from pymc_subsample.mcmc.hmc import hmc_proposal
from pymc_subsample.mcmc.mode import LogPosterior, find_mode, newton_step, positive_definite
from pymc_subsample.mcmc.regime import Regime
from pymc_subsample.mcmc.surrogate import TaylorSurrogate

PRECISION = np.array([[4.0, 1.0], [1.0, 2.0]])
MODE = np.array([0.5, -1.0])


def gaussian_posterior(n_obs: int) -> LogPosterior:
    """A Gaussian log posterior: the likelihood sum is -(x - MODE)' P (x - MODE) / 2."""

    def loglik(rows):
        d = np.atleast_2d(rows) - MODE
        return -0.5 * np.einsum("ki,ij,kj->k", d, PRECISION, d)

    def expand(x, eps, window=None, full=None):
        grad = -PRECISION @ (x - MODE)
        return TaylorSurrogate(x.copy(), float(loglik(x)[0]), grad, -PRECISION), 3 * n_obs

    return LogPosterior(
        dim=2,
        n_obs=n_obs,
        expand=expand,
        sums=lambda rows, window: loglik(rows),
        log_f0=lambda x: 0.0,
        f0_grad=lambda x: np.zeros(2),
    )


@pytest.mark.parametrize("n_obs", [1_000, 200_000])  # all the data, then a window first
def test_newton_finds_the_mode_and_the_laplace_precision_of_a_gaussian(n_obs):
    fit = find_mode(gaussian_posterior(n_obs), np.array([30.0, 40.0]))
    np.testing.assert_allclose(fit.x, MODE, atol=1e-8)
    np.testing.assert_allclose(fit.neg_hessian, PRECISION, rtol=1e-6)
    assert fit.spent > 0


def test_newton_takes_the_full_data_gradient_from_its_own_pass_when_given():
    """With ``sum_grad`` the all-data step reads the gradient from it, not from ``expand``."""
    post = gaussian_posterior(200_000)
    calls = []

    def expand(x, eps, window=None, full=None):
        calls.append((window, full))
        return post.expand(x, eps, window, full)

    def sum_grad(x):
        calls.append("gradient")
        return -PRECISION @ (x - MODE), 2 * post.n_obs

    fit = find_mode(
        LogPosterior(2, post.n_obs, expand, post.sums, post.log_f0, post.f0_grad, sum_grad),
        np.array([30.0, 40.0]),
    )
    np.testing.assert_allclose(fit.x, MODE, atol=1e-8)
    assert "gradient" in calls and (None, False) not in calls


def test_a_newton_step_with_a_small_decrement_never_lowers_the_log_posterior():
    """Along a direction the posterior is flat in, the full step overshoots: it is halved.

    The log posterior :math:`-2 x_0^2 - \\sqrt{1 + x_1^2}` at :math:`x_1 = 2` has
    a decrement of 8.9, below :math:`10 d`, and a full step to :math:`x_1 = -8`,
    5.8 nats lower.
    """

    def loglik(rows):
        rows = np.atleast_2d(rows)
        return -2.0 * rows[:, 0] ** 2 - np.sqrt(1.0 + rows[:, 1] ** 2)

    def expand(x, eps, window=None, full=None):
        s = np.sqrt(1.0 + x[1] ** 2)
        grad = np.array([-4.0 * x[0], -x[1] / s])
        hess = np.diag([-4.0, -1.0 / s**3])
        return TaylorSurrogate(x.copy(), float(loglik(x)[0]), grad, hess), 3

    post = LogPosterior(2, 1, expand, lambda rows, window: loglik(rows), lambda x: 0.0,
                        lambda x: np.zeros(2))  # fmt: skip
    x = np.array([0.0, 2.0])
    step = newton_step(post, x, np.full(2, 1e-4), None)
    assert step.decrement < 10 * post.dim
    assert loglik(step.x)[0] >= loglik(x)[0]
    fit = find_mode(post, x)  # within about one posterior sd (here 1.2) of the mode at 0
    assert loglik(fit.x)[0] >= loglik(step.x)[0] and np.abs(fit.x).max() < 1.0


def test_positive_definite_lifts_negative_eigenvalues():
    lifted = positive_definite(np.array([[1.0, 0.0], [0.0, -2.0]]))
    np.testing.assert_allclose(lifted, np.diag([1.0, 2.0]))
    with pytest.raises(np.linalg.LinAlgError):
        positive_definite(np.full((2, 2), np.nan))


def test_hmc_on_an_exact_surrogate_conserves_energy_and_reverses():
    """Small steps on a Gaussian: energy error ~0, and the flipped trajectory comes back."""
    inv_mass = np.linalg.inv(PRECISION)

    def kwargs(rng):
        return dict(
            gradient=lambda x: -PRECISION @ (x - MODE),
            log_density=lambda rows: (
                -0.5 * np.einsum("ki,ij,kj->k", rows - MODE, PRECISION, rows - MODE)
            ),
            inv_mass=inv_mass,
            chol_mass=np.linalg.cholesky(PRECISION),
            step_size=0.01,
            path_length=1.0,
            rng=rng,
        )

    x = np.array([1.0, 0.0])
    x_new, extra, info = hmc_proposal(x, **kwargs(np.random.default_rng(0)))
    assert not info.diverged and info.n_steps >= 90
    assert info.integrator_accept > 0.999
    assert not np.allclose(x_new, x) and np.isfinite(extra)
    # a diverging trajectory returns the start with a log ratio of -inf
    far = dict(kwargs(np.random.default_rng(0)), step_size=1e200)
    with np.errstate(over="ignore", invalid="ignore"):
        x_same, extra, info = hmc_proposal(x, **far)
    assert info.diverged and extra == -np.inf and info.integrator_accept == 0.0
    np.testing.assert_array_equal(x_same, x)


def test_hmc_adaptation_shortens_paths_and_flags_a_rejected_proposal():
    adaptation = HMCAdaptation(0.5, 1.5)
    for _ in range(FALLBACK_AFTER - 1):
        adaptation.update(False, 0.9)
    assert not adaptation.rejected  # too few trajectories to tell
    assert adaptation.path < 1.5  # rejections shorten the path (towards 0.4 acceptance)
    adaptation.update(False, 0.9)
    assert adaptation.rejected and adaptation.accept_rate == 0.0
    # its sampling state round-trips (PyMC's protocol)
    state = adaptation.sampling_state
    other = HMCAdaptation(0.5, 1.5)
    other.sampling_state = state
    assert other.current(True) == adaptation.current(True)
    assert other.path == adaptation.path and other.accept_n == FALLBACK_AFTER


def test_a_regime_names_a_known_reason():
    assert Regime("hmc", True).code == 0 and not Regime("hmc", True).fell_back
    assert Regime("normal", True, "hmc_rejected").fell_back
    with pytest.raises(ValueError, match="reason"):
        Regime("normal", True, "tired")

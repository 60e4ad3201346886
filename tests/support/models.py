r"""The regression models of the RacingMetropolis benchmarks, tests and examples.

One definition of each model, data simulator and PyMC builder apart, so that
``benchmarks/racing_metropolis.py``, ``benchmarks/peers.py``,
``examples/logistic_large_n.py`` and ``tests/test_metropolis.py`` sample the
same posterior from the same data:

- logistic regression, :math:`a \sim N(0, 3^2)`, :math:`b_k \sim N(0, 3^2)`,
  :math:`y_n \sim \mathrm{Bernoulli}(\operatorname{logit}^{-1}(a + x_n^\top b))`;
- robust regression, the same priors, :math:`\sigma \sim \mathrm{HalfNormal}(1)`,
  :math:`y_n \sim t_4(a + x_n^\top b, \sigma)`.

The design :math:`x` is standard normal; by default it has four covariates
and the true coefficients are :data:`TRUE_A` and :data:`TRUE_BETA`. Both
builders put ``x`` and ``y`` in ``pm.Data`` (named ``"x"`` and ``"y_data"``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "COEFS",
    "TRUE_A",
    "TRUE_BETA",
    "logistic_data",
    "logistic_model",
    "studentt_data",
    "studentt_model",
]

#: True intercept of the simulated data.
TRUE_A = 0.2
#: True slopes of the simulated data (four covariates).
TRUE_BETA = np.array([0.8, -0.5, 0.3, 0.0])
#: Names of the coefficients in ``arviz`` summaries, for the default four covariates.
COEFS = ("a", "b[0]", "b[1]", "b[2]", "b[3]")


def logistic_data(
    n_obs: int, seed: int = 0, *, a: float = TRUE_A, beta: np.ndarray = TRUE_BETA
) -> tuple[np.ndarray, np.ndarray]:
    r"""Simulate logistic-regression data.

    Draws, from ``np.random.default_rng(seed)`` and in this order, the design
    ``x`` (standard normal, one column per entry of ``beta``) and then
    :math:`y_n \sim \mathrm{Bernoulli}(\operatorname{logit}^{-1}(a + x_n^\top\beta))`.

    Parameters
    ----------
    n_obs : int
        Number of observations :math:`N`.
    seed : int
        Seed of ``np.random.default_rng``.
    a : float
        True intercept.
    beta : numpy.ndarray
        True slopes, one per covariate.

    Returns
    -------
    x : numpy.ndarray, shape (N, len(beta))
        Standard normal design.
    y : numpy.ndarray, shape (N,)
        Outcomes in {0, 1}.
    """
    beta = np.asarray(beta, dtype=float)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_obs, len(beta)))
    y = rng.binomial(1, 1 / (1 + np.exp(-(a + x @ beta))))
    return x, y


def studentt_data(
    n_obs: int, seed: int = 0, *, a: float = TRUE_A, beta: np.ndarray = TRUE_BETA
) -> tuple[np.ndarray, np.ndarray]:
    r"""Simulate robust-regression data: :math:`y_n = a + x_n^\top\beta + 0.5\,t_4` noise.

    Parameters
    ----------
    n_obs : int
        Number of observations :math:`N`.
    seed : int
        Seed of ``np.random.default_rng``.
    a : float
        True intercept.
    beta : numpy.ndarray
        True slopes, one per covariate.

    Returns
    -------
    x : numpy.ndarray, shape (N, len(beta))
        Standard normal design.
    y : numpy.ndarray, shape (N,)
        Outcomes with Student-t noise (4 degrees of freedom, scale 0.5).
    """
    beta = np.asarray(beta, dtype=float)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_obs, len(beta)))
    y = a + x @ beta + 0.5 * rng.standard_t(4, size=n_obs)
    return x, y


def logistic_model(x: np.ndarray, y: np.ndarray):
    """Build the PyMC logistic-regression model on ``(x, y)``.

    Parameters
    ----------
    x : numpy.ndarray, shape (N, K)
        Design.
    y : numpy.ndarray, shape (N,)
        Outcomes in {0, 1}.

    Returns
    -------
    pymc.Model
        With data ``x`` and ``y_data`` and free variables ``a`` and ``b``
        (``K`` entries), in that order.
    """
    import pymc as pm

    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=x.shape[1])
        pm.Bernoulli("y", logit_p=a + x_data @ b, observed=y_data)
    return model


def studentt_model(x: np.ndarray, y: np.ndarray):
    """Build the PyMC robust-regression model on ``(x, y)``.

    Parameters
    ----------
    x : numpy.ndarray, shape (N, K)
        Design.
    y : numpy.ndarray, shape (N,)
        Outcomes.

    Returns
    -------
    pymc.Model
        With data ``x`` and ``y_data`` and free variables ``a``, ``b``
        (``K`` entries) and ``sigma``, in that order.
    """
    import pymc as pm

    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=x.shape[1])
        sigma = pm.HalfNormal("sigma", 1)
        pm.StudentT("y", nu=4, mu=a + x_data @ b, sigma=sigma, observed=y_data)
    return model

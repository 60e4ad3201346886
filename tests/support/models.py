r"""The regression models of the RacingMetropolis benchmarks, tests and examples.

One definition of each model, data simulator and PyMC builder apart, so that
``benchmarks/racing_metropolis.py``, ``benchmarks/peers.py``,
``examples/logistic_large_n.py`` and ``tests/test_metropolis.py`` sample the
same posterior from the same data:

- logistic regression, :math:`a \sim N(0, 3^2)`, :math:`b_k \sim N(0, 3^2)`,
  :math:`y_n \sim \mathrm{Bernoulli}(\operatorname{logit}^{-1}(a + x_n^\top b))`;
- robust regression, the same priors, :math:`\sigma \sim \mathrm{HalfNormal}(1)`,
  :math:`y_n \sim t_4(a + x_n^\top b, \sigma)`;
- the same with the degrees of freedom unknown, :math:`\nu \sim \mathrm{Gamma}(2, 0.1)`
  (:func:`studentt_nu_model`);
- a logistic regression with many AR(0.5)-correlated columns
  (:func:`correlated_logistic_data`, the same :func:`logistic_model`);
- a hierarchical regression with group intercepts,
  :math:`\alpha_g \sim N(\mu_\alpha, \tau^2)`, :math:`y_n \sim N(\alpha_{g_n} +
  x_n^\top b, \sigma^2)` (:func:`hierarchical_data`, :func:`hierarchical_model`);
- two models whose parameter has no useful gradient, with their exact
  posterior (:func:`step_posterior`): a threshold,
  :math:`y_n \sim N(\mathrm{switch}(x_n < \tau, -1/2, 1/2), 1)`
  (:func:`threshold_model`), and a continuous change point,
  :math:`y_t \sim \mathrm{Poisson}(\mathrm{switch}(t < \tau, \lambda_1, \lambda_2))`
  (:func:`change_point_model`), each with :math:`\tau` uniform.

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
    "change_point_model",
    "correlated_logistic_data",
    "hierarchical_data",
    "hierarchical_model",
    "logistic_data",
    "logistic_model",
    "step_posterior",
    "studentt_data",
    "studentt_model",
    "studentt_nu_model",
    "threshold_model",
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


def correlated_logistic_data(
    n_obs: int, dim: int, rho: float = 0.5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    r"""Simulate a logistic regression with ``dim`` AR(``rho``)-correlated columns.

    Column :math:`j` of the design is :math:`x_{\cdot j} = \rho\, x_{\cdot, j-1} +
    \sqrt{1 - \rho^2}\, z_{\cdot j}` with :math:`z` standard normal, so every column is
    standard normal and :math:`\mathrm{corr}(x_{\cdot i}, x_{\cdot j}) = \rho^{|i-j|}`.
    The true slopes are :math:`N(0, 1/d)` (drawn first, from the same generator), so
    that the linear predictor has unit-order variance whatever :math:`d`; the true
    intercept is :data:`TRUE_A`.

    Parameters
    ----------
    n_obs : int
        Number of observations :math:`N`.
    dim : int
        Number of covariates :math:`d` (the model has :math:`d + 1` coefficients).
    rho : float
        Correlation of neighbouring columns.
    seed : int
        Seed of ``np.random.default_rng``.

    Returns
    -------
    x : numpy.ndarray, shape (N, dim)
        Design.
    y : numpy.ndarray, shape (N,)
        Outcomes in {0, 1}.
    """
    rng = np.random.default_rng(seed)
    beta = rng.normal(scale=1 / np.sqrt(dim), size=dim)
    x = rng.normal(size=(n_obs, dim))
    scale = np.sqrt(1 - rho**2)
    for j in range(1, dim):  # in place, column by column: no second (N, d) array
        x[:, j] *= scale
        x[:, j] += rho * x[:, j - 1]
    y = rng.binomial(1, 1 / (1 + np.exp(-(TRUE_A + x @ beta))))
    return x, y


def studentt_nu_model(x: np.ndarray, y: np.ndarray):
    r"""Build the robust regression with unknown degrees of freedom on ``(x, y)``.

    As :func:`studentt_model`, with :math:`\nu \sim \mathrm{Gamma}(2, 0.1)`
    (Juárez & Steel 2010) in place of :math:`\nu = 4`.

    Parameters
    ----------
    x : numpy.ndarray, shape (N, K)
        Design.
    y : numpy.ndarray, shape (N,)
        Outcomes (e.g. :func:`studentt_data`).

    Returns
    -------
    pymc.Model
        With data ``x`` and ``y_data`` and free variables ``a``, ``b``, ``sigma``
        and ``nu``, in that order.
    """
    import pymc as pm

    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=x.shape[1])
        sigma = pm.HalfNormal("sigma", 1)
        nu = pm.Gamma("nu", alpha=2, beta=0.1)
        pm.StudentT("y", nu=nu, mu=a + x_data @ b, sigma=sigma, observed=y_data)
    return model


def hierarchical_data(
    n_obs: int, groups: int = 100, seed: int = 0, *, beta: np.ndarray = TRUE_BETA
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Simulate a regression with group intercepts.

    Groups :math:`g_n` uniform over ``groups``, intercepts :math:`\alpha_g \sim
    N(0.5, 0.7^2)`, standard normal design, :math:`y_n = \alpha_{g_n} + x_n^\top
    \beta + \varepsilon_n`, :math:`\varepsilon_n \sim N(0, 1)`; drawn in that order
    from ``np.random.default_rng(seed)``.

    Parameters
    ----------
    n_obs : int
        Number of observations :math:`N`.
    groups : int
        Number of groups.
    seed : int
        Seed of ``np.random.default_rng``.
    beta : numpy.ndarray
        True slopes.

    Returns
    -------
    x : numpy.ndarray, shape (N, len(beta))
        Design.
    g : numpy.ndarray of int64, shape (N,)
        Group of each observation.
    y : numpy.ndarray, shape (N,)
        Outcomes.
    """
    beta = np.asarray(beta, dtype=float)
    rng = np.random.default_rng(seed)
    g = rng.integers(groups, size=n_obs)
    alpha = rng.normal(0.5, 0.7, size=groups)
    x = rng.normal(size=(n_obs, len(beta)))
    y = alpha[g] + x @ beta + rng.normal(size=n_obs)
    return x, g, y


def hierarchical_model(x: np.ndarray, g: np.ndarray, y: np.ndarray, groups: int | None = None):
    r"""Build the PyMC hierarchical regression on ``(x, g, y)`` (centred intercepts).

    :math:`\mu_\alpha \sim N(0, 3^2)`, :math:`\tau \sim \mathrm{HalfNormal}(1)`,
    :math:`\alpha_g \sim N(\mu_\alpha, \tau^2)`, :math:`b_k \sim N(0, 3^2)`,
    :math:`\sigma \sim \mathrm{HalfNormal}(1)`, :math:`y_n \sim N(\alpha_{g_n} +
    x_n^\top b, \sigma^2)`. Centred: with many observations per group the data
    pin each intercept down, where the centred form is the better geometry
    (Papaspiliopoulos, Roberts & Sköld 2007).

    Parameters
    ----------
    x : numpy.ndarray, shape (N, K)
        Design.
    g : numpy.ndarray of int, shape (N,)
        Group of each observation.
    y : numpy.ndarray, shape (N,)
        Outcomes.
    groups : int, optional
        Number of groups (default: ``g.max() + 1``).

    Returns
    -------
    pymc.Model
        With data ``x``, ``g`` and ``y_data`` and free variables ``mu_a``, ``tau``,
        ``alpha`` (``groups`` entries), ``b`` (``K`` entries) and ``sigma``, in
        that order.
    """
    import pymc as pm

    groups = int(g.max()) + 1 if groups is None else int(groups)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        g_data = pm.Data("g", g)
        y_data = pm.Data("y_data", y)
        mu_a = pm.Normal("mu_a", 0, 3)
        tau = pm.HalfNormal("tau", 1)
        alpha = pm.Normal("alpha", mu_a, tau, shape=groups)
        b = pm.Normal("b", 0, 3, shape=x.shape[1])
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", alpha[g_data] + x_data @ b, sigma, observed=y_data)
    return model


def threshold_model(n_obs: int, seed: int = 0, tau: float = 0.3):
    r"""A threshold model whose parameter enters through a comparison only, and its data.

    :math:`x_n \sim U(-2, 2)`, :math:`y_n \sim N(\mathrm{switch}(x_n < \tau, -1/2, 1/2), 1)`
    (true :math:`\tau` = ``tau``), prior :math:`\tau \sim U(-2, 2)`: the terms are
    piecewise constant in :math:`\tau`.

    Returns
    -------
    model : pymc.Model
        With data ``x`` and ``yd`` and the free variable ``tau``.
    reference : dict
        The arguments of :func:`step_posterior` for the exact posterior of :math:`\tau`.
    """
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, n_obs)
    y = np.where(x < tau, -0.5, 0.5) + rng.normal(size=n_obs)
    with pm.Model() as model:
        t = pm.Uniform("tau", -2, 2)
        mean = pt.switch(pm.Data("x", x) < t, -0.5, 0.5)
        pm.Normal("y", mean, 1, observed=pm.Data("yd", y))
    below, above = -0.5 * (y + 0.5) ** 2, -0.5 * (y - 0.5) ** 2
    return model, {"x": x, "below": below, "above": above, "lower": -2.0, "upper": 2.0}


def change_point_model(n_obs: int, seed: int = 0, rates=(3.0, 3.6)):
    r"""A Poisson series with a continuous change point, and its data.

    :math:`y_t \sim \mathrm{Poisson}(\mathrm{switch}(t < \tau, \lambda_1, \lambda_2))`
    for :math:`t = 0, \dots, N - 1`, the true change at :math:`0.4 N`, prior
    :math:`\tau \sim U(0, N)`; the rates are known.

    Returns
    -------
    model : pymc.Model
        With data ``t`` and ``yd`` and the free variable ``tau``.
    reference : dict
        The arguments of :func:`step_posterior` for the exact posterior of :math:`\tau`.
    """
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(seed)
    t = np.arange(n_obs, dtype=float)
    early, late = rates
    y = rng.poisson(np.where(t < 0.4 * n_obs, early, late))
    with pm.Model() as model:
        tau = pm.Uniform("tau", 0, n_obs)
        rate = pt.switch(pm.Data("t", t) < tau, early, late)
        pm.Poisson("y", rate, observed=pm.Data("yd", y))
    below, above = y * np.log(early) - early, y * np.log(late) - late  # up to log y!
    return model, {"x": t, "below": below, "above": above, "lower": 0.0, "upper": float(n_obs)}


def step_posterior(
    x: np.ndarray, below: np.ndarray, above: np.ndarray, lower: float, upper: float
) -> tuple[float, float, float]:
    r"""Exact posterior moments of a threshold :math:`\tau \sim U(a, b)` whose terms step at data.

    Term :math:`n` is ``below[n]`` when :math:`x_n < \tau` and ``above[n]``
    otherwise, so the log likelihood is constant on each interval
    :math:`(x_{(k)}, x_{(k+1)})` between sorted data (and the bounds):
    :math:`L_k = \sum_{i \le k} b_{(i)} + \sum_{i > k} a_{(i)}`, by cumulative sums.
    The posterior is the mixture of the uniforms on those intervals with weights
    :math:`\propto e^{L_k} (x_{(k+1)} - x_{(k)})`, whose moments are exact:
    :math:`E[\tau^j] = \sum_k w_k (r_k^{j+1} - l_k^{j+1}) / ((j+1)(r_k - l_k))`.

    Returns
    -------
    mean, sd, kurtosis : float
        :math:`E\tau`, :math:`\mathrm{sd}\,\tau` and :math:`E(\tau - E\tau)^4 / \mathrm{sd}^4`.
    """
    order = np.argsort(x, kind="stable")
    xs, b_s, a_s = x[order], below[order], above[order]
    edges = np.concatenate([[lower], xs, [upper]])
    log_lik = np.concatenate([[0.0], np.cumsum(b_s)]) + np.concatenate(
        [np.cumsum(a_s[::-1])[::-1], [0.0]]
    )
    width = np.diff(edges)
    keep = width > 0
    left, right, log_lik = edges[:-1][keep], edges[1:][keep], log_lik[keep]
    w = np.exp(log_lik - log_lik.max()) * width[keep]
    w /= w.sum()

    def moment(j, lo, hi):  # E[u^j] under the mixture of uniforms on (lo, hi)
        return w @ ((hi ** (j + 1) - lo ** (j + 1)) / ((j + 1) * (hi - lo)))

    mean = moment(1, left, right)
    # central moments: the same integrals with the intervals shifted by the mean
    var = moment(2, left - mean, right - mean)
    fourth = moment(4, left - mean, right - mean)
    return float(mean), float(np.sqrt(var)), float(fourth / var**2)

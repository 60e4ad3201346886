r"""Proposals for RacingMetropolis, separate from the accept test.

Each proposal maps the current flat position :math:`x` to a proposed
:math:`x'` and returns :math:`\log q(x' \mid x)` and :math:`\log q(x \mid x')`
up to a common constant (Chen & Ghahramani 2016, Sec. 4).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["langevin_log_density", "langevin_proposal", "random_walk_proposal"]


def random_walk_proposal(
    x: np.ndarray, scaling: float, rng: np.random.Generator
) -> tuple[np.ndarray, float, float]:
    r"""Gaussian random walk :math:`x' = x + s z`, :math:`z \sim N(0, I)` (symmetric).

    Parameters
    ----------
    x : numpy.ndarray
        Current flat position.
    scaling : float
        Step scale :math:`s`.
    rng : numpy.random.Generator
        Source of :math:`z`.

    Returns
    -------
    tuple
        ``(x_new, log q(x_new | x), log q(x | x_new))``; both densities are 0
        (they cancel).
    """
    return x + scaling * rng.standard_normal(x.shape), 0.0, 0.0


def langevin_log_density(x_to: np.ndarray, x_from: np.ndarray, drift: np.ndarray, eps: float):
    r"""Log density of the Langevin proposal, up to a constant.

    .. math:: \log q(x_\text{to} \mid x_\text{from}) = -\frac{\lVert x_\text{to} - x_\text{from}
              - \tfrac{\epsilon^2}{2} g(x_\text{from}) \rVert^2}{2\epsilon^2}

    Parameters
    ----------
    x_to, x_from : numpy.ndarray
        Flat positions.
    drift : numpy.ndarray
        :math:`g(x_\text{from})`, the (stochastic) gradient at ``x_from``.
    eps : float
        Step size :math:`\epsilon`.

    Returns
    -------
    float
    """
    r = x_to - x_from - 0.5 * eps * eps * drift
    return float(-0.5 * np.dot(r, r) / (eps * eps))


def langevin_proposal(
    x: np.ndarray,
    eps: float,
    gradient: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
) -> tuple[np.ndarray, float, float]:
    r"""Stochastic-gradient Langevin proposal (SGLD; Welling & Teh 2011).

    .. math:: x' = x + \frac{\epsilon^2}{2} g(x) + \epsilon z, \qquad z \sim N(0, I),

    with :math:`g` a gradient estimate of the log target built on one
    mini-batch (the caller fixes the batch, so :math:`g` is a deterministic
    function for this step and the reverse density uses :math:`g(x')` on the
    same batch: MH with this proposal is exact for each batch, hence for the
    mixture over batches).

    Parameters
    ----------
    x : numpy.ndarray
        Current flat position.
    eps : float
        Step size.
    gradient : callable
        :math:`g`, flat position to flat gradient.
    rng : numpy.random.Generator
        Source of :math:`z`.

    Returns
    -------
    tuple
        ``(x_new, log q(x_new | x), log q(x | x_new))``.
    """
    g_x = gradient(x)
    x_new = x + 0.5 * eps * eps * g_x + eps * rng.standard_normal(x.shape)
    g_new = gradient(x_new)
    return (
        x_new,
        langevin_log_density(x_new, x, g_x, eps),
        langevin_log_density(x, x_new, g_new, eps),
    )

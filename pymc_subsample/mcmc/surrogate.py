r"""Second-order Taylor control variates defined by a finite-difference stencil.

For per-observation terms :math:`l_n(\theta)`, :math:`\theta \in \mathbb{R}^d`,
and a reference point :math:`\hat\theta`, the control variate is

.. math:: h_n(\theta) = l_n(\hat\theta) + g_n^\top \Delta + \tfrac12 \Delta^\top H_n \Delta,
          \qquad \Delta = \theta - \hat\theta,

(Bardenet, Doucet & Holmes 2017, Sec. 7; Cornish et al. 2019), with
:math:`g_n` and :math:`H_n` the central finite differences of :math:`l_n` on the
stencil :math:`S = \{\hat\theta,\ \hat\theta \pm \epsilon_i e_i,\
\hat\theta \pm (\epsilon_i e_i + \epsilon_j e_j)\ (i<j)\}` of
:math:`K = 1 + d + d^2` points:

.. math::
    g_{n,i} = \frac{l_n(\hat\theta+\epsilon_i e_i) - l_n(\hat\theta-\epsilon_i e_i)}{2\epsilon_i},
    \quad
    H_{n,ii} = \frac{l_n(\hat\theta+\epsilon_i e_i) - 2 l_n(\hat\theta)
               + l_n(\hat\theta-\epsilon_i e_i)}{\epsilon_i^2},

    H_{n,ij} = \frac{l_n(\cdot_{++}) - l_n(\cdot_{+i}) - l_n(\cdot_{+j}) + 2 l_n(\hat\theta)
               - l_n(\cdot_{-i}) - l_n(\cdot_{-j}) + l_n(\cdot_{--})}{2 \epsilon_i \epsilon_j}

(second-order accurate; :math:`\cdot_{++} = \hat\theta + \epsilon_i e_i +
\epsilon_j e_j`, :math:`\cdot_{+i} = \hat\theta + \epsilon_i e_i`).

So :math:`h_n(\theta) = \sum_k w_k(\theta)\, l_n(s_k)` is linear in the
stencil values with weights :math:`w(\theta)` that do not depend on
:math:`n`, and :math:`\sum_n h_n(\theta) = \sum_k w_k(\theta) T_k` follows
exactly from the :math:`K` stencil sums :math:`T_k = \sum_n l_n(s_k)`: memory
:math:`O(d^2)`, no per-observation storage. On a race's batch, the stencil is
evaluated with the two points in one call and the residuals
:math:`l_n(\theta) - h_n(\theta)` cost one :math:`(2 \times K)` by
:math:`(K \times m)` product. With ``full=False`` the off-diagonal second
differences are dropped (:math:`K = 1 + 2d`), for large blocks.

Residuals are third order in :math:`\Delta`: at the posterior scale
:math:`\Delta \sim N^{-1/2}` a race needs a batch that does not grow with
:math:`N` (Cornish et al. 2019). Pure NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "MISFIT",
    "MISFIT_RARE",
    "CoordinateSurrogate",
    "QuadraticSurrogate",
    "TaylorSurrogate",
    "misfit_share",
    "stencil_points",
]


def _pairs(d: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(d) for j in range(i + 1, d)]


def stencil_points(theta_ref: np.ndarray, eps: np.ndarray, full: bool = True) -> np.ndarray:
    r"""Return the finite-difference stencil around :math:`\hat\theta`, shape ``(K, d)``.

    Order: :math:`\hat\theta`; :math:`\hat\theta + \epsilon_i e_i` then
    :math:`\hat\theta - \epsilon_i e_i` for each :math:`i`; with ``full``, for
    each pair :math:`i < j` the two points :math:`\hat\theta \pm (\epsilon_i
    e_i + \epsilon_j e_j)`.

    Parameters
    ----------
    theta_ref : numpy.ndarray
        :math:`\hat\theta`, shape ``(d,)``.
    eps : numpy.ndarray
        Steps :math:`\epsilon_i > 0`, shape ``(d,)``.
    full : bool
        Include the mixed points (second cross differences).

    Returns
    -------
    numpy.ndarray
    """
    theta_ref = np.asarray(theta_ref, dtype=np.float64)
    d = len(theta_ref)
    e = np.diag(np.asarray(eps, dtype=np.float64))
    rows = [theta_ref[None, :]]
    for i in range(d):
        rows.append((theta_ref + e[i])[None, :])
        rows.append((theta_ref - e[i])[None, :])
    if full:
        for i, j in _pairs(d):
            rows.append((theta_ref + e[i] + e[j])[None, :])
            rows.append((theta_ref - e[i] - e[j])[None, :])
    return np.concatenate(rows)


class _QuadraticSum:
    r"""The summed expansion :math:`\hat L + G^\top\Delta + \Delta^\top H\Delta/2`, its gradient."""

    theta_ref: np.ndarray
    value: float
    grad: np.ndarray
    hess: np.ndarray

    def total(self, thetas: np.ndarray) -> np.ndarray:
        r"""Return :math:`\sum_n h_n(\theta_j) = \hat L + G^\top\Delta + \Delta^\top H\Delta/2`.

        For a stencil surrogate, equal to ``weights(thetas) @ sums``.
        """
        delta = np.atleast_2d(thetas) - self.theta_ref
        quad = np.einsum("ji,ik,jk->j", delta, self.hess, delta)
        return self.value + delta @ self.grad + 0.5 * quad

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        r"""Gradient :math:`G + H\Delta` of :math:`\sum_n h_n` at ``theta``."""
        return self.grad + self.hess @ (np.asarray(theta) - self.theta_ref)


@dataclass(frozen=True)
class QuadraticSurrogate(_QuadraticSum):
    r"""The quadratic control variate :math:`h_n` of a stencil, from its sums.

    Attributes
    ----------
    theta_ref : numpy.ndarray
        :math:`\hat\theta`, shape ``(d,)``.
    eps : numpy.ndarray
        Stencil steps, shape ``(d,)``.
    sums : numpy.ndarray
        :math:`T_k = \sum_n l_n(s_k)` at the stencil points, shape ``(K,)``.
    full : bool
        Whether the stencil has the mixed points.
    """

    theta_ref: np.ndarray
    eps: np.ndarray
    sums: np.ndarray
    full: bool = True

    def __post_init__(self):
        d = len(self.theta_ref)
        expected = 1 + 2 * d + (d * (d - 1) if self.full else 0)
        if self.sums.shape != (expected,):
            raise ValueError(f"need {expected} stencil sums for d = {d}, got {self.sums.shape}")
        value, grad, hess = self.expansion(self.sums[None, :])
        object.__setattr__(self, "value", float(value[0]))
        object.__setattr__(self, "grad", grad[0])
        object.__setattr__(self, "hess", hess[0])

    @property
    def dim(self) -> int:
        """Dimension :math:`d` of the block."""
        return len(self.theta_ref)

    @property
    def n_points(self) -> int:
        """Number :math:`K` of stencil points."""
        return len(self.sums)

    def points(self) -> np.ndarray:
        """Return the stencil, shape ``(K, d)`` (:func:`stencil_points`)."""
        return stencil_points(self.theta_ref, self.eps, self.full)

    def expansion(self, values: np.ndarray):
        r"""Value, gradient and Hessian of the expansion from stencil values.

        Parameters
        ----------
        values : numpy.ndarray
            Stencil values, shape ``(M, K)`` (e.g. one row per observation, or
            the sums as one row).

        Returns
        -------
        tuple
            :math:`l(\hat\theta)` ``(M,)``, :math:`g` ``(M, d)``, :math:`H` ``(M, d, d)``.
        """
        d, eps = self.dim, self.eps
        center = values[:, 0]
        plus = values[:, 1 : 1 + 2 * d : 2]
        minus = values[:, 2 : 2 + 2 * d : 2]
        grad = (plus - minus) / (2.0 * eps)
        hess = np.zeros((len(values), d, d))
        idx = np.arange(d)
        hess[:, idx, idx] = (plus - 2.0 * center[:, None] + minus) / eps**2
        if self.full:
            base = 1 + 2 * d
            for p, (i, j) in enumerate(_pairs(d)):
                pp, mm = values[:, base + 2 * p], values[:, base + 2 * p + 1]
                hij = pp + mm + 2.0 * center - plus[:, i] - minus[:, i] - plus[:, j] - minus[:, j]
                hij /= 2.0 * eps[i] * eps[j]
                hess[:, i, j] = hij
                hess[:, j, i] = hij
        return center, grad, hess

    def weights(self, thetas: np.ndarray) -> np.ndarray:
        r"""Weights :math:`w(\theta_j)` with :math:`h_n(\theta_j) = \sum_k w_{jk} l_n(s_k)`.

        Parameters
        ----------
        thetas : numpy.ndarray
            Points, shape ``(J, d)``.

        Returns
        -------
        numpy.ndarray
            Shape ``(J, K)``.
        """
        delta = np.atleast_2d(thetas) - self.theta_ref
        d, eps = self.dim, self.eps
        w = np.zeros((len(delta), self.n_points))
        u = delta / eps  # steps in units of the stencil
        w[:, 0] = 1.0 - (u * u).sum(axis=1)
        w[:, 1 : 1 + 2 * d : 2] = 0.5 * u + 0.5 * u * u
        w[:, 2 : 2 + 2 * d : 2] = -0.5 * u + 0.5 * u * u
        if self.full:
            base = 1 + 2 * d
            for p, (i, j) in enumerate(_pairs(d)):
                c = 0.5 * u[:, i] * u[:, j]  # weight of H_ij in Delta' H Delta / 2
                w[:, base + 2 * p] = c
                w[:, base + 2 * p + 1] = c
                w[:, 0] += 2.0 * c
                for k in (i, j):
                    w[:, 1 + 2 * k] -= c
                    w[:, 2 + 2 * k] -= c
        return w


@dataclass(frozen=True)
class TaylorSurrogate(_QuadraticSum):
    r"""A second-order Taylor control variate computed by automatic differentiation.

    :math:`h_n(\theta) = l_n(\hat\theta) + \nabla l_n(\hat\theta)^\top\Delta
    + \tfrac12 \Delta^\top \nabla^2 l_n(\hat\theta) \Delta`, held only through
    its exact sums :math:`\hat L = \sum_n l_n(\hat\theta)`, :math:`G`, :math:`H`;
    the per-observation residuals are computed on each batch from the graph
    (:meth:`pymc_subsample.model.expansion.Expansion.residual_batch`), so the
    cost per observation does not grow with :math:`d` as a stencil's
    :math:`1 + d + d^2` points do.

    Attributes
    ----------
    theta_ref : numpy.ndarray
        :math:`\hat\theta`, shape ``(d,)``.
    value : float
        :math:`\hat L`.
    grad : numpy.ndarray
        :math:`G`, shape ``(d,)``.
    hess : numpy.ndarray
        :math:`H`, shape ``(d, d)``.
    """

    theta_ref: np.ndarray
    value: float
    grad: np.ndarray
    hess: np.ndarray

    @property
    def dim(self) -> int:
        """Dimension :math:`d` of the block."""
        return len(self.theta_ref)


@dataclass(frozen=True)
class CoordinateSurrogate:
    r"""A Taylor surrogate in coordinates :math:`\phi(\theta)`, as a function of :math:`\theta`.

    :math:`\sum_n h_n(\theta) = \hat L + G^\top\Delta + \tfrac12\Delta^\top H\Delta`
    with :math:`\Delta = \phi(\theta) - \hat\phi` (``expansion`` holds
    :math:`\hat\phi, \hat L, G, H`), and its gradient by the chain rule,
    :math:`J_\phi(\theta)^\top (G + H\Delta)`. Where the terms are smooth in
    :math:`\phi` but not in :math:`\theta` (coefficients
    :math:`\alpha = \mathrm{softplus}(z)` at their boundary) this fits the
    log-likelihood far better than an expansion in :math:`\theta`; it is not
    quadratic in :math:`\theta`, which a leapfrog integrator does not need.

    Attributes
    ----------
    expansion : TaylorSurrogate
        The expansion in the flat coordinates.
    to_coordinates : callable
        Flat :math:`\theta` to flat :math:`\phi`.
    pullback : callable
        ``pullback(theta, v)`` = :math:`J_\phi(\theta)^\top v`, flat.
    """

    expansion: TaylorSurrogate
    to_coordinates: object
    pullback: object

    def total(self, thetas: np.ndarray) -> np.ndarray:
        r"""Return :math:`\sum_n h_n(\theta_j)` for each row of ``thetas``."""
        rows = np.stack([self.to_coordinates(t) for t in np.atleast_2d(thetas)])
        return self.expansion.total(rows)

    def gradient(self, theta: np.ndarray) -> np.ndarray:
        r"""Gradient :math:`J_\phi(\theta)^\top (G + H\Delta)` in :math:`\theta`."""
        return self.pullback(theta, self.expansion.gradient(self.to_coordinates(theta)))


#: A row's control variate misses when its residual difference exceeds this share of
#: the terms' difference there and of their mean absolute difference over the rows.
MISFIT = 0.1
#: Misses on at most this share of the rows (and at least one) are *rare*: a race's
#: batch would seldom draw them.
MISFIT_RARE = 0.5


def misfit_share(residual: np.ndarray, raw: np.ndarray) -> float:
    r"""Share of rows on which a control variate misses the terms' difference.

    With the per-row differences of the terms between two points,
    :math:`\Delta_n = l_n(x_1) - l_n(x_0)`, and of their residuals,
    :math:`r_n = (l_n - h_n)(x_1) - (l_n - h_n)(x_0)`, row :math:`n` is missed
    when :math:`|r_n| > c\,|\Delta_n|` and :math:`|r_n| > c\, \overline{|\Delta|}`,
    :math:`c` = :data:`MISFIT`. Smooth terms leave residuals of third order, a
    small share of :math:`\Delta_n` on every row; terms linear on pieces
    (:math:`|y_n - \theta|`) leave none on most rows and all of it on the rows
    between the points. Rows with a non-finite value are left out.
    """
    residual = np.asarray(residual, dtype=np.float64)
    raw = np.asarray(raw, dtype=np.float64)
    ok = np.isfinite(residual) & np.isfinite(raw)
    if not ok.any():
        return 0.0
    residual, raw = np.abs(residual[ok]), np.abs(raw[ok])
    missed = (residual > MISFIT * raw) & (residual > MISFIT * raw.mean())
    return float(np.count_nonzero(missed) / residual.size)

r"""Newton's method on a block's log posterior, and the Laplace mass matrix at its mode.

The log posterior of a block :math:`\theta \in \mathbb{R}^d` is
:math:`\log f_0(\theta) + \sum_n l_n(\theta)`. Each Newton step expands the
sum to second order at the current point (a
:class:`~pymc_subsample.mcmc.surrogate.TaylorSurrogate` or
:class:`~pymc_subsample.mcmc.surrogate.QuadraticSurrogate`), adds the
gradient and the finite-difference Hessian of :math:`\log f_0`, and solves
:math:`-\nabla^2 \log p\ s = \nabla \log p` on a positive-definite lift of the
Hessian, backtracking while the step lowers the log posterior (Nocedal &
Wright 2006, Ch. 3). The negative Hessian at the mode is the Laplace
approximation's precision, the proposals' mass matrix :math:`M`.

Pure NumPy: the model is read through the callables of :class:`LogPosterior`
(flat positions in, numbers out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "MODE_WINDOW",
    "ROUNDING",
    "LogPosterior",
    "ModeFit",
    "NewtonStep",
    "find_mode",
    "gradient_jacobian",
    "mass_factors",
    "newton_step",
    "positive_definite",
    "stencil_steps",
]

#: Observations at most in the window that the first Newton steps sum over (scaled to N).
MODE_WINDOW = 50_000
#: Relative loss of the log posterior that a full Newton step in the quadratic region may
#: show and be kept (rounding near the mode).
ROUNDING = 1e-10


@dataclass(frozen=True)
class LogPosterior:
    r"""A block's log posterior :math:`\log f_0 + \sum_n l_n` on flat positions.

    Parameters
    ----------
    dim : int
        :math:`d`, the length of a flat position.
    n_obs : int
        :math:`N`, the number of terms :math:`l_n`.
    expand : callable
        ``expand(x, eps, window=None, full=None)``: the second-order expansion of
        :math:`\sum_n l_n` at ``x`` (steps ``eps`` for a finite-difference
        stencil; sums over the first ``window`` observations scaled to
        :math:`N` when given; ``full``: the stencil's mixed points), and the
        terms it evaluated: ``(surrogate, count)``. Raises ``FloatingPointError``
        where the sums are not finite.
    sums : callable
        ``sums(rows, window)``: :math:`\sum_n l_n` at each flat row (over a
        window scaled to :math:`N`, or all when ``window`` is None).
    log_f0 : callable
        :math:`\log f_0` at a flat position (a float).
    f0_grad : callable
        Its gradient at a flat position.
    sum_grad : callable, optional
        ``sum_grad(x)``: :math:`\nabla \sum_n l_n` at ``x`` over all the data and
        the terms it evaluated, ``(gradient, count)``; a pass whose cost per
        observation grows as :math:`d` where the expansion's Hessian costs
        :math:`d^2`. Without it, the gradient comes from ``expand`` (no mixed
        points).
    """

    dim: int
    n_obs: int
    expand: Callable[..., tuple[Any, int]]
    sums: Callable[[np.ndarray, int | None], np.ndarray]
    log_f0: Callable[[np.ndarray], float]
    f0_grad: Callable[[np.ndarray], np.ndarray]
    sum_grad: Callable[[np.ndarray], tuple[np.ndarray, int]] | None = None

    def full_gradient(self, x: np.ndarray, eps: np.ndarray) -> tuple[np.ndarray, int]:
        r"""Gradient of :math:`\sum_n l_n` at ``x`` over all the data, and the terms evaluated."""
        if self.sum_grad is not None:
            return self.sum_grad(x)
        diag, cost = self.expand(x, eps, None, False)  # the 2d + 1 axis points
        return diag.grad, cost

    def f0_hessian(self, x: np.ndarray, eps: np.ndarray) -> np.ndarray:
        r"""Hessian of :math:`\log f_0` at ``x``: central differences of its gradient."""
        return gradient_jacobian(self.f0_grad, x, eps)

    def neg_hessian(self, surrogate, x: np.ndarray, eps: np.ndarray) -> np.ndarray:
        r"""Positive-definite :math:`-\nabla^2(\log f_0 + \sum_n h_n)` at ``x``."""
        return positive_definite(-(surrogate.hess + self.f0_hessian(x, eps)))


@dataclass(frozen=True)
class NewtonStep:
    r"""One Newton iteration: the expansion at the start, its metric, the end, the decrement.

    Attributes
    ----------
    surrogate
        The expansion of the sum at the start point.
    neg_hessian : numpy.ndarray
        Positive-definite negative Hessian of the log posterior there.
    x : numpy.ndarray
        The new point (after backtracking).
    decrement : float
        Newton decrement :math:`g^\top (-H)^{-1} g` at the start point.
    spent : int
        Terms evaluated.
    """

    surrogate: Any
    neg_hessian: np.ndarray
    x: np.ndarray
    decrement: float
    spent: int


@dataclass(frozen=True)
class ModeFit:
    """Result of :func:`find_mode`: the mode, the expansion there, its metric, the cost."""

    x: np.ndarray
    surrogate: Any
    neg_hessian: np.ndarray
    spent: int


def stencil_steps(neg_hessian: np.ndarray) -> np.ndarray:
    """Stencil steps of a tenth of the posterior sd of each coordinate (Laplace), clipped."""
    sd = np.sqrt(np.diag(np.linalg.inv(neg_hessian)))
    return np.clip(0.1 * sd, 1e-10, 1e-2)


def mass_factors(neg_hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return :math:`M^{-1}` and the Cholesky factors of :math:`M` and :math:`M^{-1}`."""
    inv_mass = np.linalg.inv(neg_hessian)
    return inv_mass, np.linalg.cholesky(neg_hessian), np.linalg.cholesky(inv_mass)


def positive_definite(matrix: np.ndarray) -> np.ndarray:
    """Symmetrize and lift eigenvalues to at least 1e-8 of the largest (a valid metric).

    Raises
    ------
    numpy.linalg.LinAlgError
        When the matrix is not finite.
    """
    sym = 0.5 * (matrix + matrix.T)
    vals, vecs = np.linalg.eigh(sym)
    if not np.isfinite(vals).all():
        raise np.linalg.LinAlgError("the Hessian of the log posterior is not finite")
    floor = 1e-8 * max(float(np.abs(vals).max()), 1e-300)
    return (vecs * np.maximum(np.abs(vals), floor)) @ vecs.T


def gradient_jacobian(
    gradient: Callable[[np.ndarray], np.ndarray], x: np.ndarray, eps: np.ndarray
) -> np.ndarray:
    r"""Symmetrized central differences of ``gradient`` at ``x``: a Hessian, ``(d, d)``.

    Column :math:`i` is :math:`(g(x + \epsilon_i e_i) - g(x - \epsilon_i e_i)) / 2\epsilon_i`.
    """
    d = len(x)
    hess = np.empty((d, d))
    for i in range(d):
        e = np.zeros(d)
        e[i] = eps[i]
        hess[:, i] = (gradient(x + e) - gradient(x - e)) / (2 * eps[i])
    return 0.5 * (hess + hess.T)


def newton_step(
    post: LogPosterior, x: np.ndarray, eps: np.ndarray, window: int | None
) -> NewtonStep:
    """One Newton iteration on the log posterior (sums over ``window``, or all data).

    The step is halved until the log posterior does not decrease (down to
    :math:`10^{-6}` of it). The full step is tried first, and it is checked
    even where the decrement is small (below :math:`10 d`): a small decrement
    does not make the posterior quadratic along a direction it is flat in,
    where the full step can be many posterior standard deviations long.
    Within the quadratic region a full step that loses no more than
    :data:`ROUNDING` (relative) is kept, so that rounding at the mode does not
    halve it.
    """
    sur, spent = post.expand(x, eps, window)
    grad = sur.grad + post.f0_grad(x)
    neg_h = post.neg_hessian(sur, x, eps)
    step = np.linalg.solve(neg_h, grad)
    decrement = float(grad @ step)
    lp0 = sur.value + post.log_f0(x)
    slack = ROUNDING * max(1.0, abs(lp0)) if decrement < 10 * post.dim else 0.0
    t = 1.0
    while t > 1e-6:  # backtracking on the log posterior
        row = x + t * step
        lp = post.sums(row[None, :], window)[0] + post.log_f0(row)
        spent += post.n_obs if window is None else window
        if np.isfinite(lp) and lp >= lp0 - slack:
            break
        t *= 0.5
    return NewtonStep(sur, neg_h, x + t * step, decrement, spent)


def find_mode(post: LogPosterior, x: np.ndarray) -> ModeFit:
    """Newton steps to the mode; the expansion and its metric there.

    Iterates on a window of at most :data:`MODE_WINDOW` observations (sums
    scaled to :math:`N`) until the Newton decrement is below :math:`d`; then
    one Newton step on all the data with the full gradient (``sum_grad``, or
    the :math:`2d+1` axis points) and the window's Hessian lands in the quadratic region, where
    the full stencil gives the expansion: about :math:`d^2 + 3d + 2`
    evaluations per observation in all. Falls back to full Newton iterations
    when the window misleads.

    Raises
    ------
    FloatingPointError, numpy.linalg.LinAlgError
        Where the sums or the Hessian are not finite.
    """
    n_obs, dim = post.n_obs, post.dim
    window = min(n_obs, MODE_WINDOW)
    eps = 1e-4 * np.maximum(1.0, np.abs(x))
    spent = 0
    if window < n_obs:
        for _ in range(50):
            newton = newton_step(post, x, eps, window)
            neg_h, x, spent = newton.neg_hessian, newton.x, spent + newton.spent
            eps = stencil_steps(neg_h)
            if newton.decrement < dim:
                break
        # on all the data, the gradient (one pass, or 2d + 1 points) with the window's Hessian
        grad, cost = post.full_gradient(x, eps)
        spent += cost
        grad = grad + post.f0_grad(x)
        step = np.linalg.solve(neg_h, grad)
        # the window's optimum sits about sqrt(N / window) posterior sds from the mode:
        # a Newton decrement of that order is the quadratic region, not a misleading window
        if float(grad @ step) < 10 * dim * n_obs / window:
            x = x + step
            eps = stencil_steps(neg_h)
            sur, cost = post.expand(x, eps)
            spent += cost
            return ModeFit(x, sur, post.neg_hessian(sur, x, eps), spent)
    for _ in range(20):
        newton = newton_step(post, x, eps, None)
        sur, neg_h, spent = newton.surrogate, newton.neg_hessian, spent + newton.spent
        eps = stencil_steps(neg_h)
        if newton.decrement < 1e-3 * dim:  # converged: keep the expansion at x
            break
        x = newton.x
        if newton.decrement < 10 * dim:  # one more stencil at the new point
            sur, cost = post.expand(x, eps)
            spent += cost
            neg_h = post.neg_hessian(sur, x, eps)
            grad = sur.grad + post.f0_grad(x)
            if float(grad @ np.linalg.solve(neg_h, grad)) < dim:
                break  # within about one posterior sd of the mode: done
    return ModeFit(x, sur, neg_h, spent)

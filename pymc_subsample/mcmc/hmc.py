r"""Hamiltonian proposal on a surrogate log density: a leapfrog trajectory, momentum flipped.

From :math:`x` with momentum :math:`p \sim N(0, M)`, :math:`L` leapfrog steps of
size :math:`\epsilon` on the Hamiltonian :math:`H(x, p) = -\log \tilde\pi(x) +
\tfrac12 p^\top M^{-1} p` give :math:`(x', p')`; with the momentum flipped at
the end the map is an involution that preserves volume, so MH with target
:math:`\pi` accepts with :math:`\log\pi(x') - \log\pi(x) + K(p) - K(p')`
(Neal 2011). :math:`\tilde\pi` is the surrogate (a quadratic expansion of
the likelihood plus the exact prior), which reads no data; the accept test
on :math:`\pi` itself is made elsewhere. The step size is jittered by
:math:`\pm 10\%` per trajectory and :math:`L = \lceil \ell / \epsilon \rceil`,
at most :data:`MAX_LEAPFROG`, for a path length :math:`\ell`.

A pure step function in the manner of BlackJAX's kernels: state in, proposal
and an information record (:class:`HMCInfo`) out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_LEAPFROG", "HMCInfo", "hmc_proposal"]

#: Leapfrog steps at most per trajectory.
MAX_LEAPFROG = 100


@dataclass(frozen=True)
class HMCInfo:
    r"""What one trajectory did.

    Attributes
    ----------
    integrator_accept : float
        :math:`\min(1, e^{-\Delta H})` on the surrogate: the integrator's own
        acceptance, which step-size adaptation targets (0 for a divergence).
    n_steps : int
        Leapfrog steps taken.
    step_size : float
        The jittered step size used.
    diverged : bool
        The position left the finite numbers: the proposal is the start,
        with a log ratio of :math:`-\infty`.
    surrogate_change : float
        :math:`\log\tilde\pi(x') - \log\tilde\pi(x)`, the surrogate's log
        density change along the trajectory (NaN for a divergence): against the
        exact change, the surrogate's misfit
        (:class:`~pymc_subsample.mcmc.regime.FitCheck`).
    """

    integrator_accept: float
    n_steps: int
    step_size: float
    diverged: bool
    surrogate_change: float = float("nan")


def hmc_proposal(
    x: np.ndarray,
    *,
    gradient: Callable[[np.ndarray], np.ndarray],
    log_density: Callable[[np.ndarray], np.ndarray],
    inv_mass: np.ndarray,
    chol_mass: np.ndarray,
    step_size: float,
    path_length: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float, HMCInfo]:
    r"""Propose by a leapfrog trajectory on the surrogate :math:`\tilde\pi`.

    Parameters
    ----------
    x : numpy.ndarray
        Current flat position, shape ``(d,)``.
    gradient : callable
        :math:`\nabla \log\tilde\pi` at a flat position.
    log_density : callable
        :math:`\log\tilde\pi` at each row of a ``(K, d)`` array (up to a
        constant); read at the two ends only.
    inv_mass, chol_mass : numpy.ndarray
        :math:`M^{-1}` and the Cholesky factor of :math:`M`.
    step_size : float
        :math:`\epsilon` before the jitter.
    path_length : float
        Integration time :math:`\ell`.
    rng : numpy.random.Generator
        Source of the jitter, then of :math:`p`.

    Returns
    -------
    tuple
        ``(x_new, K(p) - K(p'), info)``: the proposal's part of the MH log
        ratio is the kinetic energy difference.
    """
    eps = float(step_size) * rng.uniform(0.9, 1.1)
    n_steps = int(min(MAX_LEAPFROG, max(1, np.ceil(path_length / eps))))
    p = chol_mass @ rng.standard_normal(len(x))
    kinetic0 = 0.5 * p @ inv_mass @ p
    theta = x.copy()
    p = p + 0.5 * eps * gradient(theta)
    for k in range(n_steps):
        theta = theta + eps * (inv_mass @ p)
        if not np.isfinite(theta).all():
            return x, -np.inf, HMCInfo(0.0, k + 1, eps, True)
        g = gradient(theta)
        p = p + (eps if k < n_steps - 1 else 0.5 * eps) * g
    kinetic1 = 0.5 * p @ inv_mass @ p
    # the integrator's own energy error on the surrogate (no data read) tunes the step
    # size; the surrogate's misfit, which no step size removes, is left to the accept test
    energy = log_density(np.stack([x, theta]))
    error = float(energy[1] - energy[0] + kinetic0 - kinetic1)
    accept = float(np.exp(min(0.0, error))) if np.isfinite(error) else 0.0
    change = float(energy[1] - energy[0])
    return theta, float(kinetic0 - kinetic1), HMCInfo(accept, n_steps, eps, False, change)

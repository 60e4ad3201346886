r"""A compiled trigamma for PyTensor's Numba backend.

PyTensor 3 compiles graphs with Numba by default, but has no Numba lowering
for :class:`pytensor.scalar.math.TriGamma` (:math:`\psi_1 = (\log\Gamma)''`).
It then runs the op in Python object mode, which is slow and, worse, makes the
whole compiled function uncacheable: every process, and every new function in
a process, compiles it again. The second derivatives of a Student-t
log-likelihood in its degrees of freedom contain it, so the exact Taylor
control variates of :class:`~pymc_subsample.RacingMetropolis` on such a model
recompiled for seconds at every first use. Importing this module registers a
cacheable lowering:

.. math:: \psi_1(x) = \sum_{k=0}^{K-1} \frac{1}{(x+k)^2} + \psi_1(x + K),

with :math:`x + K \ge 10` and the asymptotic series
:math:`\psi_1(y) \approx \frac1y + \frac1{2y^2} + \frac1{6y^3} - \frac1{30y^5}
+ \frac1{42y^7} - \frac1{30y^9} + \frac5{66y^{11}} - \frac{691}{2730y^{13}}`
(Abramowitz & Stegun 1964, 6.4.12), relative error below :math:`10^{-14}`;
for :math:`x \le 0` the reflection
:math:`\psi_1(x) = \pi^2/\sin^2(\pi x) - \psi_1(1 - x)` (infinite at the poles).

This module must keep its import path (``pymc_subsample._numba_trigamma``):
PyTensor's on-disk cache of compiled graphs pickles the path of the module
whose functions a graph calls, and a cached graph whose module moved fails to
load (``ModuleNotFoundError``) in every later process on that machine.
"""

from __future__ import annotations

import math

import numpy as np

from ._numba_cache import njit_cached

__all__ = ["trigamma"]


@njit_cached()
def _series(y):  # pragma: no cover - compiled
    inv = 1.0 / y
    inv2 = inv * inv
    tail = -1.0 / 30.0 + inv2 * (5.0 / 66.0 - inv2 * 691.0 / 2730.0)
    tail = 1.0 / 6.0 + inv2 * (-1.0 / 30.0 + inv2 * (1.0 / 42.0 + inv2 * tail))
    return inv + 0.5 * inv2 + inv * inv2 * tail


@njit_cached()
def trigamma(x):  # pragma: no cover - compiled
    r"""Return :math:`\psi_1(x)`, the trigamma function, for a float ``x``."""
    if np.isnan(x):
        return np.nan
    reflect = 0.0
    sign = 1.0
    if x <= 0.0:
        if x == math.floor(x):
            return np.inf
        s = math.sin(math.pi * x)
        reflect = (math.pi * math.pi) / (s * s)
        sign = -1.0
        x = 1.0 - x
    acc = 0.0
    while x < 10.0:
        acc += 1.0 / (x * x)
        x += 1.0
    return reflect + sign * (acc + _series(x))


def _register() -> None:
    """Register the lowering with PyTensor's Numba backend (no-op where it is absent)."""
    try:
        from pytensor.link.numba.dispatch.scalar import (
            register_scalar_funcify,
            scalar_op_cache_key,
        )
        from pytensor.scalar.math import TriGamma
    except ImportError:  # pragma: no cover - another PyTensor layout: keep its behaviour
        return

    @register_scalar_funcify(TriGamma)
    def numba_funcify_TriGamma(op, node, **kwargs):
        return trigamma, scalar_op_cache_key(op, cache_version=1)


_register()

r"""Compiled (Numba) kernels of a race look: running statistics and elimination.

A look of a race on :math:`S` surviving arms and :math:`m` new observations
merges the batch's means and centred cross-products into the running ones
(Chan, Golub & LeVeque 1979) at cost :math:`O(S^2 m)` (pairwise) or
:math:`O(S m)` (marginal), then compares every arm with the leader at cost
:math:`O(S^2)`. Each happens in one compiled call, so that a look costs a
few microseconds of bookkeeping besides the reward evaluation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["merge_marginal", "merge_pairwise", "normal_keep_marginal", "normal_keep_pairwise"]


@njit(cache=True)
def _batch_means(batch):  # pragma: no cover - compiled
    s, m = batch.shape
    out = np.empty(s)
    for i in range(s):
        acc = 0.0
        for k in range(m):
            acc += batch[i, k]
        out[i] = acc / m
    return out


@njit(cache=True)
def merge_pairwise(batch, n, mean, m2):  # pragma: no cover - compiled
    r"""Merge a batch into running means and centred cross-products.

    Parameters
    ----------
    batch : numpy.ndarray
        ``(S, m)`` rewards of the surviving arms on the new observations.
    n : int
        Observations merged so far.
    mean : numpy.ndarray
        ``(S,)`` running means.
    m2 : numpy.ndarray
        ``(S, S)`` centred cross-products
        :math:`\sum_n (l_{i,n}-\bar l_i)(l_{j,n}-\bar l_j)`.

    Returns
    -------
    tuple
        New ``(mean, m2)``, fresh arrays (the inputs are not modified).
    """
    s, m = batch.shape
    bmean = _batch_means(batch)
    tot = n + m
    corr = n * m / tot
    new_mean = mean + (bmean - mean) * (m / tot)
    centred = np.empty((s, m))
    for i in range(s):
        for k in range(m):
            centred[i, k] = batch[i, k] - bmean[i]
    new_m2 = m2.copy()
    for i in range(s):
        di = bmean[i] - mean[i]
        for j in range(i, s):
            acc = 0.0
            for k in range(m):
                acc += centred[i, k] * centred[j, k]
            v = new_m2[i, j] + acc + di * (bmean[j] - mean[j]) * corr
            new_m2[i, j] = v
            new_m2[j, i] = v
    return new_mean, new_m2


@njit(cache=True)
def merge_marginal(batch, n, mean, m2):  # pragma: no cover - compiled
    r"""Like :func:`merge_pairwise` with ``m2`` the ``(S,)`` centred sums of squares."""
    s, m = batch.shape
    bmean = _batch_means(batch)
    tot = n + m
    corr = n * m / tot
    new_mean = mean + (bmean - mean) * (m / tot)
    new_m2 = m2.copy()
    for i in range(s):
        acc = 0.0
        for k in range(m):
            c = batch[i, k] - bmean[i]
            acc += c * c
        di = bmean[i] - mean[i]
        new_m2[i] += acc + di * di * corr
    return new_mean, new_m2


@njit(cache=True)
def _leader(mean, offsets):  # pragma: no cover - compiled
    lead = 0
    best = mean[0] + offsets[0]
    for i in range(1, mean.shape[0]):
        v = mean[i] + offsets[i]
        if v > best:
            best = v
            lead = i
    return lead, best


@njit(cache=True)
def normal_keep_pairwise(mean, m2, offsets, n, factor, floor):  # pragma: no cover - compiled
    r"""Racing-Normal elimination on pairwise differences after a look of ``n`` observations.

    With :math:`\hat x` the leader of :math:`\hat\mu_i + o_i`, arm :math:`i` is
    kept iff :math:`\hat\mu_{\hat x} + o_{\hat x} - \hat\mu_i - o_i \le
    \texttt{factor} \cdot \max(\hat\sigma_{\hat x,i}, \texttt{floor})`, with
    ``factor`` :math:`= B \sqrt{(N-T)/((N-1)T)}`, the half-width per unit
    standard deviation (Chen & Ghahramani 2016, Alg. 1).

    Returns
    -------
    tuple
        ``(keep, lead)``: boolean mask over the arms and the leader's position.
    """
    s = mean.shape[0]
    lead, best = _leader(mean, offsets)
    keep = np.ones(s, dtype=np.bool_)
    for i in range(s):
        if i != lead:
            var = (m2[lead, lead] + m2[i, i] - 2.0 * m2[lead, i]) / n
            sd = max(np.sqrt(max(var, 0.0)), floor)
            keep[i] = best - (mean[i] + offsets[i]) <= factor * sd
    return keep, lead


@njit(cache=True)
def normal_keep_marginal(mean, m2, offsets, n, factor, floor):  # pragma: no cover - compiled
    r"""Racing-Normal elimination on marginal intervals (see :func:`normal_keep_pairwise`).

    Arm :math:`i` is kept iff :math:`\hat\mu_{\hat x} + o_{\hat x} -
    \texttt{factor}\,\hat\sigma_{\hat x} \le \hat\mu_i + o_i +
    \texttt{factor}\,\hat\sigma_i`.
    """
    s = mean.shape[0]
    lead, best = _leader(mean, offsets)
    keep = np.ones(s, dtype=np.bool_)
    sd_lead = max(np.sqrt(max(m2[lead] / n, 0.0)), floor)
    for i in range(s):
        if i != lead:
            sd = max(np.sqrt(max(m2[i] / n, 0.0)), floor)
            keep[i] = best - factor * sd_lead <= mean[i] + offsets[i] + factor * sd
    return keep, lead

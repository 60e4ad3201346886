r"""Compiled (Numba) kernels of a race look: running statistics and elimination.

A look of a race on :math:`S` surviving arms and :math:`m` new observations
merges the batch into the running means (Chan, Golub & LeVeque 1979), finds
the leader :math:`\hat x` of :math:`\hat\mu_i + o_i`, and updates the spread
statistics the bound needs, all at cost :math:`O(S m)`:

* pairwise: the centred sums of squares of the differences
  :math:`d_{i,n} = l_{\hat x,n} - l_{i,n}` with the leader, accumulated since
  it became the leader (under doubling, at least the latest half of the
  observations; all of them when the leader never changes). A full
  :math:`S \times S` matrix of cross-products would cost :math:`O(S^2 m)`,
  more than evaluating the rewards;
* marginal: each arm's centred sum of squares.

Each look is one compiled call, so its bookkeeping costs little besides the
reward evaluation (see the results pages).
"""

from __future__ import annotations

import numpy as np

from .._numba_cache import njit_cached

__all__ = [
    "GIVE_UP_MARGIN",
    "look_marginal",
    "look_normal",
    "look_pairwise",
    "look_rows",
    "skew_guard",
    "stuck_arms",
    "stuck_rows",
]

# reassociation lets sums vectorize; no "nnan"/"ninf": the kernels must see -inf and NaN
_FAST = {"reassoc", "nsz", "arcp", "contract"}

#: Standard errors of today's gap added before an arm counts as stuck (:func:`stuck_arms`).
#: With one, an arm that the race would drop a look or two later looked stuck by chance
#: in about 2% of the draws of a point-mass conditional (Normal terms, N = 10^6, D = 10,
#: neighbours 1/9 apart), and those draws took the exact pass over the values left: about
#: 70% of the terms the race read. With 1.5, none in 600 such draws (terms per draw 3.7x
#: fewer), while a diffuse race reads 0.3-0.8% more terms before it gives up.
GIVE_UP_MARGIN = 1.5


@njit_cached(fastmath=_FAST)
def _merge_means(batch, n, mean, offsets):  # pragma: no cover - compiled
    s, m = batch.shape
    bmean = np.empty(s)
    finite = True
    for i in range(s):
        acc = 0.0
        for k in range(m):
            acc += batch[i, k]
        bmean[i] = acc / m
        finite &= np.isfinite(bmean[i])
    if not finite:  # the caller checks the batch and drops -inf arms
        return bmean, mean, -1, 0.0
    new_mean = mean + (bmean - mean) * (m / (n + m))
    lead = 0
    best = new_mean[0] + offsets[0]
    for i in range(1, s):
        v = new_mean[i] + offsets[i]
        if v > best:
            best = v
            lead = i
    return bmean, new_mean, lead, best


@njit_cached(fastmath=_FAST)
def _g1sq(m2, m3, m, mu):  # pragma: no cover - compiled
    """Squared sample skewness from centred sums of squares and cubes of ``m`` values."""
    if m2 <= 1e-20 * m * mu * mu:  # constant up to rounding: no skewness to speak of
        return 0.0
    return m3 * m3 * m / max(m2**3, 1e-300)


@njit_cached(fastmath=_FAST)
def look_pairwise(
    batch, n, mean, ref, n_ref, dmean, dm2, offsets, factor, floor
):  # pragma: no cover
    r"""One Racing-Normal look on differences with the leader.

    Parameters
    ----------
    batch : numpy.ndarray
        ``(S, m)`` rewards of the survivors on the new observations.
    n : int
        Observations merged before this look.
    mean : numpy.ndarray
        ``(S,)`` running means.
    ref : int
        Leader whose differences ``dmean``/``dm2`` track (−1: none yet).
    n_ref : int
        Observations behind ``dmean`` and ``dm2``.
    dmean, dm2 : numpy.ndarray
        ``(S,)`` mean and centred sum of squares of :math:`l_{\mathrm{ref},n} - l_{i,n}`.
    offsets : numpy.ndarray
        ``(S,)`` offsets of the survivors.
    factor : float
        Half-width per unit standard deviation,
        :math:`B\sqrt{(N-T)/((N-1)T)}` at :math:`T = n + m`; 0 or less: no
        elimination (the caller only wants the statistics).
    floor : float
        Floor on the standard deviation of a difference.

    Returns
    -------
    tuple
        ``(mean, lead, n_ref, dmean, dm2, keep, bmean)``, fresh arrays;
        ``lead`` is −1 (and nothing is merged) when some reward is not
        finite; ``bmean`` holds the arms' means on this batch (for
        :func:`skew_guard`); arm
        :math:`i` is kept iff :math:`\hat\mu_{\hat x} + o_{\hat x} - \hat\mu_i
        - o_i \le \texttt{factor}\,\max(\hat\sigma_{\hat x,i}, \texttt{floor})`.
    """
    s, m = batch.shape
    bmean, new_mean, lead, best = _merge_means(batch, n, mean, offsets)
    if lead < 0:
        return mean, lead, n_ref, dmean, dm2, np.ones(s, dtype=np.bool_), bmean
    if lead != ref:
        n_ref = 0
        dmean = np.zeros(s)
        dm2 = np.zeros(s)
    new_dmean = np.empty(s)
    new_dm2 = np.empty(s)
    tot = n_ref + m
    corr = n_ref * m / tot
    for i in range(s):
        bd = bmean[lead] - bmean[i]
        acc = 0.0
        for k in range(m):
            c = batch[lead, k] - batch[i, k] - bd
            acc += c * c
        delta = bd - dmean[i]
        new_dmean[i] = dmean[i] + delta * (m / tot)
        new_dm2[i] = dm2[i] + acc + delta * delta * corr
    keep = np.ones(s, dtype=np.bool_)
    if factor > 0.0:
        for i in range(s):
            if i != lead:
                sd = max(np.sqrt(max(new_dm2[i] / tot, 0.0)), floor)
                keep[i] = best - (new_mean[i] + offsets[i]) <= factor * sd
    return new_mean, lead, tot, new_dmean, new_dm2, keep, bmean


@njit_cached(fastmath=_FAST)
def look_marginal(batch, n, mean, m2, offsets, factor, floor):  # pragma: no cover - compiled
    r"""One Racing-Normal look on marginal intervals.

    Merges the batch into the running means and centred sums of squares
    ``m2``; arm :math:`i` is kept iff :math:`\hat\mu_{\hat x} + o_{\hat x} -
    \texttt{factor}\,\hat\sigma_{\hat x} \le \hat\mu_i + o_i +
    \texttt{factor}\,\hat\sigma_i` (standard deviations floored at ``floor``).

    Returns
    -------
    tuple
        ``(mean, lead, m2, keep, bmean)``, fresh arrays; ``lead`` is −1 (and
        nothing is merged) when some reward is not finite; ``bmean`` holds
        the arms' means on this batch (for :func:`skew_guard`).
    """
    s, m = batch.shape
    bmean, new_mean, lead, best = _merge_means(batch, n, mean, offsets)
    if lead < 0:
        return mean, lead, m2, np.ones(s, dtype=np.bool_), bmean
    tot = n + m
    corr = n * m / tot
    new_m2 = m2.copy()
    for i in range(s):
        acc = 0.0
        for k in range(m):
            c = batch[i, k] - bmean[i]
            acc += c * c
        di = bmean[i] - mean[i]
        new_m2[i] += acc + di * di * corr
    keep = np.ones(s, dtype=np.bool_)
    if factor > 0.0:
        sd_lead = max(np.sqrt(max(new_m2[lead] / tot, 0.0)), floor)
        for i in range(s):
            if i != lead:
                sd = max(np.sqrt(max(new_m2[i] / tot, 0.0)), floor)
                keep[i] = best - factor * sd_lead <= new_mean[i] + offsets[i] + factor * sd
    return new_mean, lead, new_m2, keep, bmean


@njit_cached(fastmath=_FAST)
def _batch_g1sq(batch, i, lead, bmean, pairwise):  # pragma: no cover - compiled
    """Squared skewness of arm ``i``'s rewards on the batch (of its differences with the leader)."""
    m = batch.shape[1]
    centre = bmean[lead] - bmean[i] if pairwise else bmean[i]
    acc = 0.0
    acc3 = 0.0
    for k in range(m):
        if pairwise:
            c = batch[lead, k] - batch[i, k] - centre
        else:
            c = batch[i, k] - centre
        c2 = c * c
        acc += c2
        acc3 += c2 * c
    return _g1sq(acc, acc3, m, centre)


@njit_cached(fastmath=_FAST)
def skew_guard(
    lead, keep, score, m2, n_var, size, n_obs, cantelli, pairwise, batch, bmean
):  # pragma: no cover - compiled
    r"""Keep the arms whose elimination rests on a mean too skewed to be near-normal.

    An arm about to be dropped is doubtful when its gap to the leader is
    below ``cantelli`` standard errors (a larger gap is decisive for any
    distribution, by Cantelli's inequality). A doubtful arm is kept when
    Cochran's rule fails: the mean of :math:`T` draws is close to normal
    once :math:`T > 25 \hat g_1^2`, with :math:`\hat g_1` the skewness on
    the latest batch (of its differences with the leader in pairwise mode).
    In marginal mode, a leader that fails the rule keeps every arm.

    Parameters
    ----------
    lead : int
        Row of the leader.
    keep : numpy.ndarray
        ``(S,)`` bool, the bound's verdict.
    score : numpy.ndarray
        ``(S,)`` running means plus offsets.
    m2 : numpy.ndarray
        ``(S,)`` centred sums of squares (of differences with the leader
        when ``pairwise``) over ``n_var`` observations.
    n_var : int
        Observations behind ``m2``.
    size, n_obs : int
        :math:`T` and :math:`N` (finite-population correction).
    cantelli : float
        Standard errors beyond which a gap is decisive.
    pairwise : bool
        Variance mode.
    batch : numpy.ndarray
        ``(S, m)`` rewards of the latest batch; the skewness :math:`\hat g_1`
        is computed from it only for the doubtful arms (and the leader).
    bmean : numpy.ndarray
        ``(S,)`` means on the latest batch, as returned by
        :func:`look_pairwise` or :func:`look_marginal`.

    Returns
    -------
    numpy.ndarray
        The new ``keep``.
    """
    s = len(keep)
    out = keep.copy()
    fpc = np.sqrt((n_obs - size) / (n_obs - 1.0) / size)
    var_lead = max(m2[lead] / n_var, 0.0)
    lead_checked = False
    for i in range(s):
        if keep[i]:
            continue
        var = max(m2[i] / n_var, 0.0)
        sd = np.sqrt(var) if pairwise else np.sqrt(var + var_lead)
        if score[lead] - score[i] >= cantelli * sd * fpc:
            continue
        if not pairwise and not lead_checked:
            lead_checked = True
            # pairwise (False here), not the literal: a literal is a second compilation
            if size < 25.0 * _batch_g1sq(batch, lead, lead, bmean, pairwise):
                return np.ones(s, dtype=np.bool_)
        if size < 25.0 * _batch_g1sq(batch, i, lead, bmean, pairwise):
            out[i] = True
    return out


@njit_cached(fastmath=_FAST)
def look_normal(
    batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor, pairwise, guard, n_obs, cantelli
):  # pragma: no cover - compiled
    r"""One whole Racing-Normal look in one compiled call: statistics, bound and skew guard.

    :func:`look_pairwise` (``pairwise``) or :func:`look_marginal`, then, when
    the bound drops an arm and ``guard`` is set, :func:`skew_guard` on the
    merged statistics (:math:`T` = ``n + m``; the variance is over the
    leader's ``n_ref`` observations in pairwise mode, :math:`T` otherwise).
    One call instead of two saves a Python round trip per look.

    Parameters
    ----------
    batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor
        As for :func:`look_pairwise` (``dmean``, ``ref`` and ``n_ref`` are
        passed through unchanged in marginal mode).
    pairwise : bool
        Variance mode.
    guard : bool
        Apply Cochran's rule (:func:`skew_guard`) to the arms the bound drops.
    n_obs : int
        Population size :math:`N`.
    cantelli : float
        Standard errors beyond which a gap is decisive (:func:`skew_guard`).

    Returns
    -------
    tuple
        ``(stats, lead, n_ref, n_keep, keep)``: ``stats`` a fresh ``(3, s)``
        array whose rows are the merged ``mean``, ``dmean`` and ``m2``;
        ``n_keep`` the number of arms ``keep`` marks. ``lead`` is −1 (nothing
        merged) when some reward is not finite. Two arrays, not four: each
        array returned to Python costs about a microsecond to box.
    """
    new_mean, lead, tot, new_dmean, new_m2, keep = _look_normal(
        batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor, pairwise, guard, n_obs,
        cantelli,
    )  # fmt: skip
    stats = np.empty((3, len(keep)))
    stats[0] = new_mean
    stats[1] = new_dmean
    stats[2] = new_m2
    return stats, lead, tot, np.count_nonzero(keep), keep


@njit_cached(fastmath=_FAST)
def _look_normal(
    batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor, pairwise, guard, n_obs, cantelli
):  # pragma: no cover - compiled
    """Run the look of :func:`look_normal`; return ``(mean, lead, n_ref, dmean, m2, keep)``."""
    s, m = batch.shape
    size = n + m
    if pairwise:
        new_mean, lead, tot, new_dmean, new_m2, keep, bmean = look_pairwise(
            batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor
        )
        n_var = max(tot, 1)
    else:
        new_mean, lead, new_m2, keep, bmean = look_marginal(
            batch, n, mean, m2, offsets, factor, floor
        )
        tot = n_ref
        new_dmean = dmean
        n_var = size
    if not (lead < 0 or s == 1 or not guard or keep.all()):
        score = new_mean + offsets
        keep = skew_guard(
            lead, keep, score, new_m2, n_var, size, n_obs, cantelli, pairwise, batch, bmean
        )
    return new_mean, lead, tot, new_dmean, new_m2, keep


@njit_cached(fastmath=_FAST)
def look_rows(
    batch, n, rows, ref, n_ref, factor, floor, pairwise, guard, n_obs, cantelli, new, last
):  # pragma: no cover - compiled
    r""":func:`look_normal` on a state held as rows, for the Python driver.

    Parameters
    ----------
    batch, n, ref, n_ref, factor, floor, pairwise, guard, n_obs, cantelli
        As for :func:`look_normal`.
    rows : numpy.ndarray
        ``(4, s)``: the survivors' running ``mean``, ``dmean``, ``m2`` and
        offsets, one row each (:class:`~pymc_subsample.racing.race.RaceState`).
    new : numpy.ndarray
        ``(5, s)``, written: the merged four rows, then ``keep`` as 1.0 / 0.0.
    last : tuple of float
        ``(factor, floor)`` of the last subsampled look, for the give-up test
        (:func:`stuck_arms` on the arms kept); a negative factor skips it.

    Returns
    -------
    tuple
        ``(lead, n_ref, n_keep, n_stuck)``, with ``n_stuck`` −1 when the
        give-up test was skipped. Scalars only, and fewer arguments than
        :func:`look_normal` and :func:`stuck_arms` called apart: boxing an
        array returned to Python (dearer than allocating it there), typing
        the arguments and the calls themselves are most of what a look costs
        the Python driver.
    """
    mean, dmean, m2, offsets = rows[0], rows[1], rows[2], rows[3]
    new_mean, lead, tot, new_dmean, new_m2, keep = _look_normal(
        batch, n, mean, ref, n_ref, dmean, m2, offsets, factor, floor, pairwise, guard, n_obs,
        cantelli,
    )  # fmt: skip
    new[0] = new_mean
    new[1] = new_dmean
    new[2] = new_m2
    new[3] = offsets
    n_keep = 0
    for i in range(len(keep)):
        new[4, i] = 1.0 if keep[i] else 0.0
        n_keep += keep[i]
    n_stuck = -1
    if lead >= 0 and last[0] >= 0.0:  # after a look the differences track its leader
        size = n + batch.shape[1]
        n_stuck = _count_stuck(
            new_mean, offsets, new_m2, keep, lead, tot, size, pairwise, last[0], last[1], n_obs
        )
    return lead, tot, n_keep, n_stuck


@njit_cached()
def stuck_arms(
    mean, offsets, m2, ref, n_ref, n_drawn, pairwise, factor, floor, n_obs
):  # pragma: no cover
    r"""Count the survivors a race is unlikely to drop before its last subsampled look.

    With :math:`\hat x` the leader of ``mean + offsets``, arm :math:`i` is
    stuck when :math:`\hat\mu_{\hat x} - \hat\mu_i + c\,\widehat{\mathrm{se}}_i
    < \texttt{factor}\,\max(\hat\sigma_i, \texttt{floor})`, :math:`c` =
    :data:`GIVE_UP_MARGIN`, the half-width
    the bound will still have at that look (see
    :meth:`~pymc_subsample.racing.race.SharedRace.hopeless`). Pairwise: −1
    (no verdict) while the differences do not track the current leader.
    """
    s = len(mean)
    lead = 0
    best = mean[0] + offsets[0]
    for i in range(1, s):
        if mean[i] + offsets[i] > best:
            best = mean[i] + offsets[i]
            lead = i
    if pairwise and (ref != lead or n_ref == 0):
        return -1
    keep = np.ones(s, dtype=np.bool_)
    return _count_stuck(
        mean, offsets, m2, keep, lead, n_ref, n_drawn, pairwise, factor, floor, n_obs
    )


@njit_cached()
def _count_stuck(
    mean, offsets, m2, keep, lead, n_ref, n_drawn, pairwise, factor, floor, n_obs
):  # pragma: no cover - compiled
    """Count what :func:`stuck_arms` counts, among the arms ``keep`` marks, leader ``lead``."""
    best = mean[lead] + offsets[lead]
    t = n_drawn
    fpc = np.sqrt((n_obs - t) / ((n_obs - 1.0) * t))
    var_lead = max(m2[lead] / n_drawn, 0.0)
    stuck = 0
    for i in range(len(mean)):
        if i == lead or not keep[i]:
            continue
        if pairwise:
            sd = np.sqrt(max(m2[i] / n_ref, 0.0))
        else:
            sd = np.sqrt(max(m2[i] / n_drawn, 0.0) + var_lead)
        gap = best - (mean[i] + offsets[i])
        if gap + GIVE_UP_MARGIN * sd * fpc < factor * max(sd, floor):
            stuck += 1
    return stuck


@njit_cached()
def stuck_rows(rows, ref, n_ref, n_drawn, pairwise, factor, floor, n_obs):  # pragma: no cover
    """Count the stuck arms (:func:`stuck_arms`) of a state held as rows (:func:`look_rows`)."""
    return stuck_arms(
        rows[0], rows[3], rows[2], ref, n_ref, n_drawn, pairwise, factor, floor, n_obs
    )

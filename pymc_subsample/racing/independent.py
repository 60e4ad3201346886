r"""Racing arms that have their own reward populations, of unequal sizes.

Arm :math:`i` owns a finite population :math:`\{l_{i,1}, \dots, l_{i,N_i}\}`
and the arm to find is the one of largest *total*

.. math:: x^* = \arg\max_i \; N_i (\mu_i + o_i), \qquad
          \mu_i = \frac{1}{N_i} \sum_{n=1}^{N_i} l_{i,n},

with :math:`o_i` an optional constant per reward (the Gumbel noise of a
Gumbel-max draw, spread over the population). Unlike the shared-index race,
two arms share no observations, so only marginal variances exist and the
arms are compared through confidence intervals on their totals. This is the
race of the author-coreference experiment of Chen & Ghahramani (2016,
Sec. 5.3 and App. C.3): one arm per candidate cluster, whose population is the
factors between a mention and the current members of that cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from scipy import stats

from ..validation import check_choice, check_float, check_int
from .bounds import ebs_width, normal_threshold, normal_width, rare_event_floor
from .common import RaceResult, argmax_or_raise, check_probability, checked_rewards
from .schedule import IndexStream, doubling_schedule

__all__ = ["INDEPENDENT_BOUNDS", "QUANTILES", "cluster_schedule", "race_independent"]

#: Names accepted by ``bound`` in :func:`race_independent`.
INDEPENDENT_BOUNDS = ("normal", "ebs", "exact")
#: Names accepted by ``quantile`` in :func:`race_independent`.
QUANTILES = ("t", "normal", "joint")


@lru_cache(maxsize=1 << 16)
def _t_quantile(df: int, p: float) -> float:
    """Upper ``p`` quantile of Student's t with ``df`` degrees of freedom (cached)."""
    return float(stats.t.isf(p, max(df, 1)))


#: ``rewards(arm, idx) -> 1-D array of len(idx)``: arm ``arm``'s rewards at
#: indices ``idx`` of its own population ``range(sizes[arm])``.
ArmRewardFn = Callable[[int, np.ndarray], np.ndarray]


def cluster_schedule(n_obs: int, first: int = 3, fraction: float = 0.1) -> np.ndarray:
    r"""Cumulative look sizes of the author-coreference race (Chen & Ghahramani 2016, App. C.3).

    .. math:: T^{(1)} = m^{(1)}, \quad
              T^{(2)} = m^{(1)} + \max(\lceil f\,(N - m^{(1)}) \rceil, 1), \quad
              T^{(t+1)} = \min(2 T^{(t)}, N),

    with :math:`m^{(1)} = 3` and :math:`f = 1/10` in the paper. A first batch
    of 50, the usual Racing-Normal choice, would already read a third of the
    factors when cluster sizes follow a power law.

    Parameters
    ----------
    n_obs : int
        Population size :math:`N \ge 1`.
    first : int
        :math:`m^{(1)}`, at least 2 (a variance needs two draws).
    fraction : float
        :math:`f`, in (0, 1].

    Returns
    -------
    numpy.ndarray
        Strictly increasing int64 cumulative sizes ending at ``n_obs``.
    """
    n_obs = check_int("n_obs", n_obs, low=1, example=1000)
    first = check_int("first", first, low=2, example=3, why=" (a variance needs two draws)")
    fraction = check_float("fraction", fraction, low=0.0, high=1.0, low_open=True, example=0.1)
    if n_obs <= first:
        return np.array([n_obs], dtype=np.int64)
    sizes = [int(first)]
    t = first + max(math.ceil(fraction * (n_obs - first)), 1)
    while t < n_obs:
        sizes.append(t)
        t *= 2
    sizes.append(n_obs)
    return np.asarray(sizes, dtype=np.int64)


def _checked_arm(rewards: ArmRewardFn, arm: int, idx: np.ndarray) -> tuple[np.ndarray, bool]:
    """Call ``rewards(arm, idx)``; check its shape, NaN and +inf."""
    out = np.asarray(rewards(arm, idx), dtype=np.float64)
    if out.shape != (len(idx),):
        raise ValueError(
            f"rewards(arm, idx) must return a 1-D array of len(idx) = {len(idx)}, "
            f"got shape {out.shape} for arm {arm}"
        )
    if math.isfinite(out.sum()):  # fast path: every entry finite
        return out, True
    out2, finite = checked_rewards(lambda _a, _i: out[None, :], np.array([arm]), idx)
    return out2[0], finite


def _looks(sizes: np.ndarray, schedules, batch_size: int) -> list[list[int]]:
    """Per-arm cumulative look sizes: looks below 2 dropped, ``N_i`` appended."""
    if schedules is None:
        raw = [doubling_schedule(int(n), batch_size) for n in sizes]
    else:
        raw = list(schedules)
        if len(raw) != len(sizes):
            raise ValueError(f"schedules has {len(raw)} entries for {len(sizes)} arms")
    out = []
    for i, (lk, n) in enumerate(zip(raw, sizes.tolist(), strict=True)):
        lk = lk.tolist() if isinstance(lk, np.ndarray) else [int(t) for t in lk]
        if lk and (
            lk[0] < 1 or lk[-1] > n or any(a >= b for a, b in zip(lk, lk[1:], strict=False))
        ):
            raise ValueError(
                f"schedules[{i}] must be increasing cumulative sizes in [1, N_i = {n}], got {lk}"
            )
        lk = [t for t in lk if 2 <= t < n]  # a look needs two draws for a variance
        lk.append(n)
        out.append(lk)
    return out


#: Arms up to this size draw their order as one permutation; larger ones use IndexStream.
_PERMUTE_LIMIT = 1 << 16


def race_independent(
    rewards: ArmRewardFn,
    sizes: Sequence[int] | np.ndarray,
    *,
    delta: float = 0.05,
    bound: str = "normal",
    schedules: Sequence[Sequence[int]] | None = None,
    batch_size: int = 50,
    rng: np.random.Generator | int | None = None,
    reward_range: float | Sequence[float] | None = None,
    offsets: Sequence[float] | np.ndarray | None = None,
    quantile: str = "t",
) -> RaceResult:
    r"""Find the arm of largest total reward over populations of unequal sizes.

    Each arm :math:`i` draws its own indices without replacement from
    :math:`\{0, \dots, N_i - 1\}` on its schedule :math:`T_i^{(1)} < \dots <
    T_i^{(K_i)} = N_i`; all surviving arms advance one look per round. After a
    round, with :math:`\hat\mu_i` the mean of the :math:`T_i` rewards drawn,
    :math:`\hat S_i = N_i(\hat\mu_i + o_i)` the estimated total and
    :math:`\hat x = \arg\max_i \hat S_i` the leader, arm :math:`i` is dropped
    when

    .. math:: \hat S_{\hat x} - N_{\hat x} G_{\hat x} > \hat S_i + N_i G_i ,

    with :math:`G_i = G(\delta / D, T_i, \hat\sigma_i)` the half-width for the
    mean of arm :math:`i` (marginal variance; zero once :math:`T_i = N_i`).
    The best arm survives every look with probability at least
    :math:`1 - \delta` (union bound over the :math:`D` arms, one-sided
    intervals; Chen & Ghahramani 2016, Prop. 3 with each arm's own :math:`T_i`
    and :math:`N_i`). The race ends when one arm is left or every survivor is
    exact; then the largest exact total wins, lowest index first on ties.

    Arms with :math:`N_i \le 2` (or whose schedule has no look of at least two
    draws below :math:`N_i`) are evaluated exactly at the first look. An arm
    with a −inf reward has total −inf and leaves at once.

    Parameters
    ----------
    rewards : callable
        ``rewards(arm, idx)`` returns arm ``arm``'s rewards at the int64 indices
        ``idx`` of its own population ``range(sizes[arm])``, as a 1-D array of
        ``len(idx)`` entries, each finite or −inf.
    sizes : sequence of int
        Population sizes :math:`N_i \ge 1`, one per arm.
    delta : float
        Probability of returning a wrong arm, in (0, 1).
    bound : {"normal", "ebs", "exact"}
        ``"normal"``: Racing-Normal, :math:`G_i = B_i s_{T_i}` with
        :math:`s_T = \tilde\sigma_i \sqrt{(N_i - T)/((N_i - 1) T)}`,
        :math:`B_i` a quantile at :math:`\delta/(D K_i')` for arm :math:`i`'s
        own schedule of :math:`K_i'` looks before :math:`N_i` (see
        ``quantile``) and :math:`\tilde\sigma_i` the biased standard
        deviation floored at :math:`C_i\sqrt{p_0(1-p_0)}`,
        :math:`p_0 = 1/(T_i+1)` (rare events).
        ``"ebs"``: empirical Bernstein–Serfling at :math:`\delta/(D K_i')`,
        :math:`K_i'` the number of looks of arm :math:`i` before
        :math:`N_i`. ``"exact"``: evaluate every reward.
    schedules : sequence of sequences of int, optional
        One increasing cumulative-size sequence per arm, ending at (or below)
        :math:`N_i`; :math:`N_i` is appended when missing and looks below 2
        are skipped. The bounds are computed for these schedules. Default: the
        doubling schedule from ``batch_size``, clipped at each :math:`N_i`.
        :func:`cluster_schedule` gives the author-coreference one.
    batch_size : int
        First look :math:`m^{(1)} \ge 2` of the default schedules.
    rng : numpy.random.Generator or int, optional
        Source of the index draws.
    reward_range : float or sequence of float, optional
        :math:`C_i`, a bound on :math:`\max_n l_{i,n} - \min_n l_{i,n}` (one
        for all arms, or one per arm). When ``None`` the range of the rewards
        drawn so far is used in its place; that plug-in cannot see an event no
        look has drawn yet.
    offsets : array_like, optional
        :math:`o_i`, a constant added to each of arm :math:`i`'s rewards, so
        that its total moves by :math:`N_i o_i` (for a Gumbel-max draw,
        :math:`o_i = (\log f_0(i) + \varepsilon_i)/N_i`).
    quantile : {"t", "normal", "joint"}
        Racing-Normal only: how :math:`B_i` is set at a look of :math:`T_i`
        draws. ``"t"`` (default): the Student-t quantile
        :math:`t_{T_i-1}^{-1}(1 - \delta/(D K_i'))` with the unbiased standard
        deviation (union bound over arm :math:`i`'s :math:`K_i'` looks before
        :math:`N_i`). The App. C.3 schedule looks first at 3 draws, where the
        normal quantile is far too small: on a hard race its error rate
        exceeds :math:`\delta` (see the tests and the results pages).
        ``"normal"``: :math:`\Phi^{-1}(1 - \delta/(D K_i'))`, the paper's
        Racing-Normal with a union bound over looks. ``"joint"``: the normal
        threshold from the joint Gaussian law of the looks
        (:func:`~pymc_subsample.racing.bounds.normal_threshold` at
        :math:`\delta/D`), barely below ``"normal"`` on the
        :func:`cluster_schedule` looks but solved numerically for every new
        ``(schedule, N_i, D)``, too slow when cluster sizes change at every
        Gibbs step.

    Returns
    -------
    RaceResult
        ``means[i]`` is :math:`\hat\mu_i + o_i` when arm :math:`i` left the
        race (exact for arms drawn to :math:`N_i`; −inf for arms with a −inf
        reward).

    Raises
    ------
    ValueError
        For ``delta`` outside (0, 1), an unknown ``bound``, sizes that are not
        positive integers, ``batch_size < 2``, malformed ``schedules``,
        ``offsets`` or ``reward_range``, a ``rewards`` callback returning the
        wrong shape, NaN or +inf, or when every arm has a −inf reward.
    """
    delta = check_probability(delta)
    check_choice("bound", bound, INDEPENDENT_BOUNDS)
    check_choice("quantile", quantile, QUANTILES)
    sizes = np.asarray(sizes)
    if (
        sizes.ndim != 1
        or len(sizes) == 0
        or not np.issubdtype(sizes.dtype, np.integer)
        or (sizes < 1).any()
    ):
        raise ValueError(f"sizes must be a non-empty 1-D sequence of integers >= 1, got {sizes!r}")
    sizes = sizes.astype(np.int64)
    n_arms = len(sizes)
    batch_size = check_int(
        "batch_size", batch_size, low=2, example=50, why=" (a variance needs two draws)"
    )
    offsets = np.zeros(n_arms) if offsets is None else np.asarray(offsets, dtype=float)
    if offsets.shape != (n_arms,) or not np.isfinite(offsets).all():
        raise ValueError(f"offsets must be {n_arms} finite numbers (one per arm), got {offsets!r}")
    if reward_range is not None:
        c_user = np.broadcast_to(np.asarray(reward_range, dtype=float), (n_arms,)).copy()
        if not (np.isfinite(c_user).all() and (c_user >= 0).all()):
            raise ValueError(f"reward_range must be finite and >= 0, got {reward_range!r}")
    rng = np.random.default_rng(rng)
    looks = _looks(sizes, schedules, int(batch_size))

    if bound == "exact":
        return _exact(rewards, sizes, offsets)

    delta_arm = delta / n_arms
    n_looks = np.array([max(len(lk) - 1, 1) for lk in looks])
    if bound == "normal" and quantile == "joint":
        thresholds = np.array(
            [
                normal_threshold(lk[:-1], int(n), delta_arm)
                for lk, n in zip(looks, sizes, strict=True)
            ]
        )
    elif bound == "normal" and quantile == "normal":
        thresholds = stats.norm.isf(delta_arm / n_looks)
    else:
        delta_look = delta_arm / n_looks
    orders: list = [None] * n_arms  # a permutation, or an IndexStream for big arms
    size_list = sizes.tolist()
    sums = [0.0] * n_arms  # running sums of the rewards drawn
    sumsq = [0.0] * n_arms  # running sums of squared deviations (Chan et al. merge)
    drawn = [0] * n_arms
    lo = [math.inf] * n_arms
    hi = [-math.inf] * n_arms
    means = np.full(n_arms, np.nan)
    alive = np.ones(n_arms, dtype=bool)
    dead_inf = np.zeros(n_arms, dtype=bool)
    n_evals = 0
    n_rounds = 0
    while True:
        n_rounds += 1
        for i in np.flatnonzero(alive).tolist():
            lk = looks[i]
            target = lk[min(n_rounds - 1, len(lk) - 1)]
            prev = drawn[i]
            k = target - prev
            if k <= 0:
                continue
            order = orders[i]
            if order is None and target == size_list[i]:
                idx = np.arange(target, dtype=np.int64)
            elif isinstance(order, IndexStream):
                idx = order.take(k)
            else:
                if order is None:
                    n_i = size_list[i]
                    if n_i <= _PERMUTE_LIMIT:
                        order = orders[i] = rng.permutation(n_i)
                    else:
                        order = orders[i] = IndexStream(n_i, rng)
                        idx = order.take(k)
                if not isinstance(order, IndexStream):
                    idx = order[prev:target]
            batch, finite = _checked_arm(rewards, i, idx)
            n_evals += k
            if not finite:
                drawn[i] = target  # counted in n_drawn and exhausted like any draw
                alive[i] = False
                dead_inf[i] = True
                means[i] = -np.inf
                continue
            bsum = float(batch.sum())
            bmean = bsum / k
            dev = batch - bmean
            m2 = float(dev @ dev)
            if prev:
                d = bmean - sums[i] / prev
                m2 += d * d * prev * k / target
            sumsq[i] += m2
            sums[i] += bsum
            drawn[i] = target
            bmin, bmax = float(batch.min()), float(batch.max())
            if bmin < lo[i]:
                lo[i] = bmin
            if bmax > hi[i]:
                hi[i] = bmax
        if not alive.any():
            # every survivor hit -inf: the best arm was dropped earlier; decide the rest exactly
            others = np.flatnonzero(~dead_inf)
            if len(others) == 0:
                argmax_or_raise(np.full(1, -np.inf))
            totals = np.full(len(others), -np.inf)
            for k, i in enumerate(others.tolist()):
                rest = size_list[i] - drawn[i]
                if rest:
                    order = orders[i]
                    if order is None:
                        idx = np.arange(rest, dtype=np.int64)
                    elif isinstance(order, IndexStream):
                        idx = order.take(rest)
                    else:
                        idx = order[drawn[i] :]
                    batch, finite = _checked_arm(rewards, i, idx)
                    n_evals += rest
                    drawn[i] = size_list[i]
                    if not finite:
                        means[i] = -np.inf
                        continue
                    sums[i] += float(batch.sum())
                means[i] = sums[i] / size_list[i] + offsets[i]
                totals[k] = size_list[i] * means[i]
            winner = int(others[argmax_or_raise(totals)])
            return RaceResult(winner, n_evals, n_rounds + 1, True, max(drawn), means)
        live = np.flatnonzero(alive)
        live_l = live.tolist()
        n = np.array([drawn[i] for i in live_l], dtype=np.int64)
        big_n = sizes[live]
        mean = np.array([sums[i] for i in live_l]) / n + offsets[live]
        total = big_n * mean
        exact = n >= big_n
        if len(live) == 1 or exact.all():
            means[live] = mean
            winner = int(live[int(np.argmax(total))])
            return RaceResult(
                winner, n_evals, n_rounds, _any_full(drawn, size_list), max(drawn), means
            )
        sigma = np.sqrt(np.maximum(np.array([sumsq[i] for i in live_l]) / n, 0.0))
        if reward_range is None:
            c = np.array([hi[i] - lo[i] for i in live_l])
        else:
            c = c_user[live]
        safe_n = np.maximum(n, 1)
        if bound == "normal":
            if quantile == "t":
                # unbiased sd with Student-t quantiles at T_i - 1 degrees of freedom
                sigma = sigma * np.sqrt(safe_n / np.maximum(safe_n - 1, 1))
                thr = np.array(
                    [
                        _t_quantile(int(t) - 1, float(p))
                        for t, p in zip(safe_n, delta_look[live], strict=True)
                    ]
                )
            else:
                thr = thresholds[live]
            sigma = np.maximum(sigma, rare_event_floor(c, safe_n))
            width = normal_width(thr, sigma, safe_n, big_n)
        else:
            width = ebs_width(delta_look[live], sigma, safe_n, big_n, c)
        width = np.where(exact, 0.0, width)
        half = big_n * width
        lead = int(np.argmax(total))
        drop = total[lead] - half[lead] > total + half
        drop[lead] = False
        if drop.any():
            gone = live[drop]
            means[gone] = mean[drop]
            alive[gone] = False
            if len(live) - len(gone) == 1:
                means[live[~drop]] = mean[~drop]
                return RaceResult(
                    int(live[~drop][0]),
                    n_evals,
                    n_rounds,
                    _any_full(drawn, size_list),
                    max(drawn),
                    means,
                )


def _any_full(drawn: list[int], sizes: list[int]) -> bool:
    """Tell whether some arm was drawn to its whole population."""
    return any(d >= n for d, n in zip(drawn, sizes, strict=True))


def _exact(rewards, sizes, offsets):
    """Decide on exact totals: every reward of every arm."""
    means = np.full(len(sizes), -np.inf)
    for i, n in enumerate(sizes):
        batch, finite = _checked_arm(rewards, i, np.arange(int(n), dtype=np.int64))
        if finite:
            means[i] = float(batch.sum()) / n + offsets[i]
    winner = argmax_or_raise(sizes * means)
    return RaceResult(winner, int(sizes.sum()), 1, True, int(sizes.max()), means)

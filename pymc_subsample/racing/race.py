r"""Best-arm identification on finite reward populations by racing.

Implements Alg. 1 of seed 000 (Racing-Normal, Racing-EBS), the adapted
lil'UCB of Sec. 3.2 (in :mod:`pymc_subsample.racing.lilucb`) and an exact
reference, behind one function, :func:`race`. The arm to find is

.. math:: x^* = \arg\max_i \sum_{n=1}^{N_i} l_{i,n} = \arg\max_i N_i \mu_i ,

which for a common population size :math:`N` is the arm of highest mean reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .bounds import ebs_width, normal_threshold, normal_width, rare_event_floor
from .schedule import IndexStream, doubling_schedule

__all__ = ["BOUNDS", "VARIANCES", "RaceResult", "RewardFn", "race"]

#: Names accepted by ``bound``.
BOUNDS = ("normal", "ebs", "lilucb", "exact")
#: Names accepted by ``variance``.
VARIANCES = ("pairwise", "marginal")

#: ``rewards(arms, idx) -> array of shape (len(arms), len(idx))``.
RewardFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

_EXACT_CHUNK = 1 << 24  # rewards per call when evaluating a whole population
_GRAM_LIMIT = 16  # above this many arms, pairwise Racing-Normal uses batch variances


@dataclass(frozen=True)
class RaceResult:
    """Outcome of one race.

    Attributes
    ----------
    winner : int
        Index of the arm returned.
    n_evaluations : int
        Rewards drawn in total, over all arms and rounds (at most ``sum(N_i)``).
    n_rounds : int
        Number of looks (rounds of the schedule, or blocks of pulls for lil'UCB).
    exhausted : bool
        True when some arm had to be evaluated on its whole population.
    n_drawn : int
        Largest number of observations drawn for one arm.
    means : numpy.ndarray or None
        Estimated mean reward of each arm (offset included) when it left the
        race, exact for arms evaluated on all observations; NaN for arms never
        evaluated. Recorded by the shared-index races and ``bound="exact"``.
    """

    winner: int
    n_evaluations: int
    n_rounds: int
    exhausted: bool
    n_drawn: int
    means: np.ndarray | None = None


def _check_probability(delta: float) -> float:
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}; e.g. delta=0.05")
    return delta


def validate_race_args(delta, bound, batch_size, variance, n_arms) -> float:
    """Check the arguments shared by :func:`race` and the samplers built on it.

    Parameters
    ----------
    delta : float
        Error probability, in (0, 1).
    bound : str
        One of :data:`BOUNDS`.
    batch_size : int
        First mini-batch size, at least 2.
    variance : str
        One of :data:`VARIANCES`.
    n_arms : int
        Number of arms, at least 1.

    Returns
    -------
    float
        ``delta`` as a float.

    Raises
    ------
    ValueError
        Naming the argument at fault and the accepted values.
    """
    delta = _check_probability(delta)
    if bound not in BOUNDS:
        raise ValueError(f"unknown bound {bound!r}; choose one of {BOUNDS}")
    if variance not in VARIANCES:
        raise ValueError(f"unknown variance {variance!r}; choose one of {VARIANCES}")
    if int(batch_size) != batch_size or batch_size < 2:
        raise ValueError(
            f"batch_size must be an integer >= 2 (a variance needs two draws), got {batch_size!r}"
        )
    if int(n_arms) != n_arms or n_arms < 1:
        raise ValueError(f"n_arms must be a positive integer, got {n_arms!r}")
    return delta


def checked_rewards(rewards: RewardFn, arms: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Call ``rewards(arms, idx)`` and check its shape and values (see :func:`_checked`)."""
    return _checked(rewards, arms, idx)[0]


def _checked(rewards: RewardFn, arms: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, bool]:
    """Call ``rewards(arms, idx)`` and check its shape and values.

    Parameters
    ----------
    rewards : callable
        The reward callback.
    arms, idx : numpy.ndarray
        Arm indices and observation indices.

    Returns
    -------
    rewards : numpy.ndarray
        float64 array of shape ``(len(arms), len(idx))``; entries finite or −inf.
    all_finite : bool
        False when some entry is −inf.

    Raises
    ------
    ValueError
        On a wrong shape, NaN or +inf.
    """
    out = np.asarray(rewards(arms, idx), dtype=np.float64)
    if out.shape != (len(arms), len(idx)):
        raise ValueError(
            f"rewards(arms, idx) must return shape (len(arms), len(idx)) = "
            f"{(len(arms), len(idx))}, got {out.shape}"
        )
    finite = math.isfinite(out.sum())  # fast path: a finite sum means every entry is finite
    if not finite:
        if np.isnan(out).any():
            raise ValueError(
                "rewards(arms, idx) returned NaN; a log-likelihood term must be a number or -inf"
            )
        if np.isposinf(out).any():
            raise ValueError(
                "rewards(arms, idx) returned +inf; a log-likelihood term must be finite or -inf"
            )
    return out, finite


def exact_totals(rewards: RewardFn, arms: np.ndarray, n_obs: int) -> np.ndarray:
    """Sum of the rewards of ``arms`` over their whole (common) population.

    Evaluated in chunks of at most ``2**24`` rewards, in index order.

    Parameters
    ----------
    rewards : callable
        The reward callback.
    arms : numpy.ndarray
        Arm indices.
    n_obs : int
        Population size.

    Returns
    -------
    numpy.ndarray
        One total per arm (−inf when any reward is −inf).
    """
    step = max(1, _EXACT_CHUNK // max(len(arms), 1))
    total = np.zeros(len(arms))
    for start in range(0, n_obs, step):
        idx = np.arange(start, min(start + step, n_obs))
        total += checked_rewards(rewards, arms, idx).sum(axis=1)
    return total


def _argmax_or_raise(values: np.ndarray) -> int:
    if not np.isfinite(values).any():
        raise ValueError(
            "every arm has a -inf reward: the target is zero at every candidate "
            "(check the model and the initial point)"
        )
    return int(np.argmax(values))


def race(
    rewards: RewardFn,
    n_arms: int,
    n_obs: int | Sequence[int],
    *,
    delta: float = 0.05,
    bound: str = "normal",
    batch_size: int = 50,
    variance: str = "pairwise",
    rng: np.random.Generator | int | None = None,
    reward_range: float | None = None,
    schedule: Sequence[int] | None = None,
    offsets: np.ndarray | None = None,
    exact_after: int | None = None,
    totals: Callable[[np.ndarray], np.ndarray] | None = None,
    skew_guard: bool = True,
) -> RaceResult:
    r"""Identify the arm of highest total reward, with error at most ``delta``.

    Racing (seed 000, Alg. 1): shared mini-batches of observation indices are
    drawn without replacement on the schedule :math:`T^{(t)}` (doubling from
    ``batch_size``, last look at :math:`N`); after each, arm :math:`i` is
    dropped when, with :math:`\hat x` the current leader,

    - pairwise: :math:`\hat\mu_{\hat x} - \hat\mu_i > G(\delta/(D-1), T, \hat\sigma_{\hat x,i})`
    - marginal: :math:`\hat\mu_{\hat x} - G(\delta/D, T, \hat\sigma_{\hat x}) >
      \hat\mu_i + G(\delta/D, T, \hat\sigma_i)`.

    An arm with a −inf reward is dropped at once. Identical arms never
    separate; the race then ends at :math:`T = N` and the lowest index wins.

    Parameters
    ----------
    rewards : callable
        ``rewards(arms, idx)`` returns ``l[arms][:, idx]``, shape
        ``(len(arms), len(idx))``, for 0-based integer arrays. Entries must be
        finite or −inf.
    n_arms : int
        Number of arms :math:`D`.
    n_obs : int or sequence of int
        Population size :math:`N`, shared by all arms; or one size :math:`N_i`
        per arm. With per-arm sizes the arms are independent populations:
        ``rewards`` is called one arm at a time (``arms`` of length 1, ``idx``
        indexing that arm's own population), the variance must be
        ``"marginal"``, each arm follows the doubling schedule clipped at its
        own :math:`N_i`, and arms are compared on totals
        :math:`N_i \hat\mu_i \pm N_i G_i`.
    delta : float
        Probability of returning a wrong arm, in (0, 1).
    bound : {"normal", "ebs", "lilucb", "exact"}
        ``"normal"``: Racing-Normal, :math:`G = B s_T` with :math:`B` computed
        for the actual schedule from the joint Gaussian law of the looks
        (:func:`~pymc_subsample.racing.bounds.normal_threshold`).
        ``"ebs"``: Racing-EBS, the empirical Bernstein–Serfling bound with a
        union bound over looks. ``"lilucb"``: adapted lil'UCB
        (:func:`~pymc_subsample.racing.lilucb.lil_ucb`). ``"exact"``: evaluate
        everything.
    batch_size : int
        First mini-batch size :math:`m^{(1)}` (paper: 50 for Normal, 2 for EBS).
    variance : {"pairwise", "marginal"}
        Standard deviation of reward differences with the leader on shared
        indices (tighter when arms are positively correlated; cost
        :math:`O(D^2 T)` for the running cross-products), or of each arm alone
        (cost :math:`O(D T)`). With more than 16 arms, pairwise Racing-Normal
        estimates the standard deviation of the differences with the current
        leader on the latest batch (at least half of the observations drawn, by
        the doubling) instead, at cost :math:`O(D T)`.
    rng : numpy.random.Generator or int, optional
        Source of the index draws.
    reward_range : float, optional
        :math:`C`, an upper bound on :math:`\max_n l_{i,n} - \min_n l_{i,n}` for
        every arm. Racing-EBS needs it; lil'UCB uses :math:`C/2` as its scale;
        Racing-Normal floors its standard deviation at
        :math:`C' \sqrt{p_0(1-p_0)}`, :math:`p_0 = 1/(T+1)`, which protects
        against rare-event rewards (``ALGORITHMS.md`` §7), with
        :math:`C' = 2C` for pairwise differences. When it is ``None``, the
        range observed on the latest batch (of the differences with the
        leader, in pairwise mode) is used in its place. That plug-in cannot
        see an event no batch has drawn yet: on rare-event populations pass a
        true bound.
    schedule : sequence of int, optional
        Increasing cumulative sample sizes to use instead of doubling;
        ``n_obs`` is appended if missing. Bounds are computed for this schedule.
    offsets : array_like, optional
        A constant per arm added to every one of its rewards (the race then
        compares :math:`\mu_i + o_i`) without being added to each reward; the
        Gumbel-max sampler passes :math:`(\log f_0(i) + \varepsilon_i)/N` here.
    exact_after : int, optional
        Largest cumulative sample size drawn as a subset: the look after it is
        at :math:`N` (all remaining observations at once, an exact decision
        among the survivors). Useful when evaluating everything in one call is
        much cheaper per reward than gathering a large subset. The bounds are
        computed for the truncated schedule.
    totals : callable, optional
        ``totals(arms)`` returns :math:`\sum_{n=1}^N l_{i,n}` for ``i in arms``
        in one call. When given, exact decisions (``bound="exact"``, and the
        look at :math:`N` when fewer than :math:`N/2` observations were drawn
        before it) use it instead of gathering the remaining rewards; such a
        look counts :math:`N` evaluations per surviving arm, the observations
        drawn before included.
    skew_guard : bool
        Racing-Normal only: no arm is dropped at a look of :math:`T`
        observations while :math:`T < 25\,\hat g_1^2`, with :math:`\hat g_1`
        the sample skewness of the rewards (of the differences with the leader,
        in pairwise mode) on the latest batch (Cochran's rule for the normal
        approximation of a mean). It guards against heavy-tailed, skewed
        rewards whose large values a small batch only hints at; ``False``
        reproduces the paper's Racing-Normal. Not applied when
        ``reward_range`` is given (the rare-event floor then takes its role).

    Returns
    -------
    RaceResult

    Raises
    ------
    ValueError
        For ``delta`` outside (0, 1), an unknown ``bound`` or ``variance``,
        ``batch_size < 2``, ``n_arms < 1``, ``n_obs < 1``, or a ``rewards``
        callback that returns the wrong shape, NaN or +inf; or when every arm
        has a −inf reward.
    """
    delta = validate_race_args(delta, bound, batch_size, variance, n_arms)
    rng = np.random.default_rng(rng)
    offsets = np.zeros(int(n_arms)) if offsets is None else np.asarray(offsets, dtype=float)
    if offsets.shape != (int(n_arms),) or not np.isfinite(offsets).all():
        raise ValueError(f"offsets must be {n_arms} finite numbers, got {offsets!r}")
    sizes = np.atleast_1d(np.asarray(n_obs))
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
        raise ValueError(f"n_obs must be a positive integer or one per arm, got {n_obs!r}")
    if reward_range is not None and not (np.isfinite(reward_range) and reward_range >= 0):
        raise ValueError(f"reward_range must be a finite number >= 0, got {reward_range!r}")
    if len(sizes) > 1 or (np.ndim(n_obs) == 1 and n_arms > 1):
        if len(sizes) != n_arms:
            raise ValueError(f"n_obs has {len(sizes)} entries for {n_arms} arms")
        if not (sizes == sizes[0]).all():
            return _race_independent(
                rewards,
                sizes,
                delta,
                bound,
                int(batch_size),
                variance,
                rng,
                reward_range,
                offsets,
            )
    big_n = int(sizes[0])
    arms = np.arange(int(n_arms))
    if bound == "exact":
        sums = _totals(rewards, totals, arms, big_n) + big_n * offsets
        return RaceResult(_argmax_or_raise(sums), big_n * len(arms), 1, True, big_n, sums / big_n)
    if bound == "lilucb":
        from .lilucb import lil_ucb

        return lil_ucb(
            rewards,
            int(n_arms),
            big_n,
            delta=delta,
            batch_size=int(batch_size),
            rng=rng,
            reward_range=reward_range,
            offsets=offsets,
        )
    looks = _make_schedule(big_n, int(batch_size), schedule, exact_after)
    return _race_shared(
        rewards,
        arms,
        big_n,
        looks,
        delta,
        bound,
        variance,
        rng,
        reward_range,
        offsets,
        totals,
        skew_guard,
    )


def _make_schedule(n_obs: int, batch_size: int, schedule, exact_after) -> np.ndarray:
    if schedule is None:
        looks = doubling_schedule(n_obs, batch_size)
    else:
        looks = np.asarray(schedule, dtype=np.int64)
        if len(looks) and ((np.diff(looks) <= 0).any() or looks[0] < 2):
            raise ValueError("schedule must be increasing cumulative sizes starting at >= 2")
    looks = looks[looks < n_obs]
    if exact_after is not None:
        looks = looks[looks <= max(int(exact_after), 0)]
    return np.append(looks, n_obs)


class _Stats:
    """Running means and centred cross-products, merged batch by batch (Chan et al.)."""

    def __init__(self, n_arms: int, pairwise: bool):
        self.n = 0
        self.mean = np.zeros(n_arms)
        self.pairwise = pairwise
        self.m2 = np.zeros((n_arms, n_arms)) if pairwise else np.zeros(n_arms)

    def update(self, batch: np.ndarray) -> None:
        m = batch.shape[1]
        bmean = np.add.reduce(batch, axis=1) * (1.0 / m)
        centred = batch - bmean[:, None]
        n = self.n + m
        d = bmean - self.mean
        corr = self.n * m / n
        if self.pairwise:
            self.m2 += centred @ centred.T
            if corr:
                self.m2 += np.outer(d * corr, d)
        else:
            self.m2 += np.einsum("ij,ij->i", centred, centred) + d * d * corr
        self.mean += d * (m / n)
        self.n = n

    def keep(self, rows: np.ndarray) -> None:
        self.mean = self.mean[rows]
        self.m2 = self.m2[np.ix_(rows, rows)] if self.pairwise else self.m2[rows]


def _totals(rewards, totals, arms, big_n) -> np.ndarray:
    """Exact sums over all observations, through ``totals`` when given."""
    if totals is None:
        return exact_totals(rewards, arms, big_n)
    out = np.asarray(totals(arms), dtype=np.float64)
    if out.shape != (len(arms),):
        raise ValueError(f"totals(arms) must return shape {(len(arms),)}, got {out.shape}")
    if np.isnan(out).any() or np.isposinf(out).any():
        raise ValueError("totals(arms) returned NaN or +inf")
    return out


def _race_shared(
    rewards,
    arms,
    big_n,
    looks,
    delta,
    bound,
    variance,
    rng,
    reward_range,
    offsets,
    totals=None,
    skew_guard=True,
):
    """Alg. 1 of seed 000 with indices shared by all surviving arms."""
    pairwise = variance == "pairwise" and len(arms) > 1
    n_comp = max(len(arms) - 1, 1) if pairwise else len(arms)
    delta_comp = delta / n_comp
    n_looks = len(looks) - 1
    if bound == "normal":
        threshold = normal_threshold(looks[:-1], big_n, delta_comp)
    else:
        delta_look = delta_comp / max(n_looks, 1)
    c_user = None
    if reward_range is not None:
        c_user = 2.0 * reward_range if pairwise else float(reward_range)
    stream = IndexStream(big_n, rng, reuse_stamps=True)
    # many arms: the D x D cross-products cost O(D^2) per observation; Racing-Normal then
    # estimates the variance of the differences with the leader on the latest batch
    batch_variance = pairwise and bound == "normal" and len(arms) > _GRAM_LIMIT
    stats = _Stats(len(arms), pairwise and not batch_variance)
    alive = arms
    means = np.full(len(arms), np.nan)
    n_evals = 0
    n_rounds = 0
    for size in looks:
        if size >= big_n and totals is not None and 2 * stream.n_drawn < big_n:
            # exact look after a truncated schedule: one fused pass over all data
            sums = _totals(rewards, totals, alive, big_n) + big_n * offsets[alive]
            winner = int(alive[_argmax_or_raise(sums)])
            means[alive] = sums / big_n
            return RaceResult(
                winner, n_evals + big_n * len(alive), n_rounds + 1, True, big_n, means
            )
        idx = stream.take(size - stream.n_drawn)
        batch, finite = _checked(rewards, alive, idx)
        n_evals += batch.size
        n_rounds += 1
        if not finite:  # some arm has a -inf term: it can never win
            rows = np.flatnonzero(np.isfinite(batch).all(axis=1))
            means[alive] = -np.inf
            if len(rows) == 0:
                return _rescue(rewards, totals, arms, alive, big_n, n_evals, n_rounds, offsets)
            alive, batch = alive[rows], batch[rows]
            stats.keep(rows)
        if size >= big_n:  # exact look: only the means matter
            score = (stats.mean * stats.n + np.add.reduce(batch, axis=1)) / big_n
            score += offsets[alive]
            means[alive] = score
            return RaceResult(
                int(alive[int(score.argmax())]), n_evals, n_rounds, True, big_n, means
            )
        stats.update(batch)
        if len(alive) == 1:
            break
        score = stats.mean + offsets[alive]
        lead = int(score.argmax())
        if batch_variance:
            var = (batch[lead] - batch).var(axis=1)
        elif pairwise:
            m2 = stats.m2
            var = (m2[lead, lead] + m2.diagonal() - 2.0 * m2[lead]) * (1.0 / size)
        else:
            var = stats.m2 * (1.0 / size)
        np.maximum(var, 0.0, out=var)
        sigma = np.sqrt(var, out=var)
        if bound == "normal":
            if c_user is not None:
                np.maximum(sigma, rare_event_floor(c_user, size), out=sigma)
            width = sigma * (threshold * math.sqrt((big_n - size) / (big_n - 1.0) / size))
        else:
            if c_user is None:
                spread = batch[lead] - batch if pairwise else batch
                c = spread.max(axis=1) - spread.min(axis=1)
            else:
                c = c_user
            width = ebs_width(delta_look, sigma, size, big_n, c)
        if pairwise:
            keep = score[lead] - score <= width
        else:
            keep = score[lead] - width[lead] <= score + width
        keep[lead] = True
        if not keep.all() and bound == "normal" and skew_guard and c_user is None:
            keep = _cochran_guard(batch, lead, keep, pairwise, size)
        if not keep.all():
            means[alive[~keep]] = score[~keep]
            rows = np.flatnonzero(keep)
            alive = alive[rows]
            stats.keep(rows)
            if len(alive) == 1:
                break
    score = stats.mean + offsets[alive]
    means[alive] = score
    winner = int(alive[int(score.argmax())])
    return RaceResult(winner, n_evals, n_rounds, stream.n_drawn >= big_n, stream.n_drawn, means)


def _skewness_squared(values: np.ndarray) -> np.ndarray:
    """Squared sample skewness of each row."""
    centred = values - values.mean(axis=1, keepdims=True)
    sq = centred * centred
    m2 = sq.sum(axis=1)
    m3 = np.einsum("ij,ij->i", sq, centred)
    return m3 * m3 * values.shape[1] / np.maximum(m2**3, 1e-300)


def _cochran_guard(batch, lead, keep, pairwise, size) -> np.ndarray:
    """Keep the arms whose elimination rests on a mean too skewed to be near-normal.

    Cochran's rule: the mean of ``n`` draws is close to normal once
    ``n > 25 g1**2``; ``g1`` is estimated on (at most 1024 observations of)
    the latest batch, of the differences with the leader in pairwise mode.
    Computed only for the arms about to be dropped.
    """
    batch = batch[:, :: -(-batch.shape[1] // 1024)]  # a spread-out sample of <= 1024
    drop = np.flatnonzero(~keep)
    if pairwise:
        g1sq = _skewness_squared(batch[lead] - batch[drop])
    else:
        g1sq = _skewness_squared(batch[np.append(drop, lead)])
        if size < 25.0 * g1sq[-1]:  # the leader's own interval is not trustworthy
            return np.ones_like(keep)
        g1sq = g1sq[:-1]
    keep = keep.copy()
    keep[drop[size < 25.0 * g1sq]] = True
    return keep


def _rescue(rewards, totals, arms, alive, big_n, n_evals, n_rounds, offsets):
    """All survivors hit −inf: the best arm was dropped earlier; decide exactly."""
    others = np.setdiff1d(arms, alive)
    if len(others) == 0:
        _argmax_or_raise(np.full(1, -np.inf))
    sums = _totals(rewards, totals, others, big_n) + big_n * offsets[others]
    winner = int(others[_argmax_or_raise(sums)])
    return RaceResult(winner, n_evals + big_n * len(others), n_rounds + 1, True, big_n)


def _race_independent(
    rewards, sizes, delta, bound, batch_size, variance, rng, reward_range, offsets
):
    """Race arms with their own populations of sizes ``N_i``, compared on totals."""
    if variance != "marginal":
        raise ValueError(
            "arms with different population sizes share no observations: pass variance='marginal'"
        )
    if bound == "lilucb":
        raise ValueError("bound='lilucb' needs a common population size; use 'normal' or 'ebs'")
    n_arms = len(sizes)
    if bound == "exact":
        totals = (
            np.array(
                [exact_totals(rewards, np.array([i]), int(sizes[i]))[0] for i in range(n_arms)]
            )
            + sizes * offsets
        )
        return RaceResult(_argmax_or_raise(totals), int(sizes.sum()), 1, True, int(sizes.max()))
    delta_arm = delta / n_arms
    looks = [doubling_schedule(int(n), batch_size) for n in sizes]
    if bound == "normal":
        thresholds = np.array(
            [normal_threshold(lk[:-1], n, delta_arm) for lk, n in zip(looks, sizes, strict=True)]
        )
    streams = [IndexStream(int(n), rng) for n in sizes]
    mean = np.zeros(n_arms)
    m2 = np.zeros(n_arms)
    drawn = np.zeros(n_arms, dtype=np.int64)
    crange = np.zeros(n_arms)
    alive = np.ones(n_arms, dtype=bool)
    n_evals = 0
    n_rounds = 0
    for t in range(max(len(lk) for lk in looks)):
        n_rounds += 1
        for i in np.flatnonzero(alive):
            target = looks[i][min(t, len(looks[i]) - 1)]
            idx = streams[i].take(target - drawn[i])
            if len(idx) == 0:
                continue
            batch = checked_rewards(rewards, np.array([i]), idx)[0]
            n_evals += len(idx)
            if np.isneginf(batch).any():
                alive[i] = False
                mean[i] = -np.inf
                continue
            m, bmean = len(batch), batch.mean()
            n = drawn[i] + m
            d = bmean - mean[i]
            m2[i] += ((batch - bmean) ** 2).sum() + d * d * drawn[i] * m / n
            mean[i] += d * m / n
            drawn[i] = n
            crange[i] = batch.max() - batch.min()
        if not alive.any():  # the best arm was dropped earlier: decide the rest exactly
            others = np.flatnonzero(np.isfinite(mean))
            sums = np.array(
                [exact_totals(rewards, np.array([i]), int(sizes[i]))[0] for i in others]
            )
            if len(others) == 0:
                _argmax_or_raise(np.full(1, -np.inf))
            sums = sums + sizes[others] * offsets[others]
            winner = int(others[_argmax_or_raise(sums)])
            return RaceResult(
                winner, n_evals + int(sizes[others].sum()), n_rounds, True, int(sizes.max())
            )
        sigma = np.sqrt(m2 / np.maximum(drawn, 1))
        c = crange if reward_range is None else float(reward_range)
        if bound == "normal":
            sigma = np.maximum(sigma, rare_event_floor(c, drawn))
            width = normal_width(thresholds, sigma, np.maximum(drawn, 1), sizes)
        else:
            n_looks = np.array([max(len(lk) - 1, 1) for lk in looks])
            width = ebs_width(delta_arm / n_looks, sigma, np.maximum(drawn, 1), sizes, c)
        total = np.where(alive, sizes * (mean + offsets), -np.inf)
        half = sizes * width
        lead = int(np.argmax(total))
        drop = alive & (total[lead] - half[lead] > total + half)
        drop[lead] = False
        alive &= ~drop
        if alive.sum() == 1 or (drawn[alive] >= sizes[alive]).all():
            break
    total = np.where(alive, sizes * (mean + offsets), -np.inf)
    winner = _argmax_or_raise(total)
    return RaceResult(winner, n_evals, n_rounds, bool((drawn >= sizes).any()), int(drawn.max()))

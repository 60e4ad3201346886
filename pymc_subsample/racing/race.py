r"""Races on a population shared by all arms: the Python driver and the one-call entry point.

* :func:`race_shared`, the Python driver of the race's state machine
  (:class:`~pymc_subsample.racing.state.SharedRace`): it owns the index
  stream, calls the reward callback at each look, and ends the race through
  :meth:`~pymc_subsample.racing.state.SharedRace.finish`;
* :func:`race`, the one-call entry point that also dispatches to adapted
  lil'UCB (:func:`~pymc_subsample.racing.lilucb.lil_ucb`), to independent
  populations and to the exact reference (:func:`race_exact`).

The compiled driver, for compiled rewards, is
:class:`~pymc_subsample.racing.compiled.CompiledRace`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .common import (
    RaceResult,
    RewardFn,
    TotalsFn,
    argmax_or_raise,
    as_reward_batch,
    check_hooks,
    exact_totals,
    validate_race_args,
)
from .config import RaceConfig
from .schedule import ExactSwitch, position_stream
from .state import SharedRace

__all__ = ["race", "race_exact", "race_shared"]

_FLOAT64 = np.dtype(np.float64)  # a singleton: ``is`` tests it faster than ``==``


def race_exact(
    rewards: RewardFn,
    n_arms: int,
    n_obs: int,
    offsets: np.ndarray | None = None,
    totals: TotalsFn | None = None,
) -> RaceResult:
    """Decide exactly: every arm on all ``n_obs`` observations (through ``totals`` if given).

    Returns
    -------
    RaceResult
        With the exact means and ``N·D`` evaluations.
    """
    arms = np.arange(int(n_arms))
    offsets = np.zeros(len(arms)) if offsets is None else offsets
    sums = exact_totals(rewards, arms, n_obs, totals) / n_obs + offsets
    return RaceResult(argmax_or_raise(sums), n_obs * len(arms), 1, True, n_obs, sums)


def race_shared(
    rewards: RewardFn,
    n_arms: int,
    n_obs: int,
    config: RaceConfig,
    *,
    rng: np.random.Generator,
    offsets: np.ndarray | None = None,
    totals: TotalsFn | None = None,
) -> RaceResult:
    r"""Run a race on a population shared by all arms (Chen & Ghahramani 2016, Alg. 1).

    Shared mini-batches are drawn without replacement on the schedule
    ``config.looks(n_obs)``; after each, with :math:`\hat x` the current
    leader, arm :math:`i` is dropped when

    - pairwise: :math:`\hat\mu_{\hat x} - \hat\mu_i > G(\delta/(D-1), T, \hat\sigma_{\hat x,i})`
    - marginal: :math:`\hat\mu_{\hat x} - G(\delta/D, T, \hat\sigma_{\hat x}) >
      \hat\mu_i + G(\delta/D, T, \hat\sigma_i)`.

    The last look is at :math:`N`: through ``totals`` (one fused pass) when
    fewer than half of the observations were drawn before it, else by
    drawing the rest. An arm with a −inf reward is dropped at once; identical
    arms end at :math:`T = N` and the lowest index wins.

    Parameters
    ----------
    rewards : callable
        ``rewards(arms, idx)``, shape ``(len(arms), n)`` for ``n`` observations
        ``idx`` (an int64 array, or a ``slice`` with ``batches="windows"``).
    n_arms, n_obs : int
        :math:`D` and :math:`N`.
    config : RaceConfig
        Settings.
    rng : numpy.random.Generator
        Source of the index draws (or of the window's start).
    offsets : numpy.ndarray, optional
        Constant per arm added to its mean reward.
    totals : callable, optional
        ``totals(arms)``: each arm's sum over all :math:`N` observations in
        one call; an exact look through it counts :math:`N` evaluations per
        surviving arm.

    Returns
    -------
    RaceResult
    """
    kernel = SharedRace(config, n_arms, n_obs, offsets)
    state = kernel.init()
    if kernel.n_arms == 1:
        return kernel.result(state._replace(means=kernel.offsets.astype(float)))
    stream = position_stream(config.batches, n_obs, rng)
    give_up = totals is not None and kernel.can_give_up
    for size in kernel.look_sizes:
        if size >= n_obs and totals is not None and 2 * state.n_drawn < n_obs:
            return kernel.finish(state, totals, rewards)
        k = size - state.n_drawn
        if k <= 0:  # whole blocks already reached this look
            continue
        alive = state.alive
        positions = stream.take(k)
        k = len(positions) if not isinstance(positions, slice) else k
        batch = rewards(alive, positions)
        if batch.dtype is not _FLOAT64 or batch.shape != (len(alive), k):
            batch = as_reward_batch(batch, len(alive), k)
        if not batch.flags.c_contiguous:  # the compiled look vectorizes on C order only
            batch = np.ascontiguousarray(batch)
        state = kernel.update(state, batch)
        if len(state.alive) == 0:
            return kernel.finish(state, totals, rewards)
        if state.winner >= 0:
            break
        if state.sparse or (give_up and kernel.hopeless(state)):  # straight to the exact pass
            return kernel.finish(state, totals, rewards)
    return kernel.result(state)


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
    totals: TotalsFn | None = None,
    skew_guard: bool = True,
    config: RaceConfig | None = None,
) -> RaceResult:
    r"""Identify the arm of highest total reward, with error at most ``delta``.

    One entry point for every race: Racing-Normal and Racing-EBS on a shared
    population (:func:`race_shared` with a :class:`RaceConfig` built from the
    keywords, or ``config`` itself), adapted lil'UCB
    (:func:`~pymc_subsample.racing.lilucb.lil_ucb`), arms with populations
    of their own (:func:`~pymc_subsample.racing.independent.race_independent`),
    and the exact reference (:func:`race_exact`). Keywords that do not apply
    to the chosen algorithm raise an error instead of being ignored.

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
        per arm: the arms are then independent populations
        (``rewards`` is called one arm at a time, ``idx`` indexing that arm's
        own population), compared on totals :math:`N_i \hat\mu_i`, with
        ``variance="marginal"``.
    delta : float
        Probability of returning a wrong arm, in (0, 1).
    bound : {"normal", "ebs", "lilucb", "exact"}
        The algorithm (see :class:`RaceConfig` for the first two).
    batch_size : int
        First mini-batch size :math:`m^{(1)}` (paper: 50 for Normal, 2 for EBS).
    variance : {"pairwise", "marginal"}
        See :class:`RaceConfig`.
    rng : numpy.random.Generator or int, optional
        Source of the index draws.
    reward_range : float, optional
        See :class:`RaceConfig`; lil'UCB uses :math:`C/2` as its scale.
    schedule : sequence of int, optional
        See :class:`RaceConfig`.
    offsets : array_like, optional
        A constant per arm added to its mean reward (the race then compares
        :math:`\mu_i + o_i`).
    exact_after : int, optional
        Largest cumulative sample size drawn as a subset; the next look is at
        :math:`N` (``ExactSwitch.after_size(exact_after)``).
    totals : callable, optional
        ``totals(arms)`` returns :math:`\sum_{n=1}^N l_{i,n}` in one call, used
        by exact looks.
    skew_guard : bool
        See :class:`RaceConfig`.
    config : RaceConfig, optional
        Settings for a shared-index race, instead of the keywords above.

    Returns
    -------
    RaceResult

    Raises
    ------
    ValueError
        For ``delta`` outside (0, 1), an unknown ``bound`` or ``variance``,
        ``batch_size < 2``, ``n_arms < 1``, ``n_obs < 1``, a keyword that does
        not apply to ``bound``, or a ``rewards`` callback that returns the
        wrong shape, NaN or +inf; or when every arm has a −inf reward.
    """
    if config is not None:
        bound = config.bound
    delta = validate_race_args(delta, bound, batch_size, variance, n_arms)
    rng = np.random.default_rng(rng)
    n_arms = int(n_arms)
    offsets = np.zeros(n_arms) if offsets is None else np.asarray(offsets, dtype=float)
    if offsets.shape != (n_arms,) or not np.isfinite(offsets).all():
        raise ValueError(f"offsets must be {n_arms} finite numbers, got {offsets!r}")
    sizes = np.atleast_1d(np.asarray(n_obs))
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
        raise ValueError(f"n_obs must be a positive integer or one per arm, got {n_obs!r}")
    check_hooks(reward_range, exact_after, skew_guard)
    if len(sizes) > 1 or (np.ndim(n_obs) == 1 and n_arms > 1):
        if len(sizes) != n_arms:
            raise ValueError(f"n_obs has {len(sizes)} entries for {n_arms} arms")
        if not (sizes == sizes[0]).all():
            _refuse(bound, schedule=schedule, exact_after=exact_after, totals=totals)
            if variance != "marginal":
                raise ValueError(
                    "arms with different population sizes share no observations: "
                    "pass variance='marginal'"
                )
            if bound == "lilucb":
                raise ValueError(
                    "bound='lilucb' needs a common population size; use 'normal' or 'ebs'"
                )
            from .independent import race_independent

            def arm_rewards(arm, idx):
                return np.asarray(rewards(np.array([arm]), idx))[0]

            return race_independent(
                arm_rewards, sizes, delta=delta, bound=bound, batch_size=int(batch_size),
                rng=rng, reward_range=reward_range, offsets=offsets,
            )  # fmt: skip
    big_n = int(sizes[0])
    if bound == "exact":
        _refuse(bound, schedule=schedule, exact_after=exact_after)
        return race_exact(rewards, n_arms, big_n, offsets, totals)
    if bound == "lilucb":
        _refuse(bound, schedule=schedule, exact_after=exact_after, totals=totals)
        from .lilucb import lil_ucb

        return lil_ucb(
            rewards, n_arms, big_n, delta=delta, batch_size=int(batch_size), rng=rng,
            reward_range=reward_range, offsets=offsets,
        )  # fmt: skip
    if config is None:
        config = RaceConfig(
            delta=delta, bound=bound, variance=variance, batch_size=int(batch_size),
            reward_range=reward_range, schedule=None if schedule is None else tuple(schedule),
            exact=ExactSwitch(None if exact_after is None else max(int(exact_after), 0)),
            skew_guard=skew_guard,
        )  # fmt: skip
    return race_shared(rewards, n_arms, big_n, config, rng=rng, offsets=offsets, totals=totals)


def _refuse(bound: str, **hooks) -> None:
    """Raise when a shared-index hook is passed to an algorithm that cannot honour it."""
    given = [name for name, value in hooks.items() if value is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} only apply to the shared-index races ('normal', 'ebs'); "
            f"bound={bound!r} cannot honour them: drop them or choose bound='normal'"
        )

r"""Types and checks shared by every race: the result record, argument checks, reward calls.

This module sits at the bottom of :mod:`pymc_subsample.racing`: it imports
nothing else from the package but the argument checks of
:mod:`pymc_subsample.validation`, and every race (shared-index, lil'UCB,
independent populations, the exact reference) returns its
:class:`RaceResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..validation import check_bool, check_choice, check_float, check_int
from ..validation import check_probability as _check_probability

__all__ = [
    "BOUNDS",
    "VARIANCES",
    "RaceResult",
    "RewardFn",
    "TotalsFn",
    "argmax_or_raise",
    "as_reward_batch",
    "check_hooks",
    "check_probability",
    "check_reward_values",
    "checked_rewards",
    "exact_totals",
    "validate_race_args",
]

#: Names accepted by ``bound``.
BOUNDS = ("normal", "ebs", "lilucb", "exact")
#: Names accepted by ``variance``.
VARIANCES = ("pairwise", "marginal")

#: ``rewards(arms, idx) -> array of shape (len(arms), len(idx))``; ``idx`` is an
#: int64 array of observation indices, or a ``slice`` for contiguous windows.
RewardFn = Callable[[np.ndarray, np.ndarray | slice], np.ndarray]
#: ``totals(arms) -> array of shape (len(arms),)``: each arm's sum over all observations.
TotalsFn = Callable[[np.ndarray], np.ndarray]

_EXACT_CHUNK = 1 << 24  # rewards per call when evaluating a whole population


@dataclass(frozen=True)
class RaceResult:
    """Outcome of one race, whatever the algorithm.

    Attributes
    ----------
    winner : int
        Index of the arm returned.
    n_evaluations : int
        Rewards drawn in total, over all arms and looks, counting an exact look
        as all of a surviving arm's observations. At most ``sum(N_i)``, except
        when an exact pass re-reads observations already drawn (a shared-index
        race's pass through ``totals``, or its exact decision among the arms
        dropped earlier once every survivor hit a −inf reward): then below
        ``2 * sum(N_i)``.
    n_rounds : int
        Number of looks (rounds of the schedule, or blocks of pulls for lil'UCB).
    exhausted : bool
        True when some arm was evaluated on its whole population.
    n_drawn : int
        Largest number of observations drawn for one arm.
    means : numpy.ndarray
        Estimated mean reward of each arm, offset included, when it left the
        race (exact for arms evaluated on all their observations; −inf for arms
        with a −inf reward; NaN for arms never evaluated).
    """

    winner: int
    n_evaluations: int
    n_rounds: int
    exhausted: bool
    n_drawn: int
    means: np.ndarray


def check_probability(delta: float, name: str = "delta") -> float:
    """Return ``delta`` as a float; raise unless it lies in (0, 1).

    :func:`pymc_subsample.validation.check_probability` with the value first.
    """
    return _check_probability(name, delta)


def validate_race_args(delta, bound, batch_size, variance, n_arms) -> float:
    """Check the arguments shared by the races and the samplers built on them.

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
        Naming the argument at fault, the value and a valid one
        (:mod:`pymc_subsample.validation`; a value of the wrong type raises
        its :class:`~pymc_subsample.validation.ArgumentTypeError`, a
        ``ValueError`` too).
    """
    delta = check_probability(delta)
    check_choice("bound", bound, BOUNDS)
    check_choice("variance", variance, VARIANCES)
    check_int(
        "batch_size", batch_size, low=2, example=50,
        why=" (a variance needs two draws; the steps also accept 'auto')",
    )  # fmt: skip
    check_int("n_arms", n_arms, low=1, example=2)
    return delta


def check_hooks(reward_range, exact_after, skew_guard) -> None:
    """Check the keywords of the shared-index races beside :func:`validate_race_args`.

    ``reward_range`` a finite number >= 0 or None, ``exact_after`` an integer
    >= 0 or None, ``skew_guard`` a boolean.

    Raises
    ------
    ValueError
        Naming the argument, the value and a valid one.
    """
    check_float("reward_range", reward_range, low=0.0, example=10.0, special=(None,))
    check_int("exact_after", exact_after, low=0, example=1000, special=(None,))
    check_bool("skew_guard", skew_guard)


def checked_rewards(
    rewards: RewardFn, arms: np.ndarray, idx: np.ndarray | slice, n_idx: int | None = None
) -> tuple[np.ndarray, bool]:
    """Call ``rewards(arms, idx)`` and check its shape and values.

    Parameters
    ----------
    rewards : callable
        The reward callback.
    arms : numpy.ndarray
        Arm indices.
    idx : numpy.ndarray or slice
        Observation indices, or a contiguous window.
    n_idx : int, optional
        Number of observations in ``idx`` (needed when it is a slice).

    Returns
    -------
    rewards : numpy.ndarray
        float64 array of shape ``(len(arms), n_idx)``; entries finite or −inf.
    all_finite : bool
        False when some entry is −inf.

    Raises
    ------
    ValueError
        On a wrong shape, NaN or +inf, naming the fix.
    """
    n_idx = len(idx) if n_idx is None else n_idx
    out = as_reward_batch(rewards(arms, idx), len(arms), n_idx)
    finite = math.isfinite(out.sum())  # fast path: a finite sum means every entry is finite
    if not finite:
        check_reward_values(out)
    return out, finite


def as_reward_batch(values, n_arms: int, n_idx: int) -> np.ndarray:
    """Return ``values`` as a float64 array of shape ``(n_arms, n_idx)``; raise otherwise."""
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (n_arms, n_idx):
        raise ValueError(
            f"rewards(arms, idx) must return shape (len(arms), len(idx)) = "
            f"{(n_arms, n_idx)}, got {out.shape}"
        )
    return out


def check_reward_values(batch: np.ndarray) -> None:
    """Raise ``ValueError`` on NaN or +inf rewards (−inf is allowed: the arm is dropped)."""
    if np.isnan(batch).any():
        raise ValueError(
            "rewards(arms, idx) returned NaN; a log-likelihood term must be a number or -inf"
        )
    if np.isposinf(batch).any():
        raise ValueError(
            "rewards(arms, idx) returned +inf; a log-likelihood term must be finite or -inf"
        )


def exact_totals(
    rewards: RewardFn, arms: np.ndarray, n_obs: int, totals: TotalsFn | None = None
) -> np.ndarray:
    """Sum of the rewards of ``arms`` over their whole (common) population.

    Through ``totals(arms)`` when given (one fused pass), otherwise by calling
    ``rewards`` in chunks of at most ``2**24`` rewards, in index order.

    Parameters
    ----------
    rewards : callable
        The reward callback.
    arms : numpy.ndarray
        Arm indices.
    n_obs : int
        Population size.
    totals : callable, optional
        ``totals(arms)``, the sums in one call.

    Returns
    -------
    numpy.ndarray
        One total per arm (−inf when any reward is −inf).

    Raises
    ------
    ValueError
        When a total is NaN or +inf, or ``totals`` returns the wrong shape.
    """
    if totals is not None:
        out = np.asarray(totals(arms), dtype=np.float64)
        if out.shape != (len(arms),):
            raise ValueError(f"totals(arms) must return shape {(len(arms),)}, got {out.shape}")
        if np.isnan(out).any() or np.isposinf(out).any():
            raise ValueError(
                "totals(arms) returned NaN or +inf; a sum of log-likelihood terms must be "
                "finite or -inf"
            )
        return out
    step = max(1, _EXACT_CHUNK // max(len(arms), 1))
    total = np.zeros(len(arms))
    for start in range(0, n_obs, step):
        idx = np.arange(start, min(start + step, n_obs))
        total += checked_rewards(rewards, arms, idx)[0].sum(axis=1)
    return total


def argmax_or_raise(values: np.ndarray) -> int:
    """Index of the largest value; ``ValueError`` when every value is −inf."""
    if not np.isfinite(values).any():
        raise ValueError(
            "every arm has a -inf reward: the target is zero at every candidate "
            "(check the model and the initial point)"
        )
    return int(np.argmax(values))

r"""Synthetic reward populations of the bandit study of Chen & Ghahramani (2016, Sec. 5.1).

Rewards of each arm are drawn from one of Normal(0, 1), Uniform[0, 1] or
LogNormal(0, 2), standardized per arm, scaled by :math:`\sigma` and shifted so
that the arms' totals are a fixed log-distribution:

.. math:: l_{i,n} = \sigma z_{i,n} + \frac{\log p(i)}{N}, \qquad
          \sum_n l_{i,n} = \log p(i).

Racing these with Gumbel noise (:func:`~pymc_subsample.racing.sample_categorical`)
draws from :math:`p`; :math:`\sigma` sets the difficulty.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "REWARD_DISTRIBUTIONS",
    "bandit_population",
    "gumbel_race_errors",
    "rare_event_population",
]

#: Reward distributions of the study.
REWARD_DISTRIBUTIONS = ("normal", "uniform", "lognormal")


def bandit_population(
    dist: str,
    n_arms: int,
    n_obs: int,
    sigma: float,
    rng: np.random.Generator | int | None = None,
    probs: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Build a reward table :math:`l` of shape ``(n_arms, n_obs)``.

    Parameters
    ----------
    dist : {"normal", "uniform", "lognormal"}
        Distribution of the raw rewards (LogNormal has parameters (0, 2)).
    n_arms, n_obs : int
        :math:`D` and :math:`N`.
    sigma : float
        Standard deviation of each arm's rewards.
    rng : numpy.random.Generator or int, optional
        Source of randomness.
    probs : numpy.ndarray, optional
        Target distribution :math:`p`; default :math:`p(i) \propto i + 1`.

    Returns
    -------
    rewards : numpy.ndarray
        The table :math:`l`.
    log_p : numpy.ndarray
        :math:`\log p`, equal to the row sums of ``rewards``.
    """
    rng = np.random.default_rng(rng)
    if dist == "normal":
        raw = rng.normal(size=(n_arms, n_obs))
    elif dist == "uniform":
        raw = rng.uniform(size=(n_arms, n_obs))
    elif dist == "lognormal":
        raw = rng.lognormal(0.0, 2.0, size=(n_arms, n_obs))
    else:
        raise ValueError(f"unknown dist {dist!r}; choose one of {REWARD_DISTRIBUTIONS}")
    if probs is None:
        probs = np.arange(1, n_arms + 1, dtype=float)
    log_p = np.log(np.asarray(probs, dtype=float) / np.sum(probs))
    z = raw - raw.mean(axis=1, keepdims=True)
    z /= z.std(axis=1, keepdims=True)
    return sigma * z + (log_p / n_obs)[:, None], log_p


def rare_event_population(
    n_obs: int, n_events: int, jump: float, rng: np.random.Generator | int | None = None
) -> np.ndarray:
    r"""Two arms that differ only on ``n_events`` rare observations.

    Arm 0 is 0 everywhere except ``jump`` at ``n_events`` random observations;
    arm 1 is the constant :math:`0.5\,\text{jump}\,n_\text{events}/N`, so arm 0
    has the higher mean (by half of its rare contribution) although almost
    every small batch shows arm 1 ahead with zero variance of the difference
    (a failure of the normal approximation that the rare-event floor guards against).

    Parameters
    ----------
    n_obs : int
        :math:`N`.
    n_events : int
        Number of observations where arm 0 jumps.
    jump : float
        Size of the jump (the reward range :math:`C`).
    rng : numpy.random.Generator or int, optional
        Source of randomness.

    Returns
    -------
    numpy.ndarray
        Table of shape ``(2, n_obs)``; arm 0 is the best.
    """
    rng = np.random.default_rng(rng)
    table = np.zeros((2, n_obs))
    table[0, rng.choice(n_obs, size=n_events, replace=False)] = jump
    table[1] = 0.5 * jump * n_events / n_obs
    return table


def gumbel_race_errors(
    table: np.ndarray,
    log_p: np.ndarray,
    reps: int,
    rng: np.random.Generator,
    shuffle_every: int | None = None,
    layout: str = "windows",
    **race_kwargs,
) -> tuple[int, np.ndarray]:
    r"""Count wrong Gumbel-max races on a reward table.

    Each repetition draws Gumbel noise, races with
    :func:`~pymc_subsample.racing.sample_categorical` and compares the result with
    the exact :math:`\arg\max_i \log p(i) + \varepsilon_i` for the same noise.

    Parameters
    ----------
    table : numpy.ndarray
        Rewards :math:`\log f_n(i)`, shape ``(D, N)``.
    log_p : numpy.ndarray
        Row sums of ``table`` (the exact log target).
    reps : int
        Number of races.
    rng : numpy.random.Generator
        Source of the noise and of the index draws.
    shuffle_every : int, optional
        Read batches from a column-permuted copy of the table, permuted anew
        every ``shuffle_every`` races, as the PyMC steps do; default:
        independent random index draws for every race.
    layout : {"windows", "blocks"}
        With ``shuffle_every``: contiguous windows or random blocks of the
        permuted copy (``RaceConfig.batches``).
    **race_kwargs
        Passed to :func:`~pymc_subsample.racing.sample_categorical`.

    Returns
    -------
    errors : int
        Races whose result differs from the exact argmax.
    evaluations : numpy.ndarray
        Rewards drawn by each race.
    """
    from pymc_subsample.racing import sample_categorical

    n_arms, n_obs = table.shape

    def rewards(arms, idx):
        return table[np.ix_(arms, idx)]

    if shuffle_every is not None:
        from pymc_subsample.racing import RaceConfig

        config = RaceConfig(batches=layout, **race_kwargs)
        race_kwargs = {"config": config}
        permuted = [table]

        def rewards(arms, idx):
            return permuted[0][arms][:, idx]

    errors = 0
    evaluations = np.empty(reps, dtype=np.int64)
    for r in range(reps):
        if shuffle_every is not None and r % shuffle_every == 0:
            permuted[0] = table[:, rng.permutation(n_obs)]
        noise = rng.gumbel(size=n_arms)
        x, res = sample_categorical(
            np.zeros(n_arms), rewards, n_obs, rng=rng, noise=noise, **race_kwargs
        )
        errors += x != int(np.argmax(log_p + noise))
        evaluations[r] = res.n_evaluations
    return errors, evaluations

r"""Settings of a race on a shared population, validated once and planned once per size.

:class:`RaceConfig` holds what stays fixed across the races of a sampler (δ,
bound, variance, first batch, schedule, reward range, exact switch, batch
layout) and plans a race for a number of arms and a population size: its
looks, its bound (Racing-Normal or Racing-EBS, Chen & Ghahramani 2016,
Alg. 1) and the half-width factors of its looks, computed once per size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..validation import check_choice
from .bounds import EBSBound, NormalBound, normal_threshold
from .common import check_hooks, validate_race_args
from .schedule import ExactSwitch, doubling_schedule

__all__ = ["BATCH_LAYOUTS", "RaceConfig", "RacePlan"]

#: Names accepted by ``RaceConfig.batches`` (and ``RaceOptions.batches``, ``ObservationTerms``'
#: ``batches``), the one list: contiguous blocks of a row-permuted copy of the data,
#: independent random rows, or contiguous windows of the data in its own order.
BATCH_LAYOUTS = ("blocks", "random", "windows")


class RacePlan(NamedTuple):
    """A race planned for a number of arms and a population size (:meth:`RaceConfig.plan`).

    Attributes
    ----------
    looks : numpy.ndarray
        Cumulative sample sizes of the looks, read-only, ending at :math:`N`.
    bound : NormalBound or EBSBound
        The bound of the race.
    widths : dict
        Each look's cumulative size :math:`T` below :math:`N` to its
        ``(factor, floor)``: the half-width per unit standard deviation and
        the floor on a standard deviation (Racing-EBS: ``(-1, 0)``, no
        closed-form width).
    sizes : tuple of int
        ``looks`` as Python ints.
    """

    looks: np.ndarray
    bound: NormalBound | EBSBound
    widths: dict
    sizes: tuple


@dataclass(frozen=True)
class RaceConfig:
    r"""Settings of a race, fixed across the races of a sampler.

    Parameters
    ----------
    delta : float
        Probability of returning a wrong arm, in (0, 1).
    bound : {"normal", "ebs"}
        ``"normal"``: Racing-Normal, :math:`G = B s_T` with :math:`B` computed
        for the actual schedule from the joint Gaussian law of the looks
        (:func:`~pymc_subsample.racing.bounds.normal_threshold`).
        ``"ebs"``: Racing-EBS, the empirical Bernstein–Serfling bound with a
        union bound over looks.
    variance : {"pairwise", "marginal"}
        Standard deviation of the reward differences with the leader on
        shared indices (tighter when arms are positively correlated), or of
        each arm alone. Both cost :math:`O(D T)`: the differences are
        accumulated from the look at which the current leader took the lead
        (:func:`~pymc_subsample.racing.kernels.look_pairwise`).
    batch_size : int
        First mini-batch size :math:`m^{(1)}` of the doubling schedule.
    reward_range : float, optional
        :math:`C`, a bound on :math:`\max_n l_{i,n} - \min_n l_{i,n}` for every
        arm. Racing-EBS needs it for its guarantee; Racing-Normal floors its
        standard deviation at :math:`C' \sqrt{p_0(1-p_0)}`, :math:`p_0 =
        1/(T+1)` (:func:`~pymc_subsample.racing.bounds.rare_event_floor`),
        :math:`C' = 2C` for pairwise differences. Without it, EBS plugs in the
        range seen on the latest batch, which cannot see an event no batch
        has drawn: on rare-event populations pass a true bound.
    schedule : tuple of int, optional
        Increasing cumulative sample sizes to use instead of doubling; the
        population size is appended. Bounds are computed for this schedule.
    exact : ExactSwitch
        When the race stops subsampling and decides with one exact pass
        (:class:`~pymc_subsample.racing.schedule.ExactSwitch`); bounds are
        computed for the truncated schedule.
    skew_guard : bool
        Racing-Normal without ``reward_range``: no arm is dropped at a look of
        :math:`T` observations while :math:`T < 25\,\hat g_1^2`, with
        :math:`\hat g_1` the sample skewness of the rewards (of the
        differences with the leader, in pairwise mode) on the latest batch
        (Cochran's rule for the normal approximation of a mean). ``False``
        reproduces the paper's Racing-Normal.
    batches : {"random", "blocks", "windows"}
        ``"random"``: each look draws uniformly random new indices and passes
        them to ``rewards`` as an int64 array. ``"blocks"``: as for
        ``"windows"``, the population is stored in a uniformly random order,
        and each look draws whole blocks of
        :func:`~pymc_subsample.racing.schedule.block_rows` consecutive
        positions, uniformly at random among those not drawn
        (:class:`~pymc_subsample.racing.schedule.RandomBlocks`), passing the
        positions as an int64 array (a look may read up to a block more than
        its schedule asks). ``"windows"``: the population
        is stored in a uniformly random order (the caller's duty, e.g. a
        row-permuted copy of the data) and the race reads consecutive
        positions from a uniformly random start, cyclically, passing each look
        as a ``slice`` (an index array where it wraps around).
    """

    delta: float = 0.05
    bound: str = "normal"
    variance: str = "pairwise"
    batch_size: int = 50
    reward_range: float | None = None
    schedule: tuple[int, ...] | None = None
    exact: ExactSwitch = ExactSwitch()
    skew_guard: bool = True
    batches: str = "random"
    _cache: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    def __post_init__(self):
        validate_race_args(self.delta, self.bound, self.batch_size, self.variance, 1)
        if self.bound not in ("normal", "ebs"):
            raise ValueError(
                f"RaceConfig is for the shared-index races ('normal', 'ebs'); got {self.bound!r}: "
                "use lil_ucb(...) or race_exact(...) for the others"
            )
        check_hooks(self.reward_range, None, self.skew_guard)
        if self.schedule is not None:
            looks = np.asarray(self.schedule)
            if len(looks) and ((np.diff(looks) <= 0).any() or looks[0] < 2):
                raise ValueError("schedule must be increasing cumulative sizes starting at >= 2")
            object.__setattr__(self, "schedule", tuple(int(s) for s in self.schedule))
        if not isinstance(self.exact, ExactSwitch):
            raise TypeError(f"exact must be an ExactSwitch, got {self.exact!r}")
        check_choice("batches", self.batches, BATCH_LAYOUTS)
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "batch_size", int(self.batch_size))

    def looks(self, n_obs: int) -> np.ndarray:
        """Cumulative sample sizes of the looks for a population of ``n_obs``, ending at it."""
        return self.plan(1, n_obs).looks

    def kernel_bound(self, n_arms: int, n_obs: int) -> NormalBound | EBSBound:
        """Return the bound for a race of ``n_arms`` arms on ``n_obs`` observations (cached)."""
        return self.plan(n_arms, n_obs).bound

    def plan(self, n_arms: int, n_obs: int) -> RacePlan:
        """Return the :class:`RacePlan` of a race, computed once per config and size."""
        key = (n_arms, n_obs)
        plan = self._cache.get(key)
        if plan is None:
            plan = self._cache[key] = self._make_plan(int(n_arms), int(n_obs))
        return plan

    def _make_plan(self, n_arms: int, n_obs: int) -> RacePlan:
        if self.schedule is None:
            looks = doubling_schedule(n_obs, self.batch_size)
        else:
            looks = np.asarray(self.schedule, dtype=np.int64)
        looks = self.exact.truncate(looks, n_obs)
        looks.setflags(write=False)
        pairwise = self.variance == "pairwise" and n_arms > 1
        n_comp = max(n_arms - 1, 1) if pairwise else n_arms
        delta_comp = self.delta / n_comp
        c = self.reward_range
        if c is not None and pairwise:
            c = 2.0 * c
        if self.bound == "normal":
            threshold = normal_threshold(looks[:-1], n_obs, delta_comp)
            cantelli = float(np.sqrt(max(len(looks) - 1, 1) / delta_comp - 1.0))
            bound = NormalBound(threshold, n_obs, c, self.skew_guard, cantelli)
            widths = {int(t): (bound.factor(t), bound.floor(t)) for t in looks[:-1]}
        else:
            bound = EBSBound(delta_comp / max(len(looks) - 1, 1), n_obs, c)
            widths = {int(t): (-1.0, 0.0) for t in looks[:-1]}
        return RacePlan(looks, bound, widths, tuple(int(t) for t in looks))

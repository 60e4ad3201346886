r"""Best-arm identification on a finite reward population shared by all arms, by racing.

Racing-Normal and Racing-EBS (Chen & Ghahramani 2016, Alg. 1) as explicit
state, in the style of BlackJAX kernels:

* :class:`RaceConfig`, the frozen settings (δ, bound, variance, first batch,
  schedule, reward range, exact switch, batch layout);
* :class:`RaceState`, the state of one race (surviving arms, observations
  drawn, running means and cross-products, evaluations, looks);
* :class:`SharedRace`, the kernel for one population and one set of
  offsets: :meth:`~SharedRace.init` and :meth:`~SharedRace.update`, pure;
* :func:`race_shared`, the driver that owns the index stream and the exact
  final look; :func:`race`, the one-call entry point that also dispatches to
  adapted lil'UCB (:func:`~pymc_subsample.racing.lilucb.lil_ucb`), to
  independent populations and to the exact reference.

The arm to find is

.. math:: x^* = \arg\max_i \sum_{n=1}^{N} l_{i,n} + N o_i,

with :math:`o_i` a constant offset per arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..validation import check_choice
from .bounds import EBSBound, NormalBound, normal_threshold
from .common import (
    BOUNDS,
    VARIANCES,
    RaceResult,
    RewardFn,
    TotalsFn,
    argmax_or_raise,
    as_reward_batch,
    check_hooks,
    check_reward_values,
    exact_totals,
    validate_race_args,
)
from .kernels import look_marginal, look_pairwise, look_rows, stuck_rows
from .schedule import ExactSwitch, doubling_schedule, position_stream

__all__ = [
    "BATCHES",
    "SPARSE_SHARE",
    "SPARSE_TOLERANCE",
    "RaceConfig",
    "RaceState",
    "SharedRace",
    "race",
    "race_exact",
    "race_shared",
    "sparse_arms",
]

#: Names accepted by ``RaceConfig.batches``.
BATCHES = ("blocks", "random", "windows")

_FLOAT64 = np.dtype(np.float64)  # a singleton: ``is`` tests it faster than ``==``
_NO_WIDTH = (-1.0, 0.0)  # no give-up count in a look

#: An arm whose rewards on a look equal the leader's on more than this share of the rows
#: has *sparse differences* with it: the few rows where they differ decide between them,
#: and a bound estimated from a batch that may hold none of them is not to be trusted.
SPARSE_SHARE = 0.5

#: Rewards count as equal when they differ by at most this fraction of the look's largest
#: reward: residuals of an expansion that is exact on a row (a term linear in the
#: parameter there) differ by rounding, not by zero.
SPARSE_TOLERANCE = 1e-9


def sparse_arms(batch: np.ndarray, lead: int) -> np.ndarray:
    r"""Return which arms' rewards equal the leader's on more than :data:`SPARSE_SHARE` of a look.

    Rewards :math:`r_{in}` and :math:`r_{\hat x n}` count as equal when
    :math:`|r_{in} - r_{\hat x n}| \le \epsilon \max_{j,m} |r_{jm}|`, with
    :math:`\epsilon` = :data:`SPARSE_TOLERANCE`.

    Parameters
    ----------
    batch : numpy.ndarray
        ``(arms, m)`` rewards of the look (finite).
    lead : int
        Row of the leader in ``batch``.

    Returns
    -------
    numpy.ndarray
        Boolean, one per arm; False for the leader.
    """
    tolerance = SPARSE_TOLERANCE * float(np.abs(batch).max()) if batch.size else 0.0
    close = np.abs(batch - batch[lead]) <= tolerance
    same = np.count_nonzero(close, axis=1) > SPARSE_SHARE * batch.shape[1]
    same[lead] = False
    return same


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
        check_choice("batches", self.batches, BATCHES)
        object.__setattr__(self, "delta", float(self.delta))
        object.__setattr__(self, "batch_size", int(self.batch_size))

    def looks(self, n_obs: int) -> np.ndarray:
        """Cumulative sample sizes of the looks for a population of ``n_obs``, ending at it."""
        return self.plan(1, n_obs)[0]

    def kernel_bound(self, n_arms: int, n_obs: int) -> NormalBound | EBSBound:
        """Return the bound for a race of ``n_arms`` arms on ``n_obs`` observations (cached)."""
        return self.plan(n_arms, n_obs)[1]

    def plan(self, n_arms: int, n_obs: int) -> tuple:
        """Return ``(looks, bound, widths, sizes)`` for a race, computed once per config and size.

        ``widths`` maps each look's cumulative size :math:`T` below :math:`N`
        to the compiled look's ``(factor, floor)`` (EBS: ``(-1, 0)``);
        ``sizes`` is ``looks`` as a tuple of Python ints.
        """
        key = (n_arms, n_obs)
        plan = self._cache.get(key)
        if plan is None:
            plan = self._cache[key] = self._make_plan(int(n_arms), int(n_obs))
        return plan

    def _make_plan(self, n_arms: int, n_obs: int) -> tuple:
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
        return looks, bound, widths, tuple(int(t) for t in looks)


class RaceState(NamedTuple):
    """State of a race on a shared population.

    Attributes
    ----------
    alive : numpy.ndarray
        int64 indices of the surviving arms.
    n_drawn : int
        Observations drawn so far (shared by the survivors).
    rows : numpy.ndarray
        ``(4, len(alive))``, one row each (also read as the properties of the
        same names):

        - ``mean``, the running mean reward of each survivor (offsets excluded);
        - ``dmean``, pairwise: the mean difference of the leader's rewards and
          each survivor's;
        - ``m2``, the centred sums of squares of those differences (pairwise),
          or of each survivor's rewards (marginal);
        - ``offset``, each survivor's offset.

        One array, so that a look passes and returns one
        (:func:`~pymc_subsample.racing.kernels.look_rows`).
    ref : int
        Pairwise: position in ``alive`` of the leader whose differences
        ``dmean`` and ``m2`` track (−1: none).
    n_ref : int
        Pairwise: observations behind ``dmean`` and ``m2``.
    means : numpy.ndarray
        Mean reward plus offset of every arm when it left the race (NaN while
        it races or if never evaluated; −inf for −inf rewards).
    n_evaluations : int
        Rewards evaluated so far.
    n_rounds : int
        Looks so far.
    winner : int
        The arm returned, −1 while the race goes on.
    n_stuck : int
        Survivors counted stuck by the look that made this state (see
        :meth:`SharedRace.hopeless`); −1 when that look did not count them.
    sparse : bool
        A look kept arms that its bound would have dropped because their
        differences with the leader were sparse (:func:`sparse_arms`): the
        race goes to its exact pass.
    """

    alive: np.ndarray
    n_drawn: int
    rows: np.ndarray
    ref: int
    n_ref: int
    means: np.ndarray
    n_evaluations: int
    n_rounds: int
    winner: int
    n_stuck: int = -1
    sparse: bool = False

    @property
    def mean(self) -> np.ndarray:
        """Running mean reward of each survivor (offsets excluded)."""
        return self.rows[0]

    @property
    def dmean(self) -> np.ndarray:
        """Pairwise: mean difference of the leader's rewards and each survivor's."""
        return self.rows[1]

    @property
    def m2(self) -> np.ndarray:
        """Centred sums of squares of the differences (pairwise) or rewards (marginal)."""
        return self.rows[2]

    @property
    def offset(self) -> np.ndarray:
        """Offset of each survivor."""
        return self.rows[3]


#: ``(alive, means)`` of the state before the first look, per number of arms (never written).
_INITIAL: dict[int, tuple[np.ndarray, np.ndarray]] = {}


class SharedRace:
    r"""The racing kernel for one population shared by all arms.

    Parameters
    ----------
    config : RaceConfig
        Settings.
    n_arms : int
        Number of arms :math:`D`.
    n_obs : int
        Population size :math:`N`.
    offsets : numpy.ndarray, optional
        Constant per arm added to its mean reward (the Gumbel-max sampler
        passes :math:`(\log f_0(i) + \varepsilon_i)/N`).
    """

    def __init__(self, config: RaceConfig, n_arms: int, n_obs: int, offsets=None):
        self.config = config
        self.n_arms = int(n_arms)
        self.n_obs = int(n_obs)
        self.offsets = np.zeros(self.n_arms) if offsets is None else offsets
        self.looks, self.bound, self._widths, self.look_sizes = config.plan(self.n_arms, self.n_obs)
        self.pairwise = config.variance == "pairwise" and self.n_arms > 1
        self.normal = config.bound == "normal"
        self._guard = self.normal and self.bound.guards_skew
        self._cantelli = self.bound.cantelli if self.normal else 0.0
        self._t_last = self.look_sizes[-2] if len(self.looks) > 1 else 0
        # the last subsampled look's width, for the give-up count inside each look
        self._last = (
            tuple(float(w) for w in self._widths[self._t_last]) if self.can_give_up else _NO_WIDTH
        )

    def with_offsets(self, offsets: np.ndarray) -> SharedRace:
        """Return a copy of this kernel with other offsets (the settings are shared, not copied)."""
        kernel = object.__new__(SharedRace)
        kernel.__dict__.update(self.__dict__)
        kernel.offsets = offsets
        return kernel

    def init(self) -> RaceState:
        """State before the first look: every arm alive, nothing drawn.

        Races of ``n_arms`` arms share its ``alive`` and ``means`` arrays:
        updates never write into a state's arrays, they return new ones.
        """
        d = self.n_arms
        first = _INITIAL.get(d)
        if first is None:
            first = _INITIAL[d] = (np.arange(d), np.full(d, np.nan))
        rows = np.zeros((4, d))
        rows[3] = self.offsets
        return RaceState(first[0], 0, rows, -1, 0, first[1], 0, 0, -1 if d > 1 else 0)

    def update(self, state: RaceState, batch: np.ndarray) -> RaceState:
        """Merge the survivors' rewards on the next look and eliminate; return the new state.

        Parameters
        ----------
        state : RaceState
            State before the look.
        batch : numpy.ndarray
            ``(len(state.alive), m)`` rewards on the look's new observations.

        Returns
        -------
        RaceState
            With ``winner >= 0`` when the race is decided; an empty ``alive``
            when every survivor hit a −inf reward (the caller then decides the
            arms dropped earlier exactly).

        Raises
        ------
        ValueError
            When a reward is NaN or +inf.
        """
        n_prev = state.n_drawn
        size = n_prev + batch.shape[1]
        n_evals = state.n_evaluations + batch.size
        n_rounds = state.n_rounds + 1
        if size < self.n_obs and self.normal:  # the common case: one compiled call
            factor, floor = self._widths.get(size) or self._width(size)
            new = np.empty((5, batch.shape[0]))
            last = self._last if size < self._t_last else _NO_WIDTH
            lead, n_ref, n_keep, n_stuck = look_rows(
                batch, n_prev, state.rows, state.ref, state.n_ref, factor, floor,
                self.pairwise, self._guard, self.n_obs, self._cantelli, new, last,
            )  # fmt: skip
            if lead >= 0:
                return self._drop(
                    state, new, lead, n_ref, n_keep, size, n_evals, n_rounds, n_stuck, batch
                )  # fmt: skip
        elif size < self.n_obs:  # Racing-EBS
            factor, floor = self._widths.get(size) or self._width(size)
            mean, dmean, m2, offsets = state.rows
            if self.pairwise:
                out = look_pairwise(
                    batch, n_prev, mean, state.ref, state.n_ref, dmean, m2, offsets, factor,
                    floor,
                )  # fmt: skip
            else:
                out = look_marginal(batch, n_prev, mean, m2, offsets, factor, floor)
            if out[1] >= 0:
                return self._eliminate(state, batch, out, size)
        elif np.isfinite(batch.sum()):
            return self._final(state, batch, size)
        check_reward_values(batch)  # NaN and +inf are errors; -inf drops the arm
        # an arm with a -inf term can never win
        alive, ref = state.alive, state.ref
        finite_rows = np.isfinite(batch).all(axis=1)
        rows = np.flatnonzero(finite_rows)
        means = state.means.copy()
        means[alive[~finite_rows]] = -np.inf
        ref = int(np.searchsorted(rows, ref)) if ref in rows else -1
        batch = batch[rows]
        dropped = state._replace(
            alive=alive[rows], rows=state.rows[:, rows], ref=ref, means=means,
            n_evaluations=n_evals - batch.size,
        )  # fmt: skip
        if len(dropped.alive) == 0:
            return dropped._replace(n_drawn=size, n_evaluations=n_evals, n_rounds=n_rounds)
        return self.update(dropped, batch)

    @property
    def can_give_up(self) -> bool:
        """True when the race ends in an exact pass before :math:`N` (an :class:`ExactSwitch`)."""
        return self.normal and self.config.exact.after is not None and len(self.looks) > 1

    def hopeless(self, state: RaceState) -> bool:
        r"""Predict that the race will not decide before its exact pass.

        An arm is stuck when its gap to the leader plus 1.5 of today's
        standard errors (:data:`~pymc_subsample.racing.kernels.GIVE_UP_MARGIN`)
        is below the half-width the bound will still have at the last
        subsampled look,
        :math:`\hat\mu_{\hat x} - \hat\mu_i + 1.5\,\widehat{\mathrm{se}}(T)
        < G(T_\text{last})`, with today's standard deviations: the race is
        unlikely to drop it in time. (Without the standard errors, a gap
        that is only small by chance at a small :math:`T` would send a race
        that was about to decide into an exact pass over all :math:`N`.) The
        race is hopeless when the stuck arms and the leader make at least
        half of the survivors: further looks would then not shrink the
        exact pass much. (With many arms, a few stuck neighbours of the leader
        do not stop the race from dropping the others first.) Going exact early
        never adds an error.
        """
        t_last = self._t_last
        if state.n_drawn >= t_last:
            return False
        stuck = state.n_stuck  # counted by the look that made the state (Racing-Normal)
        if stuck < 0:
            factor, floor = self._widths[t_last]
            stuck = stuck_rows(
                state.rows, state.ref, state.n_ref, state.n_drawn, self.pairwise, factor, floor,
                self.n_obs,
            )  # fmt: skip
        return stuck > 0 and 2 * (stuck + 1) >= len(state.alive)

    def _width(self, size: int) -> tuple[float, float]:
        """Return the look's ``(factor, floor)`` at a size off the schedule (cached)."""
        width = (
            (-1.0, 0.0) if not self.normal else (self.bound.factor(size), self.bound.floor(size))
        )
        self._widths[size] = width  # whole blocks round the same looks up the same way
        return width

    def _final(self, state: RaceState, batch: np.ndarray, size: int) -> RaceState:
        """Exact look on the last observations: only the means matter."""
        alive = state.alive
        score = (state.mean * state.n_drawn + batch.sum(axis=1)) / self.n_obs
        score += state.offset
        means = state.means.copy()
        means[alive] = score
        return state._replace(
            n_drawn=size,
            means=means,
            n_evaluations=state.n_evaluations + batch.size,
            n_rounds=state.n_rounds + 1,
            winner=int(alive[int(score.argmax())]),
        )

    def _drop(
        self, state, new, lead, n_ref, n_keep, size, n_evals, n_rounds, n_stuck=-1, batch=None
    ) -> RaceState:
        """Apply a :func:`~pymc_subsample.racing.kernels.look_rows` verdict to the state.

        ``new, lead, n_ref, n_keep, n_stuck`` as that look returns them:
        ``new`` the merged rows ``mean, dmean, m2, offset`` and then ``keep``.
        With the look's ``batch``, arms with sparse differences from the
        leader (:func:`sparse_arms`) are kept, whatever the bound says, and
        the state is marked ``sparse``.
        """
        alive = state.alive
        ref = lead if self.pairwise else -1
        means = state.means
        sparse = False
        if n_keep < len(alive) and len(alive) > 1 and batch is not None:
            kept = sparse_arms(batch, lead) & (new[4] == 0.0)
            if kept.any():  # their bound cannot be trusted: they stay, and the race goes exact
                new[4, kept] = 1.0
                n_keep += int(np.count_nonzero(kept))
                sparse = True
        if n_keep < len(alive) and len(alive) > 1:
            keep = new[4] != 0.0
            gone = ~keep
            means = means.copy()
            means[alive[gone]] = new[0, gone] + new[3, gone]
            if ref >= 0:
                ref = int(np.count_nonzero(keep[:ref]))
            alive, rows = alive[keep], new[:4, keep]
        else:
            rows = new[:4]
        winner = int(alive[0]) if len(alive) == 1 else -1
        return RaceState(
            alive, size, rows, ref, n_ref, means, n_evals, n_rounds, winner, n_stuck, sparse
        )

    def _eliminate(self, state: RaceState, batch: np.ndarray, out: tuple, size: int):
        """Racing-EBS: apply the compiled look's statistics and the EBS eliminations."""
        n_evals = state.n_evaluations + batch.size
        n_rounds = state.n_rounds + 1
        if self.pairwise:
            mean, lead, n_ref, dmean, m2, keep, _ = out
        else:
            (mean, lead, m2, keep, _), n_ref, dmean = out, state.n_ref, state.dmean
        offsets = state.offset
        if len(state.alive) > 1:
            keep = self._ebs_keep(batch, mean + offsets, lead, m2, n_ref, size)
        new = np.stack([mean, dmean, m2, offsets, keep.astype(float)])
        n_keep = int(np.count_nonzero(keep))
        return self._drop(state, new, lead, n_ref, n_keep, size, n_evals, n_rounds, batch=batch)

    def _ebs_keep(self, batch, score, lead, m2, n_ref, size) -> np.ndarray:
        """Racing-EBS elimination (the range of the latest batch stands in for a missing C)."""
        if self.pairwise:
            sigma = np.sqrt(np.maximum(m2 / n_ref, 0.0))
            spread = batch[lead] - batch
        else:
            sigma = np.sqrt(np.maximum(m2 / size, 0.0))
            spread = batch
        width = self.bound.width(sigma, size, spread.max(axis=1) - spread.min(axis=1))
        if self.pairwise:
            keep = score[lead] - score <= width
        else:
            keep = score[lead] - width[lead] <= score + width
        keep[lead] = True
        return keep

    def exact_look(self, state: RaceState, sums: np.ndarray, n_evaluations: int) -> RaceState:
        """Decide among the survivors from their exact sums over all observations."""
        score = sums / self.n_obs + state.offset
        means = state.means.copy()
        means[state.alive] = score
        winner = int(state.alive[argmax_or_raise(score)])
        return state._replace(
            n_drawn=self.n_obs,
            means=means,
            n_evaluations=state.n_evaluations + n_evaluations,
            n_rounds=state.n_rounds + 1,
            winner=winner,
        )

    def result(self, state: RaceState) -> RaceResult:
        """Return the :class:`~pymc_subsample.racing.common.RaceResult` of a decided race."""
        means, alive = state.means, state.alive
        if len(alive) == 1:  # the usual end: the winner alone, still racing
            i = alive[0]
            if np.isnan(means[i]):
                means = means.copy()
                means[i] = state.rows[0, 0] + state.rows[3, 0]
        elif np.isnan(means[alive]).any():
            means = means.copy()
            means[alive] = state.mean + state.offset
        exhausted = state.n_drawn >= self.n_obs
        return RaceResult(
            state.winner, state.n_evaluations, state.n_rounds, exhausted, state.n_drawn, means
        )


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
            return _exact_pass(kernel, state, rewards, totals)
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
            return _rescue(kernel, state, rewards, totals)
        if state.winner >= 0:
            break
        if state.sparse or (give_up and kernel.hopeless(state)):  # straight to the exact pass
            return _exact_pass(kernel, state, rewards, totals)
    return kernel.result(state)


def _exact_pass(kernel: SharedRace, state: RaceState, rewards, totals) -> RaceResult:
    """Decide among the survivors on their exact sums; rescue when every one of them is −inf."""
    n_obs = kernel.n_obs
    sums = exact_totals(rewards, state.alive, n_obs, totals)
    n_evaluations = n_obs * len(state.alive)
    if np.isfinite(sums).any():
        return kernel.result(kernel.exact_look(state, sums, n_evaluations))
    means = state.means.copy()
    means[state.alive] = -np.inf
    state = state._replace(
        alive=state.alive[:0], n_drawn=n_obs, means=means,
        n_evaluations=state.n_evaluations + n_evaluations, n_rounds=state.n_rounds + 1,
    )  # fmt: skip
    return _rescue(kernel, state, rewards, totals)


def _rescue(kernel: SharedRace, state: RaceState, rewards, totals) -> RaceResult:
    """All survivors hit −inf: the best arm was dropped earlier; decide the others exactly."""
    others = np.flatnonzero(np.isfinite(state.means))
    if len(others) == 0:
        argmax_or_raise(np.full(1, -np.inf))
    n_obs = kernel.n_obs
    sums = exact_totals(rewards, others, n_obs, totals) / n_obs + kernel.offsets[others]
    means = state.means.copy()
    means[others] = sums
    winner = int(others[argmax_or_raise(sums)])
    n_evals = state.n_evaluations + n_obs * len(others)
    return RaceResult(winner, n_evals, state.n_rounds + 1, True, n_obs, means)


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


__all__ += ["BOUNDS", "VARIANCES"]

r"""The state machine of a race on a shared population: state, kernel, result.

Racing-Normal and Racing-EBS (Chen & Ghahramani 2016, Alg. 1) as explicit
state, in the style of BlackJAX kernels:

* :class:`RaceState`, the state of one race (surviving arms, observations
  drawn, running means and cross-products, evaluations, looks);
* :class:`SharedRace`, the kernel for one population and one set of
  offsets, whose step functions are pure: :meth:`~SharedRace.init`,
  :meth:`~SharedRace.update` (one look), :meth:`~SharedRace.hopeless` (the
  give-up test) and :meth:`~SharedRace.finish` (the exact pass or rescue
  that ends a race not decided by its looks, then its
  :class:`~pymc_subsample.racing.common.RaceResult`, the info record).

Two drivers run this machine: :func:`~pymc_subsample.racing.race.race_shared`
in Python (any reward callback) and
:class:`~pymc_subsample.racing.compiled.CompiledRace`, whose looks run in one
compiled call on compiled rewards; both end through :meth:`SharedRace.finish`.
The arm to find is

.. math:: x^* = \arg\max_i \sum_{n=1}^{N} l_{i,n} + N o_i,

with :math:`o_i` a constant offset per arm.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .common import (
    RaceResult,
    RewardFn,
    TotalsFn,
    argmax_or_raise,
    check_reward_values,
    exact_totals,
)
from .config import RaceConfig
from .kernels import look_marginal, look_pairwise, look_rows, stuck_rows

__all__ = [
    "NO_WIDTH",
    "SPARSE_SHARE",
    "SPARSE_TOLERANCE",
    "RaceState",
    "SharedRace",
    "sparse_arms",
]

#: ``(factor, floor)`` of a look that counts no stuck arms (:func:`~.kernels.look_rows`).
NO_WIDTH = (-1.0, 0.0)


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

    Attributes
    ----------
    looks, bound, look_sizes
        The race's :class:`~pymc_subsample.racing.config.RacePlan` (``looks``,
        ``bound``, and ``sizes`` as ``look_sizes``).
    pairwise : bool
        Variances of differences with the leader (more than one arm).
    normal : bool
        Racing-Normal (else Racing-EBS).
    guard : bool
        Eliminations wait for Cochran's rule
        (:func:`~pymc_subsample.racing.kernels.skew_guard`).
    cantelli : float
        Standard errors beyond which a gap is decisive (0 for Racing-EBS).
    t_last : int
        Cumulative size of the last subsampled look (0 with none).
    last_width : tuple of float
        ``(factor, floor)`` at ``t_last`` when the race can give up
        (:attr:`can_give_up`), for the stuck count of each look; else
        :data:`NO_WIDTH`.
    """

    def __init__(self, config: RaceConfig, n_arms: int, n_obs: int, offsets=None):
        self.config = config
        self.n_arms = int(n_arms)
        self.n_obs = int(n_obs)
        self.offsets = np.zeros(self.n_arms) if offsets is None else offsets
        self.looks, self.bound, self._widths, self.look_sizes = config.plan(self.n_arms, self.n_obs)
        self.pairwise = config.variance == "pairwise" and self.n_arms > 1
        self.normal = config.bound == "normal"
        self.guard = self.normal and self.bound.guards_skew
        self.cantelli = self.bound.cantelli if self.normal else 0.0
        self.t_last = self.look_sizes[-2] if len(self.looks) > 1 else 0
        # the last subsampled look's width, for the give-up count inside each look
        self.last_width = (
            tuple(float(w) for w in self._widths[self.t_last]) if self.can_give_up else NO_WIDTH
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
            factor, floor = self._widths.get(size) or self.width(size)
            new = np.empty((5, batch.shape[0]))
            last = self.last_width if size < self.t_last else NO_WIDTH
            lead, n_ref, n_keep, n_stuck = look_rows(
                batch, n_prev, state.rows, state.ref, state.n_ref, factor, floor,
                self.pairwise, self.guard, self.n_obs, self.cantelli, new, last,
            )  # fmt: skip
            if lead >= 0:
                return self._drop(
                    state, new, lead, n_ref, n_keep, size, n_evals, n_rounds, n_stuck, batch
                )  # fmt: skip
        elif size < self.n_obs:  # Racing-EBS
            factor, floor = self._widths.get(size) or self.width(size)
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
            alive=alive[rows], rows=np.ascontiguousarray(state.rows[:, rows]), ref=ref, means=means,
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
        t_last = self.t_last
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

    def width(self, size: int) -> tuple[float, float]:
        """Return the ``(factor, floor)`` of a look at cumulative size ``size`` (cached).

        The half-width per unit standard deviation and the floor on a
        standard deviation (Racing-EBS: ``(-1, 0)``); sizes off the schedule
        (looks of whole blocks) are computed once and kept.
        """
        width = self._widths.get(size)
        if width is not None:
            return width
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
            # C order, as every other state's rows: a second layout is a second compilation
            alive, rows = alive[keep], np.ascontiguousarray(new[:4, keep])
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

    def finish(
        self, state: RaceState, totals: TotalsFn | None = None, rewards: RewardFn | None = None
    ) -> RaceResult:
        """End a race: its result when decided, else an exact pass over the survivors.

        A state that is not decided (``winner`` −1, after a look that gave up,
        kept arms with sparse differences, or stopped before :math:`N`) is
        decided from the survivors' exact sums, through ``totals`` (one fused
        pass) or else ``rewards`` on every observation. When every survivor has
        a −inf reward (none left, or −inf sums), the best arm was dropped
        earlier: the arms dropped with a finite mean are decided exactly (the
        rescue).

        Parameters
        ----------
        state : RaceState
            The state after the race's last look.
        totals : callable, optional
            ``totals(arms)``: each arm's sum over all :math:`N` observations.
        rewards : callable, optional
            ``rewards(arms, idx)``, read when ``totals`` is None.

        Returns
        -------
        RaceResult
            The info record of the race.

        Raises
        ------
        ValueError
            When a sum is NaN or +inf, or every arm's is −inf.
        """
        if state.winner >= 0:
            return self.result(state)
        if len(state.alive) == 0:
            return self._rescue(state, totals, rewards)
        n_obs = self.n_obs
        sums = exact_totals(rewards, state.alive, n_obs, totals)
        n_evaluations = n_obs * len(state.alive)
        if np.isfinite(sums).any():
            return self.result(self.exact_look(state, sums, n_evaluations))
        means = state.means.copy()
        means[state.alive] = -np.inf
        state = state._replace(
            alive=state.alive[:0], n_drawn=n_obs, means=means,
            n_evaluations=state.n_evaluations + n_evaluations, n_rounds=state.n_rounds + 1,
        )  # fmt: skip
        return self._rescue(state, totals, rewards)

    def _rescue(self, state: RaceState, totals, rewards) -> RaceResult:
        """All survivors hit −inf: decide the arms dropped with a finite mean exactly."""
        others = np.flatnonzero(np.isfinite(state.means))
        if len(others) == 0:
            argmax_or_raise(np.full(1, -np.inf))
        n_obs = self.n_obs
        sums = exact_totals(rewards, others, n_obs, totals) / n_obs + self.offsets[others]
        means = state.means.copy()
        means[others] = sums
        winner = int(others[argmax_or_raise(sums)])
        n_evals = state.n_evaluations + n_obs * len(others)
        return RaceResult(winner, n_evals, state.n_rounds + 1, True, n_obs, means)

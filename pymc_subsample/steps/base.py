"""Conduct shared by the racing PyMC steps: settings, per-chain state, batches, audits."""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import contextmanager

import numpy as np
from pymc.step_methods.compound import BlockedStep, Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator

from ..mcmc.audit import SCORE_RTOL, diagnose, error_rate_exceeds, explain
from ..mcmc.backoff import Backoff
from ..mcmc.cost import choose_exact_after, choose_first_batch, fit_round_cost, median_seconds
from ..model.function_cache import compile_cached
from ..model.row_support import RowSupport
from ..model.terms import ObservationTerms
from ..model.tiered import promotions, uncounted
from ..options import AuditOptions, RaceOptions, options_or_default
from ..racing import ExactSwitch, RaceConfig, warmup
from ..racing.common import validate_race_args
from ..racing.schedule import position_stream
from ..validation import ArgumentTypeError, check_bool, check_instance

__all__ = [
    "AUDIT_AGREE",
    "AUDIT_BUDGET",
    "AUDIT_DISAGREE",
    "AUDIT_NOT_RUN",
    "CERTAIN_ERROR_PROB",
    "FIRST_AUDIT_BY",
    "SHUFFLE_DIVISOR",
    "RacingStep",
    "RacingStepState",
    "check_step_context",
    "step_rng",
]

#: ``audit_agree`` value of a draw that was not audited.
AUDIT_NOT_RUN = -1
#: ``audit_agree`` value of an audited draw whose race decided as the exact computation.
AUDIT_AGREE = 1
#: ``audit_agree`` value of an audited draw whose race decided differently.
AUDIT_DISAGREE = 0
#: Share of the sampling time that audits may take with ``audit_every="auto"`` (the default).
AUDIT_BUDGET = 0.05
#: ``shuffle_every="auto"`` redraws the row permutation every :math:`N` / this many draws.
SHUFFLE_DIVISOR = 10
#: Every chain audits at least one raced decision by this draw (unless ``audit.every`` is 0),
#: whatever the time budget: the blocks whose exact passes are dearest are audited too.
FIRST_AUDIT_BY = 50
#: An audit that finds the race chose a value of exact conditional probability below this
#: (a value impossible on rows the race did not read) acts at once, whatever the count.
CERTAIN_ERROR_PROB = 1e-12


def check_step_context(model, initial_point, compile_kwargs) -> None:
    """Check the PyMC arguments every step takes: ``model``, ``initial_point``, ``compile_kwargs``.

    Raises
    ------
    ArgumentTypeError
        For a model that is not a ``pm.Model``, or a point or compile
        keywords that are not dicts (None is accepted for each).
    """
    import pymc as pm

    check_instance("model", model, pm.Model, example="model (a pm.Model)")
    check_instance("initial_point", initial_point, dict, example="model.initial_point()")
    check_instance("compile_kwargs", compile_kwargs, dict, example="{'mode': 'FAST_RUN'}")


def step_rng(rng) -> np.random.Generator:
    """Return PyMC's generator for ``rng``; raise naming ``rng`` when it is not a seed."""
    try:
        return get_random_generator(rng)
    except (TypeError, ValueError) as err:
        raise ArgumentTypeError(
            f"rng must be None, an integer seed (or a sequence of them), a numpy Generator or "
            f"BitGenerator, got {rng!r} ({err}); e.g. rng=42"
        ) from err


@dataclass_state
class RacingStepState(StepMethodState):
    """Sampling state saved and restored between sequential chains."""

    n_steps: int


class RacingStep(BlockedStep):
    r"""Base class of the racing steps: settings, model terms, rng, batches, audits.

    Subclasses set ``name`` and ``stats_dtypes_shapes``, call this
    ``__init__`` and then :meth:`_set_exact_switch`, and implement ``step``.

    Parameters
    ----------
    vars : list
        The block.
    delta : float
        Error allowed per decision, in (0, 1) (the races' error rate:
        :attr:`race_delta` may lower it, never raise it).
    race : RaceOptions
        How each race runs (:class:`~pymc_subsample.options.RaceOptions`), its
        "auto" settings as the step leaves them: ``batch_size`` and
        ``exact_fraction`` are then chosen by timing the model
        (:meth:`_plan_races`); ``shuffle_every`` redraws the row permutation every
        :math:`\max(1, \lfloor N /` :data:`SHUFFLE_DIVISOR` :math:`\rfloor)` draws;
        ``backoff`` decides exactly while most recent races gave up
        (:class:`~pymc_subsample.mcmc.backoff.Backoff`, reset at every chain).
    audit : AuditOptions
        How the step checks its decisions (:class:`~pymc_subsample.options.AuditOptions`):
        every ``audit.every``-th draw, or (``"auto"``) draw :math:`t` when the time
        spent in audits so far is at most :data:`AUDIT_BUDGET` of this step's own
        time, :math:`S_{\text{audit}}(t) \le 0.05\, S(t)`, against the model's own
        joint log density (:meth:`_joint_scores`). When the audited error rate is
        significantly above ``delta``, the step warns and, with ``audit.act``,
        decides exactly for the rest of its run (:attr:`audit_exact`). Details:
        :ref:`racing-step`.
    data : list, optional
        Per-observation data inputs (:class:`~pymc_subsample.model.terms.ObservationTerms`).
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.

    Attributes
    ----------
    race : RaceOptions
        The race settings as given (after the subclass's own "auto" choices).
    audit : AuditOptions
        The audit settings as given.
    batch_size : int
        The first batch used (``race.batch_size``, or the one "auto" chose).
    shuffle_every : int
        Draws between redraws of the row permutation (``race.shuffle_every``
        resolved for the current :math:`N`).
    """

    _state_class = RacingStepState

    def __init__(
        self,
        vars,
        *,
        delta: float,
        race: RaceOptions,
        audit: AuditOptions,
        data,
        model,
        rng,
        initial_point,
        compile_kwargs,
        blocked: bool,
    ):
        import pymc as pm

        check_step_context(model, initial_point, compile_kwargs)
        race = options_or_default("race", race, RaceOptions)
        audit = options_or_default("audit", audit, AuditOptions)
        self.model = pm.modelcontext(model)
        self.race = race
        self.audit = audit
        auto_batch = race.batch_size == "auto"
        self.delta = validate_race_args(
            delta, race.bound, 50 if auto_batch else race.batch_size, race.variance, 1
        )
        self.batch_size = None if auto_batch else int(race.batch_size)
        blocked = check_bool("blocked", blocked)
        self.rng = step_rng(rng)
        self._compile_kwargs = dict(compile_kwargs or {})
        self._joint_fn = None  # the model's joint log density, compiled at the first audit
        #: True once audits found the races wrong: every later decision is exact. Kept across
        #: chains (a fault found in one chain holds in the next).
        self.audit_exact = False
        #: True when those exact decisions take the joint log density, the race's own terms
        #: having been found not to be the model's (a "structural" cause).
        self._exact_independent = False
        #: The cause the audits named when they found the races wrong
        #: (:data:`~pymc_subsample.mcmc.audit.CAUSES`), None before; kept across chains.
        self.audit_cause: str | None = None
        if initial_point is None:
            initial_point = self.model.initial_point()
        self.initial_point = initial_point
        self.terms = ObservationTerms(
            self.model,
            vars,
            data=data,
            initial_point=initial_point,
            compile_kwargs=compile_kwargs,
            batches=race.batches,
        )
        self.vars = self.terms.vars
        #: which candidates are finite on every row, when the block moves the terms' support
        self.row_support = RowSupport(self.terms)
        #: True when the support moves with the block in a way no cheap check sees: every
        #: decision is then exact (:attr:`decides_exactly`)
        self._support_exact = False
        #: True while the racing kernels compile in another process (:mod:`~pymc_subsample.
        #: racing.warmup`): every decision is then exact, and the races planned after
        self._kernels_pending = False
        if self.row_support.mode == "unknown":
            self._decide_exactly_for_support(self.row_support.reason)
        self._auto_shuffle = race.shuffle_every == "auto"
        if self.terms.out_of_core and not self._auto_shuffle:
            raise ValueError(
                f"RaceOptions(shuffle_every={race.shuffle_every}) on out-of-core data "
                "(pymc_subsample.Data): the row permutation is drawn once and kept in the "
                "store with the data (a new one would rewrite every row), so it is never "
                "redrawn; leave shuffle_every at 'auto'"
            )
        self.shuffle_every = (
            max(1, self.terms.n_obs // SHUFFLE_DIVISOR)
            if self._auto_shuffle
            else int(race.shuffle_every)
        )
        self.blocked = blocked
        self._backoff = Backoff(race.backoff)
        self.tune = False
        self.n_steps = 0
        self.race_config: RaceConfig | None = None
        self.exact_switch = ExactSwitch.never()
        self._reset_audits()
        self._shuffle()
        self._seen_promotions = promotions()

    # -- settings (read-only views of the options) ----------------------------------

    def _decide_exactly_for_support(self, reason: str) -> None:
        """Decide every draw exactly: the support moves with the block, unchecked; say so once."""
        self._support_exact = True
        names = ", ".join(v.name for v in self.vars)
        warnings.warn(
            f"{type(self).__name__}: the likelihood terms of {names} are -inf on some rows "
            f"and not others depending on the value of {names} (a support bounded by the "
            f"parameter), and the step cannot tell cheaply which values are possible on every "
            f"row ({reason}): a race reading a few rows could pick an impossible value, so "
            "every decision of this step is exact (all N rows). To race, write the bound as a "
            "comparison of the parameter with the data (as PyMC's DiscreteUniform, Uniform, "
            "Truncated and Binomial do), or sample this variable with an exact PyMC step",
            UserWarning,
            stacklevel=4,
        )

    @property
    def bound(self) -> str:
        """The races' bound (``race.bound``)."""
        return self.race.bound

    @property
    def variance(self) -> str:
        """The races' variance estimate (``race.variance``)."""
        return self.race.variance

    @property
    def reward_range(self) -> float | None:
        """The known range of a reward difference, or None (``race.reward_range``)."""
        return self.race.reward_range

    @property
    def backoff(self) -> bool:
        """Whether the step backs off to exact decisions (``race.backoff``)."""
        return self.race.backoff

    @property
    def audit_every(self) -> int | str:
        """Draws between audits, 0 or "auto" (``audit.every``)."""
        return self.audit.every

    # -- settings ------------------------------------------------------------------

    def _check_expand_in(self, expand_in, fix: str) -> None:
        """Refuse ``expand_in`` without control variates, whose expansion it is in."""
        if expand_in and not self.control_variates:
            raise ValueError(
                "expand_in names the coordinates of the control variates' expansion, and "
                f"control_variates is off: {fix}"
            )

    def _plan_races(self, n_cands: int) -> None:
        """Resolve ``batch_size="auto"`` and ``exact_fraction``; build :attr:`race_config`.

        Both "auto" settings time a batch and a fused exact evaluation of
        ``n_cands`` candidates at the initial point once
        (:func:`~pymc_subsample.mcmc.cost.fit_round_cost`): the first batch then
        balances the look's fixed cost against its terms
        (:func:`~pymc_subsample.mcmc.cost.choose_first_batch`), and the exact
        switch keeps a race within half of an exact decision
        (:func:`~pymc_subsample.mcmc.cost.choose_exact_after`); again at new data
        (:meth:`_replan_races`).
        """
        exact_fraction = self.race.exact_fraction
        auto_switch = exact_fraction == "auto"
        self._auto_plan = (self.batch_size is None, auto_switch)
        self._exact_fraction = exact_fraction
        self._n_cands = n_cands
        # a function compiled on this machine before starts in Numba (its machine code
        # cached); the others wait until they have paid, as on a model new to the machine
        self._replan_races(self.initial_point)

    def _rows_promoted(self) -> bool:
        """Return True once the terms' rows function (the races' hot path) runs compiled."""
        return bool(getattr(getattr(self.terms, "_rows_fn", None), "promoted", False))

    def _replan_races(self, point) -> None:
        """Time the model at ``point`` if a setting is "auto"; set the plan for :math:`N`.

        While another process compiles the racing kernels
        (:func:`~pymc_subsample.racing.warmup.ready` is False), nothing is timed
        and every decision is exact; :meth:`step` plans again once they are ready.
        """
        cost = exact = None
        # a race calls the racing kernels (and is timed on them): decide exactly while
        # another process compiles them (not out of core, where an exact decision is a pass)
        self._kernels_pending = not self.terms.out_of_core and not warmup.ready()
        if any(self._auto_plan) and self.terms.n_obs >= 200 and not self._kernels_pending:
            cost, exact = self._measure(point, self._n_cands)
        self._exact_seconds = exact
        self._choose_plan(cost)

    def _choose_plan(self, cost: tuple[float, float] | None) -> None:
        """Set the first batch (if "auto"), the exact switch and :attr:`race_config`.

        ``cost`` is the fitted cost ``(a, b)`` of a look (None: not timed).
        """
        n_obs = self.terms.n_obs
        auto_batch, auto_switch = self._auto_plan
        if auto_batch:
            self.batch_size = 50 if cost is None else choose_first_batch(n_obs, cost)
        if auto_switch:
            exact = self._exact_seconds
            after = (
                n_obs if cost is None else choose_exact_after(n_obs, self.batch_size, cost, exact)
            )
        else:
            after = int(np.ceil(self._exact_fraction * n_obs))
            # fewer than three looks cannot pay for the race's overhead: decide at once
            after = after if after >= 4 * self.batch_size else 0
        self.exact_switch = ExactSwitch.never() if after >= n_obs else ExactSwitch(after)
        if self.bound in ("normal", "ebs"):
            self.race_config = RaceConfig(
                delta=self.race_delta,
                bound=self.bound,
                variance=self.variance,
                batch_size=self.batch_size,
                reward_range=self.reward_range,
                exact=self.exact_switch,
                batches=self.terms.batches,
            )

    @property
    def race(self) -> RaceOptions:
        """The race options; on a built step only ``bound`` may change, to "exact" and back.

        The rest of the plan (first batch, exact switch, compiled driver) was
        built from these options, so a new value of another field, or a bound
        other than the one built and ``"exact"``, raises instead of being
        ignored: build a new step for those.
        """
        return self._race_options

    @race.setter
    def race(self, race: RaceOptions) -> None:
        check_instance("race", race, RaceOptions, example="RaceOptions(bound='exact')")
        built = getattr(self, "_built_race", None)
        if built is None:  # construction
            self._race_options = self._built_race = race
            return
        changed = [
            f.name
            for f in dataclasses.fields(RaceOptions)
            if f.name != "bound" and getattr(race, f.name) != getattr(built, f.name)
        ]
        if changed or race.bound not in (built.bound, "exact"):
            what = ", ".join(changed) or f"bound={race.bound!r}"
            raise ValueError(
                f"a built step takes new race options only to switch its bound between "
                f"{built.bound!r} and 'exact' (got {what}): build a new step with "
                "race=RaceOptions(...) for other settings"
            )
        self._race_options = race

    @property
    def exact_after(self) -> int:
        """Largest cumulative sample size a race draws before its exact pass (N: never)."""
        after = self.exact_switch.after
        return self.terms.n_obs if after is None else after

    @property
    def race_delta(self) -> float:
        """The races' error probability: ``delta`` (a step may lower it, never raise it)."""
        return self.delta

    @property
    def decides_exactly(self) -> bool:
        """True when every decision is made exactly.

        ``bound="exact"``, an immediate switch, audits that found the races
        wrong (:attr:`audit_exact`), a support that moves with the block in a
        way no cheap check sees (:class:`~pymc_subsample.model.row_support.RowSupport`),
        or, for the first draws on a machine that has not compiled the racing
        kernels yet, while another process compiles them
        (:mod:`~pymc_subsample.racing.warmup`).
        """
        return self._exact_for_now or self._kernels_pending

    @property
    def _exact_for_now(self) -> bool:
        """The reasons of :attr:`decides_exactly` other than the pending kernels' warm-up."""
        return (
            self.bound == "exact"
            or self.exact_switch.decides_at_once
            or self.audit_exact
            or self._support_exact
        )

    def _measure(self, point, n_cands: int) -> tuple[tuple[float, float], float]:
        """Time batch and exact evaluations at ``point``: ``((a, b), exact_seconds)``."""
        n_obs = self.terms.n_obs
        cands = [np.repeat(np.asarray(point[v.name])[None], n_cands, axis=0) for v in self.vars]

        rng = np.random.default_rng(0)
        layout = self.terms.batches

        def look(m):  # a look as a race makes it: fresh positions (cold memory), then rewards
            positions = position_stream(layout, n_obs, rng).take(m)
            return self._batch_rewards(cands, positions, point)

        def call_seconds(m):
            m = min(m, n_obs)
            return median_seconds(lambda: look(m))

        with uncounted():  # timing calls: no function moves to its compiled tier for them
            exact = median_seconds(lambda: self.terms.loglik_sum(cands, point))
            return fit_round_cost(call_seconds, n_cands, n_obs), exact

    def _batch_rewards(self, cands, positions, point) -> np.ndarray:
        """Return what a race's look evaluates on a batch: the raw terms here.

        Steps with control variates evaluate residuals instead; :meth:`_measure` times this.
        """
        return self.terms.loglik_batch(cands, positions, point)

    # -- per-chain state -------------------------------------------------------------

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, draw counter, permutation, back-off) before a chain."""
        super().setup_chain(rng, tune, draws)
        self._backoff.reset()
        self.n_steps = 0
        self.tune = tune > 0
        self._reset_audits()
        if self.terms.data_unchanged():
            self._shuffle()
        # otherwise the first draw takes up the new data, and shuffles them

    @property
    def backoff_state(self) -> dict:
        """Per decision key, the back-off's ``(run, left, share)``: a copy, empty as a chain starts.

        Read from :class:`~pymc_subsample.mcmc.backoff.Backoff` (its ``state``).
        """
        return {key: tuple(state) for key, state in self._backoff.state.items()}

    def data_changed(self) -> None:
        """Take up the current values of the data inputs now (:meth:`_take_up_data`).

        Not needed after ``pm.set_data``: every draw checks that each pm.Data
        input of the terms still holds the array the step was built on, and
        takes up new ones itself (with a warning). Call it after writing into
        a data array in place, which that check cannot see, or to rebuild
        before sampling (no warning).
        """
        self._take_up_data(self.initial_point, warn=False)

    def _take_up_data(self, point, *, warn: bool) -> None:
        """Rebuild everything that depends on the data, after ``pm.set_data``.

        :math:`N`, the row permutation and its copies
        (:meth:`ObservationTerms.take_up_data
        <pymc_subsample.model.terms.ObservationTerms.take_up_data>`), ``shuffle_every``
        when "auto", the back-off, the race plan (:meth:`_replan_races`; for a
        new :math:`N` only: the plan depends on :math:`N` and the cost of a
        term, not on the values) and, in :meth:`_data_taken_up`, what the
        subclass fitted to the old data.
        With ``warn``, says so in a ``UserWarning``.

        Raises
        ------
        ValueError
            When the new data cannot be taken up (per-observation inputs of
            different lengths, no rows, missing values): the step then
            refuses every draw until they can.
        """
        changed, old_n, new_n = self.terms.take_up_data(point)
        self.row_support.take_up_data()
        if self._auto_shuffle:
            self.shuffle_every = max(1, new_n // SHUFFLE_DIVISOR)
        self._backoff.reset()
        self._shuffle()
        resized = new_n != old_n
        if resized:
            self._replan_races(point)
        self._data_taken_up(point, resized)
        if warn:
            warnings.warn(
                f"{type(self).__name__}: the data changed since it last read them "
                f"({', '.join(changed)} set anew, e.g. by pm.set_data; N = {old_n} -> {new_n}); "
                "it rebuilt everything that depends on them (row permutation, race plan, "
                "fitted sums) before this draw",
                UserWarning,
                stacklevel=3,
            )

    def _data_taken_up(self, point, resized: bool) -> None:
        """Drop or refit what the subclass derived from the old data (``resized``: new N)."""

    def _shuffle(self) -> None:
        self.terms.shuffle(self.rng)
        self._since_shuffle = 0

    def step(self, point):
        """Draw the block once; return the new point and the stats (PyMC's ``BlockedStep``).

        Times the draw, audits included: the ``"auto"`` rule of ``audit_every``
        budgets the audits against this step's own time. First checks that the
        data are those the step last read, and takes up new ones
        (:meth:`_take_up_data`).
        """
        if not self.terms.data_unchanged():
            self._take_up_data(point, warn=True)
        if self._seen_promotions != promotions() or (self._kernels_pending and warmup.ready()):
            self._seen_promotions = promotions()
            self._functions_promoted(point)  # the costs changed: plan the races again
        start = time.perf_counter()
        audit = self._begin_draw()
        if (
            audit
            and self._joint_fn is None
            and not self.terms.out_of_core
            and not self.decides_exactly
        ):  # compiled once, outside both clocks; a step that decides exactly has no race to audit
            self._compile_joint()
            start = time.perf_counter()
        try:
            return self._draw(point, audit)
        finally:
            self._run_seconds += time.perf_counter() - start

    def finish_compiling(self) -> None:
        """Compile the step's hot functions with Numba now, and plan the races on them.

        A step starts on PyTensor's Python VM and compiles each function once
        its calls have paid for it (:mod:`~pymc_subsample.model.tiered`): the
        first draws come early, the fast ones after a fraction of a second of
        sampling. Calling this reaches that steady state at once (for timing a
        step, say); the chain's law is the same either way.
        """
        self.terms.promote()
        warmup.wait()
        self._seen_promotions = promotions()
        self._functions_promoted(self.initial_point)

    def _functions_promoted(self, point) -> None:
        """Plan the races again: functions moved to their final tier, or the kernels came.

        The "auto" settings were chosen by timing the functions
        (:meth:`_plan_races`); a function that moved from PyTensor's Python VM
        to Numba (:class:`~pymc_subsample.model.tiered.TieredFunction`) costs
        far less a call, so the plan is made again at ``point``. Each race
        stays a race of its settings: the chain's law is unchanged. Once the
        rows function (the races' hot path) has moved, the terms' other
        functions move with it where this machine holds their machine code
        (:meth:`ObservationTerms.promote
        <pymc_subsample.model.terms.ObservationTerms.promote>`): the plan times
        the exact pass too. The others move once they have paid: compiling them
        here put a compilation of seconds before the first draw of a model's
        second run; exact decisions count towards the race driver's budget, so
        a plan timed on the slow tier still reaches the compiled race. Also called
        once the racing kernels that another process compiled are ready
        (:mod:`~pymc_subsample.racing.warmup`): the races start then.
        """
        if self._rows_promoted():
            self.terms.promote(loop=False, compiled_only=True)
        if any(self._auto_plan) or self._kernels_pending:
            self._replan_races(point)

    def _draw(self, point, audit: bool):
        """Draw the block once (audited when ``audit``); return the new point and the stats."""
        raise NotImplementedError

    def _begin_draw(self) -> bool:
        """Advance the draw counter, redraw the permutation when due; True if audited."""
        self.n_steps += 1
        self._since_shuffle += 1
        if self._since_shuffle > self.shuffle_every:
            self._shuffle()
            self._since_shuffle = 1
        if self.audit_every == 0:
            return False
        if self.n_audits == 0 and self.n_steps >= FIRST_AUDIT_BY:  # none yet this chain
            return True
        if self.audit_every == "auto":
            return self._audit_seconds <= AUDIT_BUDGET * self._run_seconds
        return self.n_steps % self.audit_every == 0

    # -- audits ----------------------------------------------------------------------

    def _reset_audits(self) -> None:
        """Reset the audits' per-chain counters (not :attr:`audit_exact`, kept across chains)."""
        self.n_audits = 0
        self.n_disagreements = 0
        self.n_structural = 0  # audits whose exact decision from our terms was not the model's
        self._zero_shares: list[float] = []  # batches' shares of zero differences, when wrong
        self._run_seconds = 0.0  # in this step's draws since the chain's first one
        self._audit_seconds = 0.0  # in the audits' exact passes
        self._fastest_audit = np.inf

    @property
    def audit_time_fraction(self) -> float:
        """Share of this step's time in this chain spent in audits so far (0 before a draw)."""
        return self._audit_seconds / self._run_seconds if self._run_seconds > 0 else 0.0

    @contextmanager
    def _audit_clock(self):
        """Time an audit's exact pass (the ``"auto"`` rule of ``audit_every`` reads it)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            # a one-off stall (a first call, garbage collection) is charged at most three
            # times the fastest audit, so that it does not stop the audits for long
            seconds = time.perf_counter() - start
            self._fastest_audit = min(self._fastest_audit, seconds)
            self._audit_seconds += min(seconds, 3.0 * self._fastest_audit)

    def _joint_scores(self, candidates, point) -> np.ndarray:
        r"""Return the model's joint log density at each candidate of the block, shape ``(K,)``.

        The exact path of the audits, independent of the race's machinery: the
        model's own log density (every term, Jacobians included, as
        ``model.logp()``) on the data as they are (the ``pm.Data`` variables,
        not the race's row-permuted copies), compiled at the first call. Scores
        of two candidates differ by :math:`\log f_0 + \sum_n \log f_n` of the
        model, whatever the race's terms; one pass over the data per candidate.
        Out of core (``pymc_subsample.Data``), whose placeholders the model's
        log density cannot read, the terms' own :math:`\log f_0` and their
        sums over every row (a Dask pass over the data in their own order).
        """
        if self.terms.out_of_core:  # the model's log density reads placeholders: the terms'
            self._score_rtol = SCORE_RTOL  # sums, a Dask pass over every row
            log_f0 = self.terms.log_f0(candidates, point)
            return log_f0 + self.terms.loglik_sum(candidates, point)
        if self._joint_fn is None:
            self._compile_joint()
        names = [v.name for v in self.model.value_vars]
        n_cands = len(candidates[0])
        scores = np.empty(n_cands)
        for k in range(n_cands):
            at = dict(point)
            for v, c in zip(self.vars, candidates, strict=True):
                at[v.name] = c[k]
            scores[k] = float(self._joint_fn(*[at[n] for n in names]))
        return scores

    def _compile_joint(self) -> None:
        """Compile the model's joint log density for :meth:`_joint_scores`, and call it once."""
        # tiered (model/tiered.py): compiled once the audits have paid for it, so that
        # the first draws do not wait for it; the "auto" audits, budgeted on their time,
        # are sparser until then
        kwargs = {"on_unused_input": "ignore", **self._compile_kwargs}
        model = self.model
        fn = compile_cached(model, model.logp(), model.value_vars, **kwargs)
        value = fn(*[self.initial_point[v.name] for v in model.value_vars])
        self._joint_fn = fn
        # single precision rounds a sum over many rows far above the double one
        self._score_rtol = SCORE_RTOL if np.asarray(value).dtype == np.float64 else 1e-4

    def _audit_batch(self, candidates, point) -> np.ndarray:
        """Raw terms of ``candidates`` on a batch as a race reads it (a private rng, not ``rng``).

        For :func:`~pymc_subsample.mcmc.audit.zero_difference_share` at a wrong decision.
        """
        n_obs = self.terms.n_obs
        size = min(n_obs, max(int(self.batch_size or 50), 50))
        rng = np.random.default_rng(self.n_audits)
        positions = position_stream(self.terms.batches, n_obs, rng).take(size)
        return self.terms.loglik_batch(candidates, positions, point)

    def _record_audit(
        self,
        agree: bool,
        *,
        structural: bool = False,
        zero_share: float | None = None,
        certain: bool = False,
        impossible: bool = False,
    ) -> None:
        r"""Count an audited decision; act when the error rate clearly exceeds delta.

        ``structural``: the exact decision from the race's own terms differed
        from the model's (:func:`~pymc_subsample.mcmc.audit.scores_differ`);
        ``zero_share``: the share of zero per-row differences on a batch
        (:func:`~pymc_subsample.mcmc.audit.zero_difference_share`), measured at
        wrong decisions. When the error rate is significantly above delta
        (:func:`~pymc_subsample.mcmc.audit.error_rate_exceeds`), the step warns,
        naming the cause (:func:`~pymc_subsample.mcmc.audit.diagnose`), and, with
        ``audit.act``, decides exactly from then on (:attr:`audit_exact`), from the
        model's joint log density if the cause is structural; with ``act=False``
        it only warns (once: :attr:`audit_cause` is then set). ``certain``: the
        race chose a value of exact probability below :data:`CERTAIN_ERROR_PROB`,
        an error no rate of delta explains: the step acts at once, naming the
        moving support as the cause when the value was ``impossible`` (its exact
        log density :math:`-\infty`), else the cause the audits measured.
        """
        self.n_audits += 1
        self.n_disagreements += int(not agree)
        self.n_structural += int(structural)
        if zero_share is not None:
            self._zero_shares.append(float(zero_share))
        if agree or (self.audit_cause is not None and not certain) or self.audit_exact:
            # P(Binomial(n, delta) >= k) grows with n at fixed k: an agreement cannot make
            # the test below pass, so it is run (a slow scipy call) only at disagreements
            return
        k, n = self.n_disagreements, self.n_audits
        if certain or error_rate_exceeds(k, n, self.race_delta):
            share = float(np.mean(self._zero_shares)) if self._zero_shares else None
            cause = "support" if impossible else diagnose(self.n_structural, share)
            self.audit_cause = cause
            act = self.audit.act
            if act:
                self.audit_exact = True
                self._exact_independent = cause == "structural"
            warnings.warn(
                explain(cause, type(self).__name__, k, n, self.race_delta, act=act),
                UserWarning,
                stacklevel=3,
            )

    def reset_tuning(self):
        """Nothing to reset: the Gibbs race has no tuning parameters."""
        return

    @staticmethod
    def competence(var, has_grad):
        """Never assigned automatically: pass the step to ``pm.sample(step=...)``."""
        return Competence.INCOMPATIBLE

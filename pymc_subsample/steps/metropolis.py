r"""RacingMetropolis: Metropolis–Hastings whose accept test is a race on mini-batches.

MH from :math:`\theta` to :math:`\theta'` with :math:`u \sim U(0,1)` accepts iff
:math:`\log u < \log f_0(\theta') - \log f_0(\theta) + \sum_n (l_n(\theta') -
l_n(\theta)) + c`, with :math:`c` the proposal's part of the log ratio. The sum is
decided by a two-arm race (Chen & Ghahramani 2016, Sec. 4;
:func:`~pymc_subsample.racing.mh_test`) on the residuals :math:`l_n - h_n` of a
second-order Taylor control variate :math:`h_n` around a reference point
(exact derivatives of the graph, :class:`~pymc_subsample.mcmc.surrogate.TaylorSurrogate`,
or, for a graph that cannot be differentiated twice, a finite-difference
stencil, :class:`~pymc_subsample.mcmc.surrogate.QuadraticSurrogate`; Bardenet,
Doucet & Holmes 2017; Cornish et al. 2019), with the exact sums of :math:`h_n` moved to
the offsets. The same surrogate drives the default proposal: a Hamiltonian
trajectory on :math:`\log f_0 + \sum_n h_n`, which reads no data.

This module holds the MH decision; the proposals and their tuning are in
:mod:`~pymc_subsample.steps.metropolis_proposals`, the surrogate's build and
fit in :mod:`~pymc_subsample.steps.metropolis_surrogate`, the switch to NUTS
in :mod:`~pymc_subsample.steps.nuts_regime`.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import replace

import numpy as np
from pymc.step_methods.state import dataclass_state

from ..mcmc.adaptation import HMCAdaptationState
from ..mcmc.audit import scores_differ, zero_difference_share
from ..mcmc.backoff import Backoff
from ..mcmc.laplace import FlatBlock, LaplaceFit
from ..mcmc.regime import SMALL_N, FitCheck, Regime
from ..model.blocks import check_expand_in, continuous_value_vars, prior_points
from ..model.gradient_path import (
    GradientPath,
    block_names,
    gradient_path,
    refuse_gradient_features,
    zero_gradient,
)
from ..model.row_locality import LOCALITY_DRAWS
from ..options import (
    AuditOptions,
    ProposalOptions,
    RaceOptions,
    options_or_default,
    reject_moved_keywords,
)
from ..racing import mh_test
from ..validation import check_bool, check_choice, check_float
from .base import (
    AUDIT_AGREE,
    AUDIT_DISAGREE,
    AUDIT_NOT_RUN,
    RacingStep,
    RacingStepState,
    check_step_context,
)
from .metropolis_proposals import MetropolisProposals
from .metropolis_surrogate import MetropolisSurrogate
from .nuts_regime import NutsRegime

__all__ = ["PROPOSALS", "RacingMetropolis", "RacingMetropolisState"]

#: Names accepted by ``proposal``.
PROPOSALS = ("hmc", "normal", "langevin")
#: Tuning decisions whose acceptance sets :attr:`RacingMetropolis.race_delta` (the last ones),
#: and the fewest that do.
_DELTA_WINDOW = 200
_DELTA_MIN_DECISIONS = 20
#: Draws between scale updates, at most, of the random walk of a block without a gradient.
_NO_GRADIENT_TUNE_INTERVAL = 20
#: Rows on which the terms' gradient is evaluated where the gradient rule cannot decide.
_GRADIENT_CHECK_ROWS = 1024


@dataclass_state
class RacingMetropolisState(RacingStepState):
    """Everything a draw of :class:`RacingMetropolis` changes, for PyMC's ``sampling_state``.

    Saved and restored as PyMC's ``MetropolisState`` is: restoring a state gives
    the same next draws from the same point. What it holds and leaves out:
    :ref:`metropolis-step`.
    """

    tune: bool
    scaling: float | np.ndarray
    steps_until_tune: int
    accepted_sum: np.ndarray
    hmc_adaptation: HMCAdaptationState
    delta_share: float
    _tuning_accepts: deque
    _started: bool
    _backoff: Backoff


class RacingMetropolis(NutsRegime, MetropolisProposals, MetropolisSurrogate, RacingStep):
    r"""Metropolis–Hastings step for continuous variables with a racing accept test.

    Updates a block of continuous variables in PyMC's unconstrained value space.
    A move from :math:`\theta` to :math:`\theta'` is accepted iff
    :math:`\log u < \log f_0(\theta') - \log f_0(\theta) + \sum_n (l_n(\theta') -
    l_n(\theta)) + c`, the sum decided by a two-arm race on the residuals
    :math:`l_n - h_n` of a second-order control variate :math:`h_n` fitted at the
    posterior mode (Chen & Ghahramani 2016, Sec. 4; Bardenet, Doucet & Holmes 2017):
    each decision agrees with exact MH for the same proposal and :math:`u` with
    probability at least :math:`1-\delta` under the bound's assumptions. The
    warm-up, the proposals, the state and the sampler stats: :ref:`metropolis-step`.

    Parameters
    ----------
    vars : list
        Continuous variables (or their value variables).
    delta : float
        Error allowed per accept/reject decision, in (0, 1).
    proposal : {"hmc", "normal", "langevin"}, optional
        ``"hmc"``: a leapfrog trajectory on the surrogate
        :math:`\log f_0 + \sum_n h_n` with the Laplace mass matrix, which reads no
        data (Hoffman & Gelman 2014 for its step size); ``"normal"``: a
        preconditioned Gaussian random walk; ``"langevin"``: a stochastic-gradient
        Langevin proposal. Default: ``"hmc"``, or ``"normal"`` with
        ``ProposalOptions(elemwise=True)``. With none of ``proposal``,
        ``scaling``, ``control_variates``, ``expand_in``, ``race``, ``audit``
        and ``proposal_options`` passed and at most
        :data:`~pymc_subsample.mcmc.regime.SMALL_N`
        observations, the step draws with PyMC's NUTS on the exact log density
        (regime reason ``"small_n"``): no race pays there.
    scaling : float, optional
        Initial leapfrog step size (``"hmc"``, in units of the posterior scale,
        default 0.5), absolute isotropic scale (``"normal"``; None adapts
        :math:`2.38/\sqrt d` in units of the Laplace scale) or :math:`\epsilon`
        (``"langevin"``, default 1). Tuned during tuning.
    data : list of pm.Data, optional
        The per-observation data inputs (guessed when omitted).
    race : RaceOptions, optional
        How each race runs (:class:`~pymc_subsample.options.RaceOptions`); its
        "auto" first batch is 50 here and its exact switch a quarter of the data.
        ``RaceOptions(bound="exact")`` is plain MH on all :math:`N` observations;
        ``"lilucb"`` and ``variance="marginal"`` are refused.
    audit : AuditOptions, optional
        How often a draw's decisions are checked against exact MH for the same
        proposals and :math:`u`, and what a failed audit does
        (:class:`~pymc_subsample.options.AuditOptions`).
    proposal_options : ProposalOptions, optional
        The proposals' tuning (:class:`~pymc_subsample.options.ProposalOptions`).
    control_variates : bool, optional
        Race on the residuals :math:`l_n - h_n` (the default); if the terms are not
        finite on the stencil, the step warns and races on the raw terms with a
        random walk. A block that reaches its terms only through operations
        without a derivative (a comparison, a switch's condition, ``floor``,
        ``round``, ``sign``: :mod:`~pymc_subsample.model.gradient_path`) has a
        zero gradient almost everywhere: the step then draws it with a tuned
        random walk on the raw terms (exact decisions up to
        :data:`~pymc_subsample.mcmc.regime.SMALL_N` observations), and refuses
        ``proposal="hmc"`` or ``"langevin"``, ``control_variates=True`` and
        ``expand_in`` when passed.
    expand_in : sequence of str, optional
        Deterministics :math:`\phi(\theta)` of the block in which the control
        variates expand the terms instead of :math:`\theta`. Requires
        ``control_variates``.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.
    **moved
        Keywords that moved into the options objects (``bound``, ``batch_size``,
        ``covariance``, ``elemwise``, ...): each raises a ``TypeError`` that names
        its new place (:func:`~pymc_subsample.options.reject_moved_keywords`).
    """

    _state_class = RacingMetropolisState
    name = "racing_metropolis"
    stats_dtypes_shapes = {
        "accept": (np.float64, []),
        "accepted": (np.float64, []),
        "scaling": (np.float64, []),
        "n_evals": (np.int64, []),
        "frac_evals": (np.float64, []),
        "exhausted": (bool, []),
        "n_decisions": (np.int64, []),
        "n_audited": (np.int64, []),
        "n_wrong": (np.int64, []),
        "n_raced": (np.int64, []),
        "n_refits": (np.int64, []),
        "audit_agree": (np.int8, []),
        "audit_exact": (bool, []),
        "tune": (bool, []),
        "regime": (np.int8, []),
        "diverging": (bool, []),
    }

    def __init__(
        self,
        vars,
        *,
        delta: float = 0.05,
        proposal: str | None = None,
        scaling: float | None = None,
        data=None,
        race: RaceOptions | None = None,
        audit: AuditOptions | None = None,
        proposal_options: ProposalOptions | None = None,
        control_variates: bool | None = None,
        expand_in=None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **moved,
    ):
        reject_moved_keywords(type(self).__name__, moved, ("race", "audit", "proposal_options"))
        # a race asked for: a proposal, its scale, control variates, race, audit or proposal options
        race_asked = any(
            x is not None
            for x in (proposal, scaling, control_variates, expand_in, race, audit, proposal_options)
        )
        # before the build: a mistake costs no compile
        race = options_or_default("race", race, RaceOptions)
        audit = options_or_default("audit", audit, AuditOptions)
        proposal_options = options_or_default("proposal_options", proposal_options, ProposalOptions)
        check_expand_in(expand_in)
        if race.bound == "lilucb":
            raise ValueError(
                "bound='lilucb' races many arms one at a time; an accept test has two arms "
                "that share their observations: use race=RaceOptions(bound='normal') or 'ebs'"
            )
        if race.variance != "pairwise":
            raise ValueError(
                "an accept test races the difference of two points on shared observations: "
                "its variance is 'pairwise'; leave RaceOptions.variance at its default"
            )
        # "auto" here: a first batch of 50 and the exact switch at a quarter of the data
        race = replace(
            race,
            batch_size=50 if race.batch_size == "auto" else race.batch_size,
            exact_fraction=0.25 if race.exact_fraction == "auto" else race.exact_fraction,
        )
        elemwise = proposal_options.elemwise
        asked = {
            "proposal": proposal,
            "control_variates": control_variates,
            "expand_in": expand_in,
            "race": race_asked,
        }
        if control_variates is None:
            control_variates = True
        control_variates = check_bool("control_variates", control_variates)
        check_choice("proposal", proposal, (*PROPOSALS, None))
        if proposal is None:
            proposal = "normal" if elemwise else "hmc"
        scaling = check_float("scaling", scaling, low=0.0, low_open=True, special=(None,))
        if elemwise and proposal != "normal":
            raise ValueError(
                "ProposalOptions(elemwise=True) needs proposal='normal' (the others move all "
                "at once)"
            )
        import pymc as pm

        check_step_context(model, initial_point, compile_kwargs)
        continuous_value_vars(pm.modelcontext(model), vars, "RacingMetropolis")
        super().__init__(
            vars,
            delta=delta,
            race=race,
            audit=audit,
            data=data,
            model=model,
            rng=rng,
            initial_point=initial_point,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
        )
        point = self.initial_point
        #: how the block reaches its terms
        #: (:func:`~pymc_subsample.model.gradient_path.gradient_path`)
        self.gradient_path = self._find_gradient_path(point)
        self._asked = asked  # the gradient features the user named (refused without a gradient)
        self.proposal = proposal
        self._shapes = [np.shape(point[v.name]) for v in self.vars]
        self._sizes = [int(np.prod(s)) for s in self._shapes]
        self.dim = sum(self._sizes)
        self.control_variates = control_variates
        self._set_proposal(proposal, scaling, proposal_options)
        self._delta_share = 1.0  # of delta, for the races (race_delta): set after tuning
        self._plan_races(2)
        self.tune = True
        #: the proposal in use and why (the chosen one is ``proposal``): :meth:`_fall_back`
        self.regime = Regime(proposal, self.preconditioned)
        #: the surrogate's fit, measured in tuning (:class:`~pymc_subsample.mcmc.regime.FitCheck`)
        self.fit_check = FitCheck()
        #: PyMC's NUTS on the block, built when the step leaves the surrogate ("poor_fit")
        self.nuts = None
        self._chain_start: dict | None = None  # the block's values at the chain's first draw
        self._nuts_start: dict | None = None  # where NUTS takes the chain at its first draw
        self._tune_left: int | None = None  # tuning draws left in the chain (None: unknown)
        self._nuts_failed = False  # NUTS could not be built: the step keeps racing
        self._nuts_logp = None  # NUTS's log density and gradient, compiled by the probe
        self.block = FlatBlock(self.vars, self._shapes)
        #: the surrogate's fit (None when a poor fit at construction started the step in NUTS)
        self.fit: LaplaceFit | None = None
        self._coordinates, self._expansion, self._coordinate_expansion = [], None, None
        if not self.gradient_path.connected:
            self._leave_gradient(self.gradient_path)
        # at small N and defaults, PyMC's NUTS on the exact log density: no surrogate, no probe
        in_nuts = self.gradient_path.connected and self._nuts_at_small_n
        if not (in_nuts and self._start_in_nuts(point)) and (
            expand_in or not self._probes_fit or not self._probe_fit(point)
        ):
            self._build_fit(expand_in, point)
        self.reset_tuning()

    def _find_gradient_path(self, point: dict) -> GradientPath:
        """Apply the gradient rule to the terms; where it cannot open an operation, evaluate.

        The graph rule (:func:`~pymc_subsample.model.gradient_path.gradient_path`)
        decides; on a graph with operations it does not open, a gradient of
        the terms that is zero (on up to ``_GRADIENT_CHECK_ROWS`` rows) at
        ``point`` and at draws from the prior says there is no useful gradient
        too (:func:`~pymc_subsample.model.gradient_path.zero_gradient`).
        """
        path = gradient_path(self.terms.loglik_graph, self.vars)
        if not path.connected or not path.opaque:
            return path
        rows = np.arange(min(self.terms.n_obs, _GRADIENT_CHECK_ROWS))
        points = [point, *prior_points(self.model, LOCALITY_DRAWS, seed=0)]

        def gradient(at):
            values = [np.asarray(at[v.name]) for v in self.vars]
            return self.terms.gradient(values, rows, at)[0]

        try:
            zero = zero_gradient(gradient, points)
        except (NotImplementedError, TypeError, ValueError):  # no gradient graph at all
            return path
        if not zero:
            return path
        why = (
            f"operations the rule does not open ({', '.join(path.opaque)}) whose gradient "
            "was zero at the initial point and at draws from the prior"
        )
        return GradientPath(False, (*path.cuts, why), path.opaque)

    def _leave_gradient(self, path: GradientPath) -> None:
        """Draw the block without its gradient: the terms are piecewise constant in it.

        Refuses the gradient features the user asked for (a ``ValueError``
        naming the block, the feature and the fix); otherwise the step runs a
        random walk on the raw terms, isotropic and tuned (no control variates,
        no Laplace fit, no probe, no NUTS; its scale tuned every
        ``_NO_GRADIENT_TUNE_INTERVAL`` draws at most), with exact decisions up to
        :data:`~pymc_subsample.mcmc.regime.SMALL_N` observations (a full pass
        is cheap, and the per-row differences of a move are zero but for the
        rows it crosses, so races read most rows anyway). Warns once when the
        default proposal was left; the ``regime`` stat reports reason
        ``"no_gradient"`` at every draw.
        """
        names = block_names(self.model, self.vars)
        refuse_gradient_features(names, path, self._asked)
        self.gradient_path = path
        self.proposal = "normal"
        self.control_variates = False
        self.preconditioned = False
        # no Laplace scale to start from (with elemwise too: its per-coordinate scales come
        # from the fit): the scale starts at 1 and is found by tuning alone, so more often
        if self.user_scaling is None:
            self.user_scaling = 1.0
        self.tune_interval = min(self.tune_interval, _NO_GRADIENT_TUNE_INTERVAL)
        self.regime = Regime("normal", False, "no_gradient")
        if self.terms.n_obs <= SMALL_N:
            self.race = replace(self.race, bound="exact")
        if self._asked["proposal"] is None:
            warnings.warn(
                f"RacingMetropolis: {names} {'reach' if ',' in names else 'reaches'} the "
                "likelihood terms only through "
                f"{path.describe()}, so their gradient is zero almost everywhere; the step "
                f"draws {names} with a tuned random walk on the raw terms"
                + (" (exact decisions: N is small)" if self.bound == "exact" else "")
                + ", not with HMC, NUTS or control variates (regime reason 'no_gradient': "
                f"sampler stat regime = {self.regime.code}). Pass proposal='normal' to "
                "silence this",
                UserWarning,
                stacklevel=4,
            )

    # -- per-chain state -------------------------------------------------------------

    def reset_tuning(self):
        """Restore the initial scale (PyMC calls this between runs).

        The surrogate is kept: it depends on the data only, so later chains
        reuse it (new data drop it: :meth:`_data_taken_up`); each chain still
        starts its tuning at its own draw from the Laplace approximation. So is
        :attr:`regime`: a proposal left in one chain is left in the next.
        """
        self._started = False
        self._reset_proposal()
        #: the last tuning decisions' acceptances (:attr:`race_delta`)
        self._tuning_accepts: deque = deque(maxlen=_DELTA_WINDOW)
        self.delta_share = 1.0
        self.fit_check.clear()
        if self.nuts is not None:
            self.nuts.reset_tuning()
            self.nuts.tune = self.tune

    @property
    def race_delta(self) -> float:
        r"""The races' error probability, :math:`\delta \min(1, \alpha / (1 - \alpha))`.

        :math:`\alpha` is the acceptance rate of the last tuning decisions
        (floored at 0.01; 1 until tuning ends). A wrong decision is most harmful
        when it accepts: at a low acceptance rate, errors at rate :math:`\delta`
        among the rejections would make a large share of the moves. With this
        rate, wrong accepts stay at most a share :math:`\delta` of the right
        ones (Korattikara et al. 2014 bound the error per decision).
        """
        return self.delta * self._delta_share

    @property
    def tuning_accepts(self) -> tuple[float, ...]:
        """The acceptances of the most recent tuning draws, oldest first (for :attr:`race_delta`).

        One per draw (the mean of its decisions with ``elemwise``); emptied
        when a chain starts its tuning.
        """
        return tuple(self._tuning_accepts)

    @property
    def delta_share(self) -> float:
        """:attr:`race_delta` over ``delta``: set when tuning ends, 1 before."""
        return self._delta_share

    @delta_share.setter
    def delta_share(self, share: float) -> None:
        self._delta_share = float(share)
        if getattr(self, "race_config", None) is not None:
            self.race_config = replace(self.race_config, delta=self.race_delta)

    def _data_taken_up(self, point, resized: bool) -> None:
        """Drop the surrogate and mass matrix (refitted at the next step): new data.

        The Langevin gradient's batch is set again for the new :math:`N`.
        """
        self._set_gradient_batch()
        if self.fit is not None:
            self.fit.reset()

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, counters, surrogate, scale) before a chain starts."""
        super().setup_chain(rng, tune, draws)
        self._tune_left = int(tune)
        self.reset_tuning()
        if self.nuts is not None:
            self.nuts.setup_chain(self.rng.spawn(1)[0], tune, draws)
            self.nuts.tune = self.tune

    def stop_tuning(self):
        """End tuning: fix the step size; warn when the surrogate proposal accepts too little.

        When a refit moved the reference in tuning, the sums kept from earlier
        references are dropped: after tuning, every refit starts from the same one.
        """
        super().stop_tuning()
        if self.nuts is not None:
            self.nuts.stop_tuning()
        if len(self._tuning_accepts) >= _DELTA_MIN_DECISIONS:
            rate = max(float(np.mean(self._tuning_accepts)), 0.01)
            self.delta_share = min(1.0, rate / (1.0 - rate))
        if self.fit is not None:
            self.fit.end_tuning()
        self._end_proposal_tuning()

    # -- flat <-> per-variable values ---------------------------------------------------

    def _flatten(self, parts) -> np.ndarray:
        return self.block.flatten(parts)

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        return self.block.split(flat)

    def _candidates(self, rows: np.ndarray) -> list[np.ndarray]:
        return self.block.candidates(rows)

    # -- the step -------------------------------------------------------------------

    def _begin_draw(self) -> bool:
        """As the base step's; never an audit in the NUTS regime (it decides nothing by race)."""
        audit = super()._begin_draw()
        return audit and self.regime.proposal != "nuts"

    def _draw(self, point, audit):
        """One MH step with a racing accept test; return the new point and stats.

        With ``elemwise``, one random-walk decision per dimension, in random order.
        """
        if self.regime.proposal == "nuts":
            return self._nuts_draw(point)
        exact_mode = self.audit_exact  # as at the draw's start
        if not self._started:  # where pm.sample started the chain (NUTS restarts there)
            self._chain_start = {v.name: np.array(point[v.name]) for v in self.vars}
        x0 = self._flatten([np.asarray(point[v.name]) for v in self.vars])
        x, spent = self._ensure_surrogate(x0, point)
        log = {
            "n_evals": spent,
            "exhausted": False,
            "audited": 0,
            "wrong": 0,
            "raced": 0,
            "refits": 0,
            "rows": 0,
        }
        info = None  # the HMC trajectory's record
        if self.elemwise:
            accepted = np.zeros(len(x), dtype=bool)
            accept = np.zeros(len(x))
            for i in self.rng.permutation(len(x)):
                x_new = x.copy()
                x_new[i] += self.scaling[i] * self.rng.standard_normal()
                accepted[i], accept[i] = self._decide(x, x_new, 0.0, point, audit, log, key=i)
                if accepted[i]:
                    x = x_new
        else:
            x_new, extra, info = self._propose(x, point, log)
            ok, acc = self._decide(x, x_new, extra, point, audit, log)
            accepted, accept = np.array([ok]), np.array([acc])
            if self.tune and self._checks_fit:
                misfit = self._misfit(np.stack([x, x_new]), extra, info, point, log)
                self.fit_check.record(ok, misfit, log["rows"] / self.terms.n_obs)
            if ok:
                x = x_new
        n_decisions = len(accepted)
        stats = {
            "accept": float(np.mean(accept)),
            "accepted": float(np.mean(accepted)),
            "scaling": float(np.mean(self.scaling)),
            "n_evals": log["n_evals"],
            "frac_evals": log["rows"] / (self.terms.n_obs * n_decisions),
            "exhausted": log["exhausted"],
            "n_decisions": n_decisions,
            "n_audited": log["audited"],
            "n_wrong": log["wrong"],
            "n_raced": log["raced"],
            "n_refits": log["refits"],
            "audit_agree": (AUDIT_DISAGREE if log["wrong"] else AUDIT_AGREE)
            if log["audited"]
            else AUDIT_NOT_RUN,
            "audit_exact": exact_mode,
            "tune": self.tune,
            "regime": self.regime.code,
            "diverging": False,
        }
        if self.tune:
            self._tuning_accepts.append(float(np.mean(accepted)))
            if self._checks_fit and self.fit_check.poor(self.terms.n_obs) and self._may_switch:
                self._switch_to_nuts(point)
            if self.regime.proposal != "nuts":
                self._tune_step(accepted, accept, 1.0 if info is None else info.integrator_accept)
            self._count_tuning_draw()
        self.fit.watch_refits(log["refits"])
        if accepted.any() or x is not x0:
            point = dict(point)
            for v, value in zip(self.vars, self._split(x), strict=True):
                point[v.name] = value
        return point, [stats]

    def _decide(self, x, x_new, extra, point, audit, log, key=0) -> tuple[bool, float]:
        """Race the MH test from flat ``x`` to ``x_new``; return (accepted, accept prob.).

        ``extra`` is the proposal's part of the log ratio; ``key`` the decision's
        back-off key (the dimension with ``elemwise``).
        """
        terms = self.terms
        n_obs = terms.n_obs
        pair = np.stack([x, x_new])
        cands = self._candidates(pair)
        log_f0 = terms.log_f0(cands, point)
        log_u = float(np.log(self.rng.random()))
        if not (np.isfinite(log_f0[1]) and np.isfinite(extra)):
            return False, 0.0
        if (
            self.row_support.mode == "bounds"
            and self.row_support.infeasible([c[1:] for c in cands], point)[0]
        ):  # the proposal's terms are -inf on some row: rejected without a race
            return False, 0.0
        if self._exact_independent:  # audits found our terms wrong: the model's joint density
            joint = self._joint_scores(cands, point)
            log_alpha = float(joint[1] - joint[0] + extra)
            log_alpha = -np.inf if np.isnan(log_alpha) else log_alpha
            log["n_evals"] += 2 * n_obs
            log["rows"] += n_obs
            log["exhausted"] = True
            log["log_alpha"], log["misfit"] = log_alpha, np.nan
            log["f0_change"] = float(log_f0[1] - log_f0[0])
            return bool(log_u < log_alpha), float(np.exp(min(0.0, log_alpha)))
        exact_part = log_f0[1] - log_f0[0] + extra
        exact = self.decides_exactly or self._backoff.take(key)
        # an exact decision sums every term: a control variate would cancel from it
        sur = coordinate_sur = None
        if (
            self.control_variates
            and self.fit.surrogate is not None
            and not exact
            and not self.fit.raw_races
        ):
            sur, coordinate_sur, _ = self.fit.expansion_at(point, log, self.tune)
        spent = [0]  # terms evaluated, stencil included
        rewards, h_total = self.fit.residual_rewards(pair, cands, point, sur, coordinate_sur, spent)
        exact_part += h_total[1] - h_total[0]

        def sums(arms):
            spent[0] += n_obs * len(arms)
            return terms.loglik_sum([c[arms] for c in cands], point) - h_total[arms]

        config = None if exact else self.race_config
        decision = mh_test(rewards, n_obs, exact_part, log_u, config, rng=self.rng, totals=sums)
        res = decision.race
        # the exact log ratio (estimated from the batch when raced), for the fit's measure
        log["log_alpha"], log["f0_change"] = decision.log_alpha, float(log_f0[1] - log_f0[0])
        # on the control variate's residuals, the estimate less the exact part is the misfit
        log["misfit"] = decision.log_alpha - exact_part if sur is not None else np.nan
        if config is not None:
            log["raced"] += 1
            self._backoff.record(key, spent[0], 2 * n_obs)  # as n_evals counts, against 2N
        log["n_evals"] += spent[0]
        log["rows"] += min(res.n_drawn, n_obs)
        log["exhausted"] |= res.exhausted
        if audit and config is not None:
            agree = self._audit(decision.accepted, cands, log_f0, extra, log_u, point)
            log["audited"] += 1
            log["wrong"] += int(not agree)
        return decision.accepted, decision.accept_probability

    def _audit(self, accepted, cands, log_f0, extra, log_u, point) -> bool:
        r"""Audit a raced decision ``accepted``; return True when it agrees with exact MH.

        Exact MH for the same :math:`u` accepts iff :math:`\log u < \ell(\theta') -
        \ell(\theta) + c`, with :math:`\ell` the model's joint log density on the
        original data (:meth:`_joint_scores`), independent of the race's terms.
        At a disagreement, what the cause takes is measured too: the exact
        scores from the race's own sums (one fused pass) against the joint
        ones, and the share of zero differences on a batch.
        """
        with self._audit_clock():
            joint = self._joint_scores(cands, point)
            agree = bool(log_u < joint[1] - joint[0] + extra) == bool(accepted)
        structural, share = False, None
        # accepting a proposal of zero density is an error no rate of delta explains
        certain = bool(accepted) and bool(np.isneginf(joint[1]))
        if not agree:
            ours = log_f0 + self.terms.loglik_sum(cands, point)
            structural = scores_differ(ours, joint, self._score_rtol)
            share = zero_difference_share(self._audit_batch(cands, point))
        self._record_audit(
            agree, structural=structural, zero_share=share, certain=certain, impossible=certain
        )
        return agree

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
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import replace

import numpy as np
from pymc.step_methods.metropolis import tune as pymc_tune

from ..mcmc.audit import scores_differ, zero_difference_share
from ..mcmc.proposals import langevin_proposal, random_walk_proposal
from ..mcmc.surrogate import (
    MISFIT_RARE,
    CoordinateSurrogate,
    QuadraticSurrogate,
    TaylorSurrogate,
    misfit_share,
    stencil_points,
)
from ..model.blocks import check_expand_in, continuous_value_vars, model_deterministics
from ..model.expansion import Expansion
from ..model.expansion_cache import ExpansionCache, inputs_key
from ..options import (
    AuditOptions,
    ProposalOptions,
    RaceOptions,
    options_or_default,
    reject_moved_keywords,
)
from ..racing import IndexStream, mh_test
from ..validation import check_bool, check_choice, check_float
from .base import (
    AUDIT_AGREE,
    AUDIT_DISAGREE,
    AUDIT_NOT_RUN,
    RacingStep,
    check_step_context,
)

__all__ = ["PROPOSALS", "RacingMetropolis"]

#: Names accepted by ``proposal``.
PROPOSALS = ("hmc", "normal", "langevin")
_FULL_STENCIL_MAX_DIM = 12  # without autodiff: the full stencil up to here, the diagonal above
_TARGET_HMC = 0.8
#: HMC decisions in tuning after which an acceptance below _FALLBACK_RATE switches to a random walk.
_FALLBACK_AFTER = 100
_FALLBACK_RATE = 0.05
#: Tuning decisions whose acceptance sets :attr:`RacingMetropolis.race_delta` (the last ones),
#: and the fewest that do.
_DELTA_WINDOW = 200
_DELTA_MIN_DECISIONS = 20
_TARGET_PATH = 0.4  # acceptance of the exact test that the path length is tuned towards
#: Newton steps at most that recentre the expansion at the other inputs' values (refits).
_RECENTRE_STEPS = 10
#: Draws after which refits of the expansion at more than _REFIT_SHARE of the draws warn.
_REFIT_AFTER = 50
_REFIT_SHARE = 0.25


class RacingMetropolis(RacingStep):
    r"""Metropolis–Hastings step for continuous variables with a racing accept test.

    Updates a block of continuous variables in PyMC's unconstrained value space.
    At its first step it finds the posterior bulk from wherever the chain
    starts: Newton steps on the log posterior, whose gradient and Hessian are
    finite differences of the per-observation terms summed over the data
    (first on a window of at most 50,000 observations, then on all), which
    also give the quadratic surrogate :math:`h_n` at the mode
    :math:`\hat\theta` and the mass matrix :math:`M = -\nabla^2(\log f_0 + \sum_n
    h_n)(\hat\theta)`. During tuning the chain then starts at :math:`\hat\theta`.
    Each accept/reject decision agrees with exact MH for the same proposal and
    :math:`u` with probability at least :math:`1-\delta` under the bound's
    assumptions.

    Parameters
    ----------
    vars : list
        Continuous variables (or their value variables).
    delta : float
        Error allowed per accept/reject decision, in (0, 1).
    proposal : {"hmc", "normal", "langevin"}, optional
        ``"hmc"`` (default): a leapfrog trajectory of ``path_length`` (in
        units of the posterior scale) with mass matrix :math:`M` on the
        surrogate :math:`\log f_0 + \sum_n h_n`, the momentum flipped at the
        end; it costs :math:`O(d^2)` and a gradient of :math:`\log f_0` per step
        and reads no data; the step size is tuned by dual averaging towards an
        acceptance of 0.8 of the leapfrog integrator on the surrogate (Hoffman &
        Gelman 2014), and the path length, during tuning, towards an acceptance
        of 0.4 of the exact test (where the surrogate misfits the posterior,
        shorter paths are accepted more often). When the exact test accepts
        under 5% of 100 tuning trajectories, the step warns and falls back to
        the preconditioned random walk for the rest of its run. ``"normal"``: Gaussian
        random walk, preconditioned by :math:`M^{-1}` unless ``scaling`` is
        given. ``"langevin"``: stochastic-gradient Langevin proposal
        :math:`\theta' = \theta + \frac{\epsilon^2}{2} g(\theta) + \epsilon z`
        with :math:`g` the exact gradient of :math:`\log f_0` plus :math:`N/m`
        times that of a mini-batch of ``gradient_batch`` observations (both in
        ``proposal_options``); the
        proposal density ratio enters the test. Default: ``"hmc"``, or
        ``"normal"`` with ``ProposalOptions(elemwise=True)``.
    scaling : float, optional
        ``"hmc"``: initial leapfrog step size in units of the posterior scale
        (default 0.5). ``"normal"``: None (default) adapts a step of
        :math:`2.38/\sqrt d` in units of :math:`M^{-1/2}`; a number is an
        absolute isotropic scale, as ``pm.Metropolis``'s. ``"langevin"``:
        :math:`\epsilon` (default 1). Tuned during tuning.
    data : list of pm.Data, optional
        The per-observation data inputs (guessed when omitted).
    race : RaceOptions, optional
        How each race runs (:class:`~pymc_subsample.options.RaceOptions`);
        its "auto" first batch is 50 here and its exact switch a quarter of
        the data. ``RaceOptions(bound="exact")`` is plain MH on all :math:`N`
        observations; ``"lilucb"`` and ``variance="marginal"`` are refused
        (an accept test races two points on shared observations). The
        back-off counts a race as given up when it evaluated at least half of
        an exact decision's :math:`2N` terms (counted as ``n_evals`` counts
        them), per dimension with ``elemwise``.
    audit : AuditOptions, optional
        How often a draw's decisions are checked against exact MH for the same
        proposals and :math:`u` (:math:`\log u` against the difference of the
        model's own joint log density, on the original data, at the proposal
        and the current point, plus :math:`c`), and what a failed audit does
        (:class:`~pymc_subsample.options.AuditOptions`).
    proposal_options : ProposalOptions, optional
        The proposals' tuning (:class:`~pymc_subsample.options.ProposalOptions`):
        a covariance estimate that replaces the Laplace one (use it where the
        Laplace approximation misfits, e.g. many coefficients at a support
        boundary), the HMC path length (the number of leapfrog steps is
        ``ceil(path_length / step size)``, at most 100), the tuning interval,
        the Langevin gradient's batch and target acceptance, and ``elemwise``.
    control_variates : bool
        Race on the residuals :math:`l_n - h_n` (default). The surrogate is
        built whenever this is on or the proposal is ``"hmc"``. If the terms
        are not finite on the stencil (a support boundary), the step warns and
        races on the raw terms with a random walk. Ignored by the race with
        ``RaceOptions(bound="exact")`` (plain MH sums everything).
    expand_in : sequence of str, optional
        Deterministics of the block :math:`\phi = \phi(\theta)` (names) in which
        the control variates expand the terms instead of :math:`\theta`:
        :math:`h_n = l_n(\hat\phi) + \nabla l_n(\hat\phi)^\top\Delta +
        \tfrac12\Delta^\top\nabla^2 l_n(\hat\phi)\Delta` with
        :math:`\Delta = \phi(\theta) - \phi(\hat\theta)` at the fitted mode
        :math:`\hat\theta` (one more pass over the data for the sums). For
        parameters that enter the terms through a transform that is far from
        linear over the posterior, e.g. coefficients
        :math:`\alpha = \mathrm{softplus}(z)` at their boundary. The surrogate
        behind the HMC proposal is then this expansion too, read as a function
        of :math:`\theta` (:class:`~pymc_subsample.mcmc.surrogate.CoordinateSurrogate`;
        the mode and the mass matrix stay those of :math:`\theta`). Requires
        ``control_variates``.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.
    **moved
        Keywords that moved into the options objects (``bound``,
        ``batch_size``, ``covariance``, ``elemwise``, ...): each raises a
        ``TypeError`` that names its new place
        (:func:`~pymc_subsample.options.reject_moved_keywords`).

    Notes
    -----
    Sampler stats per draw: ``accept`` (acceptance probability estimated from
    the race's means; exact for exhausted races), ``accepted`` (fraction of
    proposals accepted), ``scaling`` (step size or scale), ``n_evals``
    (per-observation evaluations: both points on each batch, each of the
    Taylor residual's three parts counted, or the stencil's points with the
    stencil fallback; the warm-up's passes), ``frac_evals`` (the share of the
    :math:`N` observations a decision read, averaged over the draw's decisions:
    1 for an exact decision; the same meaning in
    :class:`~pymc_subsample.SubsampledCategoricalGibbs`), ``exhausted``,
    ``n_decisions``, ``n_audited`` and ``n_wrong``
    (audited decisions and those that differed from exact MH: their sums over
    draws give the per-decision error rate), ``n_raced`` (decisions raced; the
    others were made exactly by the back-off), ``n_refits`` (recomputations
    of the control variates' sums, see below, each one or more passes over
    the data counted in ``n_evals``), ``audit_agree`` (1/0, −1 when not
    audited), ``audit_exact`` (the draw's decisions were exact because audits had
    found the races wrong) and ``tune``.

    The terms may read other value variables :math:`\psi` that other steps
    move. The exact sums of :math:`h_n` hold for one value of :math:`\psi`,
    and a race reads its residuals at the current one, so the sums are kept
    per value of :math:`\psi` (:class:`~pymc_subsample.model.expansion_cache.ExpansionCache`)
    and recomputed with a full pass at a value not among the last few seen
    (with Newton steps that move the reference where :math:`\psi` moved the
    block's mode away from it); the proposal's surrogate and mass matrix are
    those at :math:`\psi` too. Where :math:`\psi` changes at most draws (a
    continuous variable sampled by another step), each draw pays that pass:
    the step stays right up to :math:`\delta` but saves little, and warns,
    naming the inputs to put in its block.
    """

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
        control_variates: bool = True,
        expand_in=None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **moved,
    ):
        reject_moved_keywords(type(self).__name__, moved, ("race", "audit", "proposal_options"))
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
        self.proposal = proposal
        self._shapes = [np.shape(point[v.name]) for v in self.vars]
        self._sizes = [int(np.prod(s)) for s in self._shapes]
        self.dim = sum(self._sizes)
        self.proposal_options = proposal_options
        self.covariance = None
        if proposal_options.covariance is not None:
            cov = proposal_options.covariance  # a finite square float array
            if cov.shape != (self.dim, self.dim) or not np.allclose(cov, cov.T):
                raise ValueError(
                    f"covariance must be a finite symmetric ({self.dim}, {self.dim}) matrix, "
                    f"got shape {cov.shape}; e.g. "
                    f"proposal_options=ProposalOptions(covariance=np.eye({self.dim}))"
                )
            try:
                np.linalg.cholesky(cov)
            except np.linalg.LinAlgError as err:
                raise ValueError("covariance must be positive definite") from err
            self.covariance = 0.5 * (cov + cov.T)
        n_obs = self.terms.n_obs
        self._delta_share = 1.0  # of delta, for the races (race_delta): set after tuning
        self._plan_races(2)
        self._gradient_batch = gradient_batch = proposal_options.gradient_batch
        self.gradient_batch = min(int(gradient_batch or max(self.batch_size, 100)), n_obs)
        target_accept = proposal_options.target_accept
        self.target_accept = 0.36 if target_accept is None else target_accept
        self.elemwise = elemwise
        self.control_variates = control_variates
        self._coordinates, self._to_coordinates, self._pullback = [], None, None
        self._coordinate_shapes: list = []
        #: the Taylor expansions of the terms in the block and in the expand_in Deterministics
        self._expansion: Expansion | None = None
        self._coordinate_expansion: Expansion | None = None
        self._check_expand_in(expand_in, "leave control_variates=True")
        if expand_in:
            self._coordinates = model_deterministics(self.model, expand_in)
            cv = Expansion(self.terms, "block", self._coordinates, point=point)
            self._coordinate_expansion = cv
            self._to_coordinates, self._pullback = cv.coordinates_of, cv.pullback
            self._coordinate_shapes = cv.shapes
        self.path_length = float(proposal_options.path_length)
        self.user_scaling = scaling
        self.preconditioned = proposal == "hmc" or (
            proposal == "normal" and scaling is None and not elemwise
        )
        self.tune_interval = int(proposal_options.tune_interval)
        self.tune = True
        needs_surrogate = (
            self.preconditioned or self.control_variates or (self.elemwise and scaling is None)
        )
        self._autodiff = needs_surrogate and self._compile_taylor()
        if self._coordinates:
            if not self._autodiff:
                raise ValueError(
                    "expand_in: the terms cannot be differentiated twice, so there is no "
                    "Taylor expansion to make in the Deterministics; leave expand_in out"
                )
            # the races read this expansion: its gathered residuals compiled now, not in the
            # first race (seconds for a large graph, inside the sampler's clock)
            self._coordinate_expansion.compile(gather=True)
        self.reset_tuning()

    def _compile_taylor(self) -> bool:
        """Compile the exact Taylor expansion of the graph; False where it cannot be derived.

        Automatic differentiation gives the value, gradient and Hessian of the
        sum in one pass and the residuals on a batch by forward mode (about
        three term evaluations each, whatever :math:`d`). A graph that PyTensor
        cannot differentiate twice falls back to the finite-difference stencil
        (:math:`d^2 + 3d + 2` evaluations of every term).
        """
        try:
            self._expansion = Expansion(self.terms, "block", shapes=self._shapes)
            # with expand_in the races read the other expansion: its residuals compiled below
            self._expansion.compile(gather=not self._coordinates)
        except (NotImplementedError, TypeError, ValueError, AttributeError) as err:
            if self.dim > _FULL_STENCIL_MAX_DIM:
                warnings.warn(
                    f"RacingMetropolis: the log-likelihood cannot be differentiated twice "
                    f"({type(err).__name__}: {err}); its expansion falls back to a stencil of "
                    f"{2 * self.dim + 1} points per observation, second order on the diagonal "
                    "only, which makes a poorer control variate for this many parameters",
                    UserWarning,
                    stacklevel=3,
                )
            return False
        return True

    # -- per-chain state -------------------------------------------------------------

    def _initial_scaling(self) -> float:
        if self.user_scaling is not None:
            return float(self.user_scaling)
        if self.proposal == "hmc":
            return 0.5
        if self.proposal == "normal" and self.preconditioned:
            return 2.38 / np.sqrt(self.dim)
        return 1.0

    def reset_tuning(self):
        """Restore the initial scale (PyMC calls this between runs).

        The surrogate is kept: it depends on the data only, so later chains
        reuse it (new data drop it: :meth:`_data_taken_up`); each chain still
        starts its tuning at its own draw from the Laplace approximation.
        """
        if not hasattr(self, "surrogate"):
            self.surrogate: QuadraticSurrogate | TaylorSurrogate | None = None
            #: the control variates' expansion in ``expand_in`` (None: the surrogate's)
            self.coordinate_surrogate: TaylorSurrogate | None = None
            self._surrogate_failed = False
            self._chol_mass = self._inv_mass = self._chol_cov = None
            #: True when the control variates miss a few rows entirely (:meth:`_probe_misfit`):
            #: races then read the raw terms
            self._raw_races = False
            self._init_refits()
        self._started = False
        scale = self._initial_scaling()
        self.scaling = np.full(self.dim, scale) if self.elemwise else scale
        self._dual = _DualAveraging(np.log(scale)) if self.proposal == "hmc" else None
        self._accept_sum, self._accept_n, self._integrator_accept = 0.0, 0, 1.0
        self._path = self.path_length
        #: the last tuning decisions' acceptances (:attr:`race_delta`)
        self._tuning_accepts: deque = deque(maxlen=_DELTA_WINDOW)
        self._set_delta_share(1.0)
        self._reset_interval()

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

    def _set_delta_share(self, share: float) -> None:
        self._delta_share = float(share)
        if getattr(self, "race_config", None) is not None:
            self.race_config = replace(self.race_config, delta=self.race_delta)

    def _reset_interval(self) -> None:
        self.steps_until_tune = self.tune_interval
        self.accepted_sum = np.zeros(self.dim if self.elemwise else 1, dtype=int)

    def _data_taken_up(self, point, resized: bool) -> None:
        """Drop the surrogate and mass matrix (refitted at the next step): new data.

        The Langevin gradient's batch is set again for the new :math:`N`.
        """
        n_obs = self.terms.n_obs
        self.gradient_batch = min(int(self._gradient_batch or max(self.batch_size, 100)), n_obs)
        self.surrogate = self.coordinate_surrogate = None
        self._expansions.clear()
        self._surrogate_failed = False
        self._raw_races = False
        self._chol_mass = self._inv_mass = self._chol_cov = None

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, counters, surrogate, scale) before a chain starts."""
        super().setup_chain(rng, tune, draws)
        self.reset_tuning()

    def stop_tuning(self):
        """End tuning: fix the step size; warn when the surrogate proposal accepts too little.

        When a refit moved the reference in tuning, the sums kept from earlier
        references are dropped: after tuning, every refit starts from the same one.
        """
        super().stop_tuning()
        if len(self._tuning_accepts) >= _DELTA_MIN_DECISIONS:
            rate = max(float(np.mean(self._tuning_accepts)), 0.01)
            self._set_delta_share(min(1.0, rate / (1.0 - rate)))
        if self._reference_moved:
            self._expansions.clear()
            self._reference_moved = False
        if self._dual is not None:
            self.scaling = float(np.exp(self._dual.log_bar))
            rate = self._accept_sum / max(self._accept_n, 1)
            if self._accept_n > 50 and rate < 0.3:
                warnings.warn(
                    f"RacingMetropolis: the surrogate proposal accepted "
                    f"{rate:.0%} of its proposals during tuning; the quadratic "
                    "surrogate fits this posterior poorly (multimodal, heavy-tailed or strongly "
                    "non-Gaussian). Use proposal='normal', or NUTS for this block",
                    UserWarning,
                    stacklevel=2,
                )

    # -- flat <-> per-variable values --------------------------------------------

    def _flatten(self, parts) -> np.ndarray:
        return np.concatenate([np.ravel(p).astype(np.float64) for p in parts])

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        return [c[0, ...] for c in self._candidates(flat[None, :])]  # 0-d arrays, not scalars

    def _candidates(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per-variable candidate arrays ``(K, *shape)`` from flat rows ``(K, d)``."""
        out, start = [], 0
        for v, shape, size in zip(self.vars, self._shapes, self._sizes, strict=True):
            part = rows[:, start : start + size].reshape((len(rows), *shape))
            out.append(part.astype(v.dtype))
            start += size
        return out

    # -- the surrogate ----------------------------------------------------------------

    def _sums(self, rows: np.ndarray, point: dict, window: int | None = None) -> np.ndarray:
        """Sum the terms at flat ``rows``: over a window scaled to N, or over all N."""
        n_obs = self.terms.n_obs
        if window is not None and window < n_obs:
            vals = self.terms.loglik_batch(self._candidates(rows), slice(0, window), point)
            return vals.sum(axis=1) * (n_obs / window)
        chunk = max(1, (1 << 24) // n_obs)
        return np.concatenate(
            [
                self.terms.loglik_sum(self._candidates(rows[k : k + chunk]), point)
                for k in range(0, len(rows), chunk)
            ]
        )

    def _f0_grad(self, x: np.ndarray, point: dict) -> np.ndarray:
        return self._flatten(self.terms.log_f0_grad(self._split(x), point))

    def _f0_hessian(self, x: np.ndarray, point: dict, eps: np.ndarray) -> np.ndarray:
        """Central differences of the gradient of log f0 (no data read)."""
        d = len(x)
        hess = np.empty((d, d))
        for i in range(d):
            e = np.zeros(d)
            e[i] = eps[i]
            hess[:, i] = (self._f0_grad(x + e, point) - self._f0_grad(x - e, point)) / (2 * eps[i])
        return 0.5 * (hess + hess.T)

    def _surrogate_at(
        self, x, eps, point, window=None, full=None
    ) -> tuple[QuadraticSurrogate | TaylorSurrogate, int]:
        n_obs = self.terms.n_obs
        if self._autodiff:  # exact value, gradient and Hessian of the sum, in one pass
            value, grad, hess = self._expansion.sums(x, point, window=window)
            if not (np.isfinite(value) and np.isfinite(hess).all()):
                raise FloatingPointError("the log-likelihood is not finite at the reference")
            cost = (self.dim + 1) * (n_obs if window is None else min(window, n_obs))
            return TaylorSurrogate(x.copy(), value, grad, 0.5 * (hess + hess.T)), cost
        full = self.dim <= _FULL_STENCIL_MAX_DIM if full is None else full
        rows = stencil_points(x, eps, full)
        sums = self._sums(rows, point, window)
        cost = len(rows) * (n_obs if window is None else min(window, n_obs))
        if not np.isfinite(sums).all():
            raise FloatingPointError("the log-likelihood terms are not finite on the stencil")
        return QuadraticSurrogate(x.copy(), eps.copy(), sums, full), cost

    def _newton(self, x, eps, point, window):
        """One Newton iteration on the log posterior (sums over ``window``, or all data).

        Returns ``(surrogate at x, -Hessian, new x, decrement, terms evaluated)``.
        """
        sur, spent = self._surrogate_at(x, eps, point, window)
        grad = sur.grad + self._f0_grad(x, point)
        neg_h = _positive_definite(-(sur.hess + self._f0_hessian(x, point, eps)))
        step = np.linalg.solve(neg_h, grad)
        decrement = float(grad @ step)
        if decrement < 10 * self.dim:  # in the quadratic region: take the full step
            return sur, neg_h, x + step, decrement, spent
        lp0 = sur.value + float(self.terms.log_f0(self._candidates(x[None]), point)[0])
        t = 1.0
        while t > 1e-6:  # backtracking on the log posterior
            rows = (x + t * step)[None, :]
            lp = self._sums(rows, point, window)[0]
            lp += float(self.terms.log_f0(self._candidates(rows), point)[0])
            spent += self.terms.n_obs if window is None else window
            if np.isfinite(lp) and lp >= lp0:
                break
            t *= 0.5
        return sur, neg_h, x + t * step, decrement, spent

    def _fit_surrogate(self, x: np.ndarray, point: dict) -> tuple[np.ndarray, int]:
        """Newton steps to the mode; set the surrogate and mass matrix there.

        Iterates on a window of at most 50,000 observations (sums scaled to
        :math:`N`) until the Newton decrement is below :math:`d`; then one
        Newton step on all the data with the gradient from the :math:`2d+1`
        axis points and the window's Hessian lands in the quadratic region,
        where the full stencil gives the surrogate: about :math:`d^2 + 3d + 2`
        evaluations per observation in all. Falls back to full Newton
        iterations when the window misleads. Returns the mode and the terms
        evaluated.
        """
        n_obs = self.terms.n_obs
        window = min(n_obs, 50_000)
        eps = 1e-4 * np.maximum(1.0, np.abs(x))
        spent = 0
        if window < n_obs:
            for _ in range(50):
                _, neg_h, x, decrement, cost = self._newton(x, eps, point, window)
                spent += cost
                eps = _stencil_steps(neg_h)
                if decrement < self.dim:
                    break
            # on all the data, the gradient (2d + 1 points) with the window's Hessian
            diag, cost = self._surrogate_at(x, eps, point, full=False)
            spent += cost
            grad = diag.grad + self._f0_grad(x, point)
            step = np.linalg.solve(neg_h, grad)
            # the window's optimum sits about sqrt(N / window) posterior sds from the mode:
            # a Newton decrement of that order is the quadratic region, not a misleading window
            if float(grad @ step) < 10 * self.dim * n_obs / window:
                x = x + step
                eps = _stencil_steps(neg_h)
                sur, cost = self._surrogate_at(x, eps, point)
                spent += cost
                neg_h = _positive_definite(-(sur.hess + self._f0_hessian(x, point, eps)))
                self._set_surrogate(sur, neg_h)
                return x, spent
        for _ in range(20):
            sur, neg_h, x_new, decrement, cost = self._newton(x, eps, point, None)
            spent += cost
            eps = _stencil_steps(neg_h)
            if decrement < 1e-3 * self.dim:  # converged: keep the expansion at x
                break
            x = x_new
            if decrement < 10 * self.dim:  # one more stencil at the new point
                sur, cost = self._surrogate_at(x, eps, point)
                spent += cost
                neg_h = _positive_definite(-(sur.hess + self._f0_hessian(x, point, eps)))
                grad = sur.grad + self._f0_grad(x, point)
                if float(grad @ np.linalg.solve(neg_h, grad)) < self.dim:
                    break  # within about one posterior sd of the mode: done
        self._set_surrogate(sur, neg_h)
        return x, spent

    def _set_surrogate(
        self, sur: QuadraticSurrogate | TaylorSurrogate, neg_hessian: np.ndarray
    ) -> None:
        """Keep the surrogate and the mass matrix :math:`M`, with its factors.

        :math:`M` is the negative Hessian, or the inverse of ``covariance`` when given.
        """
        self.surrogate = sur
        if isinstance(sur, QuadraticSurrogate):
            self._stencil_cands = self._candidates(sur.points())  # evaluated on every batch
        self._f0_eps = _stencil_steps(neg_hessian)  # steps of the refits' Hessians of log f0
        if self.covariance is not None:  # the user's estimate of the posterior covariance
            neg_hessian = np.linalg.inv(self.covariance)
        self._inv_mass, self._chol_mass, self._chol_cov = _mass_factors(neg_hessian)

    def _ensure_surrogate(self, x, point) -> tuple[np.ndarray, int]:
        """Fit the surrogate if needed; at a chain's first tuning step, start in the bulk.

        Returns the position to continue from and the terms evaluated.
        """
        needed = (
            self.preconditioned
            or self.control_variates
            or (self.elemwise and self.user_scaling is None)
        )
        spent = 0
        if self.surrogate is None and not self._surrogate_failed and needed:
            try:
                mode, spent = self._fit_surrogate(x.copy(), point)
            except (FloatingPointError, np.linalg.LinAlgError) as err:
                self._surrogate_failed = True
                if self.proposal == "hmc" or self.preconditioned:
                    self.proposal, self.preconditioned = "normal", False
                    self._dual = None
                    self.scaling = 1.0 if self.user_scaling is None else float(self.user_scaling)
                warnings.warn(
                    f"RacingMetropolis: control variates turned off ({err}); racing on the raw "
                    "terms with a random-walk proposal",
                    UserWarning,
                    stacklevel=3,
                )
                return x, 0
            if self._coordinates:
                try:
                    spent += self._fit_coordinate_surrogate(mode, point)
                except FloatingPointError as err:
                    warnings.warn(
                        f"RacingMetropolis: expand_in dropped ({err}); the control variates "
                        "expand in the value variables",
                        UserWarning,
                        stacklevel=3,
                    )
            # the sums just fitted belong to the other inputs' values at this point
            entry = (self.surrogate, self.coordinate_surrogate, self._mass())
            self._expansions.put(inputs_key(self.terms.other_arrays(point)), entry)
            if self.control_variates:
                spent += self._probe_misfit(point)
            if self.elemwise and self.user_scaling is None:  # 1-D optimal scale per coordinate
                self.scaling = 2.38 * np.sqrt(np.diag(self._inv_mass))
        if self.surrogate is not None and self.tune and not self._started:
            # initialization, as NUTS's (tuning draws are discarded): a chain that starts
            # outside the bulk, where the Laplace approximation puts almost no mass, jumps to
            # a draw from it; one that starts inside (a posterior draw, or the mode) stays
            gap = self._chol_mass.T @ (x - self.surrogate.theta_ref)
            if 0.5 * gap @ gap > self.dim:
                z = self.rng.standard_normal(self.dim)
                x = self.surrogate.theta_ref + self._chol_cov @ z
        self._started = True
        return x, spent

    def _probe_misfit(self, point: dict, rows: int = 4096, seed: int = 0) -> int:
        r"""Race on the raw terms when the control variates miss a few rows entirely.

        On up to ``rows`` rows, for pairs of points at 0.1, 0.3 and 1 proposal
        standard deviations around the reference, compares the residual
        differences with the terms' own (:func:`~pymc_subsample.mcmc.surrogate.misfit_share`).
        Terms that are exactly linear or quadratic on most rows and not on a few
        (:math:`|y_n - \mu|`: the rows between the two points) leave residuals
        that are zero on most of a batch and as large as the terms' differences
        on rows a batch rarely draws; a race on them can end confident and wrong.
        Such a block races on the raw terms instead, and says so. Returns the
        terms evaluated.
        """
        terms = self.terms
        n_obs = terms.n_obs
        rng = np.random.default_rng(seed)
        idx = np.arange(n_obs) if n_obs <= rows else np.sort(rng.choice(n_obs, rows, False))
        ref = self.surrogate.theta_ref
        spent = [0]
        shares = []
        for scale in (0.1, 0.3, 1.0):
            u = rng.standard_normal((2, self.dim))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            pair = ref + scale * u @ self._chol_cov.T
            cands = self._candidates(pair)
            rewards, _ = self._race_rewards(
                pair, cands, point, self.surrogate, self.coordinate_surrogate, spent
            )
            with np.errstate(invalid="ignore", over="ignore"):
                raw = terms.loglik_batch(cands, idx, point)
                residual = rewards(np.arange(2), idx)
            shares.append(misfit_share(residual[1] - residual[0], raw[1] - raw[0]))
        if any(0.0 < share <= MISFIT_RARE for share in shares):
            self._raw_races = True
            names = ", ".join(v.name for v in self.vars)
            warnings.warn(
                f"RacingMetropolis: the control variates of {names} miss the terms' "
                f"differences entirely on {max(shares):.2%} of the observations and fit the "
                "others exactly (terms piecewise linear or quadratic in the block, as "
                "|y - mu|): a mini-batch would rarely draw the rows that decide, so the "
                "races read the raw terms instead (control variates kept for the proposal)",
                UserWarning,
                stacklevel=4,
            )
        return spent[0] + 2 * len(idx) * 3

    def _fit_coordinate_surrogate(self, mode: np.ndarray, point: dict) -> int:
        r"""Set the expansion in ``expand_in`` at :math:`\hat\phi = \phi(\hat\theta)`; one pass.

        Returns the terms evaluated.
        """
        ref = self._coordinates_at(mode, point)
        value, grad, hess = self._coordinate_expansion.sums(ref, point)
        if not (np.isfinite(value) and np.isfinite(hess).all()):
            raise FloatingPointError("the log-likelihood is not finite at the reference")
        self.coordinate_surrogate = TaylorSurrogate(ref, value, grad, 0.5 * (hess + hess.T))
        return (len(ref) + 1) * self.terms.n_obs

    # -- the expansion at the other inputs' current values ----------------------------

    def _init_refits(self) -> None:
        """Start the cache of the control variates' sums and the count of refits."""
        #: by the other inputs' values: (surrogate, coordinate surrogate, mass factors)
        self._expansions = ExpansionCache()
        self._refit_draws = 0  # draws made
        self._refit_count = 0  # refits in the draws after the first _REFIT_AFTER
        self._refit_warned = False
        self._moved_inputs: set[str] = set()
        self._last_inputs: tuple | None = None
        self._reference_moved = False  # in this tuning, by a refit (see _recentred)

    def _expansion_at(self, point: dict, log: dict) -> tuple:
        r"""Return the race's expansion with its sums at the other inputs' values in ``point``.

        The terms :math:`l_n(\theta; \psi)` read other value variables
        :math:`\psi` that other steps move. The residuals on a batch are taken
        at the current :math:`\psi`, so the exact sums added back must be too:
        :math:`\sum_n l_n(\theta; \psi) = \sum_n r_n(\theta; \psi) +
        \hat L(\psi) + G(\psi)^\top\Delta + \tfrac12\Delta^\top H(\psi)\Delta`
        (or the stencil sums :math:`T_k(\psi)`), at the fitted reference
        :math:`\hat\theta` (:math:`\hat\phi`, :math:`\epsilon`), or for an
        expansion by automatic differentiation in the block, at one recentred
        for :math:`\psi` (:meth:`_recentred`). Sums at values of :math:`\psi`
        not seen lately are recomputed with a full pass (counted in ``log``).
        The proposals follow :math:`\psi` too
        (:meth:`_proposal_expansion`): the HMC trajectory integrates this
        expansion, and the mass matrix is :math:`M(\psi) = -\nabla^2(\log f_0
        + \sum_n h_n)(\hat\theta)` at :math:`\psi` (as fitted with ``expand_in`` or
        ``covariance``), functions of :math:`\psi` only, so valid proposals for
        the block given :math:`\psi`.

        Returns
        -------
        tuple
            ``(surrogate, coordinate surrogate, mass)``: as ``self.surrogate`` and
            ``self.coordinate_surrogate`` but at :math:`\psi`, and the factors
            :math:`(M^{-1}, L_M, L_{M^{-1}})`; the first two None when the sums
            are not finite there (the race then reads the raw terms).
        """
        if not self.terms.input_names:  # the terms read the block and the data only
            return self.surrogate, self.coordinate_surrogate, self._mass()
        arrays = self.terms.other_arrays(point)
        key = inputs_key(arrays)
        refits = self._expansions.n_refits
        entry = self._expansions.get(key, lambda: self._refit(point, log))
        if self._expansions.n_refits > refits:
            log["refits"] += 1
            last = self._last_inputs
            if last is not None:
                names = self.terms.input_names
                self._moved_inputs.update(
                    n for n, a, b in zip(names, last, key, strict=True) if a != b
                )
        self._last_inputs = key
        return entry

    def _refit(self, point: dict, log: dict) -> tuple:
        """Recompute the race's sums at ``point``'s other inputs (full passes, in ``log``)."""
        n_obs, sur, cv = self.terms.n_obs, self.surrogate, self.coordinate_surrogate
        if cv is not None:  # the race reads the expansion in the Deterministics only
            ref = cv.theta_ref
            value, grad, hess = self._coordinate_expansion.sums(ref, point)
            log["n_evals"] += (len(ref) + 1) * n_obs
            cv = TaylorSurrogate(ref, value, grad, 0.5 * (hess + hess.T))
            finite = np.isfinite(value) and np.isfinite(grad).all() and np.isfinite(hess).all()
        elif isinstance(sur, TaylorSurrogate):
            return self._recentred(sur.theta_ref, point, log)
        else:
            rows = sur.points()
            sums = self._sums(rows, point)
            log["n_evals"] += len(rows) * n_obs
            finite = bool(np.isfinite(sums).all())
            sur = QuadraticSurrogate(sur.theta_ref, sur.eps, sums, sur.full) if finite else sur
        if not finite:
            return None, None, self._mass()
        mass = self._mass()
        if cv is None and self.covariance is None:  # M from the Hessian at these inputs
            f0_hess = self._f0_hessian(sur.theta_ref, point, self._f0_eps)
            try:
                mass = _mass_factors(_positive_definite(-(sur.hess + f0_hess)))
            except np.linalg.LinAlgError:
                pass  # keep the mass matrix as fitted
        return sur, cv, mass

    def _recentred(self, x: np.ndarray, point: dict, log: dict) -> tuple:
        r"""Return the Taylor expansion at ``point``'s other inputs, recentred when far.

        Newton steps on the block's log posterior given those inputs
        (:meth:`_newton`, a full pass each) from the fitted reference
        :math:`\hat\theta`, until the Newton decrement there is below
        :math:`d` (the reference within about a posterior sd of the mode): one
        pass where the other inputs moved little, more where they moved the
        block's mode away. The result is a function of the inputs alone. In
        tuning, the fitted reference moves to it (later refits start there);
        :meth:`stop_tuning` then drops the sums computed from earlier ones.
        Returns ``(surrogate, None, mass)`` as :meth:`_expansion_at`.
        """
        try:
            for _ in range(_RECENTRE_STEPS):
                sur, neg_h, x_next, decrement, cost = self._newton(x, self._f0_eps, point, None)
                log["n_evals"] += cost
                if decrement < self.dim:
                    break
                x = x_next
            mass = self._mass() if self.covariance is not None else _mass_factors(neg_h)
        except (FloatingPointError, np.linalg.LinAlgError):
            return None, None, self._mass()
        if not np.isfinite(sur.grad).all():
            return None, None, self._mass()
        if self.tune and sur.theta_ref is not self.surrogate.theta_ref:
            self.surrogate, self._reference_moved = sur, True
        return sur, None, mass

    def _mass(self) -> tuple:
        """Return the mass matrix as fitted: :math:`(M^{-1}, L_M, L_{M^{-1}})`."""
        return self._inv_mass, self._chol_mass, self._chol_cov

    def _watch_refits(self, refits: int) -> None:
        """Warn once when the expansion is refitted at more than a quarter of the draws."""
        self._refit_draws += 1
        watched = self._refit_draws - _REFIT_AFTER
        if watched <= 0:
            return
        self._refit_count += refits
        if self._refit_warned or watched < _REFIT_AFTER:
            return
        if self._refit_count <= _REFIT_SHARE * watched:
            return
        self._refit_warned = True
        moved = sorted(self._moved_inputs) or list(self.terms.input_names)
        values = {v.name: v for v in self.model.value_vars}
        rvs = [self.model.values_to_rvs[values[n]] for n in moved]
        continuous = [rv.name for rv in rvs if rv.dtype.startswith("float")]
        fix = (
            f"put {', '.join(repr(n) for n in continuous)} in this step's block"
            if continuous
            else "an exact step for this block costs about as much"
        )
        warnings.warn(
            f"RacingMetropolis: the likelihood terms of "
            f"{', '.join(v.name for v in self.vars)} depend on "
            f"{', '.join(repr(n) for n in moved)}, which another step moves; the expansion "
            f"was refitted at {self._refit_count} of {watched} draws, each a full "
            f"pass over the data, so races save little: {fix}",
            UserWarning,
            stacklevel=4,
        )

    # -- proposals ---------------------------------------------------------------------

    def _proposal_expansion(self, point: dict, log: dict | None = None) -> tuple:
        """Return the proposals' ``(surrogate, coordinate surrogate, mass)`` at ``point``.

        With control variates, those at the other inputs' values in ``point``
        (:meth:`_expansion_at`, its refits counted in ``log``), as the race
        reads them; else, or where those sums are not finite, as fitted.
        """
        fitted = (self.surrogate, self.coordinate_surrogate, self._mass())
        if not self.control_variates or self.surrogate is None:
            return fitted
        now = self._expansion_at(point, {"n_evals": 0, "refits": 0} if log is None else log)
        return now if now[0] is not None else fitted

    def _proposal_surrogate(self, point, log: dict | None = None, now: tuple | None = None):
        """Return the surrogate the HMC proposal integrates: in ``expand_in`` when given.

        ``now``: the proposals' expansion (:meth:`_proposal_expansion`), looked up when None.
        """
        sur, cv, _ = self._proposal_expansion(point, log) if now is None else now
        if cv is None:
            return sur
        return CoordinateSurrogate(
            cv,
            lambda theta: self._coordinates_at(theta, point),
            lambda theta, v: self._flatten(self._pullback(self._split(theta), v, point)),
        )

    def _coordinates_at(self, theta: np.ndarray, point: dict) -> np.ndarray:
        """Flat values of the ``expand_in`` Deterministics at the flat block ``theta``."""
        return self._to_coordinates(self._split(theta), point)

    def _hmc(self, x: np.ndarray, point: dict, log: dict) -> tuple[np.ndarray, float]:
        """Leapfrog on the surrogate; return the proposal and K(p) - K(p')."""
        now = self._proposal_expansion(point, log)
        sur = self._proposal_surrogate(point, now=now)
        inv_mass, chol_mass, _ = now[2]
        eps = float(self.scaling) * self.rng.uniform(0.9, 1.1)
        n_steps = int(min(100, max(1, np.ceil(self._path / eps))))
        p = chol_mass @ self.rng.standard_normal(self.dim)
        kinetic0 = 0.5 * p @ inv_mass @ p

        def grad(theta):
            return sur.gradient(theta) + self._f0_grad(theta, point)

        theta = x.copy()
        p = p + 0.5 * eps * grad(theta)
        for k in range(n_steps):
            theta = theta + eps * (inv_mass @ p)
            if not np.isfinite(theta).all():
                self._integrator_accept = 0.0
                return x, -np.inf
            g = grad(theta)
            p = p + (eps if k < n_steps - 1 else 0.5 * eps) * g
        kinetic1 = 0.5 * p @ inv_mass @ p
        # the integrator's own energy error on the surrogate (no data read) tunes the step
        # size; the surrogate's misfit, which no step size removes, is left to the race
        ends = np.stack([x, theta])
        log_f0 = self.terms.log_f0(self._candidates(ends), point)
        energy = sur.total(ends) + log_f0
        error = float(energy[1] - energy[0] + kinetic0 - kinetic1)
        self._integrator_accept = float(np.exp(min(0.0, error))) if np.isfinite(error) else 0.0
        return theta, float(kinetic0 - kinetic1)

    def _gradient_fn(self, point):
        n_obs = self.terms.n_obs
        batch = IndexStream(n_obs, self.rng).take(self.gradient_batch)
        batch.sort()
        scale = n_obs / len(batch)

        def gradient(flat):
            g_lik, g_f0 = self.terms.gradient(self._split(flat), batch, point)
            return scale * self._flatten(g_lik) + self._flatten(g_f0)

        return gradient

    # -- the step -------------------------------------------------------------------

    def _draw(self, point, audit):
        """One MH step with a racing accept test; return the new point and stats.

        With ``elemwise``, one random-walk decision per dimension, in random order.
        """
        exact_mode = self.audit_exact  # as at the draw's start
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
            if self.proposal == "hmc":
                x_new, extra = self._hmc(x, point, log)
            elif self.proposal == "normal":
                if self.preconditioned:
                    chol_cov = self._proposal_expansion(point, log)[2][2]
                    x_new = x + self.scaling * (chol_cov @ self.rng.standard_normal(len(x)))
                    extra = 0.0
                else:
                    x_new, lq_fwd, lq_rev = random_walk_proposal(x, self.scaling, self.rng)
                    extra = lq_rev - lq_fwd
            else:
                x_new, lq_fwd, lq_rev = langevin_proposal(
                    x, self.scaling, self._gradient_fn(point), self.rng
                )
                extra = lq_rev - lq_fwd
            ok, acc = self._decide(x, x_new, extra, point, audit, log)
            accepted, accept = np.array([ok]), np.array([acc])
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
        }
        if self.tune:
            self._tuning_accepts.append(float(np.mean(accepted)))
            self._tune_step(accepted, accept)
        self._watch_refits(log["refits"])
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
        if self._exact_independent:  # audits found our terms wrong: the model's joint density
            joint = self._joint_scores(cands, point)
            log_alpha = float(joint[1] - joint[0] + extra)
            log_alpha = -np.inf if np.isnan(log_alpha) else log_alpha
            log["n_evals"] += 2 * n_obs
            log["rows"] += n_obs
            log["exhausted"] = True
            return bool(log_u < log_alpha), float(np.exp(min(0.0, log_alpha)))
        exact_part = log_f0[1] - log_f0[0] + extra
        exact = self.decides_exactly or self._backoff.take(key)
        # an exact decision sums every term: a control variate would cancel from it
        sur = coordinate_sur = None
        if (
            self.control_variates
            and self.surrogate is not None
            and not exact
            and not self._raw_races
        ):
            sur, coordinate_sur, _ = self._expansion_at(point, log)
        spent = [0]  # terms evaluated, stencil included
        rewards, h_total = self._race_rewards(pair, cands, point, sur, coordinate_sur, spent)
        exact_part += h_total[1] - h_total[0]

        def sums(arms):
            spent[0] += n_obs * len(arms)
            return terms.loglik_sum([c[arms] for c in cands], point) - h_total[arms]

        config = None if exact else self.race_config
        decision = mh_test(rewards, n_obs, exact_part, log_u, config, rng=self.rng, totals=sums)
        res = decision.race
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

    def _race_rewards(self, pair, cands, point, sur, coordinate_sur, spent) -> tuple:
        r"""Return the race's ``rewards(arms, idx)`` and the sums :math:`\sum_n h_n` per arm.

        Rewards are :math:`l_n(x_a) - h_n(x_a)` for the control variate ``sur``
        (the raw terms when None) at the two rows of ``pair``; ``spent[0]``
        counts the terms evaluated.
        """
        terms = self.terms
        if sur is None:

            def rewards(arms, idx):
                values = terms.loglik_batch([c[arms] for c in cands], idx, point)
                spent[0] += values.size
                return values

            return rewards, np.zeros(2)
        if isinstance(sur, TaylorSurrogate):  # residuals from the graph's derivatives
            rows, expansion = pair, self._expansion
            if coordinate_sur is not None:  # expanded in the Deterministics
                sur, expansion = coordinate_sur, self._coordinate_expansion
                rows = np.stack([self._coordinates_at(r, point) for r in pair])

            def rewards(arms, idx):
                values = expansion.residual_batch(rows[arms], idx, point, sur.theta_ref)
                spent[0] += 3 * values.size  # value, first and second derivative per arm
                return values

            return rewards, sur.total(rows)
        # race on l_n - h_n; the exact sums of h_n join the exact part
        weights = sur.weights(pair)
        all_cands = [
            np.concatenate([s, c]) for s, c in zip(self._stencil_cands, cands, strict=True)
        ]
        k = sur.n_points

        def rewards(arms, idx):
            values = terms.loglik_batch(all_cands, idx, point)
            spent[0] += values.size
            return values[k + arms] - weights[arms] @ values[:k]

        return rewards, weights @ sur.sums

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
        if not agree:
            ours = log_f0 + self.terms.loglik_sum(cands, point)
            structural = scores_differ(ours, joint, self._score_rtol)
            share = zero_difference_share(self._audit_batch(cands, point))
        self._record_audit(agree, structural=structural, zero_share=share)
        return agree

    def _fall_back_to_random_walk(self, rate: float) -> None:
        """Replace an HMC proposal that the exact test nearly never accepts by a random walk.

        The random walk is preconditioned by the Laplace covariance at the mode
        and tuned as ``proposal="normal"`` (chains sampled later by this step
        keep it). Tuning draws are discarded, so the kernel change leaves the
        kept draws exact.
        """
        warnings.warn(
            f"RacingMetropolis: the surrogate's HMC proposal was accepted {rate:.0%} of "
            f"{self._accept_n} times in tuning (the quadratic surrogate fits this posterior "
            "poorly: multimodal, heavy-tailed, or coefficients at a boundary); the step "
            "falls back to a random walk preconditioned by the Laplace covariance. Pass "
            "proposal='normal' to start with it, or use NUTS for this block",
            UserWarning,
            stacklevel=4,
        )
        self.proposal = "normal"
        self._dual = None
        self.scaling = 2.38 / np.sqrt(self.dim)
        self._reset_interval()

    def _tune_step(self, accepted: np.ndarray, accept: np.ndarray) -> None:
        if self._dual is not None:  # hmc: dual averaging on the log step size
            # the decision itself, not the race's estimate of the acceptance probability
            # (a race that stops early estimates it from part of the data)
            rate = float(accepted[0])
            self._accept_sum += rate
            self._accept_n += 1
            # Robbins-Monro on log(path length) towards the exact test's target acceptance
            gain = 1.0 / np.sqrt(self._accept_n)
            self._path = float(
                np.clip(self._path * np.exp(gain * (rate - _TARGET_PATH)), 0.05, self.path_length)
            )
            self.scaling = float(np.exp(self._dual.update(self._integrator_accept, _TARGET_HMC)))
            rate = self._accept_sum / self._accept_n
            if self._accept_n >= _FALLBACK_AFTER and rate < _FALLBACK_RATE:
                self._fall_back_to_random_walk(rate)
            return
        self.accepted_sum = self.accepted_sum + accepted.astype(int)
        self.steps_until_tune -= 1
        if self.steps_until_tune > 0:
            return
        rate = self.accepted_sum / self.tune_interval
        if self.proposal == "normal":
            scaling = pymc_tune(self.scaling, rate)
        else:  # Robbins–Monro on log(eps) towards the target acceptance
            scaling = self.scaling * np.exp(2.0 * (rate - self.target_accept))
        self.scaling = scaling if self.elemwise else float(np.squeeze(scaling))
        self._reset_interval()


def _stencil_steps(neg_hessian: np.ndarray) -> np.ndarray:
    """Stencil steps of a tenth of the posterior sd of each coordinate (Laplace)."""
    sd = np.sqrt(np.diag(np.linalg.inv(neg_hessian)))
    return np.clip(0.1 * sd, 1e-10, 1e-2)


def _mass_factors(neg_hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return :math:`M^{-1}` and the Cholesky factors of :math:`M` and :math:`M^{-1}`."""
    inv_mass = np.linalg.inv(neg_hessian)
    return inv_mass, np.linalg.cholesky(neg_hessian), np.linalg.cholesky(inv_mass)


def _positive_definite(matrix: np.ndarray) -> np.ndarray:
    """Symmetrize and lift eigenvalues to at least 1e-8 of the largest (a valid metric)."""
    sym = 0.5 * (matrix + matrix.T)
    vals, vecs = np.linalg.eigh(sym)
    if not np.isfinite(vals).all():
        raise np.linalg.LinAlgError("the Hessian of the log posterior is not finite")
    floor = 1e-8 * max(float(np.abs(vals).max()), 1e-300)
    return (vecs * np.maximum(np.abs(vals), floor)) @ vecs.T


class _DualAveraging:
    """Dual averaging of a log step size (Nesterov 2009; Hoffman & Gelman 2014, Alg. 5)."""

    def __init__(self, log_step: float, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75):
        self.mu = log_step + np.log(10.0)
        self.log_step = self.log_bar = log_step
        self.h_bar = 0.0
        self.n = 0
        self.gamma, self.t0, self.kappa = gamma, t0, kappa
        self.accept_sum = 0.0

    @property
    def mean_accept(self) -> float:
        return self.accept_sum / max(self.n, 1)

    def update(self, accept: float, target: float) -> float:
        self.n += 1
        self.accept_sum += accept
        n = self.n
        w = 1.0 / (n + self.t0)
        self.h_bar = (1 - w) * self.h_bar + w * (target - accept)
        self.log_step = self.mu - np.sqrt(n) / self.gamma * self.h_bar
        eta = n ** (-self.kappa)
        self.log_bar = eta * self.log_step + (1 - eta) * self.log_bar
        return self.log_step

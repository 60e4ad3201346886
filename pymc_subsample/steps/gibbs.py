r"""SubsampledCategoricalGibbs: Gibbs updates of discrete variables by racing.

The full conditional of a discrete variable :math:`X` with :math:`D` values
(:func:`~pymc_subsample.model.support.discrete_support`), indexed :math:`i = 0..D-1`, is
:math:`p(X=i \mid \cdot) \propto f_0(i) \prod_{n=1}^N f_n(i)`; each draw is
:func:`~pymc_subsample.racing.sample_categorical` on it (Chen & Ghahramani
2016, Sec. 2–3),
so its law is within total variation :math:`\delta` of the exact conditional.
"""

from __future__ import annotations

import numpy as np

from ..mcmc.audit import scores_differ, zero_difference_share
from ..mcmc.cost import compiled_look_cost
from ..model.blocks import check_expand_in, prior_points
from ..model.expansion import Expansion
from ..model.support import discrete_support
from ..options import AuditOptions, RaceOptions, options_or_default, reject_moved_keywords
from ..racing import RaceResult, sample_categorical
from ..racing.common import argmax_or_raise
from ..racing.compiled import DECIDED, EXACT_PASS, CompiledRace, supports
from ..racing.race import sparse_arms
from ..validation import ArgumentTypeError
from .base import (
    AUDIT_AGREE,
    AUDIT_DISAGREE,
    AUDIT_NOT_RUN,
    RacingStep,
)

__all__ = ["COMPILED_MIN_OBS", "SubsampledCategoricalGibbs"]

#: Populations from this size on race in one compiled call per draw where they can
#: (:func:`~pymc_subsample.racing.compiled.CompiledRace`, built in about 2 s with the
#: step); smaller ones race in Python (at N = 10^4 a Python look's bookkeeping, some
#: 70 µs, cost more than its terms; below it the defaults mostly decide exactly).
COMPILED_MIN_OBS = 10_000
#: Draws of Gumbel noise and race seeds the lean path of a lone scalar takes from ``rng``
#: at a time (one call instead of two per draw).
LEAN_BUFFER = 64
#: Back-off key (block element) of a lone scalar.
LONE_KEY = (0, 0)


def _draw_stats(
    n_evals: int,
    rows: int,
    n_rows: int,
    n_rounds: int,
    exhausted: bool,
    n_raced: int,
    audit_agree: int,
    audit_exact: bool = False,
) -> dict:
    """Sampler stats of one draw (see ``SubsampledCategoricalGibbs.stats_dtypes_shapes``).

    ``rows``: observations the draw's decisions read, summed over them;
    ``n_rows``: :math:`N` times the number of decisions.
    """
    return {
        "n_evals": n_evals,
        "frac_evals": rows / n_rows,
        "n_rounds": n_rounds,
        "exhausted": exhausted,
        "n_raced": n_raced,
        "audit_agree": audit_agree,
        "audit_exact": audit_exact,
    }


def _check_control_variates(control_variates) -> bool | dict:
    """Return ``control_variates`` as a bool or a dict (a reference point); raise otherwise."""
    if control_variates is None:
        return False
    if isinstance(control_variates, dict):
        return control_variates
    if isinstance(control_variates, bool | np.bool_):
        return bool(control_variates)
    raise ArgumentTypeError(
        "control_variates must be True, False or a dict (a reference point), "
        f"got {control_variates!r}; e.g. control_variates=True"
    )


class SubsampledCategoricalGibbs(RacingStep):
    r"""Gibbs step for bounded discrete variables that races on mini-batches.

    Each element of each variable in ``vars`` is redrawn in turn from its full
    conditional :math:`p(X=i \mid \cdot) \propto f_0(i)\prod_n f_n(i)`, with
    :math:`\log f_n` the per-observation log-likelihood terms and
    :math:`\log f_0` the rest of the Markov blanket
    (:class:`~pymc_subsample.model.terms.ObservationTerms`). The draw is Gumbel-max
    with a race on growing shared mini-batches
    (:func:`~pymc_subsample.racing.sample_categorical`): its law is within total
    variation ``delta`` of the exact conditional (Chen & Ghahramani 2016, Prop. 1 and 3, under
    the bound's assumptions); ``race=RaceOptions(bound="exact")`` is an exact
    Gibbs draw over all :math:`N` observations.

    Parameters
    ----------
    vars : list
        Discrete variables with a support known when the step is built
        (scalar or vector; a vector is updated element by element, each with
        its own race): Bernoulli, Categorical (OrderedLogistic and
        OrderedProbit are Categoricals), DiscreteUniform, Binomial,
        BetaBinomial, HyperGeometric, and Truncated with an upper bound, with
        bounds that do not depend on other free variables and at most
        :data:`~pymc_subsample.model.support.MAX_CATEGORIES` values
        (:func:`~pymc_subsample.model.support.discrete_support`). Others are
        refused, naming the variable and the fix.
    delta : float
        Error allowed per draw, in (0, 1).
    data : list of pm.Data, optional
        The per-observation data inputs; guessed when omitted
        (:class:`~pymc_subsample.model.terms.ObservationTerms`).
    race : RaceOptions, optional
        How each race runs (:class:`~pymc_subsample.options.RaceOptions`):
        bound, first batch, exact switch, batch layout, back-off. The default
        races with the normal bound and chooses the first batch and the exact
        switch by timing the model at construction;
        ``RaceOptions(bound="exact")`` draws exactly over all :math:`N`
        observations. A race is on the :math:`D` values' terms: the back-off
        is kept per element of the block.
    audit : AuditOptions, optional
        How often a draw is checked against the exact Gibbs draw for the same
        Gumbel noise (Gumbel-max on the model's own joint log density at each
        value), and what a failed audit does
        (:class:`~pymc_subsample.options.AuditOptions`).
    control_variates : bool or dict
        Race on the residuals of a second-order expansion of the terms in the
        other continuous variables :math:`\psi` they depend on, around a
        reference :math:`\hat\psi` (Chen & Ghahramani 2016, Sec. 4; the
        expansion is in the parameters rather than the data), with
        :math:`\Delta = \psi - \hat\psi`:

        .. math:: h_n(i) = \log f_n(i; \hat\psi) + D_\psi \log f_n(i;
                  \hat\psi)[\Delta] + \tfrac12 D^2_\psi \log f_n(i;
                  \hat\psi)[\Delta, \Delta],

        whose sums :math:`S_i = \sum_n \log f_n(i; \hat\psi)`, its gradient
        :math:`G_i` and Hessian :math:`H_i` in :math:`\hat\psi` take one full
        pass per candidate and are cached; the race then reads :math:`\log
        f_n(i;\psi) - h_n(i)` (the directional derivatives by forward mode, on
        the batch) with :math:`S_i + G_i^\top\Delta + \Delta^\top H_i
        \Delta/2` added to :math:`\log f_0(i)`. First order only when
        :math:`\psi` has more than
        :data:`~pymc_subsample.model.expansion.MAX_SECOND_ORDER_INPUTS` coordinates.
        The decision is unchanged; the residuals are third order in
        :math:`\Delta` (second order above that size).
        ``True``: the reference is the current point, renewed whenever the
        row permutation is redrawn and at the end of tuning. A dict: a fixed
        reference point (values of the continuous value variables, e.g. a
        MAP). The cached sums are renewed whenever the other elements of the
        block or discrete inputs change, so this pays for a scalar selector
        whose neighbours move little, not for a vector updated element by
        element. ``False`` (default): races on the raw terms.
    expand_in : sequence of str, optional
        Deterministics of the model in which to expand instead of the value
        variables (:class:`~pymc_subsample.model.expansion.Expansion`, its
        ``coordinates``): with
        :math:`\phi = \phi(\psi)`, the expansion above is in :math:`\phi` and
        :math:`\Delta = \phi(\psi) - \phi(\hat\psi)`. For parameters whose
        terms are smooth in a transformed value, e.g. ARCH coefficients
        :math:`\alpha = \mathrm{softplus}(z)` near zero, where the terms are
        far from quadratic in :math:`z` but linear-in-variance in
        :math:`\alpha`. Requires ``control_variates``.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.
    **moved
        Keywords that moved into the options objects (``bound``,
        ``batch_size``, ``audit_every``, ...): each raises a ``TypeError``
        that names its new place (:func:`~pymc_subsample.options.reject_moved_keywords`).

    Notes
    -----
    For a lone scalar variable without control variates, at :math:`N \ge`
    :data:`COMPILED_MIN_OBS` and with the exact switch before half of the
    data, each race runs in one compiled call
    (:class:`~pymc_subsample.racing.compiled.CompiledRace`, the same
    decisions as the Python race), compiled when the step is built.

    Sampler stats, one value per draw: ``n_evals`` (per-observation terms
    evaluated, summed over the elements updated), ``frac_evals`` (the share of
    the :math:`N` observations a decision read, averaged over the elements
    updated: 1 for an exact draw; the same meaning in
    :class:`~pymc_subsample.RacingMetropolis`), ``n_rounds`` (race looks),
    ``exhausted`` (some race needed all :math:`N`), ``n_raced`` (elements
    drawn by a race rather than exactly, see ``RaceOptions.backoff``), ``audit_agree``
    (1: the audited draw agreed with the exact decision for every element
    raced, 0: it did not, -1: not audited) and ``audit_exact`` (the draw was
    exact because audits had found the races wrong, see ``audit``).
    """

    name = "subsampled_categorical_gibbs"
    stats_dtypes_shapes = {
        "n_evals": (np.int64, []),
        "frac_evals": (np.float64, []),
        "n_rounds": (np.int64, []),
        "exhausted": (bool, []),
        "n_raced": (np.int64, []),
        "audit_agree": (np.int8, []),
        "audit_exact": (bool, []),
    }

    def __init__(
        self,
        vars,
        *,
        delta: float = 0.05,
        data=None,
        race: RaceOptions | None = None,
        audit: AuditOptions | None = None,
        control_variates: bool | dict = False,
        expand_in=None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **moved,
    ):
        reject_moved_keywords(type(self).__name__, moved, ("race", "audit"))
        # before the build: a mistake costs no compile
        race = options_or_default("race", race, RaceOptions)
        audit = options_or_default("audit", audit, AuditOptions)
        check_expand_in(expand_in)
        _check_control_variates(control_variates)
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
        #: Each variable's candidate values (its support); a race's winner is an index into them.
        self._values = [discrete_support(self.model, v, self.initial_point) for v in self.vars]
        self.n_categories = [len(values) for values in self._values]
        #: One scalar variable: the lean path (:meth:`_lean_step`) can draw it.
        self._lone = len(self.vars) == 1 and np.size(self.initial_point[self.vars[0].name]) == 1
        self._lone_name = self.vars[0].name
        self._lone_points = [np.array(v) for v in self._values[0]]  # its values, as a point has
        self._lean_at = self._lean_seed_at = LEAN_BUFFER  # the lean path's bulk draws: none left
        self._lean_offsets = None  # (log f0 + noise) / N of the lean buffer's rows
        self._constant_f0 = None  # log f0 of a lone scalar with no other inputs, once computed
        self._constant_f0_has_inf = False
        self._set_control_variates(control_variates, expand_in)
        self._plan_races(max(self.n_categories))
        self._plan_compiled()

    # -- control variates ------------------------------------------------------------

    def _set_control_variates(self, control_variates, expand_in) -> None:
        control_variates = _check_control_variates(control_variates)
        self.control_variates = control_variates is not False
        self._fixed_reference = None
        self._reference = None
        self.expansion: Expansion | None = None  # of the terms in the other inputs
        self._check_expand_in(expand_in, "pass control_variates=True or a reference point as well")
        if not self.control_variates:
            return
        self.expansion = Expansion(self.terms, "inputs", expand_in or ())
        names = self.expansion.names
        if not names:
            self.expansion.compile(self.initial_point)  # raises the error that explains why
        if isinstance(control_variates, dict):
            missing = [n for n in names if n not in control_variates]
            if missing:
                raise ValueError(
                    f"control_variates: the reference point lacks {missing}; give values for "
                    f"every continuous value variable the terms depend on: {names}"
                )
            self._fixed_reference = {
                n: np.asarray(control_variates[n], dtype=self.initial_point[n].dtype) for n in names
            }
        self._renew_reference(self.initial_point)

    def _renew_reference(self, point) -> None:
        names = self.expansion.names
        if self._fixed_reference is not None:
            self._reference = self._fixed_reference
        else:
            self._reference = {n: np.array(point[n], copy=True) for n in names}
        self.expansion.clear()

    def _shuffle(self) -> None:
        super()._shuffle()
        if getattr(self, "_reference", None) is not None and self._fixed_reference is None:
            self._renew_on_next_draw = True

    def stop_tuning(self):
        """End tuning; with control variates, renew the reference at the next draw."""
        super().stop_tuning()
        self._renew_on_next_draw = self.control_variates and self._fixed_reference is None

    def _batch_rewards(self, cands, positions, point) -> np.ndarray:
        if self.control_variates:
            return self.expansion.residual_batch(cands, positions, point, self._reference)
        return super()._batch_rewards(cands, positions, point)

    def _expansion_shift(self, cands, point) -> np.ndarray:
        r"""Return :math:`S_i + G_i^\top\Delta + \Delta^\top H_i \Delta / 2` for every candidate."""
        ref = self._reference
        values, grads, hess = self.expansion.cached_sums(ref, point, cands)
        step = self.expansion.delta(point, ref)
        shift = values + grads @ step
        if hess is not None:
            shift += 0.5 * np.einsum("kij,i,j->k", hess, step, step)
        return shift

    @staticmethod
    def _exact_draw(log_f0, totals, noise, n_obs):
        """Exact Gumbel-max draw: argmax of log f0 + sum_n log f_n + noise, in one pass."""
        feasible = np.flatnonzero(np.isfinite(log_f0))
        score = np.full(len(log_f0), -np.inf)
        score[feasible] = log_f0[feasible] + totals(feasible) + noise[feasible]
        if np.isnan(score).any() or np.isposinf(score).any():
            raise ValueError("the log-likelihood terms summed to NaN or +inf for some candidate")
        if not np.isfinite(score).any():
            raise ValueError(
                "every candidate has a -inf log density: the conditional is zero everywhere "
                "(check the model and the initial point)"
            )
        value = int(np.argmax(score))
        n_evals = n_obs * len(feasible)
        return value, RaceResult(value, n_evals, 1, True, n_obs, score / n_obs)

    def _draw(self, point, audit):
        """Redraw every element of the block; return the new point and the stats."""
        if self._exact_independent:  # audits found our terms wrong: the model's joint density
            return self._step(dict(point), audit)
        # exact draws (back-off ones too) need no audit nor control variates: the lean path
        # takes them, and every draw of a compiled race, audited or not
        if self._compiled or (
            self._lone and (self.decides_exactly or self._backoff.left(LONE_KEY) > 0)
        ):
            drawn = self._lean_step(point, audit)
            if drawn is not None:
                return drawn
        return self._step(dict(point), audit)

    def _lean_step(self, point, audit=False):
        r""":meth:`step` of a lone scalar raced compiled, with as little Python as it needs.

        The same draw as the general path (Gumbel-max, race, back-off,
        audit), for the common case: every :math:`\log f_0` finite. Returns
        None, having drawn nothing, when that case does not hold. A lone
        scalar's exact draws take it too (every draw when it decides exactly,
        the back-off's draws otherwise), compiled races, control variates or
        not: Gumbel-max on one fused pass.
        """
        n_obs, n_cat = self.terms.n_obs, self.n_categories[0]
        log_f0 = self._constant_f0
        if log_f0 is None:
            log_f0 = self._lone_log_f0(point)
            has_inf = not np.isfinite(log_f0).all()
        else:
            has_inf = self._constant_f0_has_inf
        if has_inf:  # the Python race handles -inf candidates
            return None
        at = self._lean_next(n_cat)
        noise = self._lean_noise[at]
        verdict = AUDIT_NOT_RUN
        exact_mode = self.audit_exact  # as at the draw's start
        if self.decides_exactly or self._backoff.take(LONE_KEY):
            n_raced = 0
            value, n_evals, n_rounds, exhausted = self._lean_exact(log_f0, noise, point)
            rows = n_obs
        else:
            n_raced = 1
            if self._constant_f0 is None:
                offsets = (log_f0 + noise) / n_obs
            else:  # computed for the whole buffer at once
                if self._lean_offsets is None:
                    self._lean_offsets = (self._constant_f0 + self._lean_noise) / n_obs
                offsets = self._lean_offsets[at]
            value, n_evals, n_rounds, exhausted, totals = self._lean_race(offsets, point)
            rows = n_obs if exhausted else self._compiled_race.rows_drawn()
            # did it pay, or did most candidates reach the exact pass?
            self._backoff.record(LONE_KEY, n_evals, n_obs * n_cat)
            if audit:  # the exact decision for the same noise, from the model's joint density
                sums = None if totals is None else lambda arms: totals[arms]
                verdict = self._audit(value, [self._values[0]], log_f0, noise, point, sums)
        point = dict(point)
        point[self._lone_name] = self._lone_points[value].copy()
        stats = _draw_stats(n_evals, rows, n_obs, n_rounds, exhausted, n_raced, verdict, exact_mode)
        return point, [stats]

    def _audit(self, value, cands, log_f0, noise, point, totals=None) -> int:
        r"""Audit a raced draw ``value``; return its ``audit_agree`` verdict.

        The exact draw for the same Gumbel noise is :math:`\arg\max_i` of the
        model's joint log density at value :math:`i` plus the noise
        (:meth:`_joint_scores`). At a disagreement, what the cause takes is
        measured too: the exact scores from the race's own sums (``totals``,
        the race's when it computed them all, else one fused pass) against the
        joint ones, and the share of zero differences on a batch.
        """
        with self._audit_clock():
            joint = self._joint_scores(cands, point)
            agree = argmax_or_raise(joint + noise) == value
        structural, share = False, None
        if not agree:
            feasible = np.flatnonzero(np.isfinite(log_f0))
            sums = totals or (lambda arms: self.terms.loglik_sum([c[arms] for c in cands], point))
            ours = np.full(len(log_f0), -np.inf)
            ours[feasible] = log_f0[feasible] + sums(feasible)
            structural = scores_differ(ours, joint, self._score_rtol)
            share = zero_difference_share(self._audit_batch(cands, point))
        self._record_audit(agree, structural=structural, zero_share=share)
        return AUDIT_AGREE if agree else AUDIT_DISAGREE

    def _joint_draw(self, cands, noise, point, n_obs):
        """Exact Gumbel-max draw on the model's joint log density (:meth:`_joint_scores`)."""
        score = self._joint_scores(cands, point) + noise
        value = argmax_or_raise(score)
        return value, RaceResult(value, n_obs * len(score), 1, True, n_obs, score / n_obs)

    def _lean_exact(self, log_f0, noise, point, totals=None):
        """Exact Gumbel-max draw of a lone scalar: ``(value, n_evals, n_rounds, exhausted)``.

        ``totals``: every value's sum of terms when already computed.
        """
        n_obs = self.terms.n_obs
        if totals is None:
            totals = self.terms.loglik_sum([self._values[0]], point)
        score = log_f0 + totals + noise
        if np.isfinite(score).all():  # the usual case, with none of the checks below
            return int(score.argmax()), n_obs * len(score), 1, True
        value, res = self._exact_draw(log_f0, totals.__getitem__, noise, n_obs)
        return value, res.n_evaluations, res.n_rounds, res.exhausted

    def _lean_race(self, offsets, point):
        """Compiled race of a lone scalar: ``(value, n_evals, n_rounds, exhausted, totals)``.

        ``totals`` are every value's sums of terms when the exact pass
        computed them all (None otherwise), for an audit to reuse.
        """
        terms, race, values = self.terms, self._compiled_race, self._values[0]
        others = tuple(terms.other_arrays(point)) if self._lean_others else ()
        status = race.launch(values, terms.permuted_rows(), others, self._lean_seed(), offsets)
        if status == DECIDED:
            return (*race.outcome(), False, None)
        if status == EXACT_PASS:  # the survivors' fused sums, decided here
            alive = race.survivors()
            sums = terms.loglik_sum([values[alive]], point)
            outcome = race.exact_outcome(offsets, sums)
            if outcome is not None:
                return (*outcome, True, sums if len(alive) == len(values) else None)
            res = race.finish(status, offsets, lambda arms: sums)  # a -inf or bad sum
        else:
            res = race.finish(status, offsets, self._lone_totals(point))
        return res.winner, res.n_evaluations, res.n_rounds, res.exhausted, None

    def _lone_log_f0(self, point) -> np.ndarray:
        r""":math:`\log f_0` of a lone scalar's values; computed once when it does not vary."""
        if self._constant_f0 is not None:
            return self._constant_f0
        log_f0 = self.terms.log_f0([self._values[0]], point)
        if self.terms.log_f0_is_constant:  # the same at every draw
            self._constant_f0 = log_f0
            self._constant_f0_has_inf = not np.isfinite(log_f0).all()
        return log_f0

    def _lone_totals(self, point):
        """``totals(arms)`` of a lone scalar: each value's sum of terms in one fused pass."""
        values = self._values[0]
        return lambda arms: self.terms.loglik_sum([values[arms]], point)

    def _lean_next(self, n_cat: int) -> int:
        """Row of the lean path's next Gumbel noise (``rng`` draws a buffer at a time)."""
        at = self._lean_at
        if at >= LEAN_BUFFER:
            self._lean_noise = self.rng.gumbel(size=(LEAN_BUFFER, n_cat))
            self._lean_offsets = None  # (log f0 + noise) / N, computed when needed
            at = 0
        self._lean_at = at + 1
        return at

    def _lean_random(self, n_cat: int) -> np.ndarray:
        """Next Gumbel noise of the lean path (drawn from ``rng`` in bulk, with the seeds)."""
        at = self._lean_next(n_cat)  # first: it may draw the buffer
        return self._lean_noise[at]

    def _lean_seed(self) -> np.ndarray:
        """Next SplitMix64 seed of a lean race (drawn from ``rng`` in bulk)."""
        at = self._lean_seed_at
        if at >= LEAN_BUFFER:
            self._lean_seeds = self.rng.bit_generator.random_raw(LEAN_BUFFER)
            at = 0
        self._lean_seed_at = at + 1
        return self._lean_seeds[at : at + 1]

    def _step(self, point, audit):
        """Redraw every element of the block, the general way (audits, control variates)."""
        if self.control_variates and getattr(self, "_renew_on_next_draw", False):
            self._renew_reference(point)
            self._renew_on_next_draw = False
        terms = self.terms
        n_obs = terms.n_obs
        exact_mode = self.audit_exact  # as at the draw's start
        n_evals = n_rounds = rows = n_decisions = n_raced = 0
        exhausted = False
        agree = True
        for j, var in enumerate(self.vars):
            n_cat = self.n_categories[j]
            values = self._values[j]
            current = [np.asarray(point[v.name]) for v in self.vars]
            flat = current[j].ravel().copy()
            for k in range(flat.size):
                if self._lone:  # a lone scalar: the values
                    cands = [values]
                    log_f0 = self._lone_log_f0(point)
                else:
                    cands = [np.repeat(c[None], n_cat, axis=0) for c in current]
                    cand_j = np.repeat(flat[None], n_cat, axis=0)
                    cand_j[:, k] = values
                    cands[j] = cand_j.reshape((n_cat, *current[j].shape))
                    log_f0 = terms.log_f0(cands, point)

                def rewards(arms, idx, cands=cands):
                    return terms.loglik_batch([c[arms] for c in cands], idx, point)

                def totals(arms, cands=cands):
                    return terms.loglik_sum([c[arms] for c in cands], point)

                raw_totals = totals

                # a lone scalar's noise comes from the lean path's buffer, which its exact
                # draws share
                noise = self._lean_random(n_cat) if self._lone else self.rng.gumbel(size=n_cat)
                offsets = log_f0
                exact = self.decides_exactly or self._backoff.take((j, k))
                if self.control_variates and not exact:
                    rewards, totals, offsets = self._residual_race(j, k, cands, point, log_f0)
                if exact and self._exact_independent:  # our terms were found wrong
                    value, res = self._joint_draw(cands, noise, point, n_obs)
                elif exact:  # Gumbel-max on the fused totals
                    value, res = self._exact_draw(log_f0, raw_totals, noise, n_obs)
                else:
                    n_raced += 1
                    if self._compiled:  # a lone scalar: the whole race in one compiled call
                        value, res = self._compiled_draw(values, log_f0, noise, point, totals)
                    else:
                        value, res = sample_categorical(
                            offsets,
                            rewards,
                            n_obs,
                            rng=self.rng,
                            noise=noise,
                            totals=totals,
                            config=self.race_config,
                            **self._race_kwargs(),
                        )
                    # did it pay, or did most candidates reach the exact pass?
                    self._backoff.record((j, k), res.n_evaluations, n_obs * n_cat)
                    if audit:
                        verdict = self._audit(value, cands, log_f0, noise, point)
                        agree &= verdict == AUDIT_AGREE
                flat[k] = values[value]  # the winner is an index into the values
                current[j] = flat.reshape(current[j].shape)
                point[var.name] = current[j]
                n_evals += res.n_evaluations
                n_rounds += res.n_rounds
                exhausted |= res.exhausted
                rows += min(res.n_drawn, n_obs)
                n_decisions += 1
        verdict = (AUDIT_AGREE if agree else AUDIT_DISAGREE) if audit and n_raced else AUDIT_NOT_RUN
        stats = _draw_stats(
            n_evals, rows, n_obs * n_decisions, n_rounds, exhausted, n_raced, verdict, exact_mode
        )
        return point, [stats]

    # -- compiled races -------------------------------------------------------------

    def _data_taken_up(self, point, resized: bool) -> None:
        """Drop the expansion's sums (renew the reference); plan compiled races for a new N."""
        self._lean_offsets = None  # (log f0 + noise) / N
        if self.control_variates:
            self._renew_reference(point)
        if resized:
            self._plan_compiled(point)

    def _plan_compiled(self, point=None) -> None:
        """Use compiled races (:class:`CompiledRace`) where they apply; compile them now.

        A compiled look costs a few microseconds where a Python one costs tens,
        so the "auto" first batch and exact switch, chosen by timing Python
        looks, are chosen again by timing compiled ones
        (:func:`~pymc_subsample.mcmc.cost.compiled_look_cost`), whatever the Python
        timing chose (even deciding at once), when the compiled race applies
        with the new plan. Timed and warmed up at ``point`` (default: the
        initial point).
        """
        self._compiled = False
        if not self._compiled_structure() or self._sparse_differences():
            return
        terms = self.terms
        n_cat, n_obs = self.n_categories[0], terms.n_obs
        point = self.initial_point if point is None else point
        others = tuple(terms.other_arrays(point))
        if any(self._auto_plan) and self._exact_seconds is not None:
            before = (self.batch_size, self.exact_switch, self.race_config)
            look = compiled_look_cost(
                terms.compiled_rows(), self._values[0], others, n_obs, np.random.default_rng(0)
            )
            self._choose_plan(look)
            if not self._compiled_applies():  # keep the Python-timed plan
                self.batch_size, self.exact_switch, self.race_config = before
        self._compiled = self._compiled_applies()
        if not self._compiled:
            return
        self._lean_others = bool(others)  # the lean path reads the other inputs at each draw
        # compile the driver before sampling (a second or two, once)
        self._compiled_race = CompiledRace(
            terms.compiled_rows(), self.race_config, n_cat, n_obs, len(others)
        )
        self._compiled_draw(
            self._values[0], np.zeros(n_cat), np.zeros(n_cat), point,
            self._lone_totals(point),
            rng=np.random.default_rng(0),
        )  # fmt: skip

    def _sparse_differences(self, rows: int = 512, arms: int = 4096) -> bool:
        """Return True when values' terms equal the best one's on most rows of a probe.

        At the initial point and two draws from the prior, on ``rows`` random
        rows (:func:`~pymc_subsample.racing.race.sparse_arms`). Races of such
        a variable (a change point, a value that touches few observations)
        keep those values to an exact pass, which the Python race does at
        every look; the compiled race does not, so it is not used.
        """
        terms, values = self.terms, self._values[0]
        rng = np.random.default_rng(0)
        for point in [self.initial_point, *prior_points(self.model, 2, seed=1)]:
            idx = np.sort(rng.choice(terms.n_obs, size=min(rows, terms.n_obs), replace=False))
            batch = np.concatenate(
                [
                    terms.loglik_subset([values[a : a + arms]], idx, point)
                    for a in range(0, len(values), arms)
                ]
            )
            finite = np.isfinite(batch).all(axis=1)
            if finite.sum() > 1:
                batch = batch[finite]
                if sparse_arms(batch, int(batch.mean(axis=1).argmax())).any():
                    return True
        return False

    def _compiled_structure(self) -> bool:
        """Return True for a lone scalar, no control variates, compiled rows, large N."""
        terms = self.terms
        return bool(
            terms.n_obs >= COMPILED_MIN_OBS
            and self.bound == "normal"
            and not self.control_variates
            and self._lone
            and terms.compiled_rows() is not None
        )

    def _compiled_applies(self) -> bool:
        """Return True when the step races compiled.

        :meth:`_compiled_structure` holds and the plan :func:`supports` a
        compiled race (and does not decide every draw exactly).
        """
        return bool(
            self._compiled_structure()
            and self.race_config is not None
            and not self.decides_exactly
            and supports(self.race_config, self.n_categories[0], self.terms.n_obs, totals=True)
        )

    def _compiled_draw(self, values, log_f0, noise, point, totals, rng=None):
        """Gumbel-max draw by a compiled race; the Python race when some log f0 is -inf."""
        n_obs = self.terms.n_obs
        rng = self.rng if rng is None else rng
        if not np.isfinite(log_f0).all():
            return sample_categorical(
                log_f0, lambda arms, idx: self.terms.loglik_batch([values[arms]], idx, point),
                n_obs, rng=rng, noise=noise, totals=totals, config=self.race_config,
            )  # fmt: skip
        terms = self.terms
        res = self._compiled_race(
            values, terms.permuted_rows(), tuple(terms.other_arrays(point)), rng,
            (log_f0 + noise) / n_obs, totals,
        )  # fmt: skip
        return res.winner, res

    def data_changed(self) -> None:
        """Take up new data values; refuse new values that change a variable's support.

        Bounds in ``pm.Data`` (e.g. ``pm.DiscreteUniform("s", 0, T)``) are read
        when the step is built, and its races are planned for that many
        candidates: build a new step when they change.
        """
        for var, values in zip(self.vars, self._values, strict=True):
            now = discrete_support(self.model, var, self.initial_point)
            if not np.array_equal(now, values):
                raise ValueError(
                    f"the new data change the support of {var.name!r} from "
                    f"{values[0]}..{values[-1]} to {now[0]}..{now[-1]}: "
                    "SubsampledCategoricalGibbs enumerates the support read when it was built; "
                    "build a new step for the new data"
                )
        super().data_changed()

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state, the lean path's buffers included."""
        super().setup_chain(rng, tune, draws)
        self._lean_at = self._lean_seed_at = LEAN_BUFFER

    def _residual_race(self, j, k, cands, point, log_f0):
        """Callbacks and offsets of a race on the expansion's residuals (raw if unusable)."""
        terms = self.terms
        shift = self._expansion_shift(cands, point)  # the sums keyed on every input they read
        raw_rewards = lambda arms, idx: terms.loglik_batch([c[arms] for c in cands], idx, point)  # noqa: E731
        raw_totals = lambda arms: terms.loglik_sum([c[arms] for c in cands], point)  # noqa: E731
        if not np.isfinite(shift[np.isfinite(log_f0)]).all():  # the reference is infeasible
            return raw_rewards, raw_totals, log_f0
        ref, expansion = self._reference, self.expansion

        def rewards(arms, idx):
            return expansion.residual_batch([c[arms] for c in cands], idx, point, ref)

        def totals(arms):
            return raw_totals(arms) - shift[arms]

        return rewards, totals, np.where(np.isfinite(log_f0), log_f0 + shift, -np.inf)

    def _race_kwargs(self) -> dict:
        """Keywords of :func:`sample_categorical` for lil'UCB (no :class:`RaceConfig`)."""
        if self.race_config is not None:
            return {}
        return {
            "delta": self.delta,
            "bound": self.bound,
            "batch_size": self.batch_size,
            "reward_range": self.reward_range,
        }

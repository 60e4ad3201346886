r"""SubsampledCategoricalGibbs: Gibbs updates of discrete variables by racing.

The full conditional of a discrete variable :math:`X` with :math:`D` values
(:func:`~pymc_subsample.model.support.discrete_support`), indexed :math:`i = 0..D-1`, is
:math:`p(X=i \mid \cdot) \propto f_0(i) \prod_{n=1}^N f_n(i)`; each draw is
:func:`~pymc_subsample.racing.sample_categorical` on it (Chen & Ghahramani
2016, Sec. 2–3),
so its law is within total variation :math:`\delta` of the exact conditional.
"""

from __future__ import annotations

import time

import numpy as np

from ..mcmc.audit import impossible_choice, scores_differ, zero_difference_share
from ..model.blocks import check_expand_in
from ..model.expansion import Expansion
from ..model.support import discrete_support
from ..options import AuditOptions, RaceOptions, options_or_default, reject_moved_keywords
from ..racing import sample_categorical
from ..racing.common import argmax_or_raise
from ..racing.compiled import CompiledRace
from ..racing.packed import DECIDED, EXACT_PASS
from ..validation import ArgumentTypeError
from .base import (
    AUDIT_AGREE,
    AUDIT_DISAGREE,
    AUDIT_NOT_RUN,
    CERTAIN_ERROR_PROB,
    RacingStep,
)
from .gibbs_plan import COMPILED_MIN_OBS, CompiledRacePlanner

__all__ = ["COMPILED_MIN_OBS", "DRAW_BUFFER", "SubsampledCategoricalGibbs"]

#: Draws of Gumbel noise and compiled-race seeds a lone scalar takes from ``rng`` at a
#: time (one call instead of two per draw).
DRAW_BUFFER = 64


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


class SubsampledCategoricalGibbs(CompiledRacePlanner, RacingStep):
    r"""Gibbs step for bounded discrete variables that races on mini-batches.

    Each element of each variable in ``vars`` is redrawn in turn from its full
    conditional :math:`p(X=i \mid \cdot) \propto f_0(i)\prod_n f_n(i)`, with
    :math:`\log f_n` the per-observation log-likelihood terms and
    :math:`\log f_0` the rest of the Markov blanket
    (:class:`~pymc_subsample.model.terms.ObservationTerms`). The draw is Gumbel-max,
    :math:`\arg\max_i \log f_0(i) + \sum_n \log f_n(i) + \varepsilon_i`, with a race
    on growing shared mini-batches (:func:`~pymc_subsample.racing.sample_categorical`):
    its law is within total variation ``delta`` of the exact conditional (Chen &
    Ghahramani 2016, Prop. 1 and 3, under the bound's assumptions). Control variates,
    compiled races and the sampler stats: :ref:`gibbs-step`.

    Parameters
    ----------
    vars : list
        Discrete variables with a support known when the step is built (scalar or
        vector; a vector is updated element by element, each with its own race):
        Bernoulli, Categorical (OrderedLogistic and OrderedProbit are Categoricals),
        DiscreteUniform, Binomial, BetaBinomial, HyperGeometric, and Truncated with
        an upper bound, with bounds that do not depend on other free variables and at
        most :data:`~pymc_subsample.model.support.MAX_CATEGORIES` values
        (:func:`~pymc_subsample.model.support.discrete_support`). Others are refused,
        naming the variable and the fix.
    delta : float
        Error allowed per draw, in (0, 1).
    data : list of pm.Data, optional
        The per-observation data inputs; guessed when omitted.
    race : RaceOptions, optional
        How each race runs (:class:`~pymc_subsample.options.RaceOptions`); the
        default times the model to choose the first batch and the exact switch;
        ``RaceOptions(bound="exact")`` draws exactly over all :math:`N` observations.
        The back-off is kept per element of the block.
    audit : AuditOptions, optional
        How often a draw is checked against the exact Gibbs draw for the same
        Gumbel noise, and what a failed audit does
        (:class:`~pymc_subsample.options.AuditOptions`).
    control_variates : bool or dict
        Race on the residuals of a second-order expansion of the terms in the other
        continuous variables :math:`\psi` they depend on (Chen & Ghahramani 2016,
        Sec. 4), around the current point (``True``, renewed with the row
        permutation and at the end of tuning) or a fixed reference point (a dict).
        ``False`` (default): races on the raw terms.
    expand_in : sequence of str, optional
        Deterministics :math:`\phi(\psi)` of the model in which to expand instead of
        the value variables (:class:`~pymc_subsample.model.expansion.Expansion`).
        Requires ``control_variates``.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.
    **moved
        Keywords that moved into the options objects (``bound``, ``batch_size``,
        ``audit_every``, ...): each raises a ``TypeError`` that names its new place
        (:func:`~pymc_subsample.options.reject_moved_keywords`).
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
        #: One scalar variable: its candidates are its values, its noise drawn in bulk.
        self._lone = len(self.vars) == 1 and np.size(self.initial_point[self.vars[0].name]) == 1
        self._lone_points = [np.array(v) for v in self._values[0]]  # its values, as a point has
        self._lone_cands = [self._values[0]]
        self._noise_at = self._seed_at = DRAW_BUFFER  # bulk draws of noise and seeds: none left
        self._offset_buffer = None  # (log f0 + noise) / N of the noise buffer's rows
        self._constant_f0 = None  # log f0 of a lone scalar with no other inputs, once computed
        self._constant_f0_has_inf = False
        self._set_control_variates(control_variates, expand_in)
        self._python_race_seconds = 0.0  # spent in Python races (they pay for the driver)
        self._driver_due = False  # a compiled race applies, its driver not compiled yet
        self._plan_races(max(self.n_categories))
        self._plan_compiled()
        self._check_support_numerically()

    # -- read-only views ---------------------------------------------------------------

    @property
    def candidate_values(self) -> list[np.ndarray]:
        """Each variable's candidate values (its support): a race's winner indexes them."""
        return self._values

    @property
    def compiled(self) -> bool:
        """True when the races run in one compiled call per draw (:ref:`gibbs-step`)."""
        return self._compiled

    @property
    def compiled_race(self) -> CompiledRace | None:
        """The compiled race driver when :attr:`compiled`, else None."""
        return self._compiled_race if self._compiled else None

    @property
    def reference(self) -> dict | None:
        r"""The control variates' reference point :math:`\hat\psi` (None without them)."""
        return self._reference

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

    def _expansion_shift(self, cands, point) -> tuple[np.ndarray, bool]:
        r"""Return :math:`S_i + G_i^\top\Delta + \Delta^\top H_i \Delta / 2` for every candidate.

        Also whether :math:`\Delta = 0` (the inputs at the reference: the shift is
        then :math:`S_i`, the exact sums).
        """
        ref = self._reference
        values, grads, hess = self.expansion.cached_sums(ref, point, cands)
        step = self.expansion.delta(point, ref)
        shift = values + grads @ step
        if hess is not None:
            shift += 0.5 * np.einsum("kij,i,j->k", hess, step, step)
        return shift, not np.any(step)

    def _check_support_numerically(self) -> None:
        r"""Make one exact pass at the initial point's candidates, for a -inf the graph hid.

        A candidate whose terms sum to :math:`-\infty` while its :math:`\log f_0` is finite,
        the check of :class:`~pymc_subsample.model.row_support.RowSupport` having found it
        possible, and whose terms on a batch of rows are not all :math:`-\infty`, is
        impossible on a few rows only, by a rule the graph did not show (a ``log`` of zero,
        a ``pm.Potential``): every decision is then exact.
        """
        if self._exact_for_now:  # no race to come (the kernels' warm-up aside)
            return
        point = self.initial_point
        if self._lone:  # not through the cache of a constant log f0, filled at the first draw
            cands = self._lone_cands
            log_f0 = self.terms.log_f0(cands, point)
        else:
            flat = np.asarray(point[self.vars[0].name]).ravel()
            cands, log_f0 = self._candidates(0, 0, flat, point)
        sums = self.terms.loglik_sum(cands, point)
        missed = (
            np.isneginf(sums) & np.isfinite(log_f0) & ~self.row_support.infeasible(cands, point)
        )
        if not missed.any():
            return
        some = [c[missed] for c in cands]
        if np.isfinite(self._audit_batch(some, point)).any():
            self._decide_exactly_for_support(
                "found numerically: a candidate's terms sum to -inf over all rows while a "
                "batch of rows is finite"
            )

    # -- one draw ---------------------------------------------------------------------

    def _draw(self, point, audit):
        r"""Redraw every element of the block in turn; return the new point and the stats.

        One path for every draw: each element's candidates and :math:`\log f_0`
        (:meth:`_candidates`), then :meth:`_draw_element`, exact or raced.
        """
        if self.control_variates and getattr(self, "_renew_on_next_draw", False):
            self._renew_reference(point)
            self._renew_on_next_draw = False
        point = dict(point)
        n_obs = self.terms.n_obs
        exact_mode = self.audit_exact  # as at the draw's start
        n_evals = n_rounds = rows = n_decisions = n_raced = 0
        exhausted, agree = False, True
        for j, var in enumerate(self.vars):
            # a lone scalar has one element, whose candidates are the values themselves
            flat = None if self._lone else np.asarray(point[var.name]).ravel().copy()
            for k in range(1 if flat is None else flat.size):
                cands, log_f0 = self._candidates(j, k, flat, point)
                value, evals, rounds, ended, raced, verdict, read = self._draw_element(
                    (j, k), cands, log_f0, point, audit
                )
                if flat is None:
                    point[var.name] = self._lone_points[value].copy()
                else:  # the winner is an index into the values
                    flat[k] = self._values[j][value]
                    point[var.name] = flat.reshape(np.shape(point[var.name]))
                n_evals += evals
                n_rounds += rounds
                exhausted |= ended
                n_raced += raced
                agree &= verdict != AUDIT_DISAGREE
                rows += read
                n_decisions += 1
        verdict = (AUDIT_AGREE if agree else AUDIT_DISAGREE) if audit and n_raced else AUDIT_NOT_RUN
        stats = _draw_stats(
            n_evals, rows, n_obs * n_decisions, n_rounds, exhausted, n_raced, verdict, exact_mode
        )
        return point, [stats]

    def _candidates(self, j: int, k: int, flat, point) -> tuple[list, np.ndarray]:
        r"""Return the candidates and :math:`\log f_0` of element ``k`` of variable ``j``.

        Each candidate is the current value of every variable of the block,
        with element ``k`` of variable ``j`` set to one of its values; a lone
        scalar's candidates are its values (:math:`\log f_0` cached when
        constant, :meth:`_lone_log_f0`).
        """
        if flat is None:
            return self._lone_cands, self._lone_log_f0(point)
        n_cat = self.n_categories[j]
        current = [np.asarray(point[v.name]) for v in self.vars]
        cands = [np.repeat(c[None], n_cat, axis=0) for c in current]
        cand_j = np.repeat(flat[None], n_cat, axis=0)
        cand_j[:, k] = self._values[j]
        cands[j] = cand_j.reshape((n_cat, *current[j].shape))
        return cands, self.terms.log_f0(cands, point)

    def _draw_element(self, key, cands, log_f0, point, audit) -> tuple:
        """Draw one element by Gumbel-max: exactly, or by a race (then back-off and audit).

        Returns ``(value, n_evals, n_rounds, exhausted, n_raced, audit_agree, rows)``,
        ``rows`` the observations the decision read (:math:`N` for an exact one).
        Exact when every decision is (:attr:`decides_exactly`) or the
        back-off says so (:class:`~pymc_subsample.mcmc.backoff.Backoff`). Where the
        block moves the terms' support, only candidates finite on every row
        race (:class:`~pymc_subsample.model.row_support.RowSupport`).
        """
        noise = self._noise(len(log_f0))
        if self.decides_exactly or self._backoff.take(key):
            start = time.perf_counter()
            value, n_evals = self._exact_draw(cands, log_f0, noise, point)
            if self._driver_due:  # a compiled race's plan may race what this one decides
                self._count_python_race(time.perf_counter() - start, point)
            return value, n_evals, 1, True, 0, AUDIT_NOT_RUN, self.terms.n_obs
        if self.row_support.mode == "bounds":  # only candidates finite on every row race
            impossible = self.row_support.infeasible(cands, point)
            if impossible.any():
                log_f0 = np.where(impossible, -np.inf, log_f0)
        value, n_evals, n_rounds, exhausted, sums, rows = self._race(
            key, cands, log_f0, noise, point
        )
        # did it pay, or did most candidates reach the exact pass?
        self._backoff.record(key, n_evals, self.terms.n_obs * len(log_f0))
        verdict = AUDIT_NOT_RUN
        if audit:  # the exact decision for the same noise, from the model's joint density
            totals = None if sums is None else sums.__getitem__
            verdict = self._audit(value, cands, log_f0, noise, point, totals)
        return value, n_evals, n_rounds, exhausted, 1, verdict, rows

    def _exact_draw(self, cands, log_f0, noise, point) -> tuple[int, int]:
        r"""Exact Gumbel-max draw: ``(value, n_evals)``, the one exact draw of the step.

        :math:`\arg\max_i \log f_0(i) + \sum_n \log f_n(i) + \varepsilon_i` over
        the candidates of finite :math:`\log f_0`, the sums in one fused pass;
        from the model's joint log density instead (:meth:`_joint_scores`)
        when audits found the terms wrong.
        """
        n_obs = self.terms.n_obs
        if self._exact_independent:  # our terms were found wrong
            score = self._joint_scores(cands, point) + noise
            return argmax_or_raise(score), n_obs * len(score)
        if self._all_finite(log_f0):  # the usual case: every candidate, no checks
            score = log_f0 + self.terms.loglik_sum(cands, point) + noise
            if np.isfinite(score).all():
                return int(score.argmax()), n_obs * len(score)
        feasible = np.flatnonzero(np.isfinite(log_f0))
        score = np.full(len(log_f0), -np.inf)
        sums = self.terms.loglik_sum([c[feasible] for c in cands], point)
        score[feasible] = log_f0[feasible] + sums + noise[feasible]
        if np.isnan(score).any() or np.isposinf(score).any():
            raise ValueError("the log-likelihood terms summed to NaN or +inf for some candidate")
        if not np.isfinite(score).any():
            raise ValueError(
                "every candidate has a -inf log density: the conditional is zero everywhere "
                "(check the model and the initial point)"
            )
        return int(np.argmax(score)), n_obs * len(feasible)

    def _race(self, key, cands, log_f0, noise, point) -> tuple:
        r"""Race one element's draw: ``(value, n_evals, n_rounds, exhausted, sums, rows)``.

        The one place a driver is chosen: the compiled race
        (:meth:`_race_compiled`) where the step planned one and every
        :math:`\log f_0` is finite, else the Python race
        (:func:`~pymc_subsample.racing.sample_categorical`), on the expansion's
        residuals with control variates. ``sums``: every candidate's sums of
        terms when the race computed them all (None otherwise), for an audit;
        ``rows``: the observations the race read (:math:`N` with its exact pass).
        """
        n_obs = self.terms.n_obs
        if self._compiled and self._all_finite(log_f0):
            if log_f0 is self._constant_f0:  # (log f0 + noise) / N for the whole noise buffer
                if self._offset_buffer is None:
                    self._offset_buffer = (log_f0 + self._noise_buffer) / n_obs
                offsets = self._offset_buffer[self._noise_at - 1]
            else:
                offsets = (log_f0 + noise) / n_obs
            return self._race_compiled(offsets, point)
        terms = self.terms
        if self.control_variates:
            rewards, totals, log_f0, at_reference = self._residual_race(key, cands, point, log_f0)
            if at_reference:  # the offsets are the exact sums: decided without reading a row
                return argmax_or_raise(log_f0 + noise), 0, 0, False, None, 0
        else:

            def rewards(arms, idx):
                return terms.loglik_batch([c[arms] for c in cands], idx, point)

            def totals(arms):
                return terms.loglik_sum([c[arms] for c in cands], point)

        start = time.perf_counter()
        _, res = sample_categorical(
            log_f0, rewards, n_obs, rng=self.rng, noise=noise, totals=totals,
            config=self.race_config, **self._race_kwargs(),
        )  # fmt: skip
        self._count_python_race(time.perf_counter() - start, point)
        return (
            res.winner, res.n_evaluations, res.n_rounds, res.exhausted, None,
            min(res.n_drawn, n_obs),
        )  # fmt: skip

    def _race_compiled(self, offsets, point, seed=None) -> tuple:
        """Race a lone scalar in one compiled call: as :meth:`_race` returns.

        The looks run in the compiled driver
        (:class:`~pymc_subsample.racing.compiled.CompiledRace`), seeded from
        ``rng`` in bulk (:meth:`_race_seed`) unless ``seed`` is given; an exact
        pass is decided here on the survivors' fused sums, and anything else
        (a rescue, a −inf sum) by :meth:`CompiledRace.finish
        <pymc_subsample.racing.compiled.CompiledRace.finish>`.
        """
        terms, race, values = self.terms, self._compiled_race, self._values[0]
        others = tuple(terms.other_arrays(point)) if self._reads_others else ()
        seed = self._race_seed() if seed is None else seed
        status = race.launch(values, terms.permuted_rows(), others, seed, offsets)
        n_obs = terms.n_obs
        if status == DECIDED:
            return (*race.outcome(), False, None, race.rows_drawn())
        if status != EXACT_PASS:  # no survivor left: the rescue
            res = race.finish(status, offsets, lambda arms: terms.loglik_sum([values[arms]], point))
            return res.winner, res.n_evaluations, res.n_rounds, res.exhausted, None, n_obs
        alive = race.survivors()
        sums = terms.loglik_sum([values[alive]], point)
        outcome = race.exact_outcome(offsets, sums)
        if outcome is not None:
            return (*outcome, True, sums if len(alive) == len(values) else None, n_obs)

        def totals(arms):  # a -inf or bad sum: the survivors' sums, and the others' if rescued
            if np.array_equal(arms, alive):
                return sums
            return terms.loglik_sum([values[arms]], point)

        res = race.finish(status, offsets, totals)
        return res.winner, res.n_evaluations, res.n_rounds, res.exhausted, None, n_obs

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
        structural, share, certain = False, None, False
        if not agree:
            certain = impossible_choice(joint, value, CERTAIN_ERROR_PROB)
            feasible = np.flatnonzero(np.isfinite(log_f0))
            sums = totals or (lambda arms: self.terms.loglik_sum([c[arms] for c in cands], point))
            ours = np.full(len(log_f0), -np.inf)
            ours[feasible] = log_f0[feasible] + sums(feasible)
            structural = scores_differ(ours, joint, self._score_rtol)
            share = zero_difference_share(self._audit_batch(cands, point))
        impossible = bool(np.isneginf(joint[value]))
        self._record_audit(
            agree, structural=structural, zero_share=share, certain=certain, impossible=impossible
        )
        return AUDIT_AGREE if agree else AUDIT_DISAGREE

    def _lone_log_f0(self, point) -> np.ndarray:
        r""":math:`\log f_0` of a lone scalar's values; computed once when it does not vary."""
        if self._constant_f0 is not None:
            return self._constant_f0
        log_f0 = self.terms.log_f0(self._lone_cands, point)
        if self.terms.log_f0_is_constant:  # the same at every draw
            self._constant_f0 = log_f0
            self._constant_f0_has_inf = not np.isfinite(log_f0).all()
        return log_f0

    def _all_finite(self, log_f0) -> bool:
        r"""Return True when every :math:`\log f_0` is finite (known for a constant one)."""
        if log_f0 is self._constant_f0:
            return not self._constant_f0_has_inf
        return bool(np.isfinite(log_f0).all())

    def _noise(self, n_cat: int) -> np.ndarray:
        """Next Gumbel noise of an element; a lone scalar's comes from a buffer drawn in bulk."""
        if not self._lone:
            return self.rng.gumbel(size=n_cat)
        at = self._noise_at
        if at >= DRAW_BUFFER:
            self._noise_buffer = self.rng.gumbel(size=(DRAW_BUFFER, n_cat))
            self._offset_buffer = None  # (log f0 + noise) / N, computed when needed
            at = 0
        self._noise_at = at + 1
        return self._noise_buffer[at]

    def _race_seed(self) -> np.ndarray:
        """Next SplitMix64 seed of a compiled race (drawn from ``rng`` in bulk)."""
        at = self._seed_at
        if at >= DRAW_BUFFER:
            self._seed_buffer = self.rng.bit_generator.random_raw(DRAW_BUFFER)
            at = 0
        self._seed_at = at + 1
        return self._seed_buffer[at : at + 1]

    # -- compiled races -------------------------------------------------------------

    def _functions_promoted(self, point) -> None:
        """Plan the races again, and race compiled where the rows function now allows it."""
        super()._functions_promoted(point)
        self._plan_compiled(point)

    def finish_compiling(self) -> None:
        """Compile the hot functions with Numba now, and the race driver if it races compiled.

        See :meth:`RacingStep.finish_compiling
        <pymc_subsample.steps.base.RacingStep.finish_compiling>`.
        """
        super().finish_compiling()
        if self._driver_due:
            self._plan_compiled(self.initial_point, now=True)

    def _data_taken_up(self, point, resized: bool) -> None:
        """Drop the expansion's sums (renew the reference); plan compiled races for a new N."""
        self._offset_buffer = None  # (log f0 + noise) / N
        if self.control_variates:
            self._renew_reference(point)
        if resized:
            self._plan_compiled(point)

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
        self._noise_at = self._seed_at = DRAW_BUFFER

    def _residual_race(self, key, cands, point, log_f0):
        r"""Callbacks and offsets of a race on the expansion's residuals (raw if unusable).

        Returns ``(rewards, totals, offsets, exact)``. ``exact`` is True when the
        expansion's inputs are at its reference (:math:`\Delta = 0`): every residual is
        then zero and the offsets hold each candidate's exact sums, so the decision
        needs no race (a race would see rewards equal on every row, which it cannot
        tell from differences on rare rows, and end in an exact pass).
        """
        terms = self.terms
        # the sums keyed on every input they read
        shift, at_reference = self._expansion_shift(cands, point)
        raw_rewards = lambda arms, idx: terms.loglik_batch([c[arms] for c in cands], idx, point)  # noqa: E731
        raw_totals = lambda arms: terms.loglik_sum([c[arms] for c in cands], point)  # noqa: E731
        if not np.isfinite(shift[np.isfinite(log_f0)]).all():  # the reference is infeasible
            return raw_rewards, raw_totals, log_f0, False
        ref, expansion = self._reference, self.expansion

        def rewards(arms, idx):
            return expansion.residual_batch([c[arms] for c in cands], idx, point, ref)

        def totals(arms):
            return raw_totals(arms) - shift[arms]

        offsets = np.where(np.isfinite(log_f0), log_f0 + shift, -np.inf)
        return rewards, totals, offsets, at_reference

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

r"""SubsampledCategoricalGibbs: Gibbs updates of discrete variables by racing.

The full conditional of a discrete variable :math:`X \in \{0..D-1\}` is
:math:`p(X=i \mid \cdot) \propto f_0(i) \prod_{n=1}^N f_n(i)`; each draw is
:func:`~pymc_subsample.racing.sample_categorical` on it (Chen & Ghahramani
2016, Sec. 2–3),
so its law is within total variation :math:`\delta` of the exact conditional.
"""

from __future__ import annotations

import numpy as np
from pytensor.tensor.random.basic import BernoulliRV, CategoricalRV

from .racing import RaceResult, sample_categorical
from .step_base import AUDIT_AGREE, AUDIT_DISAGREE, AUDIT_NOT_RUN, RacingStep

__all__ = ["SubsampledCategoricalGibbs"]


def _n_categories(model, value_var, initial_point) -> int:
    rv = model.values_to_rvs[value_var]
    op = getattr(rv.owner, "op", None)
    if isinstance(op, BernoulliRV):
        return 2
    if isinstance(op, CategoricalRV):
        (k_graph,) = model.replace_rvs_by_values((rv.owner.inputs[-1].shape[-1],))
        fn = model.compile_fn(k_graph, inputs=model.value_vars, on_unused_input="ignore")
        return int(fn(initial_point))
    kind = type(op).__name__ if op is not None else "unknown"
    if value_var.dtype.startswith(("int", "uint", "bool")):
        raise ValueError(
            f"SubsampledCategoricalGibbs updates Categorical or Bernoulli variables; "
            f"{rv.name!r} is discrete but of kind {kind} (unbounded or not enumerated). "
            "Use pm.Metropolis for it, or rewrite it as a Categorical over its support"
        )
    raise ValueError(
        f"SubsampledCategoricalGibbs updates Categorical or Bernoulli variables; {rv.name!r} is "
        f"continuous ({kind}, dtype {value_var.dtype}): use RacingMetropolis or NUTS for it"
    )


class SubsampledCategoricalGibbs(RacingStep):
    r"""Gibbs step for Categorical and Bernoulli variables that races on mini-batches.

    Each element of each variable in ``vars`` is redrawn in turn from its full
    conditional :math:`p(X=i \mid \cdot) \propto f_0(i)\prod_n f_n(i)`, with
    :math:`\log f_n` the per-observation log-likelihood terms and
    :math:`\log f_0` the rest of the Markov blanket
    (:class:`~pymc_subsample.graph.ObservationTerms`). The draw is Gumbel-max
    with a race on growing shared mini-batches
    (:func:`~pymc_subsample.racing.sample_categorical`): its law is within total
    variation ``delta`` of the exact conditional (Chen & Ghahramani 2016, Prop. 1 and 3, under
    the bound's assumptions); ``bound="exact"`` is an exact Gibbs draw over all
    :math:`N` observations.

    Parameters
    ----------
    vars : list
        Categorical or Bernoulli variables (scalar or vector; a vector is
        updated element by element, each with its own race).
    delta : float
        Error allowed per draw, in (0, 1).
    bound : {"normal", "ebs", "lilucb", "exact"}
        Racing bound (see :func:`~pymc_subsample.racing.race`).
    batch_size : int or "auto"
        First mini-batch size :math:`m^{(1)}` of the doubling schedule (the
        paper's 50 for Racing-Normal, 2 for Racing-EBS). ``"auto"`` (default)
        times the model once at construction and starts where a batch's terms
        cost about as much as the look's fixed cost (one compiled call and the
        race's bookkeeping): on cheap terms and large :math:`N` that is
        thousands of observations, since smaller batches only add looks.
        The value used is kept in ``batch_size``.
    variance : {"pairwise", "marginal"}
        Variance estimate of the race.
    data : list of pm.Data, optional
        The per-observation data inputs; guessed when omitted
        (:class:`~pymc_subsample.graph.ObservationTerms`).
    audit_every : int or "auto"
        Every ``audit_every``-th draw also computes the exact decision for the
        same Gumbel noise and records ``audit_agree``; 0 turns audits off.
        ``"auto"`` (default) audits within a budget of 5% of the sampling time
        (:class:`~pymc_subsample.step_base.RacingStep`); the step warns when
        the audited error rate is significantly above ``delta``.
    reward_range : float, optional
        A bound on the range of :math:`\log f_n(i)` over observations, used by
        ``"ebs"`` and ``"lilucb"`` and as Racing-Normal's rare-event floor.
    exact_fraction : float or "auto"
        When a race stops subsampling: once it has drawn this fraction of the
        :math:`N` observations, its next look evaluates the surviving
        candidates on all observations in one fused pass (exact), so that a
        hard (diffuse) draw costs little more than an exact Gibbs draw.
        ``"auto"`` (default) times the model's batch and fused evaluations
        at construction and picks the largest look whose predicted race cost
        stays within 20% of an exact decision
        (:func:`~pymc_subsample.cost.choose_exact_after`), or decides every
        draw exactly when even a first look would not pay (small :math:`N`).
        Timings vary, so two separately built ``"auto"`` steps may choose
        differently and their draws then differ for the same
        ``random_seed`` (a step object always reproduces its own runs); pass
        a number for bit-for-bit reproducibility across builds. ``1`` races on
        the whole doubling schedule, as in the paper. The choice is kept in
        :attr:`exact_switch`.
    batches : {"windows", "random"}
        ``"windows"`` (default): races read contiguous windows of a
        row-permuted copy of the per-observation data (one more copy in
        memory; as cheap per term as a fused pass). ``"random"``: gathers of
        random rows, no copy (for data that do not fit twice in memory).
    shuffle_every : int
        Draws between redraws of the row permutation (each redraw is one pass
        over the data). Every race stays uniformly random without replacement
        whatever the value; races that share a permutation are dependent,
        which the audits in the documentation measure.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.

    Notes
    -----
    Sampler stats, one value per draw: ``n_evals`` (per-observation terms
    evaluated, summed over the elements updated), ``frac_evals``
    (``n_evals / (N * D * n_elements)``), ``n_rounds`` (race looks),
    ``exhausted`` (some race needed all :math:`N`), and ``audit_agree``
    (1: the audited draw agreed with the exact decision for every element,
    0: it did not, -1: not audited).
    """

    name = "subsampled_categorical_gibbs"
    stats_dtypes_shapes = {
        "n_evals": (np.int64, []),
        "frac_evals": (np.float64, []),
        "n_rounds": (np.int64, []),
        "exhausted": (bool, []),
        "audit_agree": (np.int8, []),
    }

    def __init__(
        self,
        vars,
        *,
        delta: float = 0.05,
        bound: str = "normal",
        batch_size: int | str = "auto",
        variance: str = "pairwise",
        data=None,
        audit_every: int | str = "auto",
        reward_range: float | None = None,
        exact_fraction: float | str = "auto",
        batches: str = "windows",
        shuffle_every: int = 1000,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
    ):
        super().__init__(
            vars,
            delta=delta,
            bound=bound,
            batch_size=batch_size,
            variance=variance,
            audit_every=audit_every,
            reward_range=reward_range,
            data=data,
            batches=batches,
            shuffle_every=shuffle_every,
            model=model,
            rng=rng,
            initial_point=initial_point,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
        )
        self.n_categories = [_n_categories(self.model, v, self.initial_point) for v in self.vars]
        self._plan_races(exact_fraction, max(self.n_categories))

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

    def step(self, point):
        """Redraw every element of the block; return the new point and the stats."""
        point = dict(point)
        audit = self._begin_draw()
        terms = self.terms
        n_obs = terms.n_obs
        n_evals = n_rounds = budget = 0
        exhausted = False
        agree = True
        for j, var in enumerate(self.vars):
            n_cat = self.n_categories[j]
            values = np.arange(n_cat, dtype=var.dtype)
            current = [np.asarray(point[v.name]) for v in self.vars]
            flat = current[j].ravel().copy()
            for k in range(flat.size):
                if len(self.vars) == 1 and flat.size == 1:  # a lone scalar: the values
                    cands = [values]
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

                noise = self.rng.gumbel(size=n_cat)
                if self.decides_exactly:  # Gumbel-max on the fused totals
                    value, res = self._exact_draw(log_f0, totals, noise, n_obs)
                else:
                    value, res = sample_categorical(
                        log_f0,
                        rewards,
                        n_obs,
                        rng=self.rng,
                        noise=noise,
                        totals=totals,
                        config=self.race_config,
                        **self._race_kwargs(),
                    )
                    if audit:
                        with self._audit_clock():
                            exact, _ = self._exact_draw(log_f0, totals, noise, n_obs)
                        self._record_audit(exact == value)
                        agree &= exact == value
                flat[k] = value
                current[j] = flat.reshape(current[j].shape)
                point[var.name] = current[j]
                n_evals += res.n_evaluations
                n_rounds += res.n_rounds
                exhausted |= res.exhausted
                budget += n_obs * n_cat
        stats = {
            "n_evals": n_evals,
            "frac_evals": n_evals / budget,
            "n_rounds": n_rounds,
            "exhausted": exhausted,
            "audit_agree": (AUDIT_AGREE if agree else AUDIT_DISAGREE) if audit else AUDIT_NOT_RUN,
        }
        return point, [stats]

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

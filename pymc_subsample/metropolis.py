r"""RacingMetropolis: Metropolis–Hastings whose accept test is a race on mini-batches.

MH from :math:`x` to :math:`x' \sim q(\cdot \mid x)` with :math:`u \sim U(0,1)` is a
two-arm race (Chen & Ghahramani 2016, Sec. 4; :func:`~pymc_subsample.racing.mh_test`):

.. math::
    l_{x',n} = \log f_n(x') + \frac{\log f_0(x') + \log q(x \mid x')}{N}, \qquad
    l_{x,n}  = \log f_n(x) + \frac{\log f_0(x) + \log q(x' \mid x) + \log u}{N},

accept iff :math:`\mu_{x'} > \mu_x`. Racing-Normal gives the test of Korattikara
et al. (2014), Racing-EBS that of Bardenet et al. (2014); ``bound="exact"`` is
plain MH on all :math:`N` observations.
"""

from __future__ import annotations

import warnings

import numpy as np
from pymc.step_methods.metropolis import tune as pymc_tune

from .control_variates import taylor_control_variate
from .graph import continuous_value_vars
from .proposals import langevin_proposal, random_walk_proposal
from .racing import IndexStream, mh_test, race_exact, residual_callbacks
from .step_base import AUDIT_AGREE, AUDIT_DISAGREE, AUDIT_NOT_RUN, RacingStep

__all__ = ["PROPOSALS", "RacingMetropolis"]

#: Names accepted by ``proposal``.
PROPOSALS = ("normal", "langevin")


class RacingMetropolis(RacingStep):
    r"""Metropolis–Hastings step for continuous variables with a racing accept test.

    Updates a block of continuous variables in PyMC's unconstrained value space.
    The per-observation terms at the current and the proposed point are
    evaluated in one compiled call on each mini-batch of the race (the current
    point's terms are recomputed on the same indices, never cached); the prior,
    Jacobian and other non-observation terms (:math:`\log f_0`) are exact. Each
    accept/reject decision agrees with exact MH for the same :math:`u` and
    proposal with probability at least :math:`1-\delta` under the bound's
    assumptions.

    Parameters
    ----------
    vars : list
        Continuous variables (or their value variables).
    delta : float
        Error allowed per accept/reject decision, in (0, 1).
    bound : {"normal", "ebs", "exact"}
        Racing bound (:func:`~pymc_subsample.racing.race`); ``"exact"`` is plain MH.
    batch_size : int
        First mini-batch size. Racing-Normal MH is biased when the test is
        loose: in a logistic regression with N = 2e4, δ = 0.05 and a first
        batch of 50 shifted posterior means by 0.1–0.26 posterior sd
        (``ALGORITHMS.md`` §3); δ = 0.01 or a batch of 500 removes most of it.
    proposal : {"normal", "langevin"}
        ``"normal"``: Gaussian random walk with scale ``scaling`` (tuned during
        tuning like ``pm.Metropolis``). ``"langevin"``: stochastic-gradient
        Langevin proposal :math:`x' = x + \frac{\epsilon^2}{2} g(x) + \epsilon z`,
        :math:`g` the exact gradient of :math:`\log f_0` plus :math:`N/m` times the
        gradient of the log-likelihood of a mini-batch of ``gradient_batch``
        observations, :math:`\epsilon` = ``scaling`` tuned during tuning towards
        ``target_accept``; the proposal density ratio enters the test.
    scaling : float
        Initial step scale.
    tune_interval : int
        Draws between scale updates during tuning.
    data : list of pm.Data, optional
        The per-observation data inputs (guessed when omitted).
    audit_every : int
        Every ``audit_every``-th draw also makes the exact decision for the same
        proposal and :math:`u` and records ``audit_agree``.
    reward_range : float, optional
        Bound on the range of the per-observation terms (see
        :class:`~pymc_subsample.SubsampledCategoricalGibbs`).
    exact_fraction : float or "auto"
        See :class:`~pymc_subsample.SubsampledCategoricalGibbs`. The default is
        larger than the Gibbs step's: an accept test against :math:`\log u` is
        often close, and MH is mostly used for expensive likelihoods, where a
        gathered subset costs about as much per term as a full pass.
    control_variates : bool
        Default True. Race on the residuals of a first-order Taylor expansion of each term
        around a reference point (:mod:`pymc_subsample.control_variates`,
        Chen & Ghahramani 2016, Sec. 4): the reference is the chain's current value, reset at
        the start and at every scale update during tuning, then fixed. Costs
        :math:`2d+1` passes over the data per reset and :math:`N(d+1)` stored
        floats; races then decide on far fewer observations near the posterior
        bulk. With ``reward_range``, the range must bound the residuals. If the
        terms are not finite around the reference point, the step warns and
        races on the raw terms. Turn it off when :math:`N(d+1)` floats do not
        fit in memory. Ignored with ``bound="exact"``.
    gradient_batch : int, optional
        Mini-batch size of the Langevin gradient (default ``max(batch_size, 100)``).
    elemwise : bool
        Random walk only: propose and race one dimension at a time (in random
        order, each with its own tuned scale), as ``pm.Metropolis`` does for
        vector variables. Default: one joint proposal for the whole block.
    target_accept : float, optional
        Acceptance rate the Langevin step size is tuned to (default 0.36, the
        paper's ARCH setting; gradient noise makes MALA's 0.574 too small a step).
    batches, shuffle_every
        See :class:`~pymc_subsample.SubsampledCategoricalGibbs`.
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.

    Notes
    -----
    Sampler stats per draw (as ``pm.Metropolis``, means over the dimensions
    when ``elemwise``): ``accept`` (acceptance probability estimated from the
    race's means; exact for exhausted races), ``accepted`` (fraction of
    proposals accepted), ``scaling``, ``n_evals`` (per-observation terms
    evaluated, both points, all decisions), ``frac_evals`` (``n_evals`` over
    :math:`2N` per decision), ``exhausted`` and ``audit_agree`` (1/0, −1 when
    not audited).
    """

    name = "racing_metropolis"
    stats_dtypes_shapes = {
        "accept": (np.float64, []),
        "accepted": (np.float64, []),
        "scaling": (np.float64, []),
        "n_evals": (np.int64, []),
        "frac_evals": (np.float64, []),
        "exhausted": (bool, []),
        "audit_agree": (np.int8, []),
        "tune": (bool, []),
    }

    def __init__(
        self,
        vars,
        *,
        delta: float = 0.05,
        bound: str = "normal",
        batch_size: int = 50,
        proposal: str = "normal",
        scaling: float = 1.0,
        tune_interval: int = 100,
        data=None,
        audit_every: int = 0,
        reward_range: float | None = None,
        exact_fraction: float | str = 0.25,
        control_variates: bool = True,
        gradient_batch: int | None = None,
        target_accept: float | None = None,
        elemwise: bool = False,
        batches: str = "windows",
        shuffle_every: int = 1000,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
    ):
        if bound == "lilucb":
            raise ValueError(
                "bound='lilucb' races many arms one at a time; an accept test has two arms "
                "that share their observations: use bound='normal' or 'ebs'"
            )
        if proposal not in PROPOSALS:
            raise ValueError(f"unknown proposal {proposal!r}; choose one of {PROPOSALS}")
        if not (np.isfinite(scaling) and scaling > 0):
            raise ValueError(f"scaling must be a positive number, got {scaling!r}")
        if int(tune_interval) != tune_interval or tune_interval < 1:
            raise ValueError(f"tune_interval must be a positive integer, got {tune_interval!r}")
        import pymc as pm

        continuous_value_vars(pm.modelcontext(model), vars, "RacingMetropolis")
        super().__init__(
            vars,
            delta=delta,
            bound=bound,
            batch_size=batch_size,
            variance="pairwise",
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
        initial_point = self.initial_point
        self.proposal = proposal
        self._shapes = [np.shape(initial_point[v.name]) for v in self.vars]
        self._sizes = [int(np.prod(s)) for s in self._shapes]
        n_obs = self.terms.n_obs
        self._plan_races(exact_fraction, 2)
        self.gradient_batch = min(int(gradient_batch or max(self.batch_size, 100)), n_obs)
        self.target_accept = 0.36 if target_accept is None else float(target_accept)
        if not 0.0 < self.target_accept < 1.0:
            raise ValueError(f"target_accept must lie in (0, 1), got {target_accept!r}")
        if elemwise and proposal != "normal":
            raise ValueError("elemwise=True needs proposal='normal' (Langevin moves all at once)")
        self.elemwise = bool(elemwise)
        # plain MH (bound="exact") sums every term: nothing for control variates to save
        self.control_variates = bool(control_variates) and bound != "exact"
        self.initial_scaling = float(scaling)
        self.tune_interval = int(tune_interval)
        self.tune = True
        self.reset_tuning()

    def _reset_tuning(self) -> None:
        self._cv_due = True  # a new control-variate reference at the next step
        self.steps_until_tune = self.tune_interval
        self.accepted_sum = np.zeros(sum(self._sizes) if self.elemwise else 1, dtype=int)

    def reset_tuning(self):
        """Restore the initial scale (PyMC calls this between runs)."""
        self._cv, self._cv_failed = None, False
        if self.elemwise:
            self.scaling = np.full(sum(self._sizes), self.initial_scaling)
        else:
            self.scaling = self.initial_scaling
        self._reset_tuning()

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, counters, scale) before a chain starts."""
        super().setup_chain(rng, tune, draws)
        self.reset_tuning()

    # -- flat <-> per-variable values --------------------------------------------

    def _flatten(self, parts) -> np.ndarray:
        return np.concatenate([np.ravel(p).astype(np.float64) for p in parts])

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        out, start = [], 0
        for v, shape, size in zip(self.vars, self._shapes, self._sizes, strict=True):
            out.append(flat[start : start + size].reshape(shape).astype(v.dtype))
            start += size
        return out

    def _candidates(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per-variable candidate arrays ``(K, *shape)`` from flat rows ``(K, d)``."""
        parts = [self._split(r) for r in rows]
        return [np.stack([p[j] for p in parts]) for j in range(len(self.vars))]

    def _update_control_variate(self, x: np.ndarray, point: dict) -> int:
        """Expand the terms around ``x``; return the terms evaluated."""
        step = 0.1 * np.broadcast_to(np.asarray(self.scaling, dtype=float), x.shape)
        self._cv_due = False
        try:
            self._cv = taylor_control_variate(
                lambda rows: self.terms.loglik_full(self._candidates(rows), point), x, step
            )
        except ValueError as err:
            self._cv, self._cv_failed = None, True
            warnings.warn(
                f"RacingMetropolis: control variates turned off ({err}); racing on the raw terms",
                UserWarning,
                stacklevel=3,
            )
        return (2 * len(x) + 1) * self.terms.n_obs

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

    def step(self, point):
        """One MH step with a racing accept test; return the new point and stats.

        With ``elemwise``, one random-walk decision per dimension, in random order.
        """
        audit = self._begin_draw()
        x = self._flatten([np.asarray(point[v.name]) for v in self.vars])
        totals = {"n_evals": 0, "exhausted": False, "agree": True}
        use_cv = self.control_variates and not self._cv_failed
        if use_cv and (self._cv is None or (self.tune and self._cv_due)):
            totals["n_evals"] += self._update_control_variate(x, point)
        if self.elemwise:
            accepted = np.zeros(len(x), dtype=bool)
            accept = np.zeros(len(x))
            for i in self.rng.permutation(len(x)):
                x_new = x.copy()
                x_new[i] += self.scaling[i] * self.rng.standard_normal()
                accepted[i], accept[i] = self._decide(x, x_new, 0.0, 0.0, point, audit, totals)
                if accepted[i]:
                    x = x_new
        else:
            if self.proposal == "normal":
                x_new, lq_fwd, lq_rev = random_walk_proposal(x, self.scaling, self.rng)
            else:
                x_new, lq_fwd, lq_rev = langevin_proposal(
                    x, self.scaling, self._gradient_fn(point), self.rng
                )
            ok, acc = self._decide(x, x_new, lq_fwd, lq_rev, point, audit, totals)
            accepted, accept = np.array([ok]), np.array([acc])
            if ok:
                x = x_new
        stats = {
            "accept": float(np.mean(accept)),
            "accepted": float(np.mean(accepted)),
            "scaling": float(np.mean(self.scaling)),
            "n_evals": totals["n_evals"],
            "frac_evals": totals["n_evals"] / (2.0 * self.terms.n_obs * len(accepted)),
            "exhausted": totals["exhausted"],
            "audit_agree": (AUDIT_AGREE if totals["agree"] else AUDIT_DISAGREE)
            if audit
            else AUDIT_NOT_RUN,
            "tune": self.tune,
        }
        if self.tune:
            self._tune_step(accepted)
        if accepted.any():
            point = dict(point)
            for v, value in zip(self.vars, self._split(x), strict=True):
                point[v.name] = value
        return point, [stats]

    def _decide(self, x, x_new, lq_fwd, lq_rev, point, audit, totals) -> tuple[bool, float]:
        """Race the MH test from flat ``x`` to ``x_new``; return (accepted, accept prob.)."""
        terms = self.terms
        n_obs = terms.n_obs
        cands = [np.stack([c, p]) for c, p in zip(self._split(x), self._split(x_new), strict=True)]
        log_f0 = terms.log_f0(cands, point)
        log_u = float(np.log(self.rng.random()))
        if not (np.isfinite(log_f0[1]) and np.isfinite(lq_rev)):
            return False, 0.0
        exact_part = log_f0[1] + lq_rev - log_f0[0] - lq_fwd

        def rewards(arms, idx):
            return terms.loglik_batch([c[arms] for c in cands], idx, point)

        def full_sums(arms):
            return terms.loglik_sum([c[arms] for c in cands], point)

        cv = self._cv  # None when control variates are off or could not be built
        if cv is not None:  # race on l_n - h_n; the exact sum of h_n joins the exact part
            rows = np.stack([x, x_new])
            residuals = residual_callbacks(
                rewards,
                full_sums,
                lambda arms, idx: cv.subset(rows[arms], terms.positions_to_rows(idx)),
                cv.total(rows),
            )
            rewards, full_sums = residuals.rewards, residuals.totals
            exact_part += residuals.shift[1] - residuals.shift[0]
        config = None if self.decides_exactly else self.race_config
        decision = mh_test(
            rewards, n_obs, exact_part, log_u, config, rng=self.rng, totals=full_sums
        )
        res = decision.race
        totals["n_evals"] += res.n_evaluations
        totals["exhausted"] |= res.exhausted
        if audit and config is not None:
            exact = race_exact(rewards, 2, n_obs, np.array([log_u, exact_part]) / n_obs, full_sums)
            agree = exact.winner == res.winner
            self._record_audit(agree)
            totals["agree"] &= agree
        return decision.accepted, decision.accept_probability

    def _tune_step(self, accepted: np.ndarray) -> None:
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
        self._reset_tuning()

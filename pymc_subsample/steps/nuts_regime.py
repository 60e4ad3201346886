r"""The switch of RacingMetropolis to PyMC's NUTS where its surrogate fits poorly.

During tuning the step records, per decision, the exact test's outcome, the
misfit :math:`\Delta\ell - \Delta\tilde\ell` of the surrogate's log density
change against the exact one, and the share of rows read
(:class:`~pymc_subsample.mcmc.regime.FitCheck`). Where the fit is poor and
subsampling cannot pay, :class:`NutsRegime` hands the block to PyMC's NUTS on
the exact full-data log density (Hoffman & Gelman 2014) for the rest of the
step's run, and maps NUTS's stats onto the step's.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from ..mcmc.regime import SMALL_N, Regime, probe_laplace_fit
from ..model.gradient_path import block_names
from .base import AUDIT_NOT_RUN

__all__ = ["NUTS_MIN_TUNE", "NutsRegime"]

#: Tuning draws a chain must have left for the step to switch to NUTS (its adaptation needs them).
NUTS_MIN_TUNE = 200


class NutsRegime:
    """Mixin of :class:`~pymc_subsample.RacingMetropolis`: the fit's measure and the NUTS regime.

    Reads the step's ``fit_check``, ``fit``, ``regime``, ``nuts``, ``_tune_left``,
    ``_nuts_failed`` and ``_nuts_logp`` (set in its constructor).
    """

    @property
    def _checks_fit(self) -> bool:
        """The surrogate's fit is measured: the HMC proposal or its random walk, racing.

        Not with ``RaceOptions(bound="exact")``: plain MH, asked for as such (a reference run).
        """
        return (
            self.proposal == "hmc"
            and self.bound != "exact"
            and self.regime.reason in ("chosen", "hmc_rejected")
            and self.fit.surrogate is not None
            and not self._nuts_failed
        )

    @property
    def _may_switch(self) -> bool:
        """Enough tuning is left in the chain for NUTS to adapt (unknown outside pm.sample).

        Never on out-of-core data: NUTS would read every row at every gradient.
        """
        if self.terms.out_of_core:
            return False
        return self._tune_left is None or self._tune_left >= NUTS_MIN_TUNE

    def _count_tuning_draw(self) -> None:
        if self._tune_left is not None:
            self._tune_left -= 1

    def _misfit(self, pair: np.ndarray, extra: float, info, point: dict, log: dict) -> float:
        r"""Return :math:`\Delta\ell - \Delta\tilde\ell` for the draw's decision (NaN if unknown).

        :math:`\Delta\ell` is the decision's exact log density change, estimated
        from its batch when raced; :math:`\Delta\tilde\ell` the surrogate's, from the
        HMC trajectory's ends, or the control variate's sums already in the race,
        or (an exact decision of the random walk) the surrogate's sums at the two
        points: :math:`O(d^2)`, no data read.
        """
        log_alpha = log.get("log_alpha", np.nan)
        if not np.isfinite(log_alpha):
            return np.nan
        if info is not None:
            return float(log_alpha - extra - info.surrogate_change)
        if np.isfinite(log.get("misfit", np.nan)):
            return float(log["misfit"])
        now = self.fit.proposal_expansion(point, log, self.tune)
        sums = self.fit.proposal_surrogate(point, now=now).total(pair)
        return float(log_alpha - extra - log["f0_change"] - (sums[1] - sums[0]))

    def _nuts_order(self) -> tuple[list, np.ndarray]:
        """Return the block's variables in the model's order, and the permutation to it.

        PyMC 6.4's NUTS mislabels variables in another order; the permutation
        takes a flat position of the block to NUTS's.
        """
        order = {v.name: i for i, v in enumerate(self.model.value_vars)}
        nuts_vars = sorted(self.vars, key=lambda v: order[v.name])
        ours = {v.name: k for k, v in enumerate(self.vars)}
        starts = np.cumsum([0, *self._sizes])
        perm = np.concatenate(
            [np.arange(starts[ours[v.name]], starts[ours[v.name] + 1]) for v in nuts_vars]
        )
        return nuts_vars, perm

    def _build_nuts(self, point: dict, start: dict):
        """Build PyMC's NUTS on the block as ``pm.sample`` builds it; the error where it cannot.

        A diagonal mass matrix started at the identity, its running mean at
        ``start``, adapted in the tuning left.
        """
        import pymc as pm
        from pymc.step_methods.hmc.quadpotential import QuadPotentialDiagAdapt

        nuts_vars, perm = self._nuts_order()
        x = self._flatten([np.asarray(start[v.name]) for v in self.vars])
        rng = self.rng.spawn(1)[0]
        potential = QuadPotentialDiagAdapt(
            self.dim, x[perm], np.ones(self.dim), 10, rng=rng.spawn(1)[0]
        )
        try:
            return pm.NUTS(
                nuts_vars,
                model=self.model,
                potential=potential,
                rng=rng,
                initial_point=point,
                compile_kwargs=self._compile_kwargs or None,
                logp_dlogp_func=self._nuts_logp,  # the probe's, compiled (None: compile)
            )
        except (NotImplementedError, TypeError, ValueError) as err:  # no gradient
            return err

    @property
    def _nuts_at_small_n(self) -> bool:
        """The step starts in NUTS: :math:`N` at most :data:`SMALL_N`, no race asked for.

        At defaults only (no ``proposal``, ``scaling``, ``control_variates``,
        ``expand_in``, race, audit or proposal options passed), with a
        gradient, in memory.
        """
        return (
            not self._asked["race"]
            and self.bound != "exact"
            and self.terms.n_obs <= SMALL_N
            and not self.terms.out_of_core
        )

    def _start_in_nuts(self, point: dict) -> bool:
        r"""Draw the block with PyMC's NUTS from the start, where a race cannot pay; True then.

        With :math:`N` at most :data:`SMALL_N` a gradient over every row costs
        little more than a race's first batch, so NUTS on the exact log
        density (Hoffman & Gelman 2014) mixes as well per second as the racing
        HMC, and needs no surrogate: nothing else is compiled, which is most of
        a new model's wait for its first draw. Logged (PyMC's logger, at the
        INFO level) and reported as reason ``"small_n"`` in the ``regime``
        stat; False (racing as asked) where NUTS cannot be built.
        """
        nuts = self._build_nuts(point, point)
        if isinstance(nuts, Exception):
            return False
        self._use_nuts(nuts, "small_n")
        names = block_names(self.model, self.vars)
        logging.getLogger("pymc").info(
            f"RacingMetropolis: N = {self.terms.n_obs} observations (at most {SMALL_N}): a "
            f"full pass costs less than a race's overhead, so {names} "
            f"{'are' if ',' in names else 'is'} drawn with PyMC's "
            f"NUTS on the exact log density (regime 'nuts', reason 'small_n': sampler stat "
            f"regime = {self.regime.code}). Pass proposal='hmc' to race anyway"
        )
        return True

    def _use_nuts(self, nuts, reason: str) -> None:
        """Draw the block with ``nuts`` for the rest of the step's run (regime ``reason``)."""
        self.nuts = nuts
        self.nuts.tune = self.tune
        self._fall_back(Regime("nuts", False, reason), float(self.nuts.step_size))

    def _enter_nuts(self, nuts, why: str) -> None:
        """Draw the block with ``nuts`` for the rest of the step's run; warn once with ``why``."""
        self._use_nuts(nuts, "poor_fit")
        names = ", ".join(v.name for v in self._nuts_order()[0])
        warnings.warn(
            f"RacingMetropolis: the quadratic surrogate fits this posterior poorly and "
            f"subsampling cannot pay here (N = {self.terms.n_obs}; {why}); the step now "
            f"draws {names} with PyMC's NUTS on the exact full-data log density, for the "
            f"rest of its run (regime 'nuts', reason 'poor_fit': sampler stat regime = "
            f"{self.regime.code}). Pass proposal='normal' to keep the racing random walk",
            UserWarning,
            stacklevel=4,
        )

    @property
    def _probes_fit(self) -> bool:
        """The Laplace fit is probed at construction: the default HMC, racing, at small N."""
        return (
            self.proposal == "hmc"
            and self.bound != "exact"
            and self.control_variates
            and not self.elemwise
            and self.terms.n_obs <= SMALL_N
            and not self.terms.out_of_core  # the probe reads the model's log density
        )

    def _probe_fit(self, point: dict) -> bool:
        """Score the Laplace fit on the exact log density before the surrogate is built.

        Where :math:`N` is small a full pass is cheap, so the fit is scored at
        once on exact values at draws from the Laplace approximation
        (:func:`~pymc_subsample.mcmc.regime.probe_laplace_fit`), with NUTS's own
        log density and gradient. A poor fit starts the step in the NUTS regime
        and the surrogate is never compiled; True then.
        """
        nuts = self._build_nuts(point, point)
        if isinstance(nuts, Exception):
            return False
        logp_grad = nuts._logp_dlogp_func
        for name, shared in nuts.shared.items():
            shared.set_value(point[name])
        _, perm = self._nuts_order()
        x0 = self._flatten([np.asarray(point[v.name]) for v in self.vars])[perm]
        # a fixed seed: the regime is a function of the model and its data, not of the rng
        check = probe_laplace_fit(logp_grad, x0, np.random.default_rng(0))
        if check is None or not check.poor(self.terms.n_obs):
            self._nuts_logp = logp_grad  # for a switch in tuning: compiled once
            return False
        self._enter_nuts(
            nuts,
            f"at construction, on {check.n} pairs of independent draws from its Laplace fit, "
            f"the quadratic missed the exact log density change by {check.misfit:.2g} nats "
            f"(median; {check.misfit_tail:.2g} at the 90% quantile), and an independence "
            f"sampler from the fit would accept {check.accept_rate:.0%}",
        )
        return True

    def _switch_to_nuts(self, point: dict) -> None:
        """Leave the surrogate for PyMC's NUTS on the exact log density; warn once.

        Built here, at the switch, as ``pm.sample`` builds its NUTS: variables in
        the model's order (PyMC 6.4 mislabels others), a diagonal mass matrix
        started at the identity and adapted in the tuning left, and the chain
        restarted where ``pm.sample`` started it. Not at the Laplace fit: the
        switch means that fit is poor, and its variances and the region the
        racing chain reached can both stall NUTS (step sizes near zero, every
        draw divergent). Tuning draws are discarded, so the kernel change and
        the jump leave the kept draws exact.
        """
        check = self.fit_check
        start = self._chain_start or point
        nuts = self._build_nuts(point, start)
        if isinstance(nuts, Exception):
            self._nuts_failed = True
            warnings.warn(
                f"RacingMetropolis: the quadratic surrogate fits this posterior poorly "
                f"({check.describe()}), but PyMC's NUTS could not be built for this block "
                f"({type(nuts).__name__}: {nuts}); the step keeps racing",
                UserWarning,
                stacklevel=3,
            )
            return
        self._nuts_start = self._chain_start
        self._enter_nuts(nuts, check.describe())

    def _nuts_draw(self, point: dict):
        """One NUTS draw of the block (regime "nuts"); its stats mapped onto this step's."""
        if self.tune:
            self._count_tuning_draw()
        self.nuts.tune = bool(self.tune)  # as this step's (set directly in a loop of steps)
        if self._nuts_start is not None:  # a tuning draw: discarded, so the jump is free
            point = {**point, **self._nuts_start}
            self._nuts_start = None
        new, (nuts_stats,) = self.nuts.step(point)
        tree = float(nuts_stats["tree_size"])
        stats = {
            "accept": float(nuts_stats["mean_tree_accept"]),
            "accepted": float(nuts_stats["index_in_trajectory"] != 0),
            "scaling": float(nuts_stats["step_size"]),
            "n_evals": int(round(tree)) * self.terms.n_obs,  # a full gradient per leapfrog
            "frac_evals": 1.0,
            "exhausted": True,
            "n_decisions": 1,
            "n_audited": 0,
            "n_wrong": 0,
            "n_raced": 0,
            "n_refits": 0,
            "audit_agree": AUDIT_NOT_RUN,
            "audit_exact": self.audit_exact,
            "tune": self.tune,
            "regime": self.regime.code,
            "diverging": bool(nuts_stats["diverging"]),
        }
        return new, [stats]

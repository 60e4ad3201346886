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

import warnings

import numpy as np

from ..mcmc.regime import Regime
from .base import AUDIT_NOT_RUN

__all__ = ["NUTS_MIN_TUNE", "NutsRegime"]

#: Tuning draws a chain must have left for the step to switch to NUTS (its adaptation needs them).
NUTS_MIN_TUNE = 200


class NutsRegime:
    """Mixin of :class:`~pymc_subsample.RacingMetropolis`: the fit's measure and the NUTS regime.

    Reads the step's ``fit_check``, ``fit``, ``regime``, ``nuts``, ``_tune_left``
    and ``_nuts_failed`` (set in its constructor).
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
        """Enough tuning is left in the chain for NUTS to adapt (unknown outside pm.sample)."""
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
        import pymc as pm
        from pymc.step_methods.hmc.quadpotential import QuadPotentialDiagAdapt

        check = self.fit_check
        order = {v.name: i for i, v in enumerate(self.model.value_vars)}
        nuts_vars = sorted(self.vars, key=lambda v: order[v.name])
        ours = {v.name: k for k, v in enumerate(self.vars)}
        starts = np.cumsum([0, *self._sizes])
        perm = np.concatenate(
            [np.arange(starts[ours[v.name]], starts[ours[v.name] + 1]) for v in nuts_vars]
        )
        start = self._chain_start or point
        x = self._flatten([np.asarray(start[v.name]) for v in self.vars])
        rng = self.rng.spawn(1)[0]
        potential = QuadPotentialDiagAdapt(
            self.dim, x[perm], np.ones(self.dim), 10, rng=rng.spawn(1)[0]
        )
        try:
            self.nuts = pm.NUTS(
                nuts_vars,
                model=self.model,
                potential=potential,
                rng=rng,
                initial_point=point,
                compile_kwargs=self._compile_kwargs or None,
            )
        except (NotImplementedError, TypeError, ValueError) as err:  # no gradient
            self._nuts_failed = True
            warnings.warn(
                f"RacingMetropolis: the quadratic surrogate fits this posterior poorly "
                f"({check.describe()}), but PyMC's NUTS could not be built for this block "
                f"({type(err).__name__}: {err}); the step keeps racing",
                UserWarning,
                stacklevel=3,
            )
            return
        self.nuts.tune = self.tune
        self._nuts_start = self._chain_start
        self._fall_back(Regime("nuts", False, "poor_fit"), float(self.nuts.step_size))
        warnings.warn(
            f"RacingMetropolis: the quadratic surrogate fits this posterior poorly and "
            f"subsampling cannot pay here (N = {self.terms.n_obs}; {check.describe()}); the "
            "step now draws "
            f"{', '.join(v.name for v in nuts_vars)} with PyMC's NUTS on the exact "
            f"full-data log density, for the rest of its run (regime 'nuts', reason "
            f"'poor_fit': sampler stat regime = {self.regime.code}). Pass proposal='normal' "
            "to keep the racing random walk",
            UserWarning,
            stacklevel=3,
        )

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

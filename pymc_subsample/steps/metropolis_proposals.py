r"""The proposals of RacingMetropolis, their settings and their tuning.

From flat :math:`\theta` the step proposes :math:`\theta'` by one of three
kernels: a leapfrog trajectory on the surrogate :math:`\log f_0 + \sum_n h_n`
with the Laplace mass matrix, which reads no data
(:func:`~pymc_subsample.mcmc.hmc.hmc_proposal`; its step size by dual averaging,
Hoffman & Gelman 2014); a Gaussian random walk, preconditioned by the Laplace
covariance or isotropic (:func:`~pymc_subsample.mcmc.proposals.random_walk_proposal`);
or a stochastic-gradient Langevin proposal on a mini-batch
(:func:`~pymc_subsample.mcmc.proposals.langevin_proposal`; Welling & Teh 2011).
The proposal's part :math:`c` of the MH log ratio goes to the accept test.
:class:`MetropolisProposals` holds the settings, the kernels, their tuning
(:mod:`~pymc_subsample.mcmc.adaptation`) and the fall-back from one proposal
to another (:class:`~pymc_subsample.mcmc.regime.Regime`); tuning draws are
discarded, so none of this changes the law of the kept draws.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..mcmc.adaptation import HMCAdaptation, tune_scale
from ..mcmc.hmc import HMCInfo, hmc_proposal
from ..mcmc.proposals import langevin_proposal, random_walk_proposal
from ..mcmc.regime import Regime
from ..options import ProposalOptions
from ..racing import IndexStream

__all__ = ["MetropolisProposals"]


class MetropolisProposals:
    """Mixin of :class:`~pymc_subsample.RacingMetropolis`: the proposals and their tuning.

    Reads the step's ``dim``, ``terms``, ``fit``, ``block``, ``rng``,
    ``batch_size``, ``tune`` and ``regime``; sets the proposal's settings
    (:meth:`_set_proposal`) and its tuned state (``scaling``,
    ``hmc_adaptation``, ``steps_until_tune``, ``accepted_sum``).
    """

    # -- settings ----------------------------------------------------------------------

    def _set_proposal(self, proposal: str, scaling: float | None, options: ProposalOptions):
        """Take up the proposal's settings; refuse a covariance that does not fit the block.

        Needs ``dim``, ``batch_size`` and ``terms``; ``elemwise`` comes from
        ``options`` (the caller has checked it against ``proposal``).
        """
        self.proposal_options = options
        self.covariance = None
        if options.covariance is not None:
            cov = options.covariance  # a finite square float array
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
        self._set_gradient_batch()
        target_accept = options.target_accept
        self.target_accept = 0.36 if target_accept is None else target_accept
        self.elemwise = elemwise = options.elemwise
        self.path_length = float(options.path_length)
        self.user_scaling = scaling
        self.preconditioned = proposal == "hmc" or (
            proposal == "normal" and scaling is None and not elemwise
        )
        self.tune_interval = int(options.tune_interval)

    def _set_gradient_batch(self) -> None:
        """Set the Langevin gradient's batch size for the current :math:`N`."""
        batch = self.proposal_options.gradient_batch
        self.gradient_batch = min(int(batch or max(self.batch_size, 100)), self.terms.n_obs)

    # -- the kernels -------------------------------------------------------------------

    def _propose(self, x: np.ndarray, point: dict, log: dict) -> tuple:
        """Propose from flat ``x`` with the proposal in use (:attr:`regime`).

        Returns ``(x_new, c, info)``: :math:`c` the proposal's part of the MH
        log ratio, ``info`` the HMC trajectory's record (None for the others).
        """
        regime = self.regime
        if regime.proposal == "hmc":
            return self._hmc(x, point, log)
        if regime.proposal == "normal" and regime.preconditioned:
            chol_cov = self.fit.proposal_expansion(point, log, self.tune)[2][2]
            return x + self.scaling * (chol_cov @ self.rng.standard_normal(len(x))), 0.0, None
        if regime.proposal == "normal":
            x_new, lq_fwd, lq_rev = random_walk_proposal(x, self.scaling, self.rng)
        else:
            gradient = self._gradient_fn(point)
            x_new, lq_fwd, lq_rev = langevin_proposal(x, self.scaling, gradient, self.rng)
        return x_new, lq_rev - lq_fwd, None

    def _hmc(self, x: np.ndarray, point: dict, log: dict) -> tuple[np.ndarray, float, HMCInfo]:
        """Leapfrog on the surrogate (:func:`~pymc_subsample.mcmc.hmc.hmc_proposal`).

        Returns the proposal, :math:`K(p) - K(p')` and the trajectory's record.
        """
        now = self.fit.proposal_expansion(point, log, self.tune)
        sur = self.fit.proposal_surrogate(point, now=now)
        inv_mass, chol_mass, _ = now[2]

        def gradient(theta):
            return sur.gradient(theta) + self.fit.f0_grad(theta, point)

        def log_density(rows):
            return sur.total(rows) + self.terms.log_f0(self.block.candidates(rows), point)

        return hmc_proposal(
            x,
            gradient=gradient,
            log_density=log_density,
            inv_mass=inv_mass,
            chol_mass=chol_mass,
            step_size=float(self.scaling),
            path_length=self.hmc_adaptation.path,
            rng=self.rng,
        )

    def _gradient_fn(self, point):
        n_obs = self.terms.n_obs
        batch = IndexStream(n_obs, self.rng).take(self.gradient_batch)
        batch.sort()
        scale = n_obs / len(batch)
        block = self.block

        def gradient(flat):
            g_lik, g_f0 = self.terms.gradient(block.split(flat), batch, point)
            return scale * block.flatten(g_lik) + block.flatten(g_f0)

        return gradient

    # -- tuning ------------------------------------------------------------------------

    def _initial_scaling(self) -> float:
        """Return the scale a chain's tuning starts from, for the proposal in use."""
        if self.user_scaling is not None:
            return float(self.user_scaling)
        regime = self.regime
        if regime.proposal == "hmc":
            return 0.5
        if regime.proposal == "normal" and regime.preconditioned:
            return 2.38 / np.sqrt(self.dim)
        return 1.0

    def _reset_proposal(self) -> None:
        """Start a chain's tuning of the proposal: its initial scale, a new HMC adaptation."""
        scale = self._initial_scaling()
        self.scaling = np.full(self.dim, scale) if self.elemwise else scale
        #: the HMC step size and path length (kept, unused, by the other proposals)
        self.hmc_adaptation = HMCAdaptation(scale, self.path_length)
        self._reset_interval()

    def _reset_interval(self) -> None:
        self.steps_until_tune = self.tune_interval
        self.accepted_sum = np.zeros(self.dim if self.elemwise else 1, dtype=int)

    def _fall_back(self, regime: Regime, scaling: float) -> None:
        """Run ``regime``'s proposal from now on, starting at ``scaling`` (the caller warns).

        ``proposal`` keeps the user's choice; :attr:`regime` records the change
        and its reason, reported in the ``regime`` stat. Kept across chains.
        """
        self.regime = regime
        self.scaling = scaling

    def _tune_step(
        self, accepted: np.ndarray, accept: np.ndarray, integrator_accept: float = 1.0
    ) -> None:
        """Tune the proposal in use after a tuning draw (:mod:`~pymc_subsample.mcmc.adaptation`).

        HMC: after every draw, from the exact test's decision (not the race's
        estimate of the acceptance probability, which reads part of the data)
        and the trajectory's ``integrator_accept``; when the exact test
        rejects nearly every trajectory, the step warns and falls back to the
        random walk preconditioned by the Laplace covariance at the mode, tuned
        as ``proposal="normal"``. Tuning draws are discarded, so the kernel
        change leaves the kept draws exact. Random walks: every ``tune_interval``
        draws.
        """
        if self.regime.proposal == "hmc":
            adaptation = self.hmc_adaptation
            self.scaling = adaptation.update(bool(accepted[0]), integrator_accept)
            if adaptation.rejected:
                warnings.warn(
                    f"RacingMetropolis: the surrogate's HMC proposal was accepted "
                    f"{adaptation.accept_rate:.0%} of {adaptation.accept_n} times in tuning (the "
                    "quadratic surrogate fits this posterior poorly: multimodal, heavy-tailed, "
                    "or coefficients at a boundary); the step falls back to a random walk "
                    "preconditioned by the Laplace covariance. Pass proposal='normal' to start "
                    "with it, or use NUTS for this block",
                    UserWarning,
                    stacklevel=3,
                )
                self._fall_back(Regime("normal", True, "hmc_rejected"), 2.38 / np.sqrt(self.dim))
                self._reset_interval()
            return
        self.accepted_sum = self.accepted_sum + accepted.astype(int)
        self.steps_until_tune -= 1
        if self.steps_until_tune > 0:
            return
        rate = self.accepted_sum / self.tune_interval
        target = None if self.regime.proposal == "normal" else self.target_accept
        scaling = tune_scale(self.scaling, rate, target)
        self.scaling = scaling if self.elemwise else float(np.squeeze(scaling))
        self._reset_interval()

    def _end_proposal_tuning(self) -> None:
        """Fix the HMC step size at tuning's end; warn when its proposal accepted too little."""
        if self.regime.proposal != "hmc":
            return
        adaptation = self.hmc_adaptation
        self.scaling = adaptation.current(False)
        rate = adaptation.accept_rate
        if adaptation.accept_n > 50 and rate < 0.3:
            warnings.warn(
                f"RacingMetropolis: the surrogate proposal accepted "
                f"{rate:.0%} of its proposals during tuning; the quadratic "
                "surrogate fits this posterior poorly (multimodal, heavy-tailed or strongly "
                "non-Gaussian). Use proposal='normal', or NUTS for this block",
                UserWarning,
                stacklevel=3,
            )

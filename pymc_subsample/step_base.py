"""Conduct shared by the racing PyMC steps: arguments, per-chain state, audits."""

from __future__ import annotations

import warnings

import numpy as np
from pymc.step_methods.compound import BlockedStep, Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator
from scipy import stats

from .cost import choose_exact_after, fit_round_cost, median_seconds
from .racing.common import validate_race_args

__all__ = ["AUDIT_DISAGREE", "AUDIT_NOT_RUN", "AUDIT_AGREE", "RacingStep", "RacingStepState"]

#: ``audit_agree`` value of a draw that was not audited.
AUDIT_NOT_RUN = -1
#: ``audit_agree`` value of an audited draw whose race decided as the exact computation.
AUDIT_AGREE = 1
#: ``audit_agree`` value of an audited draw whose race decided differently.
AUDIT_DISAGREE = 0


@dataclass_state
class RacingStepState(StepMethodState):
    """Sampling state saved and restored between sequential chains."""

    n_steps: int


class RacingStep(BlockedStep):
    """Base class of the racing steps: validated settings, rng, audit schedule.

    Subclasses set ``name`` and ``stats_dtypes_shapes`` and implement ``step``.
    """

    _state_class = RacingStepState

    def _init_racing(self, delta, bound, batch_size, variance, audit_every, reward_range, rng):
        self.delta = validate_race_args(delta, bound, batch_size, variance, 1)
        self.bound = bound
        self.batch_size = int(batch_size)
        self.variance = variance
        if int(audit_every) != audit_every or audit_every < 0:
            raise ValueError(
                f"audit_every must be an integer >= 0 (0 turns audits off), got {audit_every!r}"
            )
        self.audit_every = int(audit_every)
        if reward_range is not None and not (np.isfinite(reward_range) and reward_range >= 0):
            raise ValueError(f"reward_range must be a finite number >= 0, got {reward_range!r}")
        self.reward_range = reward_range
        self.rng = get_random_generator(rng)
        self.n_steps = 0
        self._reset_audits()

    def _reset_audits(self) -> None:
        self.n_audits = 0
        self.n_disagreements = 0
        self._warned = False

    def _record_audit(self, agree: bool) -> None:
        """Count an audited decision; warn once when the error rate clearly exceeds delta."""
        self.n_audits += 1
        self.n_disagreements += int(not agree)
        k, n = self.n_disagreements, self.n_audits
        if not self._warned and k > 0 and stats.binom.sf(k - 1, n, self.delta) < 1e-3:
            self._warned = True
            warnings.warn(
                f"{type(self).__name__}: {k} of {n} audited decisions differed from the exact "
                f"ones, significantly more than delta={self.delta:g}. The normal approximation "
                "fails on these likelihood terms (heavy tails or rare large terms): increase "
                "batch_size (e.g. 500), use variance='marginal', pass reward_range, or use "
                "bound='ebs' with reward_range",
                UserWarning,
                stacklevel=3,
            )

    def _resolve_exact_after(self, exact_fraction, n_cands: int, point) -> int:
        """Turn ``exact_fraction`` (a number in (0, 1] or "auto") into ``exact_after``."""
        if isinstance(exact_fraction, str) and exact_fraction == "auto":
            return self._calibrate(point, n_cands)
        if isinstance(exact_fraction, int | float) and 0.0 < exact_fraction <= 1.0:
            exact_after = int(np.ceil(exact_fraction * self.terms.n_obs))
            # fewer than three looks cannot pay for the race's overhead: decide at once
            return exact_after if exact_after >= 4 * self.batch_size else 0
        raise ValueError(f"exact_fraction must lie in (0, 1] or be 'auto', got {exact_fraction!r}")

    def _calibrate(self, point, n_cands: int) -> int:
        """Time subset and exact evaluations at ``point``; return ``exact_after``."""
        n_obs = self.terms.n_obs
        if n_obs < 4 * self.batch_size:
            return n_obs
        cands = [np.repeat(np.asarray(point[v.name])[None], n_cands, axis=0) for v in self.vars]
        rng = np.random.default_rng(0)

        def call_seconds(m):
            idx = np.sort(rng.choice(n_obs, size=min(m, n_obs), replace=False))
            return median_seconds(lambda: self.terms.subset(cands, idx, point))

        exact = median_seconds(lambda: self.terms.totals(cands, point))
        cost = fit_round_cost(call_seconds, n_cands, n_obs)
        return choose_exact_after(n_obs, self.batch_size, cost, exact)

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, draw counter) before a chain starts."""
        super().setup_chain(rng, tune, draws)
        self.n_steps = 0
        self.tune = tune > 0
        self._reset_audits()

    def _audit_due(self) -> bool:
        """Advance the draw counter; True when this draw is to be audited."""
        self.n_steps += 1
        return self.audit_every > 0 and self.n_steps % self.audit_every == 0

    def reset_tuning(self):
        """Nothing to reset: the Gibbs race has no tuning parameters."""
        return

    @staticmethod
    def competence(var, has_grad):
        """Never assigned automatically: pass the step to ``pm.sample(step=...)``."""
        return Competence.INCOMPATIBLE

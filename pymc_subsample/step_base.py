"""Conduct shared by the racing PyMC steps: arguments, per-chain state, audits."""

from __future__ import annotations

import numpy as np
from pymc.step_methods.compound import BlockedStep, Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator

from .racing.race import validate_race_args

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

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, draw counter) before a chain starts."""
        super().setup_chain(rng, tune, draws)
        self.n_steps = 0
        self.tune = tune > 0

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

"""What RacingMetropolis runs, against what it was asked: the proposal in use and why.

A step can leave the proposal its user chose: when the surrogate cannot be
fitted (no control variates, no mass matrix) or when the exact test rejects
nearly every HMC trajectory in tuning. :class:`Regime` records the proposal in
use and the reason; the step's ``proposal`` stays the one chosen, each change
warns once, and the sampler stat ``regime`` reports :attr:`Regime.code` per draw.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REGIME_REASONS", "Regime"]

#: Reasons, by the code the ``regime`` stat reports: the proposal as chosen; a
#: preconditioned random walk after the exact test rejected the HMC proposal in tuning;
#: a plain random walk because the surrogate could not be fitted.
REGIME_REASONS = ("chosen", "hmc_rejected", "no_surrogate")


@dataclass(frozen=True)
class Regime:
    """The proposal a RacingMetropolis step runs.

    Attributes
    ----------
    proposal : str
        ``"hmc"``, ``"normal"`` or ``"langevin"``.
    preconditioned : bool
        The random walk (or HMC) uses the Laplace covariance.
    reason : str
        One of :data:`REGIME_REASONS`: why it is not the one chosen.
    """

    proposal: str
    preconditioned: bool
    reason: str = "chosen"

    def __post_init__(self) -> None:
        if self.reason not in REGIME_REASONS:
            raise ValueError(f"reason must be one of {REGIME_REASONS}, got {self.reason!r}")

    @property
    def code(self) -> int:
        """Index of :attr:`reason` in :data:`REGIME_REASONS` (the ``regime`` stat)."""
        return REGIME_REASONS.index(self.reason)

    @property
    def fell_back(self) -> bool:
        """True when the step left the proposal chosen."""
        return self.reason != "chosen"

"""Back-off from races that do not pay: runs of exact decisions that double.

A race that gives up (it evaluates at least half of an exact decision's terms:
most candidates reached its exact pass) has paid for its looks and for the
exact answer. A race that pays costs a fraction of an exact decision and one
that gives up a little more than one (the exact switch's budget), so racing
loses only when most races give up. :class:`Backoff` keeps, per key (a block
element of the Gibbs step, a decision of the MH step), the share of recent
races that gave up; while it is above :data:`BACKOFF_SHARE`, each race that
gives up is followed by a run of exact decisions, twice as long after each
further one, up to :data:`MAX_BACKOFF`. An exact decision is exact whatever
the history that chose it, so the back-off adds no error.
"""

from __future__ import annotations

from collections.abc import Hashable

from .cost import EXACT_SWITCH_BUDGET

__all__ = ["BACKOFF_MEMORY", "BACKOFF_SHARE", "MAX_BACKOFF", "Backoff"]

#: Longest run of exact decisions taken after races that gave up.
MAX_BACKOFF = 64
#: Share of recent races that gave up (most candidates reached the exact pass) above which
#: a step backs off: a race that pays costs a fraction :math:`r` of an exact decision and
#: one that gives up at most :math:`1 + b` (:math:`b` the exact switch's budget,
#: :data:`~pymc_subsample.mcmc.cost.EXACT_SWITCH_BUDGET`), so racing loses once a share
#: :math:`s > (1 - r)/(1 + b - r)` of races give up, :math:`1/(1 + b)` as :math:`r \to 0`.
BACKOFF_SHARE = round(1.0 / (1.0 + EXACT_SWITCH_BUDGET), 2)
#: Races (about) over which that share is averaged (exponential weights 1/8).
BACKOFF_MEMORY = 8


class Backoff:
    """Runs of exact decisions after races that gave up, per key.

    Per key the state is ``[run, left, share]``: the length of the last run of
    exact decisions, how many of it are left, and the exponentially weighted
    share of recent races that gave up (weights :math:`1/`:data:`BACKOFF_MEMORY`,
    started at :data:`BACKOFF_SHARE`, so that a first race that gives up backs
    off and a key whose races pay forgets the start within a few races).
    Deterministic: the same outcomes give the same runs.

    Parameters
    ----------
    enabled : bool
        False: :meth:`record` keeps nothing, so no decision is ever exact by
        the back-off (every one races).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self.state: dict[Hashable, list] = {}

    def reset(self) -> None:
        """Forget every key (a new chain)."""
        self.state = {}

    def left(self, key: Hashable) -> int:
        """Return how many more of this key's decisions are exact by the back-off."""
        state = self.state.get(key)
        return 0 if state is None else state[1]

    def take(self, key: Hashable) -> bool:
        """Return True when this key's next decision is exact (counting it down)."""
        state = self.state.get(key)
        if state is None or state[1] == 0:
            return False
        state[1] -= 1
        return True

    def record(self, key: Hashable, n_evaluations: float, n_exact: float) -> None:
        """Count a race of this key; start or double a run of exact decisions.

        The race gave up when its ``n_evaluations`` are at least half of an
        exact decision's ``n_exact`` (in the same units). While the share of
        races that gave up is above :data:`BACKOFF_SHARE`, a race that gives
        up doubles the run that follows it (1, 2, 4, ..., :data:`MAX_BACKOFF`);
        a race that pays ends the doubling. Nothing when not ``enabled``.
        """
        if not self.enabled:
            return
        gave_up = n_evaluations >= 0.5 * n_exact
        state = self.state.get(key)
        if state is None:
            state = self.state[key] = [0, 0, BACKOFF_SHARE]
        state[2] += (float(gave_up) - state[2]) / BACKOFF_MEMORY
        if not gave_up:
            state[0] = 0
        elif state[2] > BACKOFF_SHARE:
            state[0] = min(max(2 * state[0], 1), MAX_BACKOFF)
            state[1] = state[0]

r"""Tuning of RacingMetropolis's proposals: the HMC step size and path length, random-walk scales.

HMC (:class:`HMCAdaptation`): the leapfrog step size by dual averaging of its
logarithm towards an integrator acceptance of :data:`TARGET_INTEGRATOR` on
the surrogate (:class:`DualAveraging`; Nesterov 2009; Hoffman & Gelman 2014,
Alg. 5), and the path length by a Robbins–Monro step on its logarithm towards an acceptance of
:data:`TARGET_PATH` of the exact accept test (Robbins & Monro 1951): where the
surrogate misfits the posterior, shorter paths are accepted more often.
Random walks (:func:`tune_scale`): every ``tune_interval`` draws, PyMC's
Metropolis table, or a Robbins–Monro step towards a target acceptance.
Tuning draws are discarded, so none of this changes the law of the kept draws.
"""

from __future__ import annotations

import numpy as np
from pymc.step_methods.metropolis import tune as pymc_tune
from pymc.step_methods.state import DataClassState, WithSamplingState, dataclass_state

__all__ = [
    "FALLBACK_AFTER",
    "FALLBACK_RATE",
    "MIN_PATH",
    "TARGET_INTEGRATOR",
    "TARGET_PATH",
    "DualAveraging",
    "DualAveragingState",
    "HMCAdaptation",
    "HMCAdaptationState",
    "tune_scale",
]

#: Integrator acceptance on the surrogate that the step size is tuned towards.
TARGET_INTEGRATOR = 0.8
#: Acceptance of the exact test that the path length is tuned towards.
TARGET_PATH = 0.4
#: Shortest path length.
MIN_PATH = 0.05
#: Tuning trajectories after which an exact-test acceptance below FALLBACK_RATE
#: means the surrogate's HMC proposal is rejected (:attr:`HMCAdaptation.rejected`).
FALLBACK_AFTER = 100
FALLBACK_RATE = 0.05


@dataclass_state
class DualAveragingState(DataClassState):
    """Sampling state of :class:`DualAveraging`."""

    mu: float
    log_step: float
    log_bar: float
    h_bar: float
    n: int


class DualAveraging(WithSamplingState):
    r"""Dual averaging of a log step size (Nesterov 2009; Hoffman & Gelman 2014, Alg. 5).

    After the :math:`n`-th acceptance statistic :math:`a_n`,

    .. math::
        \bar h_n = (1 - w_n) \bar h_{n-1} + w_n (\alpha - a_n),\quad w_n = \frac{1}{n + t_0},
        \qquad \log\epsilon_n = \mu - \frac{\sqrt n}{\gamma} \bar h_n,

        \log\bar\epsilon_n = n^{-\kappa} \log\epsilon_n + (1 - n^{-\kappa}) \log\bar\epsilon_{n-1},

    with :math:`\mu = \log(10\,\epsilon_0)`: :math:`\epsilon_n` while tuning,
    :math:`\bar\epsilon_n` after. The recursion of PyMC's
    :class:`pymc.step_methods.step_sizes.DualAverageAdaptation`, kept here in
    its own order of operations: PyMC's rounds differently in the last bit,
    which is enough to change a seed's chains.

    Parameters
    ----------
    step_size : float
        :math:`\epsilon_0 > 0`.
    target : float
        :math:`\alpha`, the acceptance statistic aimed at.
    gamma, t0, kappa : float
        :math:`\gamma, t_0, \kappa` (Hoffman & Gelman's values, as PyMC's NUTS).
    """

    _state_class = DualAveragingState

    def __init__(
        self,
        step_size: float,
        target: float,
        gamma: float = 0.05,
        t0: float = 10.0,
        kappa: float = 0.75,
    ) -> None:
        log_step = np.log(step_size)
        self.mu = log_step + np.log(10.0)
        self.log_step = self.log_bar = log_step
        self.h_bar = 0.0
        self.n = 0
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa

    def current(self, tune: bool) -> float:
        r"""Return :math:`\epsilon_n` while ``tune``, else the averaged :math:`\bar\epsilon_n`."""
        return float(np.exp(self.log_step if tune else self.log_bar))

    def update(self, accept: float) -> None:
        """Take the acceptance statistic of one more tuning step."""
        self.n += 1
        n = self.n
        w = 1.0 / (n + self.t0)
        self.h_bar = (1 - w) * self.h_bar + w * (self.target - accept)
        self.log_step = self.mu - np.sqrt(n) / self.gamma * self.h_bar
        eta = n ** (-self.kappa)
        self.log_bar = eta * self.log_step + (1 - eta) * self.log_bar


@dataclass_state
class HMCAdaptationState(DataClassState):
    """Sampling state of :class:`HMCAdaptation` (PyMC's ``sampling_state`` protocol)."""

    step_size: DualAveragingState
    path: float
    accept_sum: float
    accept_n: int


class HMCAdaptation(WithSamplingState):
    """Step size and path length of the surrogate's HMC proposal, tuned in tuning draws.

    Parameters
    ----------
    step_size : float
        Initial leapfrog step size (dual averaging's shrinkage point is ten times it).
    path_length : float
        Initial and largest integration time.
    """

    _state_class = HMCAdaptationState

    def __init__(self, step_size: float, path_length: float) -> None:
        self.max_path = float(path_length)
        # the constants of Hoffman & Gelman (2014), as PyMC's NUTS
        self.step_size = DualAveraging(step_size, TARGET_INTEGRATOR)
        self.path = self.max_path
        self.accept_sum = 0.0
        self.accept_n = 0

    def current(self, tune: bool) -> float:
        """Step size: the running one in tuning, the averaged one after."""
        return float(self.step_size.current(tune))

    def update(self, accepted: bool, integrator_accept: float) -> float:
        """Take one tuning trajectory's outcome; return the next step size.

        ``accepted`` is the exact test's decision (not a race's estimate of the
        acceptance probability, which reads part of the data);
        ``integrator_accept`` the integrator's acceptance on the surrogate.
        """
        rate = float(accepted)
        self.accept_sum += rate
        self.accept_n += 1
        gain = 1.0 / np.sqrt(self.accept_n)
        self.path = float(
            np.clip(self.path * np.exp(gain * (rate - TARGET_PATH)), MIN_PATH, self.max_path)
        )
        self.step_size.update(integrator_accept)
        return self.current(True)

    @property
    def accept_rate(self) -> float:
        """Share of the tuning trajectories that the exact test accepted (0 before any)."""
        return self.accept_sum / max(self.accept_n, 1)

    @property
    def rejected(self) -> bool:
        """True when the exact test accepted under FALLBACK_RATE of FALLBACK_AFTER or more."""
        return self.accept_n >= FALLBACK_AFTER and self.accept_rate < FALLBACK_RATE


def tune_scale(scaling, rate, target: float | None = None):
    r"""Return the random-walk scale after a tuning interval with acceptance ``rate``.

    ``target`` None: PyMC's Metropolis table (:func:`pymc.step_methods.metropolis.tune`);
    else a Robbins–Monro step on the log scale, :math:`s\, e^{2(\text{rate} - \text{target})}`.
    """
    if target is None:
        return pymc_tune(scaling, rate)
    return scaling * np.exp(2.0 * (rate - target))

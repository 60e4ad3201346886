r"""What RacingMetropolis runs, against what it was asked: the proposal in use and why.

A step can leave the proposal its user chose: when the surrogate cannot be
fitted (no control variates, no mass matrix), when the exact test rejects
nearly every HMC trajectory in tuning, or when the surrogate fits the
posterior poorly where subsampling cannot pay (:class:`FitCheck`): the block is
then drawn by PyMC's NUTS on the exact full-data log density (Hoffman &
Gelman 2014), which needs no quadratic. :class:`Regime` records the proposal
in use and the reason; the step's ``proposal`` stays the one chosen, each
change warns once, and the sampler stat ``regime`` reports :attr:`Regime.code`
per draw.

The fit is measured on the decisions the step makes anyway, with no extra
pass over the data. For a move from :math:`\theta` to :math:`\theta'`, the
surrogate predicts the log density change :math:`\Delta\tilde\ell =
\log\tilde\pi(\theta') - \log\tilde\pi(\theta)`, and the decision estimates the exact
change :math:`\Delta\ell` (exactly when it reads every row, from its batch
otherwise); :math:`|\Delta\ell - \Delta\tilde\ell|` is the surrogate path's
energy error against the exact one (for HMC, the part of the exact test's
log ratio that no step size removes). With the exact test's acceptance and
the share of the rows a decision reads, it tells when the quadratic fails
(Bardenet, Doucet & Holmes 2017 on when subsampled MH pays: a control
variate's residuals must be small for a race to stop early).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from .mode import gradient_jacobian

__all__ = [
    "FIT_WINDOW",
    "PROBE_PAIRS",
    "PAY_SHARE",
    "SMALL_N",
    "POOR_ACCEPT",
    "POOR_MISFIT",
    "POOR_MISFIT_TAIL",
    "REGIME_REASONS",
    "FitCheck",
    "Regime",
    "probe_laplace_fit",
]

#: Reasons, by the code the ``regime`` stat reports: the proposal as chosen; a
#: preconditioned random walk after the exact test rejected the HMC proposal in tuning;
#: a plain random walk because the surrogate could not be fitted; PyMC's NUTS on the
#: exact log density because the surrogate fits poorly where subsampling cannot pay; a
#: plain random walk on the raw terms because the block reaches them only through
#: operations without a derivative (:mod:`~pymc_subsample.model.gradient_path`); PyMC's
#: NUTS from the start because :math:`N` is at most :data:`SMALL_N` and no race was asked for.
REGIME_REASONS = ("chosen", "hmc_rejected", "no_surrogate", "poor_fit", "no_gradient", "small_n")

#: Tuning decisions a :class:`FitCheck` judges: the last ones, and the fewest it judges.
FIT_WINDOW = 100
#: Exact-test acceptance under which the fit is poor.
POOR_ACCEPT = 0.2
#: Median :math:`|\Delta\ell - \Delta\tilde\ell|` (nats) over which the fit is poor.
POOR_MISFIT = 1.0
#: 90% quantile of :math:`|\Delta\ell - \Delta\tilde\ell|` (nats) over which the fit is
#: poor: a tenth of the moves cost a factor :math:`e^{-2}` or worse in acceptance, so the
#: chain sticks where the quadratic is wrong (a curved ridge), whatever its median.
POOR_MISFIT_TAIL = 2.0
#: Mean share of the rows a decision reads at or over which subsampling cannot pay.
PAY_SHARE = 0.5
#: Observations at or under which subsampling cannot pay whatever a decision reads: a
#: full pass is cheap, and races that stop early against a poor fit stop on rejections.
SMALL_N = 20_000
#: Pairs of independent draws from the Laplace approximation that :func:`probe_laplace_fit` scores.
PROBE_PAIRS = 128


@dataclass(frozen=True)
class Regime:
    """The proposal a RacingMetropolis step runs.

    Attributes
    ----------
    proposal : str
        ``"hmc"``, ``"normal"``, ``"langevin"`` or ``"nuts"`` (PyMC's NUTS on
        the exact log density, no race).
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


class FitCheck:
    r"""How well the surrogate fits, over the last tuning decisions.

    Records per decision whether the exact test accepted, the misfit
    :math:`|\Delta\ell - \Delta\tilde\ell|` (NaN where not measured) and the
    share of the :math:`N` rows the decision read. :meth:`poor` is True when,
    over the last :data:`FIT_WINDOW` decisions, the fit is poor (acceptance
    under :data:`POOR_ACCEPT`, median misfit over :data:`POOR_MISFIT`, or its
    90% quantile over :data:`POOR_MISFIT_TAIL`) and
    subsampling cannot pay: the decisions read :data:`PAY_SHARE` of the rows
    or more on average (a race that reads most of the data saves nothing over
    an exact sampler), or :math:`N` is at most :data:`SMALL_N` (a full pass is
    cheap, and where the surrogate misfits, races stop early on rejections: few
    rows read, and a chain that barely moves).

    Parameters
    ----------
    window : int
        Decisions kept (and the fewest judged).
    """

    def __init__(self, window: int = FIT_WINDOW) -> None:
        self.window = int(window)
        self.accepts: deque = deque(maxlen=self.window)
        self.misfits: deque = deque(maxlen=self.window)
        self.rows: deque = deque(maxlen=self.window)

    def record(self, accepted: bool | float, misfit: float, rows: float) -> None:
        """Take one decision: the exact test's outcome or its probability, the misfit, the share.

        The misfit is in nats; the share is of the :math:`N` rows, read by the decision.
        """
        self.accepts.append(float(accepted))
        self.misfits.append(abs(float(misfit)))
        self.rows.append(float(rows))

    def clear(self) -> None:
        """Forget the decisions (a new proposal is judged afresh)."""
        self.accepts.clear()
        self.misfits.clear()
        self.rows.clear()

    @property
    def n(self) -> int:
        """Decisions recorded (at most :attr:`window`)."""
        return len(self.accepts)

    @property
    def accept_rate(self) -> float:
        """Share of the recorded decisions that accepted (NaN before any)."""
        return float(np.mean(self.accepts)) if self.accepts else float("nan")

    def _misfit_quantile(self, q: float) -> float:
        """Quantile ``q`` of the finite misfits (NaN when none was measured)."""
        finite = [m for m in self.misfits if np.isfinite(m)]
        return float(np.quantile(finite, q)) if finite else float("nan")

    @property
    def misfit(self) -> float:
        """Median of the finite misfits (NaN when none was measured)."""
        return self._misfit_quantile(0.5)

    @property
    def misfit_tail(self) -> float:
        """90% quantile of the finite misfits (NaN when none was measured)."""
        return self._misfit_quantile(0.9)

    @property
    def rows_share(self) -> float:
        """Mean share of the rows a decision read (NaN before any)."""
        return float(np.mean(self.rows)) if self.rows else float("nan")

    @property
    def poor_fit(self) -> bool:
        """The acceptance or the misfit says the quadratic fails (judged on a full window)."""
        if self.n < self.window:
            return False
        return (
            self.accept_rate < POOR_ACCEPT
            or self.misfit > POOR_MISFIT
            or self.misfit_tail > POOR_MISFIT_TAIL
        )

    def poor(self, n_obs: int) -> bool:
        """Return True when the fit is poor and subsampling ``n_obs`` rows cannot pay."""
        return self.poor_fit and (self.rows_share >= PAY_SHARE or n_obs <= SMALL_N)

    def describe(self) -> str:
        """Return the measured numbers, for a warning."""
        return (
            f"over the last {self.n} tuning decisions the exact test accepted "
            f"{self.accept_rate:.0%}, the surrogate's log density change missed the exact "
            f"one by {self.misfit:.2g} nats (median; {self.misfit_tail:.2g} at the 90% "
            f"quantile), and a decision read {self.rows_share:.0%} of the rows on average"
        )


def probe_laplace_fit(
    logp_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    rng: np.random.Generator,
    pairs: int = PROBE_PAIRS,
) -> FitCheck | None:
    r"""Score the Laplace approximation of a log density on exact values at draws from it.

    Finds the mode :math:`m` of :math:`\ell` from ``x0`` (L-BFGS; Nocedal &
    Wright 2006, Ch. 7), its precision :math:`P = -\nabla^2 \ell(m)` by
    central differences of the gradient, and for ``pairs`` pairs of independent
    draws :math:`\theta = m + L^{-\top} z` (:math:`P = L L^\top`,
    :math:`z \sim N(0, I)`) records in a :class:`FitCheck` the misfit
    :math:`\Delta\ell - \Delta q` of the quadratic :math:`q(\theta) = -\tfrac12
    |z|^2` and the acceptance :math:`\min(1, e^{\Delta\ell - \Delta q})` an
    independence sampler from the approximation would have (the share of
    rows read is 1: every value is exact). The same thresholds then judge it
    as they judge a step's decisions.

    Parameters
    ----------
    logp_grad : callable
        Flat position to ``(log density, gradient)``.
    x0 : ndarray, shape (d,)
        Where the mode search starts.
    rng : numpy.random.Generator
        Draws of :math:`z`.
    pairs : int
        Pairs of draws scored.

    Returns
    -------
    FitCheck or None
        None when the probe cannot tell: no finite mode, or a precision that
        is not positive definite (the step's own fit then decides).
    """

    def negative(x):
        with np.errstate(all="ignore"):
            value, grad = logp_grad(x)
        if not np.isfinite(value) or not np.all(np.isfinite(grad)):
            return np.inf, np.zeros_like(x)
        return -float(value), -np.asarray(grad, dtype=float)

    x0 = np.asarray(x0, dtype=float)
    found = minimize(negative, x0, jac=True, method="L-BFGS-B", options={"maxiter": 500})
    mode = np.asarray(found.x, dtype=float)
    top = float(found.fun)
    if not np.isfinite(top):
        return None
    dim = len(mode)
    eps = 1e-5 * np.maximum(1.0, np.abs(mode))
    precision = gradient_jacobian(lambda x: negative(x)[1], mode, eps)  # of -logp
    if not np.all(np.isfinite(precision)):
        return None
    try:
        chol = np.linalg.cholesky(precision)
    except np.linalg.LinAlgError:
        return None
    check = FitCheck(window=pairs)
    z = rng.standard_normal((pairs, 2, dim))
    for pair in z:
        misfit = []
        for zi in pair:
            theta = mode + np.linalg.solve(chol.T, zi)
            value, _ = negative(theta)
            misfit.append(-(value - top) + 0.5 * zi @ zi)  # l(theta) - l(m) - q(theta)
        change = misfit[1] - misfit[0]
        if not np.isfinite(change):
            check.record(False, np.inf, 1.0)
        else:
            check.record(float(np.exp(min(change, 0.0))), change, 1.0)
    return check

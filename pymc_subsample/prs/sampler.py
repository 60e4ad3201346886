r"""Pliable rejection sampling (seed 002, Alg. 1; App. B for unbounded support).

Rejection sampling from the pliable envelope :math:`E` of
:func:`~pymc_subsample.prs.fit_envelope`: propose :math:`x \sim E/\int E` and
accept with probability :math:`f(x)/E(x)`. Accepted points are i.i.d. from
:math:`f` whenever :math:`E \ge f` everywhere (the paper's event of
probability :math:`1-\delta`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from .envelope import PliableEnvelope, fit_envelope
from .proposal import MixtureProposal, ProductProposal

__all__ = ["MAX_DIM", "PliableRejectionSampler", "default_n_init"]

#: Largest dimension the tabulated envelope supports.
MAX_DIM = 3

#: Violations in one :meth:`PliableRejectionSampler.rvs` call after which it warns that the
#: target may be unbounded.
MAX_QUIET_RESTARTS = 5

#: With ``refine``, the envelope is refitted each time the evaluations grow by this factor.
REFIT_FACTOR = 1.5

#: Grid cells per dimension, by dimension (about 1e6 cells at most).
_CELLS = {1: 4096, 2: 512, 3: 64}


def default_n_init(budget: int, dim: int, smoothness: float = 2.0, refine: bool = False) -> int:
    r"""Return Alg. 1's initial sample size :math:`N = n^{(2s+d)/(3s+d)}` for budget :math:`n`.

    With ``refine`` half of it: the envelope is refitted as evaluations
    accumulate, so a cruder first one costs less than more uniform points (on
    seed 002's clutter targets, :math:`N/2` raised acceptance by 0.5–3 points
    with no more envelope violations; :math:`N/4` raised violations).
    """
    n = math.ceil(budget ** ((2 * smoothness + dim) / (3 * smoothness + dim)))
    return max(n // 2, 10) if refine else n


class PliableRejectionSampler:
    r"""Pliable rejection sampler of an unnormalized density in 1–3 dimensions.

    Alg. 1 of seed 002: evaluate :math:`f` at ``n_init`` uniform points of the
    box, fit the kernel envelope :math:`E = \kappa \hat F + r` (eq. 1–2, see
    :func:`~pymc_subsample.prs.fit_envelope` for how :math:`h`, :math:`\kappa`
    and :math:`r`, i.e. :math:`H_C`, are chosen from these evaluations), then
    rejection-sample from :math:`E`. With ``proposal`` instead of ``bounds``
    (App. B, "EPRS"), the initial points come from ``proposal`` :math:`g`,
    the box is where they found mass, and :math:`E = M g` outside it.

    Parameters
    ----------
    logpdf : callable
        Vectorized :math:`\log f`: takes points of shape ``(k, d)`` and returns
        ``k`` log densities (unnormalized; ``-inf`` allowed, NaN not).
    bounds : sequence of (low, high), optional
        The box :math:`\prod_k [low_k, high_k]` containing the support.
    proposal : frozen scipy.stats distribution(s), ProductProposal or MixtureProposal, optional
        Initial proposal :math:`g` for unbounded support: one 1-D marginal per
        dimension (a :class:`~pymc_subsample.prs.ProductProposal`), or a
        :class:`~pymc_subsample.prs.MixtureProposal` of them; its tails must
        dominate :math:`f`'s (a Student-t is a safe choice).
    n_init : int, optional
        Initial evaluations :math:`N`; default :func:`default_n_init` for a
        budget of 1e5 (halved with ``refine``).
    smoothness : float
        Smoothness :math:`s \in (0, 2]` of :math:`f` (Assumption 1).
    delta : float
        Confidence :math:`\delta \in (0, 1)` of the envelope (sets :math:`h_0`
        and the floor rate).
    envelope_scale : float, optional
        :math:`H_C` of eq. 2 in units of the mean target value; ``None`` chooses
        the envelope from the initial evaluations.
    refine : bool
        Refit the envelope, by the same rule, on all evaluations so far each
        time their number grows by half (seed 002 §5): the weights :math:`f/q` of
        points proposed from an envelope close to :math:`f` are nearly constant,
        so the estimate sharpens and acceptance rises toward 1.
    rng : int or numpy.random.Generator, optional
        Source of randomness.
    n_cells : int, optional
        Grid cells per dimension (default 4096, 512, 64 for d = 1, 2, 3).

    Attributes
    ----------
    n_evaluations : int
        Calls of :math:`f` so far (points, not batches), the initial phase included.
    n_accepted : int
        Accepted draws so far (returned or buffered).
    envelope_violations : int
        Proposals at which :math:`f(x) > E(x)` was observed.
    n_discarded : int
        Accepted draws thrown away because a violation invalidated them.
    envelope : PliableEnvelope
        The current envelope.

    Notes
    -----
    **Soundness.** Every accepted point is an exact draw from
    :math:`\min(f, E)/\int \min(f, E)` for the envelope in force. A proposal
    with :math:`f(x) > E(x)` proves that :math:`E` does not bound :math:`f`:
    the sampler counts it, raises :math:`E` to :math:`1.5 f(x)` on that cell (or
    raises :math:`M`), warns, and discards the draws of the current
    :meth:`rvs` call and the buffer, which were drawn under the violated
    envelope, then continues. Hence: **the draws a call returns are i.i.d.
    from** :math:`f` **whenever the envelope at the end of the call bounds**
    :math:`f` **everywhere**; draws returned by earlier calls, before a
    violation, came from :math:`\min(f, E_{old})` and cannot be recalled (the
    warning says so). The envelope also covers every point evaluated so far.
    No finite number of evaluations can prove :math:`E \ge f`; the violation
    count is the evidence.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_subsample.prs import PliableRejectionSampler
    >>> s = PliableRejectionSampler(lambda x: -0.5 * x[:, 0] ** 2, [(-6, 6)], rng=0)
    >>> s.rvs(1000).shape
    (1000,)
    """

    def __init__(
        self,
        logpdf: Callable[[np.ndarray], np.ndarray],
        bounds: Sequence[tuple[float, float]] | None = None,
        *,
        proposal=None,
        n_init: int | None = None,
        smoothness: float = 2.0,
        delta: float = 0.01,
        envelope_scale: float | None = None,
        refine: bool = False,
        rng: int | np.random.Generator | None = None,
        n_cells: int | None = None,
    ):
        if not callable(logpdf):
            raise TypeError("logpdf must be a callable taking points of shape (k, d)")
        if (bounds is None) == (proposal is None):
            raise ValueError(
                "give bounds=[(low, high), ...] for a target on a box (Alg. 1) or "
                "proposal=<frozen scipy.stats distribution(s)> for unbounded support (App. B), "
                "exactly one of them"
            )
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        if not 0.0 < smoothness <= 2.0:
            raise ValueError(f"smoothness must lie in (0, 2] (Assumption 1), got {smoothness!r}")
        if envelope_scale is not None and not (np.isfinite(envelope_scale) and envelope_scale > 0):
            raise ValueError(f"envelope_scale must be a positive number, got {envelope_scale!r}")
        self.rng = np.random.default_rng(rng)
        self._logpdf = logpdf
        if bounds is not None:
            box = np.asarray(bounds, dtype=float)
            if box.ndim == 1 and box.shape == (2,):
                box = box[None, :]
            if box.ndim != 2 or box.shape[1] != 2:
                raise ValueError(
                    f"bounds must be a sequence of (low, high) pairs, got shape {box.shape}"
                )
            if not np.all(np.isfinite(box)):
                raise ValueError(
                    f"bounds must be finite, got {bounds!r}; for unbounded support "
                    "pass proposal= instead"
                )
            if np.any(box[:, 0] >= box[:, 1]):
                raise ValueError(f"every bound needs low < high, got {bounds!r}")
            self.dim = box.shape[0]
            self._box = (box[:, 0].copy(), box[:, 1].copy())
            self._g = None
        else:
            if isinstance(proposal, ProductProposal | MixtureProposal):
                self._g = proposal
            else:
                self._g = ProductProposal(proposal)
            self.dim = self._g.dim
            self._box = None
        if self.dim > MAX_DIM:
            raise ValueError(
                f"dimension {self.dim} is above the maximum {MAX_DIM}: rejection from a "
                "tabulated envelope needs exponentially many cells; use MCMC (NUTS) instead"
            )
        if n_init is None:
            n_init = default_n_init(100_000, self.dim, smoothness, refine)
        if int(n_init) != n_init or n_init < 10:
            raise ValueError(f"n_init must be an integer >= 10, got {n_init!r}")
        self.n_init = int(n_init)
        self.smoothness = float(smoothness)
        self.delta = float(delta)
        self.envelope_scale = envelope_scale
        self.refine = bool(refine)
        self.n_cells = int(n_cells or _CELLS[self.dim])
        self.n_evaluations = 0
        self.n_accepted = 0
        self.envelope_violations = 0
        self.n_discarded = 0
        self.n_refits = 0
        self._buffer = np.empty((0, self.dim))
        self._design()

    # -- evaluation ----------------------------------------------------------------

    def _evaluate(self, x: np.ndarray) -> np.ndarray:
        out = np.asarray(self._logpdf(x), dtype=float)
        if out.shape != (len(x),):
            raise ValueError(
                f"logpdf returned shape {out.shape} for {len(x)} points of shape {x.shape}; "
                f"it must return one log density per point, shape ({len(x)},)"
            )
        if np.isnan(out).any() or np.isposinf(out).any():
            bad = x[np.isnan(out) | np.isposinf(out)][0]
            raise ValueError(
                f"logpdf returned NaN or +inf at {bad}: return -inf where the density is zero"
            )
        self.n_evaluations += len(x)
        return out

    def _design(self) -> None:
        """Run the initial phase: evaluate f at n_init design points, fit the envelope."""
        t = self.n_init
        if self._g is None:
            lo, hi = self._box
            x = lo + (hi - lo) * self.rng.random((t, self.dim))
            log_q = np.full(t, -np.sum(np.log(hi - lo)))
        else:
            x = self._g.sample(t, self.rng)
            log_q = self._g.logpdf(x)
        log_f = self._evaluate(x)
        if not np.isfinite(log_f).any():
            raise ValueError(
                f"the target is zero (logpdf = -inf) at all {t} initial points: check the "
                "bounds or proposal cover its support, or raise n_init"
            )
        if self._box is None:
            lo, hi = self._mass_box(x, log_f, log_q)
        self._lo, self._hi = lo, hi
        self._points = [x]
        self._log_f = [log_f]
        self._log_q = [log_q]
        self._fit(x, log_f, log_q)
        self._next_refit = REFIT_FACTOR * t

    def _mass_box(self, x, log_f, log_q) -> tuple[np.ndarray, np.ndarray]:
        """App. B: the box of the weighted 1e-4 and 1 - 1e-4 quantiles, widened by half.

        Weights are :math:`f/g` (importance weights of the initial draws).
        """
        w = np.exp(log_f - log_q - np.max(log_f - log_q))
        lo, hi = np.empty(self.dim), np.empty(self.dim)
        for k in range(self.dim):
            order = np.argsort(x[:, k])
            cum = np.cumsum(w[order]) / w.sum()
            lo[k] = x[order[np.searchsorted(cum, 1e-4)], k]
            hi[k] = x[order[min(np.searchsorted(cum, 1 - 1e-4), len(cum) - 1)], k]
        spread = np.maximum(hi - lo, 1e-3 * np.maximum(np.abs(lo) + np.abs(hi), 1.0))
        return lo - 0.5 * spread, hi + 0.5 * spread

    def _fit(self, x, log_f, log_q) -> None:
        self.envelope: PliableEnvelope = fit_envelope(
            x,
            log_f,
            log_q,
            self._lo,
            self._hi,
            n_cells=self.n_cells,
            smoothness=self.smoothness,
            delta=self.delta,
            envelope_scale=self.envelope_scale,
            tail=self._g,
        )

    def _maybe_refit(self) -> None:
        if not self.refine or self.n_evaluations < self._next_refit:
            return
        x, log_f, log_q = (np.concatenate(a) for a in (self._points, self._log_f, self._log_q))
        self._points, self._log_f, self._log_q = [x], [log_f], [log_q]
        self._fit(x, log_f, log_q)
        self.n_refits += 1
        self._next_refit = REFIT_FACTOR * self.n_evaluations

    # -- sampling -----------------------------------------------------------------------

    @property
    def acceptance_rate(self) -> float:
        """Accepted draws over evaluations of :math:`f`, the initial phase included."""
        return self.n_accepted / max(self.n_evaluations, 1)

    def rvs(self, size: int) -> np.ndarray:
        """Return exactly ``size`` draws, shape ``(size, d)`` (``(size,)`` when d = 1)."""
        if int(size) != size or size < 0:
            raise ValueError(f"size must be a non-negative integer, got {size!r}")
        size = int(size)
        out = [self._buffer]
        restarts = 0
        have = len(self._buffer)
        while have < size:
            env = self.envelope
            rate = max(self._recent_rate(), 0.05)
            # batches grow with the evaluations so far: a violation wastes the rest of one
            k = int(min((size - have) / rate * 1.05 + 16, 1024 + self.n_evaluations // 16))
            x = env.sample(k, self.rng)
            log_e = env.log_value(x)
            log_f = self._evaluate(x)
            log_q = log_e - env.log_mass
            if self.refine:  # only a refit reads the evaluated points
                self._points.append(x)
                self._log_f.append(log_f)
                self._log_q.append(log_q)
            ratio = log_f - log_e
            accept = np.log(self.rng.random(k)) < ratio
            violated = ratio > 1e-12
            if violated.any():
                first = int(np.argmax(violated))
                n_viol = env.cover(x, log_f)
                self.envelope_violations += n_viol
                self.n_discarded += have
                self.n_accepted -= have
                warnings.warn(
                    f"PliableRejectionSampler: the envelope was below the target at "
                    f"{n_viol} proposal(s) (first at {x[first]}, f/E = "
                    f"{np.exp(ratio[first]):.3g}); it was raised there and the {have} "
                    "draw(s) of this call made under it were discarded. Draws returned by "
                    "earlier calls came from min(f, E). Raise n_init, lower smoothness or "
                    "pass envelope_scale to avoid this",
                    RuntimeWarning,
                    stacklevel=2,
                )
                out, have = [np.empty((0, self.dim))], 0
                restarts += 1
                if restarts == MAX_QUIET_RESTARTS:
                    warnings.warn(
                        f"PliableRejectionSampler: {restarts} envelope violations in one call; "
                        "the target may be unbounded or have spikes narrower than the grid "
                        "(Assumption 1 of seed 002 needs a bounded, smooth density). Each "
                        "violation restarts the call: draw in smaller calls, or transform the "
                        "variable so that its density is bounded",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                continue
            acc = x[accept]
            self.n_accepted += len(acc)
            self._last = (k, len(acc))
            out.append(acc)
            have += len(acc)
            self._maybe_refit()
        draws = np.concatenate(out)
        self._buffer = draws[size:]
        draws = draws[:size]
        return draws[:, 0] if self.dim == 1 else draws

    def _recent_rate(self) -> float:
        k, a = getattr(self, "_last", (1, 1))
        return a / k

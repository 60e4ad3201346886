r"""The one rejection loop: build a pliable envelope, then draw from it.

Both :class:`~pymc_subsample.prs.PliableRejectionSampler` and the PyMC step
:class:`~pymc_subsample.PliableRejection` use these functions (Erraqabi et al.
2016, Alg. 1 and App. B):

* :func:`build_envelope` runs the initial phase: it evaluates :math:`\log f`
  at ``n_init`` design points (uniform on a box, or drawn from an initial
  proposal :math:`g`) and fits the envelope :math:`E` to them
  (:func:`~pymc_subsample.prs.fit_envelope`);
* :func:`refit_envelope` refits :math:`E` on more evaluated points (the
  refinement of the paper's Sec. 5);
* :func:`draw` proposes :math:`x \sim E/\int E`, evaluates :math:`f(x)` and
  accepts with probability :math:`\min(1, f(x)/E(x))`, so that accepted points
  are exact draws of :math:`\min(f, E)/\int \min(f, E)`; it either repairs the
  envelope on a violation :math:`f(x) > E(x)` and restarts (the standalone
  sampler) or only counts it (the Metropolized step, which corrects for it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..validation import check_choice, check_int
from .envelope import PliableEnvelope, default_n_cells, fit_envelope
from .proposal import MixtureProposal, ProductProposal

__all__ = ["Design", "Draws", "build_envelope", "draw", "evaluate", "refit_envelope"]

#: Violations in one :func:`draw` call after which it warns that the target may be unbounded.
MAX_QUIET_RESTARTS = 5


def evaluate(logpdf: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    r"""Return :math:`\log f(x)` for points ``x`` of shape ``(k, d)``, checked.

    Raises
    ------
    ValueError
        If ``logpdf`` does not return one finite-or-``-inf`` value per point.
    """
    out = np.asarray(logpdf(x), dtype=float)
    if out.shape == () and len(x) == 1:  # scipy's logpdf squeezes a single point
        out = out.reshape(1)
    if out.shape != (len(x),):
        raise ValueError(
            f"logpdf returned shape {out.shape} for {len(x)} points of shape {x.shape}; "
            f"it must return one log density per point, shape ({len(x)},)"
        )
    bad = np.isnan(out) | np.isposinf(out)
    if bad.any():
        raise ValueError(
            f"logpdf returned NaN or +inf at {x[bad][0]}: return -inf where the density is zero"
        )
    return out


@dataclass
class Design:
    r"""Evaluated points with their log target and log proposal densities.

    :math:`X_i`, :math:`\log f(X_i)` and the log density :math:`\log q_i(X_i)`
    each was drawn from: what :func:`fit_envelope` reads. Chunks are appended
    cheaply and concatenated on first read.
    """

    dim: int
    _chunks: list = field(default_factory=list, repr=False)

    def append(self, x: np.ndarray, log_f: np.ndarray, log_q: np.ndarray) -> None:
        """Add points of shape ``(k, d)`` with their log target and log proposal values."""
        self._chunks.append((x, log_f, log_q))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(x, log_f, log_q)``, all points so far."""
        if len(self._chunks) != 1:
            if not self._chunks:
                return np.empty((0, self.dim)), np.empty(0), np.empty(0)
            self._chunks = [tuple(np.concatenate(a) for a in zip(*self._chunks, strict=True))]
        return self._chunks[0]

    def __len__(self) -> int:
        return sum(len(c[1]) for c in self._chunks)


def _check_box(bounds) -> tuple[np.ndarray, np.ndarray]:
    box = np.asarray(bounds, dtype=float)
    if box.ndim == 1 and box.shape == (2,):
        box = box[None, :]
    if box.ndim != 2 or box.shape[1] != 2:
        raise ValueError(f"bounds must be a sequence of (low, high) pairs, got shape {box.shape}")
    if not np.all(np.isfinite(box)):
        raise ValueError(
            f"bounds must be finite, got {bounds!r}; for unbounded support pass proposal= instead"
        )
    if np.any(box[:, 0] >= box[:, 1]):
        raise ValueError(f"every bound needs low < high, got {bounds!r}")
    return box[:, 0].copy(), box[:, 1].copy()


#: The box of App. B is stretched to span every evaluated point within this many nats of
#: the largest :math:`\log f` seen (:func:`_stretch_box`).
BOX_LEVEL = float(np.log(1e4))


def _mass_box(x, log_f, log_q) -> tuple[np.ndarray, np.ndarray]:
    """App. B: the box of the weighted 1e-4 and 1 - 1e-4 quantiles, widened by half.

    Weights are :math:`f/g` (importance weights of the initial draws).
    """
    d = x.shape[1]
    w = np.exp(log_f - log_q - np.max(log_f - log_q))
    lo, hi = np.empty(d), np.empty(d)
    for k in range(d):
        order = np.argsort(x[:, k])
        cum = np.cumsum(w[order]) / w.sum()
        lo[k] = x[order[np.searchsorted(cum, 1e-4)], k]
        hi[k] = x[order[min(np.searchsorted(cum, 1 - 1e-4), len(cum) - 1)], k]
    spread = np.maximum(hi - lo, 1e-3 * np.maximum(np.abs(lo) + np.abs(hi), 1.0))
    return lo - 0.5 * spread, hi + 0.5 * spread


def _stretch_box(lo, hi, x, log_f, known=None) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the smallest box that holds ``[lo, hi]`` and the points near the top of :math:`f`.

    Those are the points, ``x`` and the ``known`` ones, with
    :math:`\log f \ge \max \log f -` :data:`BOX_LEVEL`. Weighted quantiles of a few hundred draws
    of :math:`g` miss a region that holds little of :math:`g`'s mass, such as a narrow
    ridge of :math:`f` (the neck of a funnel, where :math:`f` stays near its largest
    value), and outside the box the envelope :math:`M g` has one constant :math:`M`
    for all of it.
    """
    z, log_fz = x, log_f
    if known is not None:
        z, log_fz = np.concatenate([x, known[0]]), np.concatenate([log_f, known[1]])
    high = log_fz >= np.max(log_fz) - BOX_LEVEL
    return np.minimum(lo, z[high].min(axis=0)), np.maximum(hi, z[high].max(axis=0))


def build_envelope(
    logpdf: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    n_init: int,
    *,
    bounds: Sequence[tuple[float, float]] | None = None,
    proposal: ProductProposal | MixtureProposal | None = None,
    smoothness: float = 2.0,
    delta: float = 0.01,
    envelope_scale: float | None = None,
    n_cells: int | None = None,
    design: str = "two-stage",
    estimator: str = "auto",
    known: tuple[np.ndarray, np.ndarray] | None = None,
) -> PliableEnvelope:
    r"""Run the initial phase of PRS and return the fitted envelope.

    With ``bounds`` (Alg. 1) the ``n_init`` design points are uniform on the
    box :math:`\prod_k [low_k, high_k]`, :math:`q_i = 1/V`. With ``proposal``
    :math:`g` (App. B, EPRS) they are draws of :math:`g`, :math:`q_i = g`; the
    envelope's box is spanned by their :math:`f/g`-weighted :math:`10^{-4}` and
    :math:`1 - 10^{-4}` quantiles widened by half (the core), stretched to hold
    every point evaluated, initial or ``known``, within :data:`BOX_LEVEL` of the
    largest :math:`\log f`, and :math:`E = M g` outside it. Only design points in
    the core choose the estimate's scales; beyond it the envelope covers the
    evaluated points (a narrow ridge there, thinner than a cell, would otherwise
    force the scales up everywhere).
    The envelope :math:`E` is then :func:`~pymc_subsample.prs.fit_envelope`'s
    fit to :math:`(X_i, \log f(X_i), \log q_i(X_i))`.

    With ``design="two-stage"`` (default; a coarse-to-fine design, which the
    paper leaves open) only a quarter of the ``n_init`` points are laid out so;
    a first envelope fitted to them proposes the other three quarters
    (:math:`q_i = E_1/\int E_1`, no accept step), which therefore land where
    the mass is, and the envelope is fitted to all ``n_init``. On a target
    whose modes cover a small part of the box (the clutter posterior in 2-D)
    this puts far more points in the modes (see the results pages).
    ``"uniform"`` is Alg. 1's single stage.

    Parameters
    ----------
    logpdf : callable
        Vectorized :math:`\log f` (unnormalized): points ``(k, d)`` to ``k`` values.
    rng : numpy.random.Generator
        Source of randomness.
    n_init : int
        Evaluations of :math:`f` in the initial phase, :math:`N` (at least 10).
    bounds, proposal
        Exactly one of them: the box, or the initial proposal :math:`g`.
    smoothness, delta, envelope_scale, n_cells, estimator
        As in :func:`~pymc_subsample.prs.fit_envelope` (``n_cells`` defaults to
        :func:`~pymc_subsample.prs.default_n_cells`).
    design : {"two-stage", "uniform"}
        How the ``n_init`` points are chosen (see above).
    known : (numpy.ndarray, numpy.ndarray), optional
        Points of shape ``(J, d)`` and their :math:`\log f`, evaluated by the caller
        before (a mode search): with ``proposal``, the box spans those within
        :data:`BOX_LEVEL` of the highest value, and every envelope covers those in its
        box (``fit_envelope``'s ``known``).

    Returns
    -------
    PliableEnvelope
        With ``design`` (a :class:`Design` of the ``n_init`` points),
        ``n_evaluations`` (= ``n_init``) and the fit settings attached, which
        :func:`refit_envelope` reuses.
    """
    if (bounds is None) == (proposal is None):
        raise ValueError(
            "give bounds=[(low, high), ...] for a target on a box (Alg. 1) or "
            "proposal=<frozen scipy.stats distribution(s)> for unbounded support (App. B), "
            "exactly one of them"
        )
    n_init = check_int("n_init", n_init, low=10, example=1000)
    check_choice("design", design, ("two-stage", "uniform"))
    first = max(n_init // 4, 10) if design == "two-stage" else n_init
    if bounds is not None:
        lo, hi = _check_box(bounds)
        dim = len(lo)
        x = lo + (hi - lo) * rng.random((first, dim))
        log_q = np.full(first, -np.sum(np.log(hi - lo)))
    else:
        dim = proposal.dim
        x = proposal.sample(first, rng)
        log_q = proposal.logpdf(x)
    log_f = evaluate(logpdf, x)
    if not np.isfinite(log_f).any():
        raise ValueError(
            f"the target is zero (logpdf = -inf) at all {first} initial points: check the "
            "bounds or proposal cover its support, or raise n_init"
        )
    if known is not None:  # only finite values: -inf needs no cover, NaN or +inf cannot have one
        z, log_fz = np.asarray(known[0], dtype=float).reshape(-1, dim), np.asarray(known[1], float)
        keep = np.isfinite(log_fz)
        known = (z[keep], log_fz[keep]) if keep.any() else None
    core = None
    if bounds is None:
        core = _mass_box(x, log_f, log_q)
        lo, hi = _stretch_box(*core, x, log_f, known)
    record = Design(dim)
    record.append(x, log_f, log_q)
    settings = {
        "n_cells": int(n_cells or default_n_cells(dim)),
        "smoothness": float(smoothness),
        "delta": float(delta),
        "envelope_scale": envelope_scale,
        "tail": proposal,
        "estimator": estimator,
        "known": known,
        "core": core,
    }
    env = fit_envelope(x, log_f, log_q, lo, hi, **settings)
    if n_init > first:  # second stage: modes of the first envelope, then proposals from it
        spent = first + _mode_search(env, logpdf, record, budget=(n_init - first) // 4)
        x2 = env.sample(n_init - spent, rng)
        record.append(x2, evaluate(logpdf, x2), env.log_value(x2) - env.log_mass)
        env = fit_envelope(*record.arrays(), lo, hi, **settings)
    env.design, env.settings, env.n_evaluations = record, settings, n_init
    return env


#: Modes of the first envelope searched by the two-stage design.
N_MODES = 4


def _mode_search(env: PliableEnvelope, logpdf, record: Design, budget: int) -> int:
    r"""Climb :math:`\log f` from the first envelope's highest local maxima; return evaluations.

    A smoothed estimate is lowest, relative to :math:`f`, at a mode, exactly
    where no design point may lie; the leave-one-out check of
    :func:`fit_envelope` can only see that bias at evaluated points. Nelder–Mead
    from up to :data:`N_MODES` separated local maxima of the table (at most
    ``budget`` evaluations in all) puts points at the modes (points more than
    20 times above :math:`E_1` are dropped: a climb into a singularity). They join the
    design with :math:`\log q = \log E_1 - \log\int E_1`, the density of
    the proposals that follow (any positive weight is sound: the envelope is
    checked, not assumed, to cover them).
    """
    from scipy import ndimage, optimize

    if budget < 10:
        return 0
    shape = (env.n_cells,) * env.dim
    table = env.log_cells.reshape(shape)
    peaks = np.flatnonzero(
        (table == ndimage.maximum_filter(table, size=5, mode="nearest")).ravel()
        & np.isfinite(env.log_cells)
    )
    peaks = peaks[np.argsort(-env.log_cells[peaks])][:N_MODES]
    centres = env.lo + (np.column_stack(np.unravel_index(peaks, shape)) + 0.5) * env.width
    seen_x, seen_f = [], []
    calls = [0]

    def neg(z):
        if calls[0] >= budget:
            raise StopIteration
        calls[0] += 1
        z = np.clip(z, env.lo, env.hi)
        value = float(np.asarray(logpdf(z[None, :]), dtype=float).ravel()[0])
        if np.isnan(value) or value == np.inf:  # an unbounded density: left to draw() to report
            return 1e300
        seen_x.append(z)
        seen_f.append(value)
        return -value if np.isfinite(value) else 1e300

    per_start = max(budget // max(len(centres), 1), 5)
    for c in centres:
        try:
            optimize.minimize(
                neg,
                c,
                method="Nelder-Mead",
                options={
                    "maxfev": per_start,
                    "initial_simplex": c + np.vstack([np.zeros(env.dim), np.diag(2 * env.width)]),
                    "xatol": 1e-3 * float(np.min(env.width)),
                    "fatol": 1e-3,
                },
            )
        except StopIteration:
            break
    if seen_x:
        x, log_f = np.array(seen_x), np.array(seen_f)
        log_e = env.log_value(x)
        # a climb that ends 20 times above the first envelope found a spike (an
        # unbounded density), not a smooth mode: keep it out of the fit
        keep = log_f <= log_e + 3.0
        record.append(x[keep], log_f[keep], log_e[keep] - env.log_mass)
    return calls[0]


def refit_envelope(envelope: PliableEnvelope) -> PliableEnvelope:
    r"""Refit ``envelope`` on every point of its ``design`` (same box, tail and settings).

    Points proposed from an envelope :math:`E` enter with :math:`q = E/\int E`,
    so the importance-weighted estimate stays unbiased for :math:`f * K_h`.
    """
    x, log_f, log_q = envelope.design.arrays()
    env = fit_envelope(x, log_f, log_q, envelope.lo, envelope.hi, **envelope.settings)
    env.design, env.settings = envelope.design, envelope.settings
    env.n_evaluations = envelope.n_evaluations
    return env


@dataclass
class Draws:
    r"""What :func:`draw` returns.

    Attributes
    ----------
    x : numpy.ndarray
        Accepted points, shape ``(k, d)``, in proposal order: at least ``size``
        (the last batch's surplus included, for the caller to keep or drop), or
        fewer when ``max_proposals`` ran out.
    log_f, log_e : numpy.ndarray
        :math:`\log f` and :math:`\log E` at them.
    n_evaluations : int
        Evaluations of :math:`f` (proposals) made by the call.
    violations : int
        Proposals with :math:`f(x) > E(x)`.
    n_discarded : int
        Accepted draws thrown away because a later violation invalidated them
        (``repair=True`` only).
    n_tried : int
        Proposals up to and including the ``size``-th accepted one (all of them
        if fewer were accepted): the evaluations the draws needed, without the
        rest of the last batch.
    """

    x: np.ndarray
    log_f: np.ndarray
    log_e: np.ndarray
    n_evaluations: int = 0
    violations: int = 0
    n_discarded: int = 0
    n_tried: int = 0


def draw(
    envelope: PliableEnvelope,
    logpdf: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    size: int = 1,
    *,
    repair: bool = True,
    rate: float = 0.5,
    max_proposals: int | None = None,
    max_batch: int = 1 << 16,
    record: Design | None = None,
) -> Draws:
    r"""Rejection-sample ``size`` points from :math:`\min(f, E)`.

    Proposes :math:`x \sim E/\int E` in batches, evaluates :math:`f(x)` and
    accepts with probability :math:`\min(1, f(x)/E(x))`. A batch holds about the
    expected number of proposals, :math:`\lceil n/\text{rate}\rceil` for
    :math:`n` draws still missing (:math:`\lceil 0.7/\text{rate}\rceil` for the
    last one, so that a step at high acceptance evaluates one point), at most
    ``max_batch``.

    Parameters
    ----------
    envelope : PliableEnvelope
        :math:`E`; changed in place on a violation when ``repair``.
    logpdf : callable
        Vectorized :math:`\log f`.
    rng : numpy.random.Generator
        Source of randomness.
    size : int
        Number of draws wanted.
    repair : bool
        On a proposal with :math:`f(x) > E(x)`: raise :math:`E` there
        (:meth:`~pymc_subsample.prs.PliableEnvelope.cover`), warn, discard the
        draws of this call (made under the violated envelope) and continue, so
        that the returned draws are i.i.d. from :math:`f` whenever the final
        envelope bounds :math:`f`. ``False``: only count violations (accepted
        points are then draws of :math:`\min(f, E)`, which a Metropolized step
        corrects for).
    rate : float
        Expected acceptance rate, for the batch size.
    max_proposals : int, optional
        Stop after this many proposals even if fewer than ``size`` were accepted.
    max_batch : int
        Largest batch (a violation wastes the rest of one).
    record : Design, optional
        If given, every proposal is appended with :math:`\log q = \log E - \log\int E`
        (for :func:`refit_envelope`).

    Returns
    -------
    Draws
    """
    dim = envelope.dim
    out_x, out_f, out_e = [], [], []
    have = n_eval = violations = discarded = restarts = 0
    n_tried = None
    rate = float(np.clip(rate, 0.01, 1.0))
    while have < size and (max_proposals is None or n_eval < max_proposals):
        need = size - have
        k = int(np.ceil((need if need > 1 else 0.7) / rate))
        k = max(1, min(k, max_batch, (max_proposals - n_eval) if max_proposals else k))
        x = envelope.sample(k, rng)
        log_e = envelope.log_value(x)
        log_f = evaluate(logpdf, x)
        n_eval += k
        if record is not None:
            record.append(x, log_f, log_e - envelope.log_mass)
        ratio = log_f - log_e
        violated = ratio > 1e-12
        accept = np.log(rng.random(k)) < np.minimum(ratio, 0.0)
        if violated.any() and repair:
            first = int(np.argmax(violated))
            n_viol = envelope.cover(x, log_f)
            violations += n_viol
            discarded += have
            warnings.warn(
                f"pliable rejection: the envelope was below the target at {n_viol} "
                f"proposal(s) (first at {x[first]}, f/E = {np.exp(ratio[first]):.3g}); it was "
                f"raised there and the {have} draw(s) of this call made under it were "
                "discarded. Draws returned by earlier calls came from min(f, E). Raise "
                "n_init, lower smoothness or pass envelope_scale to avoid this",
                RuntimeWarning,
                stacklevel=3,
            )
            out_x, out_f, out_e, have = [], [], [], 0
            restarts += 1
            if restarts == MAX_QUIET_RESTARTS:
                warnings.warn(
                    f"pliable rejection: {restarts} envelope violations in one call; the "
                    "target may be unbounded or have spikes narrower than the grid "
                    "(Erraqabi et al. 2016, Assumption 1, needs a bounded, smooth density). "
                    "Each violation restarts the call: draw in smaller calls, or transform "
                    "the variable so that its density is bounded",
                    RuntimeWarning,
                    stacklevel=3,
                )
            continue
        violations += int(violated.sum())
        idx = np.flatnonzero(accept)
        if have + len(idx) >= size and n_tried is None:
            n_tried = n_eval - k + int(idx[need - 1]) + 1 if need > 0 else n_eval - k
        out_x.append(x[idx])
        out_f.append(log_f[idx])
        out_e.append(log_e[idx])
        have += len(idx)
    if out_x:
        xs, fs, es = np.concatenate(out_x), np.concatenate(out_f), np.concatenate(out_e)
    else:
        xs, fs, es = np.empty((0, dim)), np.empty(0), np.empty(0)
    return Draws(xs, fs, es, n_eval, violations, discarded, n_eval if n_tried is None else n_tried)

r"""Pliable rejection sampling (Erraqabi et al. 2016, Alg. 1; App. B for unbounded support).

Rejection sampling from the pliable envelope :math:`E` of
:func:`~pymc_subsample.prs.build_envelope`: propose :math:`x \sim E/\int E` and
accept with probability :math:`f(x)/E(x)` (:func:`~pymc_subsample.prs.draw`).
Accepted points are i.i.d. from :math:`f` whenever :math:`E \ge f` everywhere
(the paper's event of probability :math:`1-\delta`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..validation import check_bool, check_choice, check_float, check_int, check_probability
from .envelope import MAX_DIM, PliableEnvelope
from .proposal import MixtureProposal, ProductProposal
from .rejection import Design, build_envelope, draw, refit_envelope

__all__ = ["PliableRejectionSampler", "check_envelope_settings", "default_n_init"]

#: With ``refine``, the envelope is refitted each time the evaluations grow by this factor.
REFIT_FACTOR = 1.5


def default_n_init(budget: int, dim: int, smoothness: float = 2.0, refine: bool = False) -> int:
    r"""Return Alg. 1's initial sample size :math:`N = n^{(2s+d)/(3s+d)}` for budget :math:`n`.

    With ``refine`` half of it: the envelope is refitted as evaluations
    accumulate, so a cruder first one costs less than more uniform points (on
    Erraqabi et al.'s (2016) clutter targets, :math:`N/2` raised acceptance by 0.5–3 points
    with no more envelope violations; :math:`N/4` raised violations).
    """
    n = math.ceil(budget ** ((2 * smoothness + dim) / (3 * smoothness + dim)))
    return max(n // 2, 10) if refine else n


def check_envelope_settings(
    n_init, smoothness, delta, refine, *, delta_name: str = "delta"
) -> tuple[int | None, float, float, bool]:
    r"""Validate the envelope settings shared by the sampler and the PyMC step.

    Returns ``(n_init, smoothness, delta, refine)`` in their canonical types;
    ``delta_name`` is the name the caller gives :math:`\delta` (the step's
    ``envelope_error``), for the messages.

    Raises
    ------
    ArgumentTypeError, ValueError
        For a setting of the wrong type or range
        (:mod:`pymc_subsample.validation`).
    """
    delta = check_probability(delta_name, delta, example=0.01)
    smoothness = check_float(
        "smoothness", smoothness, low=0.0, high=2.0, low_open=True, example=2.0,
        why=" (the Hölder exponent of Assumption 1 of Erraqabi et al. 2016)",
    )  # fmt: skip
    n_init = check_int("n_init", n_init, low=10, example=1000, special=(None,))
    refine = check_bool("refine", refine, example=False)
    return n_init, smoothness, delta, refine


class PliableRejectionSampler:
    r"""Pliable rejection sampler of an unnormalized density in 1–3 dimensions.

    Alg. 1 of Erraqabi et al. (2016): evaluate :math:`f` at ``n_init`` points of the
    box (two-stage design by default), fit the envelope :math:`E = \kappa \hat F + r`
    (eq. 1–2, with :math:`\hat F` the kernel estimate or a log-space
    local-linear one; see :func:`~pymc_subsample.prs.fit_envelope` for how
    :math:`h`, :math:`\kappa` and :math:`r`, i.e. :math:`H_C`, are chosen from
    these evaluations), then rejection-sample from :math:`E`. With ``proposal``
    instead of ``bounds`` (App. B, "EPRS"), the initial points come from ``proposal`` :math:`g`,
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
        time their number grows by half (the paper's Sec. 5): the weights :math:`f/q` of
        points proposed from an envelope close to :math:`f` are nearly constant,
        so the estimate sharpens and acceptance rises toward 1.
    rng : int or numpy.random.Generator, optional
        Source of randomness.
    n_cells : int, optional
        Grid cells per dimension (default :func:`~pymc_subsample.prs.default_n_cells`).
    design : {"two-stage", "uniform"}
        Initial design (:func:`~pymc_subsample.prs.build_envelope`): a quarter of
        ``n_init`` uniform (or from ``proposal``), the rest proposed by a first
        envelope (default); or Alg. 1's single stage.
    estimator : {"auto", "log-linear", "kernel"}
        The estimate the envelope scales (:func:`~pymc_subsample.prs.fit_envelope`).

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
        design: str = "two-stage",
        estimator: str = "auto",
    ):
        if not callable(logpdf):
            raise TypeError(
                f"logpdf must be a callable taking points of shape (k, d), got {logpdf!r}; "
                "e.g. logpdf=lambda x: -0.5 * (x**2).sum(axis=1)"
            )
        n_init, smoothness, delta, refine = check_envelope_settings(
            n_init, smoothness, delta, refine
        )
        envelope_scale = check_float(
            "envelope_scale", envelope_scale, low=0.0, low_open=True, special=(None,)
        )
        n_cells = check_int("n_cells", n_cells, low=2, example=64, special=(None,))
        check_choice("design", design, ("two-stage", "uniform"))
        check_choice("estimator", estimator, ("auto", "log-linear", "kernel"))
        if proposal is not None and not isinstance(proposal, ProductProposal | MixtureProposal):
            proposal = ProductProposal(proposal)
        if bounds is not None and proposal is None:
            dim = np.atleast_2d(np.asarray(bounds, dtype=float)).shape[0]
        elif proposal is not None and bounds is None:
            dim = proposal.dim
        else:
            dim = None  # build_envelope says which argument is missing
        if dim is not None and dim > MAX_DIM:
            raise ValueError(
                f"dimension {dim} is above the maximum {MAX_DIM}: rejection from a "
                "tabulated envelope needs exponentially many cells; use MCMC (NUTS) instead"
            )
        self.rng = np.random.default_rng(rng)
        self._logpdf = logpdf
        self.refine = bool(refine)
        if n_init is None:
            n_init = default_n_init(100_000, dim or 1, smoothness, self.refine)
        self.envelope: PliableEnvelope = build_envelope(
            logpdf,
            self.rng,
            n_init,
            bounds=bounds,
            proposal=proposal,
            smoothness=smoothness,
            delta=delta,
            envelope_scale=envelope_scale,
            n_cells=n_cells,
            design=design,
            estimator=estimator,
        )
        self.dim = self.envelope.dim
        self.n_init = int(n_init)
        self.smoothness = float(smoothness)
        self.delta = float(delta)
        self.envelope_scale = envelope_scale
        self.n_cells = self.envelope.n_cells
        self.n_evaluations = self.n_init
        self.n_accepted = 0
        self.envelope_violations = 0
        self.n_discarded = 0
        self.n_refits = 0
        self._rate = 0.5
        self._buffer = np.empty((0, self.dim))
        self._next_refit = REFIT_FACTOR * self.n_init

    @property
    def acceptance_rate(self) -> float:
        """Accepted draws over evaluations of :math:`f`, the initial phase included."""
        return self.n_accepted / max(self.n_evaluations, 1)

    def rvs(self, size: int) -> np.ndarray:
        """Return exactly ``size`` draws, shape ``(size, d)`` (``(size,)`` when d = 1).

        Draws come from :func:`~pymc_subsample.prs.draw` with ``repair=True``;
        with ``refine`` the call pauses to refit the envelope each time the
        evaluations pass the next refit point.
        """
        size = check_int("size", size, low=0, example=1000)
        out, have = [self._buffer], len(self._buffer)
        record: Design | None = self.envelope.design if self.refine else None
        while have < size:
            want = size - have
            if self.refine:  # stop at the next refit point
                left = max(self._next_refit - self.n_evaluations, 1.0)
                want = max(1, min(want, int(left * self._rate) + 1))
            res = draw(
                self.envelope,
                self._logpdf,
                self.rng,
                want,
                repair=True,
                rate=self._rate,
                max_batch=1024 + self.n_evaluations // 16,
                record=record,
            )
            self.n_evaluations += res.n_evaluations
            self.envelope.n_evaluations = self.n_evaluations
            self.envelope_violations += res.violations
            if res.violations:  # earlier draws of this call were made under the old envelope
                self.n_discarded += have + res.n_discarded
                self.n_accepted -= have
                out, have = [np.empty((0, self.dim))], 0
            self.n_accepted += len(res.x)
            self._rate = max(len(res.x) / max(res.n_evaluations, 1), 0.05)
            out.append(res.x)
            have += len(res.x)
            if self.refine and self.n_evaluations >= self._next_refit:
                self.envelope = refit_envelope(self.envelope)
                self.n_refits += 1
                self._next_refit = REFIT_FACTOR * self.n_evaluations
        draws = np.concatenate(out)
        self._buffer = draws[size:]
        draws = draws[:size]
        return draws[:, 0] if self.dim == 1 else draws

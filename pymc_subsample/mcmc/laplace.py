r"""The Laplace fit of a RacingMetropolis block: the surrogate at the mode and the mass matrix.

At its first draw, RacingMetropolis finds the mode :math:`\hat\theta` of the
block's log posterior by Newton's method (:mod:`~pymc_subsample.mcmc.mode`) and
keeps the second-order expansion :math:`h_n` of the terms there (Bardenet,
Doucet & Holmes 2017; Cornish et al. 2019): by automatic differentiation
(:class:`~pymc_subsample.mcmc.surrogate.TaylorSurrogate`), a finite-difference
stencil (:class:`~pymc_subsample.mcmc.surrogate.QuadraticSurrogate`), and
optionally in Deterministics of the block
(:class:`~pymc_subsample.mcmc.surrogate.CoordinateSurrogate`). The expansion
is the races' control variate (:meth:`LaplaceFit.residual_rewards`) and the HMC
proposal's surrogate; :math:`M = -\nabla^2(\log f_0 + \sum_n h_n)(\hat\theta)`
is the proposals' mass matrix (the Laplace approximation's precision).

The terms may read other value variables :math:`\psi` that other steps move.
The exact sums of :math:`h_n` hold for one value of :math:`\psi`, and a race
reads its residuals at the current one, so the sums are kept per value of
:math:`\psi` (:class:`~pymc_subsample.model.expansion_cache.ExpansionCache`)
and recomputed with a full pass at a value not among the last few seen (with
Newton steps that move the reference where :math:`\psi` moved the block's mode
away from it); the proposal's surrogate and mass matrix are those at
:math:`\psi` too. Where :math:`\psi` changes at most draws (a continuous
variable sampled by another step), each draw pays that pass: the step stays
right up to :math:`\delta` but saves little, and warns
(:meth:`LaplaceFit.watch_refits`), naming the inputs to put in its block.

Reads the model only through the step's
:class:`~pymc_subsample.model.terms.ObservationTerms`.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..model.expansion_cache import ExpansionCache, inputs_key
from .mode import (
    LogPosterior,
    find_mode,
    mass_factors,
    newton_step,
    positive_definite,
    stencil_steps,
)
from .surrogate import (
    MISFIT_RARE,
    CoordinateSurrogate,
    QuadraticSurrogate,
    TaylorSurrogate,
    misfit_share,
    stencil_points,
)

__all__ = ["FULL_STENCIL_MAX_DIM", "RESIDUAL_CHUNK_ELEMENTS", "FlatBlock", "LaplaceFit"]

#: Without automatic differentiation: the full stencil up to this many coordinates, the
#: diagonal one above.
FULL_STENCIL_MAX_DIM = 12
#: Newton steps at most that recentre the expansion at the other inputs' values (refits).
_RECENTRE_STEPS = 10
#: Rows times coordinates per call of the Taylor residuals on a race's batch: a larger
#: batch is computed in pieces of this size, whose forward-mode arrays stay in cache
#: (one call on many rows of a wide block runs several times slower per row).
RESIDUAL_CHUNK_ELEMENTS = 2**17
#: Draws after which refits of the expansion at more than _REFIT_SHARE of the draws warn.
_REFIT_AFTER = 50
_REFIT_SHARE = 0.25


def _residual_pieces(expansion, rows, idx, point, reference, chunk: int) -> np.ndarray:
    """Residuals of ``rows`` on the positions ``idx``, in pieces of at most ``chunk`` positions."""
    if isinstance(idx, slice):
        start, stop = idx.start or 0, idx.stop
        if stop - start <= chunk:
            return expansion.residual_batch(rows, idx, point, reference)
        pieces = [slice(a, min(a + chunk, stop)) for a in range(start, stop, chunk)]
    else:
        if len(idx) <= chunk:
            return expansion.residual_batch(rows, idx, point, reference)
        pieces = [idx[a : a + chunk] for a in range(0, len(idx), chunk)]
    return np.concatenate(
        [expansion.residual_batch(rows, p, point, reference) for p in pieces], axis=1
    )


class FlatBlock:
    """Flat float vectors of a block against its variables' values.

    Parameters
    ----------
    vars : list
        The block's value variables (``name`` and ``dtype`` are read).
    shapes : list of tuple
        Their shapes.
    """

    def __init__(self, vars, shapes) -> None:
        self.vars = list(vars)
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.sizes)

    def flatten(self, parts) -> np.ndarray:
        """Concatenate per-variable values into one float64 vector."""
        return np.concatenate([np.ravel(p).astype(np.float64) for p in parts])

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        """Per-variable values (0-d arrays, not scalars) of a flat vector."""
        return [c[0, ...] for c in self.candidates(flat[None, :])]

    def candidates(self, rows: np.ndarray) -> list[np.ndarray]:
        """Per-variable candidate arrays ``(K, *shape)`` from flat rows ``(K, d)``."""
        out, start = [], 0
        for v, shape, size in zip(self.vars, self.shapes, self.sizes, strict=True):
            part = rows[:, start : start + size].reshape((len(rows), *shape))
            out.append(part.astype(v.dtype))
            start += size
        return out


class LaplaceFit:
    r"""The block's surrogate at the mode, its mass matrix and its sums per other inputs.

    Parameters
    ----------
    terms : ObservationTerms
        The block's per-observation terms.
    block : FlatBlock
        Flat positions against the block's values.
    model : pm.Model
        Read to name the random variables of moved inputs in a warning.
    autodiff : bool
        The terms' Taylor expansion is compiled (else a finite-difference stencil).
    covariance : numpy.ndarray, optional
        The user's estimate of the posterior covariance: :math:`M^{-1}` when given.
    control_variates : bool
        The races read residuals (the sums follow the other inputs, the probe runs).
    expansion : Expansion, optional
        The terms' Taylor expansion in the block (with ``autodiff``).
    coordinate_expansion : Expansion, optional
        Their expansion in the ``expand_in`` Deterministics, whose
        ``coordinates_of(values, point)`` gives their flat values and
        ``pullback(values, v, point)`` a vector-Jacobian product.

    Attributes
    ----------
    surrogate
        The expansion in the block at the mode (None before the fit).
    coordinate_surrogate
        The expansion in ``coordinates`` (None without them).
    inv_mass, chol_mass, chol_cov : numpy.ndarray
        :math:`M^{-1}` and the Cholesky factors of :math:`M` and :math:`M^{-1}`.
    failed : bool
        The fit raised (not finite at the mode): no control variates, no metric.
    raw_races : bool
        The control variates miss a few rows entirely (:meth:`probe_misfit`):
        races read the raw terms.
    expansions : ExpansionCache
        ``(surrogate, coordinate surrogate, mass)`` by the other inputs' values.
    """

    def __init__(
        self,
        terms,
        block: FlatBlock,
        model,
        *,
        autodiff: bool,
        covariance: np.ndarray | None,
        control_variates: bool,
        expansion=None,
        coordinate_expansion=None,
    ) -> None:
        self.terms, self.block, self.model = terms, block, model
        self.dim = block.dim
        self._autodiff = autodiff
        self.covariance = covariance
        self.control_variates = control_variates
        self._expansion = expansion
        self._coordinate_expansion = coordinate_expansion
        cv = coordinate_expansion
        self._coordinates = [] if cv is None else list(cv.coordinates)
        self._to_coordinates = None if cv is None else cv.coordinates_of
        self._pullback = None if cv is None else cv.pullback
        self.reset()
        self._init_refits()

    def reset(self) -> None:
        """Forget the fit (new data): refitted at the next draw."""
        self.surrogate: QuadraticSurrogate | TaylorSurrogate | None = None
        self.coordinate_surrogate: TaylorSurrogate | None = None
        self.failed = False
        self.raw_races = False
        self.inv_mass = self.chol_mass = self.chol_cov = None
        if hasattr(self, "expansions"):
            self.expansions.clear()

    def fit(self, x: np.ndarray, point: dict) -> tuple[np.ndarray, int]:
        """Fit at the mode from ``x``: surrogate, mass, coordinates, cache entry, probe.

        Returns the mode and the terms evaluated.

        Raises
        ------
        FloatingPointError, numpy.linalg.LinAlgError
            When the terms are not finite on the way (:attr:`failed` is set).
        """
        try:
            mode, spent = self.fit_mode(x, point)
        except (FloatingPointError, np.linalg.LinAlgError):
            self.failed = True
            raise
        if self._coordinates:
            try:
                spent += self.fit_coordinate_surrogate(mode, point)
            except FloatingPointError as err:
                warnings.warn(
                    f"RacingMetropolis: expand_in dropped ({err}); the control variates "
                    "expand in the value variables",
                    UserWarning,
                    stacklevel=4,
                )
        # the sums just fitted belong to the other inputs' values at this point
        entry = (self.surrogate, self.coordinate_surrogate, self.mass())
        self.expansions.put(inputs_key(self.terms.other_arrays(point)), entry)
        if self.control_variates:
            spent += self.probe_misfit(point)
        return mode, spent

    def end_tuning(self) -> None:
        """Drop the sums from references that a refit moved away from in tuning."""
        if self.reference_moved:
            self.expansions.clear()
            self.reference_moved = False

    # -- the surrogate ----------------------------------------------------------------

    def sums(self, rows: np.ndarray, point: dict, window: int | None = None) -> np.ndarray:
        """Sum the terms at flat ``rows``: over a window scaled to N, or over all N."""
        n_obs = self.terms.n_obs
        if window is not None and window < n_obs:
            vals = self.terms.loglik_batch(self.block.candidates(rows), slice(0, window), point)
            return vals.sum(axis=1) * (n_obs / window)
        chunk = max(1, (1 << 24) // n_obs)
        return np.concatenate(
            [
                self.terms.loglik_sum(self.block.candidates(rows[k : k + chunk]), point)
                for k in range(0, len(rows), chunk)
            ]
        )

    def f0_grad(self, x: np.ndarray, point: dict) -> np.ndarray:
        r"""Gradient of :math:`\log f_0` at the flat ``x`` (no data read)."""
        return self.block.flatten(self.terms.log_f0_grad(self.block.split(x), point))

    def surrogate_at(
        self, x, eps, point, window=None, full=None
    ) -> tuple[QuadraticSurrogate | TaylorSurrogate, int]:
        """Return the expansion of the sum at ``x`` (over ``window`` scaled to N, or all), its cost.

        Exact derivatives when compiled, else the stencil of steps ``eps``
        (``full``: with its mixed points; default up to
        :data:`FULL_STENCIL_MAX_DIM` coordinates). Raises ``FloatingPointError``
        where the sums are not finite.
        """
        n_obs = self.terms.n_obs
        if self._autodiff:  # exact value, gradient and Hessian of the sum, in one pass
            value, grad, hess = self._expansion.sums(x, point, window=window)
            if not (np.isfinite(value) and np.isfinite(hess).all()):
                raise FloatingPointError("the log-likelihood is not finite at the reference")
            cost = (self.dim + 1) * (n_obs if window is None else min(window, n_obs))
            return TaylorSurrogate(x.copy(), value, grad, 0.5 * (hess + hess.T)), cost
        full = self.dim <= FULL_STENCIL_MAX_DIM if full is None else full
        rows = stencil_points(x, eps, full)
        sums = self.sums(rows, point, window)
        cost = len(rows) * (n_obs if window is None else min(window, n_obs))
        if not np.isfinite(sums).all():
            raise FloatingPointError("the log-likelihood terms are not finite on the stencil")
        return QuadraticSurrogate(x.copy(), eps.copy(), sums, full), cost

    def posterior(self, point: dict) -> LogPosterior:
        """Return the block's log posterior at ``point``'s other values, for Newton steps."""

        def expand(x, eps, window=None, full=None):
            return self.surrogate_at(x, eps, point, window, full)

        def log_f0(x):
            return float(self.terms.log_f0(self.block.candidates(x[None]), point)[0])

        def sum_grad(x):  # value and gradient alone: no Hessian, O(d) per observation
            _, grad, _ = self._expansion.sums(x, point, hessian=False)
            if not np.isfinite(grad).all():
                raise FloatingPointError("the log-likelihood is not finite at the reference")
            return grad, 2 * self.terms.n_obs

        return LogPosterior(
            dim=self.dim,
            n_obs=self.terms.n_obs,
            expand=expand,
            sums=lambda rows, window: self.sums(rows, point, window),
            log_f0=log_f0,
            f0_grad=lambda x: self.f0_grad(x, point),
            sum_grad=sum_grad if self._autodiff else None,
        )

    def fit_mode(self, x: np.ndarray, point: dict) -> tuple[np.ndarray, int]:
        """Newton steps to the mode (:func:`~pymc_subsample.mcmc.mode.find_mode`); keep the fit.

        Sets the surrogate and mass matrix at the mode; returns the mode and the
        terms evaluated.
        """
        fit = find_mode(self.posterior(point), x)
        self.set_surrogate(fit.surrogate, fit.neg_hessian)
        return fit.x, fit.spent

    def set_surrogate(
        self, sur: QuadraticSurrogate | TaylorSurrogate, neg_hessian: np.ndarray
    ) -> None:
        """Keep the surrogate and the mass matrix :math:`M`, with its factors.

        :math:`M` is the negative Hessian, or the inverse of ``covariance`` when given.
        """
        self.surrogate = sur
        if isinstance(sur, QuadraticSurrogate):
            self._stencil_cands = self.block.candidates(sur.points())  # evaluated on every batch
        self._f0_eps = stencil_steps(neg_hessian)  # steps of the refits' Hessians of log f0
        if self.covariance is not None:  # the user's estimate of the posterior covariance
            neg_hessian = np.linalg.inv(self.covariance)
        self.inv_mass, self.chol_mass, self.chol_cov = mass_factors(neg_hessian)

    def probe_misfit(self, point: dict, rows: int = 4096, seed: int = 0) -> int:
        r"""Race on the raw terms when the control variates miss a few rows entirely.

        On up to ``rows`` rows, for pairs of points at 0.1, 0.3 and 1 proposal
        standard deviations around the reference, compares the residual
        differences with the terms' own (:func:`~pymc_subsample.mcmc.surrogate.misfit_share`).
        Terms that are exactly linear or quadratic on most rows and not on a few
        (:math:`|y_n - \mu|`: the rows between the two points) leave residuals
        that are zero on most of a batch and as large as the terms' differences
        on rows a batch rarely draws; a race on them can end confident and wrong.
        Such a block races on the raw terms instead, and says so. Returns the
        terms evaluated.
        """
        terms = self.terms
        n_obs = terms.n_obs
        rng = np.random.default_rng(seed)
        idx = np.arange(n_obs) if n_obs <= rows else np.sort(rng.choice(n_obs, rows, False))
        ref = self.surrogate.theta_ref
        spent = [0]
        shares = []
        for scale in (0.1, 0.3, 1.0):
            u = rng.standard_normal((2, self.dim))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            pair = ref + scale * u @ self.chol_cov.T
            cands = self.block.candidates(pair)
            rewards, _ = self.residual_rewards(
                pair, cands, point, self.surrogate, self.coordinate_surrogate, spent
            )
            with np.errstate(invalid="ignore", over="ignore"):
                raw = terms.loglik_batch(cands, idx, point)
                residual = rewards(np.arange(2), idx)
            shares.append(misfit_share(residual[1] - residual[0], raw[1] - raw[0]))
        if any(0.0 < share <= MISFIT_RARE for share in shares):
            self.raw_races = True
            names = ", ".join(v.name for v in self.block.vars)
            warnings.warn(
                f"RacingMetropolis: the control variates of {names} miss the terms' "
                f"differences entirely on {max(shares):.2%} of the observations and fit the "
                "others exactly (terms piecewise linear or quadratic in the block, as "
                "|y - mu|): a mini-batch would rarely draw the rows that decide, so the "
                "races read the raw terms instead (control variates kept for the proposal)",
                UserWarning,
                stacklevel=5,
            )
        return spent[0] + 2 * len(idx) * 3

    def fit_coordinate_surrogate(self, mode: np.ndarray, point: dict) -> int:
        r"""Set the expansion in ``expand_in`` at :math:`\hat\phi = \phi(\hat\theta)`; one pass.

        Returns the terms evaluated.
        """
        ref = self.coordinates_at(mode, point)
        value, grad, hess = self._coordinate_expansion.sums(ref, point)
        if not (np.isfinite(value) and np.isfinite(hess).all()):
            raise FloatingPointError("the log-likelihood is not finite at the reference")
        self.coordinate_surrogate = TaylorSurrogate(ref, value, grad, 0.5 * (hess + hess.T))
        return (len(ref) + 1) * self.terms.n_obs

    # -- the expansion at the other inputs' current values ----------------------------

    def _init_refits(self) -> None:
        """Start the cache of the control variates' sums and the count of refits."""
        #: by the other inputs' values: (surrogate, coordinate surrogate, mass factors)
        self.expansions = ExpansionCache()
        self._refit_draws = 0  # draws made
        self._refit_count = 0  # refits in the draws after the first _REFIT_AFTER
        self._refit_warned = False
        self._moved_inputs: set[str] = set()
        self._last_inputs: tuple | None = None
        self.reference_moved = False  # in this tuning, by a refit (see _recentred)

    def expansion_at(self, point: dict, log: dict, tune: bool = False) -> tuple:
        r"""Return the race's expansion with its sums at the other inputs' values in ``point``.

        The terms :math:`l_n(\theta; \psi)` read other value variables
        :math:`\psi` that other steps move. The residuals on a batch are taken
        at the current :math:`\psi`, so the exact sums added back must be too:
        :math:`\sum_n l_n(\theta; \psi) = \sum_n r_n(\theta; \psi) +
        \hat L(\psi) + G(\psi)^\top\Delta + \tfrac12\Delta^\top H(\psi)\Delta`
        (or the stencil sums :math:`T_k(\psi)`), at the fitted reference
        :math:`\hat\theta` (:math:`\hat\phi`, :math:`\epsilon`), or for an
        expansion by automatic differentiation in the block, at one recentred
        for :math:`\psi` (:meth:`_recentred`). Sums at values of :math:`\psi`
        not seen lately are recomputed with a full pass (counted in ``log``).
        The proposals follow :math:`\psi` too
        (:meth:`proposal_expansion`): the HMC trajectory integrates this
        expansion, and the mass matrix is :math:`M(\psi) = -\nabla^2(\log f_0
        + \sum_n h_n)(\hat\theta)` at :math:`\psi` (as fitted with ``expand_in`` or
        ``covariance``), functions of :math:`\psi` only, so valid proposals for
        the block given :math:`\psi`.

        Returns
        -------
        tuple
            ``(surrogate, coordinate surrogate, mass)``: as ``self.surrogate`` and
            ``self.coordinate_surrogate`` but at :math:`\psi`, and the factors
            :math:`(M^{-1}, L_M, L_{M^{-1}})`; the first two None when the sums
            are not finite there (the race then reads the raw terms).
        """
        if not self.terms.input_names:  # the terms read the block and the data only
            return self.surrogate, self.coordinate_surrogate, self.mass()
        arrays = self.terms.other_arrays(point)
        key = inputs_key(arrays)
        refits = self.expansions.n_refits
        entry = self.expansions.get(key, lambda: self._refit(point, log, tune))
        if self.expansions.n_refits > refits:
            log["refits"] += 1
            last = self._last_inputs
            if last is not None:
                names = self.terms.input_names
                self._moved_inputs.update(
                    n for n, a, b in zip(names, last, key, strict=True) if a != b
                )
        self._last_inputs = key
        return entry

    def _refit(self, point: dict, log: dict, tune: bool) -> tuple:
        """Recompute the race's sums at ``point``'s other inputs (full passes, in ``log``)."""
        n_obs, sur, cv = self.terms.n_obs, self.surrogate, self.coordinate_surrogate
        if cv is not None:  # the race reads the expansion in the Deterministics only
            ref = cv.theta_ref
            value, grad, hess = self._coordinate_expansion.sums(ref, point)
            log["n_evals"] += (len(ref) + 1) * n_obs
            cv = TaylorSurrogate(ref, value, grad, 0.5 * (hess + hess.T))
            finite = np.isfinite(value) and np.isfinite(grad).all() and np.isfinite(hess).all()
        elif isinstance(sur, TaylorSurrogate):
            return self._recentred(sur.theta_ref, point, log, tune)
        else:
            rows = sur.points()
            sums = self.sums(rows, point)
            log["n_evals"] += len(rows) * n_obs
            finite = bool(np.isfinite(sums).all())
            sur = QuadraticSurrogate(sur.theta_ref, sur.eps, sums, sur.full) if finite else sur
        if not finite:
            return None, None, self.mass()
        mass = self.mass()
        if cv is None and self.covariance is None:  # M from the Hessian at these inputs
            f0_hess = self.posterior(point).f0_hessian(sur.theta_ref, self._f0_eps)
            try:
                mass = mass_factors(positive_definite(-(sur.hess + f0_hess)))
            except np.linalg.LinAlgError:
                pass  # keep the mass matrix as fitted
        return sur, cv, mass

    def _recentred(self, x: np.ndarray, point: dict, log: dict, tune: bool) -> tuple:
        r"""Return the Taylor expansion at ``point``'s other inputs, recentred when far.

        Newton steps on the block's log posterior given those inputs
        (:func:`~pymc_subsample.mcmc.mode.newton_step`, a full pass each) from
        the fitted reference :math:`\hat\theta`, until the Newton decrement there is below
        :math:`d` (the reference within about a posterior sd of the mode): one
        pass where the other inputs moved little, more where they moved the
        block's mode away. The result is a function of the inputs alone. In
        tuning, the fitted reference moves to it (later refits start there);
        :meth:`end_tuning` then drops the sums computed from earlier ones.
        Returns ``(surrogate, None, mass)`` as :meth:`expansion_at`.
        """
        posterior = self.posterior(point)
        try:
            for _ in range(_RECENTRE_STEPS):
                newton = newton_step(posterior, x, self._f0_eps, None)
                sur, neg_h = newton.surrogate, newton.neg_hessian
                log["n_evals"] += newton.spent
                if newton.decrement < self.dim:
                    break
                x = newton.x
            mass = self.mass() if self.covariance is not None else mass_factors(neg_h)
        except (FloatingPointError, np.linalg.LinAlgError):
            return None, None, self.mass()
        if not np.isfinite(sur.grad).all():
            return None, None, self.mass()
        if tune and sur.theta_ref is not self.surrogate.theta_ref:
            self.surrogate, self.reference_moved = sur, True
        return sur, None, mass

    def mass(self) -> tuple:
        """Return the mass matrix as fitted: :math:`(M^{-1}, L_M, L_{M^{-1}})`."""
        return self.inv_mass, self.chol_mass, self.chol_cov

    def watch_refits(self, refits: int) -> None:
        """Warn once when the expansion is refitted at more than a quarter of the draws."""
        self._refit_draws += 1
        watched = self._refit_draws - _REFIT_AFTER
        if watched <= 0:
            return
        self._refit_count += refits
        if self._refit_warned or watched < _REFIT_AFTER:
            return
        if self._refit_count <= _REFIT_SHARE * watched:
            return
        self._refit_warned = True
        moved = sorted(self._moved_inputs) or list(self.terms.input_names)
        values = {v.name: v for v in self.model.value_vars}
        rvs = [self.model.values_to_rvs[values[n]] for n in moved]
        continuous = [rv.name for rv in rvs if rv.dtype.startswith("float")]
        fix = (
            f"put {', '.join(repr(n) for n in continuous)} in this step's block"
            if continuous
            else "an exact step for this block costs about as much"
        )
        warnings.warn(
            f"RacingMetropolis: the likelihood terms of "
            f"{', '.join(v.name for v in self.block.vars)} depend on "
            f"{', '.join(repr(n) for n in moved)}, which another step moves; the expansion "
            f"was refitted at {self._refit_count} of {watched} draws, each a full "
            f"pass over the data, so races save little: {fix}",
            UserWarning,
            stacklevel=4,
        )

    # -- the proposals' expansion ------------------------------------------------------

    def proposal_expansion(self, point: dict, log: dict | None = None, tune: bool = False) -> tuple:
        """Return the proposals' ``(surrogate, coordinate surrogate, mass)`` at ``point``.

        With control variates, those at the other inputs' values in ``point``
        (:meth:`expansion_at`, its refits counted in ``log``), as the race
        reads them; else, or where those sums are not finite, as fitted.
        ``tune``: a refit in tuning may move the reference (:meth:`expansion_at`).
        """
        fitted = (self.surrogate, self.coordinate_surrogate, self.mass())
        if not self.control_variates or self.surrogate is None:
            return fitted
        log = {"n_evals": 0, "refits": 0} if log is None else log
        now = self.expansion_at(point, log, tune)
        return now if now[0] is not None else fitted

    def proposal_surrogate(self, point, log: dict | None = None, now: tuple | None = None):
        """Return the surrogate the HMC proposal integrates: in ``expand_in`` when given.

        ``now``: the proposals' expansion (:meth:`proposal_expansion`), looked up when None.
        """
        sur, cv, _ = self.proposal_expansion(point, log) if now is None else now
        if cv is None:
            return sur
        return CoordinateSurrogate(
            cv,
            lambda theta: self.coordinates_at(theta, point),
            lambda theta, v: self.block.flatten(self._pullback(self.block.split(theta), v, point)),
        )

    def coordinates_at(self, theta: np.ndarray, point: dict) -> np.ndarray:
        """Flat values of the ``expand_in`` Deterministics at the flat block ``theta``."""
        return self._to_coordinates(self.block.split(theta), point)

    def residual_rewards(self, pair, cands, point, sur, coordinate_sur, spent) -> tuple:
        r"""Return the race's ``rewards(arms, idx)`` and the sums :math:`\sum_n h_n` per arm.

        Rewards are :math:`l_n(x_a) - h_n(x_a)` for the control variate ``sur``
        (the raw terms when None) at the two rows of ``pair``; ``spent[0]``
        counts the terms evaluated.
        """
        terms = self.terms
        if sur is None:

            def rewards(arms, idx):
                values = terms.loglik_batch([c[arms] for c in cands], idx, point)
                spent[0] += values.size
                return values

            return rewards, np.zeros(2)
        if isinstance(sur, TaylorSurrogate):  # residuals from the graph's derivatives
            rows, expansion = pair, self._expansion
            if coordinate_sur is not None:  # expanded in the Deterministics
                sur, expansion = coordinate_sur, self._coordinate_expansion
                rows = np.stack([self.coordinates_at(r, point) for r in pair])

            chunk = max(64, RESIDUAL_CHUNK_ELEMENTS // max(1, rows.shape[1]))

            def rewards(arms, idx):
                values = _residual_pieces(expansion, rows[arms], idx, point, sur.theta_ref, chunk)
                spent[0] += 3 * values.size  # value, first and second derivative per arm
                return values

            return rewards, sur.total(rows)
        # race on l_n - h_n; the exact sums of h_n join the exact part
        weights = sur.weights(pair)
        all_cands = [
            np.concatenate([s, c]) for s, c in zip(self._stencil_cands, cands, strict=True)
        ]
        k = sur.n_points

        def rewards(arms, idx):
            values = terms.loglik_batch(all_cands, idx, point)
            spent[0] += values.size
            return values[k + arms] - weights[arms] @ values[:k]

        return rewards, weights @ sur.sums

r"""The surrogate of RacingMetropolis: its expansion, its fit at the mode, the chain's start.

The control variates :math:`h_n` of the races and the HMC proposal's target
:math:`\log f_0 + \sum_n h_n` are one second-order expansion of the terms
around the posterior mode (Bardenet, Doucet & Holmes 2017): exact derivatives
of the graph (:class:`~pymc_subsample.model.expansion.Expansion`), or, for a
graph that cannot be differentiated twice, a finite-difference stencil.
:class:`MetropolisSurrogate` compiles the expansion when the step is built,
fits it at the first draw (:class:`~pymc_subsample.mcmc.laplace.LaplaceFit`)
and starts a chain's tuning in the bulk of the Laplace approximation.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..mcmc.laplace import FULL_STENCIL_MAX_DIM, LaplaceFit
from ..mcmc.regime import Regime
from ..mcmc.surrogate import QuadraticSurrogate, TaylorSurrogate
from ..model.blocks import model_deterministics
from ..model.expansion import Expansion

__all__ = ["MetropolisSurrogate"]


class MetropolisSurrogate:
    """Mixin of :class:`~pymc_subsample.RacingMetropolis`: the surrogate and its fit.

    Reads the step's ``terms``, ``model``, ``dim``, ``control_variates``,
    ``preconditioned``, ``elemwise``, ``user_scaling``, ``regime``, ``tune``
    and ``rng``; builds ``block`` and ``fit`` (:meth:`_build_fit`).
    """

    def _build_fit(self, expand_in, point: dict) -> None:
        """Compile the expansions the step needs and build :attr:`fit` (nothing is fitted yet).

        ``expand_in`` names the Deterministics the control variates expand in
        (checked against ``control_variates``); ``point`` is the initial point.
        """
        self._check_expand_in(expand_in, "leave control_variates=True")
        if expand_in:
            self._coordinates = model_deterministics(self.model, expand_in)
            self._coordinate_expansion = Expansion(
                self.terms, "block", self._coordinates, point=point
            )
        needs_surrogate = (
            self.preconditioned
            or self.control_variates
            or (self.elemwise and self.user_scaling is None)
        )
        self._autodiff = needs_surrogate and self._compile_taylor()
        if self._coordinates:
            if not self._autodiff:
                raise ValueError(
                    "expand_in: the terms cannot be differentiated twice, so there is no "
                    "Taylor expansion to make in the Deterministics; leave expand_in out"
                )
            # the races read this expansion: its gathered residuals compiled now, not in the
            # first race (seconds for a large graph, inside the sampler's clock)
            self._coordinate_expansion.compile(gather=True)
        #: the surrogate at the mode, the mass matrix, the sums per value of the other inputs
        self.fit = LaplaceFit(
            self.terms,
            self.block,
            self.model,
            autodiff=self._autodiff,
            covariance=self.covariance,
            control_variates=self.control_variates,
            expansion=self._expansion,
            coordinate_expansion=self._coordinate_expansion,
        )

    def _compile_taylor(self) -> bool:
        """Compile the exact Taylor expansion of the graph; False where it cannot be derived.

        Automatic differentiation gives the value, gradient and Hessian of the
        sum in one pass and the residuals on a batch by forward mode (about
        three term evaluations each, whatever :math:`d`). A graph that PyTensor
        cannot differentiate twice falls back to the finite-difference stencil
        (:math:`d^2 + 3d + 2` evaluations of every term).
        """
        try:
            self._expansion = Expansion(self.terms, "block", shapes=self._shapes)
            # with expand_in the races read the other expansion: its residuals compiled below
            self._expansion.compile(gather=not self._coordinates)
        except (NotImplementedError, TypeError, ValueError, AttributeError) as err:
            if self.dim > FULL_STENCIL_MAX_DIM:
                warnings.warn(
                    f"RacingMetropolis: the log-likelihood cannot be differentiated twice "
                    f"({type(err).__name__}: {err}); its expansion falls back to a stencil of "
                    f"{2 * self.dim + 1} points per observation, second order on the diagonal "
                    "only, which makes a poorer control variate for this many parameters",
                    UserWarning,
                    stacklevel=4,
                )
            return False
        return True

    @property
    def expansion(self) -> Expansion | None:
        """The compiled Taylor expansion of the terms in the block's variables.

        None where the terms cannot be differentiated twice (the surrogate is
        then the finite-difference stencil's) or where the step needs no
        surrogate; the surrogate at the mode is :attr:`surrogate`.
        """
        return self._expansion

    @property
    def coordinate_expansion(self) -> Expansion | None:
        """The compiled Taylor expansion in the ``expand_in`` Deterministics (None without)."""
        return self._coordinate_expansion

    @property
    def surrogate(self) -> QuadraticSurrogate | TaylorSurrogate | None:
        """The expansion of the terms at the mode; None before the first draw.

        See :class:`~pymc_subsample.mcmc.laplace.LaplaceFit`.
        """
        return None if self.fit is None else self.fit.surrogate

    @property
    def coordinate_surrogate(self) -> TaylorSurrogate | None:
        """The expansion in ``expand_in`` (None without it, or where it was dropped)."""
        return None if self.fit is None else self.fit.coordinate_surrogate

    def _ensure_surrogate(self, x, point) -> tuple[np.ndarray, int]:
        """Fit the surrogate if needed; at a chain's first tuning step, start in the bulk.

        Returns the position to continue from and the terms evaluated.
        """
        fit = self.fit
        needed = (
            self.regime.preconditioned
            or self.control_variates
            or (self.elemwise and self.user_scaling is None)
        )
        spent = 0
        if fit.surrogate is None and not fit.failed and needed:
            try:
                _, spent = fit.fit(x.copy(), point)
            except (FloatingPointError, np.linalg.LinAlgError) as err:
                if self.regime.proposal == "hmc" or self.regime.preconditioned:
                    scale = 1.0 if self.user_scaling is None else float(self.user_scaling)
                    self._fall_back(Regime("normal", False, "no_surrogate"), scale)
                warnings.warn(
                    f"RacingMetropolis: control variates turned off ({err}); racing on the raw "
                    "terms with a random-walk proposal",
                    UserWarning,
                    stacklevel=3,
                )
                return x, 0
            if self.elemwise and self.user_scaling is None:  # 1-D optimal scale per coordinate
                self.scaling = 2.38 * np.sqrt(np.diag(fit.inv_mass))
        if fit.surrogate is not None and self.tune and not self._started:
            # initialization, as NUTS's (tuning draws are discarded): a chain that starts
            # outside the bulk, where the Laplace approximation puts almost no mass, jumps to
            # a draw from it; one that starts inside (a posterior draw, or the mode) stays
            gap = fit.chol_mass.T @ (x - fit.surrogate.theta_ref)
            if 0.5 * gap @ gap > self.dim:
                z = self.rng.standard_normal(self.dim)
                x = fit.surrogate.theta_ref + fit.chol_cov @ z
        self._started = True
        return x, spent

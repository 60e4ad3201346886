r"""Independent (product) proposals: a frozen 1-D SciPy distribution per dimension.

The extended sampler of Erraqabi et al. (2016, App. B) starts from an initial proposal
:math:`g(x) = \prod_k g_k(x_k)` with :math:`f \le M g`. A product form makes
its mass in a box and exact draws conditioned on a box, or on the outside of
a box, available from the marginal CDFs, which is what the tail of
:class:`~pymc_subsample.prs.PliableEnvelope` and the A* baseline need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MixtureProposal", "ProductProposal"]


class ProductProposal:
    """Product of independent frozen 1-D ``scipy.stats`` distributions.

    Parameters
    ----------
    marginals : sequence of frozen scipy.stats distributions, or one of them
        :math:`g_k`, one per dimension; each needs ``cdf``, ``sf``, ``ppf``,
        ``isf`` and ``logpdf``.
    """

    def __init__(self, marginals):
        if hasattr(marginals, "logpdf"):
            marginals = [marginals]
        marginals = list(marginals)
        for g in marginals:
            for attr in ("cdf", "sf", "ppf", "isf", "logpdf"):
                if not hasattr(g, attr):
                    raise TypeError(
                        f"proposal marginals must be frozen 1-D scipy.stats distributions "
                        f"(e.g. scipy.stats.t(df=4, loc=0, scale=2)); {g!r} has no {attr!r}"
                    )
        self.marginals = marginals

    @property
    def dim(self) -> int:
        """Number of dimensions."""
        return len(self.marginals)

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        r"""Return :math:`\log g(x)` for points ``x`` of shape ``(k, d)``."""
        return sum(g.logpdf(x[:, k]) for k, g in enumerate(self.marginals))

    def log_mass(self, lo: Sequence[float], hi: Sequence[float]) -> float:
        r"""Return :math:`\log \int_{[lo, hi]} g`."""
        return float(
            sum(
                np.log(self._inside(g, a, b))
                for g, a, b in zip(self.marginals, lo, hi, strict=True)
            )
        )

    @staticmethod
    def _inside(g, a, b) -> float:
        return max(float(g.cdf(b) - g.cdf(a)), float(g.sf(a) - g.sf(b)))

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``k`` points, shape ``(k, d)``."""
        u = rng.random((k, self.dim))
        return np.column_stack([g.ppf(u[:, j]) for j, g in enumerate(self.marginals)])

    def sample_in(self, k: int, lo, hi, rng: np.random.Generator) -> np.ndarray:
        """Draw ``k`` points from :math:`g` conditioned on the box ``[lo, hi]``."""
        return np.column_stack(
            [_draw_in(g, lo[j], hi[j], rng.random(k)) for j, g in enumerate(self.marginals)]
        )

    def sample_outside(self, k: int, lo, hi, rng: np.random.Generator) -> np.ndarray:
        r"""Draw ``k`` points from :math:`g` conditioned on lying outside the box ``[lo, hi]``.

        Exact: the first coordinate outside its interval is chosen with
        probability :math:`\prod_{i<j} p^{in}_i \, p^{out}_j / P(\text{outside})`;
        coordinates before it are drawn inside, it is drawn outside, the rest freely.
        """
        p_in = np.array(
            [self._inside(g, a, b) for g, a, b in zip(self.marginals, lo, hi, strict=True)]
        )
        before = np.concatenate([[1.0], np.cumprod(p_in)[:-1]])
        w = before * (1.0 - p_in)
        if w.sum() <= 0:
            raise ValueError("the proposal has no mass outside the box")
        first = rng.choice(self.dim, size=k, p=w / w.sum())
        x = np.empty((k, self.dim))
        for j, g in enumerate(self.marginals):
            inside = first > j
            if inside.any():
                x[inside, j] = _draw_in(g, lo[j], hi[j], rng.random(int(inside.sum())))
            free = first < j
            if free.any():
                x[free, j] = g.ppf(rng.random(int(free.sum())))
            out = first == j
            if out.any():
                below, above = g.cdf(lo[j]), g.sf(hi[j])
                u = rng.random(int(out.sum())) * (below + above)
                low = u < below
                col = np.empty(len(u))
                col[low] = g.ppf(u[low])
                col[~low] = g.isf(u[~low] - below)
                x[out, j] = col
        return x


def _draw_in(g, a: float, b: float, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws of ``g`` conditioned on ``[a, b]`` from uniforms ``u``."""
    ca, cb = g.cdf(a), g.cdf(b)
    if cb - ca > 1e-8:
        col = g.ppf(ca + u * (cb - ca))
    else:  # far upper tail: survival functions keep the precision
        sa, sb = g.sf(a), g.sf(b)
        col = g.isf(sb + u * (sa - sb))
    return np.clip(col, a, b)


class MixtureProposal:
    r"""Mixture :math:`g = \sum_c w_c g_c` of :class:`ProductProposal` components.

    Same interface as :class:`ProductProposal`: its mass in a box and draws
    conditioned on the outside of a box are exact (pick a component with
    probability :math:`\propto w_c P_c(\text{outside})`, then draw from it).

    Parameters
    ----------
    components : sequence of ProductProposal
        Components of the same dimension.
    weights : sequence of float, optional
        Mixture weights (default equal).
    """

    def __init__(self, components, weights=None):
        self.components = [
            c if isinstance(c, ProductProposal) else ProductProposal(c) for c in components
        ]
        if len({c.dim for c in self.components}) != 1:
            raise ValueError("mixture components must have the same dimension")
        w = np.ones(len(self.components)) if weights is None else np.asarray(weights, float)
        if w.shape != (len(self.components),) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError("weights must be non-negative, one per component, not all zero")
        self.log_weights = np.log(w / w.sum())

    @property
    def dim(self) -> int:
        """Number of dimensions."""
        return self.components[0].dim

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        r"""Return :math:`\log g(x)` for points of shape ``(k, d)``."""
        parts = [lw + c.logpdf(x) for lw, c in zip(self.log_weights, self.components, strict=True)]
        return np.logaddexp.reduce(np.array(parts), axis=0)

    def log_mass(self, lo, hi) -> float:
        r"""Return :math:`\log \int_{[lo, hi]} g`."""
        return float(
            np.logaddexp.reduce(
                [
                    lw + c.log_mass(lo, hi)
                    for lw, c in zip(self.log_weights, self.components, strict=True)
                ]
            )
        )

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``k`` points, shape ``(k, d)``."""
        which = rng.choice(len(self.components), size=k, p=np.exp(self.log_weights))
        x = np.empty((k, self.dim))
        for c, comp in enumerate(self.components):
            if (which == c).any():
                x[which == c] = comp.sample(int((which == c).sum()), rng)
        return x

    def sample_outside(self, k: int, lo, hi, rng: np.random.Generator) -> np.ndarray:
        """Draw ``k`` points from :math:`g` conditioned on lying outside the box ``[lo, hi]``."""
        p_out = np.array(
            [
                np.exp(lw) * -np.expm1(c.log_mass(lo, hi))
                for lw, c in zip(self.log_weights, self.components, strict=True)
            ]
        )
        which = rng.choice(len(self.components), size=k, p=p_out / p_out.sum())
        x = np.empty((k, self.dim))
        for c, comp in enumerate(self.components):
            if (which == c).any():
                x[which == c] = comp.sample_outside(int((which == c).sum()), lo, hi, rng)
        return x

r"""Independent (product) proposals: a frozen 1-D SciPy distribution per dimension.

The extended sampler of seed 002 (App. B) starts from an initial proposal
:math:`g(x) = \prod_k g_k(x_k)` with :math:`f \le M g`. A product form makes
its mass in a box and exact draws conditioned on a box, or on the outside of
a box, available from the marginal CDFs, which is what the tail of
:class:`~pymc_subsample.prs.PliableEnvelope` and the A* baseline need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ProductProposal"]


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

r"""The pliable envelope: a kernel estimate of the target plus a uniform floor.

Erraqabi, Valko, Carpentier & Maillard (2016), Alg. 1 (eqs. 1–2) and App. B.
From design points :math:`X_i` drawn from known densities :math:`q_i`
(uniform on the box in Alg. 1, an initial proposal :math:`g` in App. B,
earlier envelopes when refitting) with
target values :math:`f(X_i)`, the importance-weighted Gaussian product-kernel
estimate

.. math:: \hat f_h(x) = \frac{1}{T}\sum_{i=1}^T \frac{f(X_i)}{q_i(X_i)} K_h(x - X_i)

is unbiased for :math:`f * K_h`; with :math:`q_i = A^{-d}` it is eq. (1) of
Erraqabi et al. (2016). The envelope is

.. math:: E(x) = \kappa \hat F_h(c(x)) + r \quad (x \in \text{box}), \qquad
          E(x) = M g(x) \quad (x \notin \text{box}),

where :math:`\hat F_h(c)` is :math:`\hat f_h` tabulated at the centres of a
regular grid of cells and maximized over each cell and its neighbours, so
that a proposal costs :math:`O(1)` to draw and to evaluate (a departure from
the paper, which evaluates the mixture of :math:`N` Gaussians: any envelope we
can sample exactly is valid, and the tabulated one is much cheaper). The
uniform floor :math:`r` is the paper's :math:`r_N` (eq. 2) and :math:`\kappa`
a multiplicative margin. Sampling :math:`x \sim E / \int E` picks a cell with
probability proportional to its mass (or the tail), then a uniform point in
the cell (or a draw of :math:`g` outside the box).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage, optimize, signal
from scipy.special import logsumexp

from ..validation import check_choice
from .proposal import MixtureProposal, ProductProposal

__all__ = [
    "MAX_DIM",
    "PliableEnvelope",
    "cell_index",
    "default_n_cells",
    "fit_envelope",
    "kernel_table",
    "log_linear_table",
    "paper_bandwidth",
    "paper_rate",
]

#: Largest dimension the tabulated envelope supports.
MAX_DIM = 3

#: Grid cells per dimension of the tabulated envelope, by dimension (about 1e6 cells at most).
N_CELLS = {1: 4096, 2: 512, 3: 64}


def default_n_cells(dim: int) -> int:
    """Return the grid cells per dimension used for a ``dim``-dimensional envelope.

    The one place grid sizes are defined (:data:`N_CELLS`): the standalone
    sampler and the PyMC step both use it.
    """
    if dim not in N_CELLS:
        raise ValueError(
            f"dimension {dim} is outside 1..{MAX_DIM}: rejection from a tabulated envelope "
            "needs exponentially many cells; use MCMC (NUTS) instead"
        )
    return N_CELLS[dim]


#: ``estimator="auto"`` skips the log-linear fit when its moment matrices, :math:`(d+1)^2`
#: floats per cell, would exceed this many floats (160 MB): from d = 4 on the default grid.
LOG_LINEAR_MAX_FLOATS = 20_000_000

#: The log-linear bandwidth search starts at :math:`h_0 2^{-1}`: its bias at a mode,
#: :math:`\tfrac12 h^2 \partial^2 \log f`, is missed by the leave-one-out check between
#: design points (at :math:`h_0` the 2-D clutter envelope fell below a mode; see the
#: results pages).
LOG_LINEAR_FIRST = 1

#: The fitted envelope must exceed every held-out value by this factor: the target
#: between evaluated points (at a peak, say) is slightly higher than at them.
COVER_MARGIN = 1.02

#: :math:`H_C` of the floor :math:`r \ge H_C \bar f \rho_T` of a data-driven envelope, in
#: units of the mean target value (a larger floor costs acceptance on Erraqabi et al.'s
#: (2016) targets, smaller ones gave no more violations; see the results pages).
FLOOR_SCALE = 0.3

#: A cell or tail raised after a violation at :math:`x` is set to this multiple of :math:`f(x)`.
VIOLATION_MARGIN = 1.5


def paper_rate(n_points: int, dim: int, smoothness: float, delta: float) -> float:
    r"""Return :math:`(\log(N/\delta)/N)^{s/(2s+d)}`, the rate of :math:`r_N` in eq. (2).

    The paper's :math:`r_N = A^d H_C` times this rate (box volume :math:`A^d`
    folded into the mean target value by the caller).
    """
    n = max(int(n_points), 2)
    return float((np.log(n / delta) / n) ** (smoothness / (2 * smoothness + dim)))


def paper_bandwidth(n_points: int, dim: int, smoothness: float, delta: float) -> float:
    r"""Return :math:`h = (\log(N/\delta)/N)^{1/(2s+d)}` for a unit box (Alg. 1)."""
    n = max(int(n_points), 2)
    return float((np.log(n / delta) / n) ** (1.0 / (2 * smoothness + dim)))


@dataclass
class PliableEnvelope:
    r"""A tabulated envelope :math:`E` that can be sampled exactly and evaluated in O(1).

    Attributes
    ----------
    lo, hi : numpy.ndarray
        The box, shape ``(d,)``.
    log_cells : numpy.ndarray
        :math:`\log E` on each grid cell, flat, C order over shape ``(G,) * d``.
    n_cells : int
        Cells per dimension :math:`G`.
    tail : ProductProposal, MixtureProposal or None
        :math:`g` outside the box (App. B); ``None`` for a bounded target.
    log_m : float
        :math:`\log M` of the tail.
    bandwidth : numpy.ndarray
        Kernel bandwidth per dimension of the fit.
    kappa, r : float
        Scale of the kernel estimate and uniform floor, relative to ``exp(log_shift)``.
    log_shift : float
        Reference log target value (the largest seen at fit time).
    estimator : str
        ``"log-linear"`` or ``"kernel"``: the estimate the fit chose.
    """

    lo: np.ndarray
    hi: np.ndarray
    log_cells: np.ndarray
    n_cells: int
    tail: ProductProposal | MixtureProposal | None = None
    log_m: float = -np.inf
    bandwidth: np.ndarray | None = None
    kappa: float = 1.0
    r: float = 0.0
    log_shift: float = 0.0
    estimator: str = "kernel"

    def __post_init__(self):
        self.width = (self.hi - self.lo) / self.n_cells
        self.log_cell_volume = float(np.sum(np.log(self.width)))
        self._log_tail_box = self.tail.log_mass(self.lo, self.hi) if self.tail else 0.0
        self.refresh()

    @property
    def dim(self) -> int:
        """Number of dimensions."""
        return len(self.lo)

    def refresh(self) -> None:
        """Recompute the cell and tail probabilities after ``log_cells`` or ``log_m`` changed."""
        log_w = self.log_cells + self.log_cell_volume
        log_grid = logsumexp(log_w)
        log_tail = -np.inf
        if self.tail is not None and np.isfinite(self.log_m):
            log_tail = self.log_m + np.log1p(-min(np.exp(self._log_tail_box), 1.0 - 1e-300))
        self.log_mass = float(np.logaddexp(log_grid, log_tail))
        self._p_tail = float(np.exp(log_tail - self.log_mass))
        self._cdf = np.cumsum(np.exp(log_w - log_grid))
        self._cdf /= self._cdf[-1]

    def cell_of(self, x: np.ndarray) -> np.ndarray:
        """Flat cell index of each point, ``-1`` outside the box."""
        return cell_index(x, self.lo, self.hi, self.n_cells)

    def log_value(self, x: np.ndarray) -> np.ndarray:
        r"""Return :math:`\log E(x)` for points of shape ``(k, d)``."""
        cell = self.cell_of(x)
        out = np.full(len(x), -np.inf)
        inside = cell >= 0
        out[inside] = self.log_cells[cell[inside]]
        if self.tail is not None and (~inside).any():
            out[~inside] = self.log_m + self.tail.logpdf(x[~inside])
        return out

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        r"""Draw ``k`` points from :math:`E/\int E`, shape ``(k, d)``."""
        n_tail = rng.binomial(k, self._p_tail) if self._p_tail > 0 else 0
        cells = np.searchsorted(self._cdf, rng.random(k - n_tail), side="right")
        cells = np.minimum(cells, len(self._cdf) - 1)
        ij = np.column_stack(np.unravel_index(cells, (self.n_cells,) * self.dim))
        x = self.lo + (ij + rng.random(ij.shape)) * self.width
        if n_tail:
            x = np.concatenate([x, self.tail.sample_outside(n_tail, self.lo, self.hi, rng)])
            x = x[rng.permutation(k)]
        return x

    def cover(self, x: np.ndarray, log_f: np.ndarray, margin: float = VIOLATION_MARGIN) -> int:
        r"""Raise :math:`E` to ``margin`` :math:`\times f` wherever :math:`f(x) > E(x)`.

        Returns the number of points that were not covered.
        """
        bad = log_f > self.log_value(x)
        if not bad.any():
            return 0
        cell = self.cell_of(x[bad])
        target = log_f[bad] + np.log(margin)
        inside = cell >= 0
        # the cell and its neighbours: f is rarely below the envelope at one cell only
        shape = (self.n_cells,) * self.dim
        ij = np.array(np.unravel_index(cell[inside], shape))
        for offset in np.ndindex(*(3,) * self.dim):
            nb = np.clip(ij + np.array(offset)[:, None] - 1, 0, self.n_cells - 1)
            np.maximum.at(self.log_cells, np.ravel_multi_index(nb, shape), target[inside])
        if (~inside).any():
            ratio = target[~inside] - self.tail.logpdf(x[bad][~inside])
            self.log_m = max(self.log_m, float(ratio.max()))
        self.refresh()
        return int(bad.sum())


def kernel_table(
    x: np.ndarray,
    weights: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    n_cells: int,
    bandwidth: np.ndarray,
) -> np.ndarray:
    r"""Tabulate :math:`\sum_i w_i K_h(c - X_i)` at the cell centres, maximized over neighbours.

    Points are binned to their cell, the histogram is smoothed with a Gaussian
    filter of standard deviation :math:`h/\Delta` cells (truncated at 4, mass
    reflected at the box's faces so that the estimate has no boundary bias), and
    each cell takes the largest value among itself and its :math:`3^d - 1`
    neighbours so that the table bounds the estimate inside each cell. Points
    outside the box are ignored. Returns shape ``(G,) * d``.
    """
    width = (hi - lo) / n_cells
    hist = _histogram(cell_index(x, lo, hi, n_cells), weights, width, n_cells)
    return _smooth_table(hist, bandwidth / width)


def cell_index(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, n_cells: int) -> np.ndarray:
    """Flat index (C order) of each point's cell in the ``(G,) * d`` grid, ``-1`` outside."""
    width = (hi - lo) / n_cells
    inside = np.all((x >= lo) & (x <= hi), axis=1)
    ij = np.clip(np.floor((x - lo) / width).astype(np.int64), 0, n_cells - 1)
    flat = np.ravel_multi_index(ij.T, (n_cells,) * len(lo))
    return np.where(inside, flat, -1)


def _histogram(cells: np.ndarray, weights: np.ndarray, width: np.ndarray, n_cells: int):
    """Weights per cell over the cell volume (a density), points outside ignored."""
    keep = cells >= 0
    hist = np.bincount(cells[keep], weights=weights[keep], minlength=n_cells ** len(width))
    return hist.reshape((n_cells,) * len(width)) / np.prod(width)


def _smooth_table(hist: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """Gaussian smoothing (``sigmas`` in cells), then the maximum over each 3^d neighbourhood."""
    smooth = _gaussian_smooth(hist, sigmas)
    return ndimage.maximum_filter(np.maximum(smooth, 0.0), size=3, mode="nearest")


def _gaussian_smooth(a: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """Separable Gaussian filter (truncated at 4 sigma, reflecting faces) by FFT per axis."""
    for axis, sigma in enumerate(sigmas):
        radius = int(4.0 * sigma + 0.5)
        if radius < 1:
            continue
        k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
        k /= k.sum()
        pad = [(0, 0)] * a.ndim
        pad[axis] = (radius, radius)
        if radius >= a.shape[axis]:
            padded = np.pad(a, pad, mode="constant")
        else:
            padded = np.pad(a, pad, mode="symmetric")
        shape = [1] * a.ndim
        shape[axis] = len(k)
        a = signal.fftconvolve(padded, k.reshape(shape), mode="valid", axes=axis)
    return a


def _filter(a: np.ndarray, kernels: list[np.ndarray]) -> np.ndarray:
    """Separable 'same'-size convolution with one centred 1-D kernel per axis, zero padding."""
    for axis, k in enumerate(kernels):
        radius = len(k) // 2
        pad = [(0, 0)] * a.ndim
        pad[axis] = (radius, radius)
        shape = [1] * a.ndim
        shape[axis] = len(k)
        a = signal.fftconvolve(np.pad(a, pad), k.reshape(shape), mode="valid", axes=axis)
    return a


def log_linear_table(
    cells: np.ndarray,
    y: np.ndarray,
    n_cells: int,
    width: np.ndarray,
    bandwidth: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Binned local-linear regression of :math:`y = \log f` at the cell centres.

    At each centre :math:`c` it fits :math:`a + b^\top (x - c)` to the points
    :math:`(X_i, y_i)` by least squares with Gaussian weights
    :math:`K_h(X_i - c)` (Fan & Gijbels 1996), points binned to their cells so
    that every weighted moment is one separable FFT convolution (Wand 1994).
    A Gaussian peak is quadratic in log space, and the local-linear estimate of
    a quadratic is off by a constant :math:`\tfrac12 \sum_j h_j^2 \partial_j^2 \log f`
    (with a uniform design), which a multiplicative margin absorbs; a kernel
    estimate of :math:`f` itself instead flattens the peak.

    Returns
    -------
    table : numpy.ndarray
        :math:`a(c) + \tfrac12 \sum_j |b_j(c)| \Delta_j`, the largest value of the
        local line over the cell, shape ``(G,) * d`` (``-inf`` where no point
        is within reach of the kernel).
    leave_one_out : numpy.ndarray
        The same for each point's own cell with that point removed
        (:math:`(a - H_{ii} y_i)/(1 - H_{ii})`, :math:`H_{ii}` the hat value of a
        point at the centre), one value per point in ``cells``.
    """
    d = len(width)
    shape = (n_cells,) * d
    # bin on a grid m times coarser while the kernel spans >= 3 of its cells (the
    # binning error is then below h/6), then read each fine cell off its coarse
    # cell's local line: the cost falls by m^d and the fit barely changes
    sigma = float(np.min(bandwidth / width))
    m = 1
    while 2 * m * 3.0 <= sigma and n_cells // (2 * m) >= 16 and n_cells % (2 * m) == 0:
        m *= 2
    coarse = n_cells // m
    ij = np.array(np.unravel_index(cells, shape))
    c_cells = np.ravel_multi_index(ij // m, (coarse,) * d)
    sol, hat, reach = _log_linear_fit(c_cells, y, coarse, width * m, bandwidth)
    # a local line may not rise more than 1 above the largest value within two
    # bandwidths (sparse neighbourhoods otherwise extrapolate wildly)
    top = np.full(coarse**d, -np.inf)
    np.maximum.at(top, c_cells, y)
    span = [2 * int(np.ceil(2.0 * b / (w * m))) + 1 for b, w in zip(bandwidth, width, strict=True)]
    top = ndimage.maximum_filter(top.reshape((coarse,) * d), size=span, mode="nearest").ravel()
    sol[:, 0] = np.minimum(sol[:, 0], top + 1.0)
    # offset of each fine cell centre from its coarse cell centre, per axis
    fine = np.indices(shape).reshape(d, -1)
    parent = np.ravel_multi_index(fine // m, (coarse,) * d)
    offset = ((fine % m) + 0.5 - 0.5 * m) * width[:, None]
    slope = sol[parent, 1:]
    spread = 0.5 * np.abs(slope) @ width
    line = sol[parent, 0] + np.einsum("cj,jc->c", slope, offset) + spread
    table = np.where(reach[parent], line, -np.inf)
    # and at least the neighbours' centre values: the fitted slope can be too
    # flat where log f bends sharply (a density vanishing at an edge)
    table = np.maximum(
        table,
        ndimage.maximum_filter(
            np.where(reach[parent], line - spread, -np.inf).reshape(shape), size=3, mode="nearest"
        ).ravel(),
    )
    h_i = np.where(reach[c_cells], hat[c_cells], 1.0)
    keep = h_i < 0.99
    loo = np.full(len(cells), -np.inf)
    own = table[cells] - sol[c_cells, 0]  # the line's rise from the coarse centre
    loo[keep] = (sol[c_cells[keep], 0] - h_i[keep] * y[keep]) / (1.0 - h_i[keep]) + own[keep]
    return table.reshape(shape), loo


def _log_linear_fit(cells, y, n_cells, width, bandwidth):
    """Local-linear solution ``(a, b)``, hat value and reach at each cell centre, flat."""
    d = len(width)
    size = n_cells**d
    shape = (n_cells,) * d
    cnt = np.bincount(cells, minlength=size).reshape(shape).astype(float)
    sy = np.bincount(cells, weights=y, minlength=size).reshape(shape)
    k0, k1, k2 = [], [], []
    for j in range(d):
        sigma = max(float(bandwidth[j] / width[j]), 1.0)  # in cells
        radius = min(int(4.0 * sigma + 0.5), 2 * n_cells)
        u = np.arange(-radius, radius + 1) * width[j]
        base = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
        k0.append(base)
        k1.append(base * u)
        k2.append(base * u**2)

    def moment(a, powers):
        return _filter(a, [(k0, k1, k2)[p][j] for j, p in enumerate(powers)])

    n = d + 1
    mat = np.empty((*shape, n, n))
    rhs = np.empty((*shape, n))
    zero = (0,) * d
    mat[..., 0, 0] = moment(cnt, zero)
    rhs[..., 0] = moment(sy, zero)
    for j in range(d):
        e_j = tuple(1 if m == j else 0 for m in range(d))
        mat[..., 0, j + 1] = mat[..., j + 1, 0] = moment(cnt, e_j)
        rhs[..., j + 1] = moment(sy, e_j)
        for k in range(j, d):
            p = [0] * d
            p[j] += 1
            p[k] += 1
            mat[..., j + 1, k + 1] = mat[..., k + 1, j + 1] = moment(cnt, tuple(p))
    s0 = mat[..., 0, 0].copy()
    reach = s0 > 1e-6
    # a small ridge on the slopes keeps cells with collinear neighbours solvable
    ridge = 1e-6 * np.maximum(s0, 1e-12)
    for j in range(d):
        mat[..., j + 1, j + 1] += ridge * bandwidth[j] ** 2
    mat[~reach] = np.eye(n)
    rhs[~reach] = 0.0
    inv = np.linalg.inv(mat.reshape(size, n, n))
    sol = np.einsum("cij,cj->ci", inv, rhs.reshape(size, n))
    # a convolution pairs offset c - X with the odd kernels, so the slopes come out negated
    sol[:, 1:] *= -1.0
    hat = inv[:, 0, 0]
    return sol, hat, reach.ravel()


def _covered_by(x, log_f, known, lo, hi, n_cells) -> np.ndarray:
    r"""Whether the cover at the ``known`` points already bounds :math:`f` at each point ``x``.

    :meth:`PliableEnvelope.cover` raises a known point's cell and its neighbours to
    :data:`VIOLATION_MARGIN` :math:`f(Z_j)`; a point :math:`X_i` in one of those cells
    with :data:`COVER_MARGIN` :math:`f(X_i)` below that value is covered whatever the
    estimate.
    """
    if known is None:
        return np.zeros(len(x), dtype=bool)
    z, log_fz = known
    d = len(lo)
    cell_z = cell_index(z, lo, hi, n_cells)
    keep = (cell_z >= 0) & np.isfinite(log_fz)
    if not keep.any():
        return np.zeros(len(x), dtype=bool)
    table = np.full(n_cells**d, -np.inf)
    np.maximum.at(table, cell_z[keep], log_fz[keep] + np.log(VIOLATION_MARGIN))
    table = ndimage.maximum_filter(
        table.reshape((n_cells,) * d), size=3, mode="constant", cval=-np.inf
    ).ravel()
    cell_x = cell_index(x, lo, hi, n_cells)
    out = np.zeros(len(x), dtype=bool)
    inside = cell_x >= 0
    out[inside] = log_f[inside] + np.log(COVER_MARGIN) <= table[cell_x[inside]]
    return out


def _scales(f_held, table_held, mass_table, volume, r_floor) -> tuple[float, float, float]:
    r"""Smallest envelope :math:`\kappa \hat F + r` covering held-out points.

    Minimizes :math:`\kappa \int \hat F + r V` subject to
    :math:`\kappa \hat F(X_j) + r \ge c f(X_j)` (:math:`c` = ``COVER_MARGIN``),
    :math:`\kappa \ge 0`, :math:`r \ge r_{floor}`: for fixed :math:`\kappa` the best
    :math:`r = \max(r_{floor}, \max_j f(X_j) - \kappa \hat F(X_j))`, and the
    objective is convex and piecewise linear in :math:`\kappa`, minimized by a
    bounded scalar search. Returns ``(kappa, r, mass)``.
    """
    keep = f_held > 0
    f_k, t_k = COVER_MARGIN * f_held[keep], table_held[keep]

    def r_of(kappa):
        return max(r_floor, float(np.max(f_k - kappa * t_k))) if keep.any() else r_floor

    def mass(kappa):
        return kappa * mass_table + r_of(kappa) * volume

    positive = t_k > 0
    k_max = float(np.max(f_k[positive] / t_k[positive])) if positive.any() else 1.0
    res = optimize.minimize_scalar(
        mass, bounds=(0.0, k_max), method="bounded", options={"xatol": 1e-4 * k_max}
    )
    kappa = min((0.0, float(res.x), k_max), key=mass)
    return kappa, r_of(kappa), mass(kappa)


def fit_envelope(
    x: np.ndarray,
    log_f: np.ndarray,
    log_q: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    n_cells: int,
    smoothness: float,
    delta: float,
    envelope_scale: float | None = None,
    tail: ProductProposal | MixtureProposal | None = None,
    n_bandwidths: int = 12,
    estimator: str = "auto",
    known: tuple[np.ndarray, np.ndarray] | None = None,
    core: tuple[np.ndarray, np.ndarray] | None = None,
) -> PliableEnvelope:
    r"""Fit a :class:`PliableEnvelope` to evaluated design points.

    Parameters
    ----------
    x : numpy.ndarray
        Design points, shape ``(T, d)``.
    log_f : numpy.ndarray
        :math:`\log f(X_i)` (unnormalized, may be ``-inf``).
    log_q : numpy.ndarray
        :math:`\log q_i(X_i)`, the density each point was drawn from.
    lo, hi : numpy.ndarray
        The box on which the kernel estimate is tabulated.
    n_cells : int
        Grid cells per dimension.
    smoothness, delta : float
        :math:`s` and :math:`\delta` of Alg. 1: they set the paper's bandwidth
        :math:`h_0 = (\log(T/\delta)/T)^{1/(2s+d)}` (times the box side) and the
        floor rate :math:`\rho_T = (\log(T/\delta)/T)^{s/(2s+d)}`.
    envelope_scale : float, optional
        The paper's :math:`H_C` in units of the mean target value
        :math:`\bar f = \hat Z / V`: the envelope is then exactly
        :math:`\hat F_{h_0} + H_C \bar f \rho_T` (eq. 2). ``None`` (default)
        chooses the bandwidth among :math:`h_0 2^{-j}` and the scales
        :math:`(\kappa, r)` from the points, by a leave-one-out linear program
        that covers every point's value, keeping the smallest envelope mass
        (:doc:`/explanation/pliable`).
    tail : ProductProposal or MixtureProposal, optional
        :math:`g` for the region outside the box (App. B).
    n_bandwidths : int
        Number of bandwidths tried.
    estimator : {"auto", "log-linear", "kernel"}
        ``"log-linear"``: :math:`\hat F = \exp` of the binned local-linear
        regression of :math:`\log f` (:func:`log_linear_table`), which fits peaks;
        ``"kernel"``: the importance-weighted kernel estimate of :math:`f` (eq. 1,
        :func:`kernel_table`); ``"auto"`` (default) keeps the smaller envelope mass
        of the two (the kernel estimate only beyond
        :data:`LOG_LINEAR_MAX_FLOATS`, or with ``envelope_scale``).
    known : (numpy.ndarray, numpy.ndarray), optional
        Points :math:`Z_j` of shape ``(J, d)`` and :math:`\log f(Z_j)` that are not
        design points (no density :math:`q` drew them: an optimizer's path, say).
        They take no part in the estimate or in the choice of :math:`(h, \kappa, r)`;
        the envelope is raised at those in the box as at the design points.
    core : (numpy.ndarray, numpy.ndarray), optional
        A box ``(lo, hi)`` inside the box: only design points in it take part in the
        choice of :math:`(h, \kappa, r)` (default: the whole box). Design points
        outside it are covered by the final raise only.

    Returns
    -------
    PliableEnvelope
        Raised, finally, so that :math:`E(X_i) \ge f(X_i)` at every design point
        and :math:`E(Z_j) \ge f(Z_j)` at every known point in the box.
    """
    t, d = x.shape
    shift = float(np.max(log_f))
    f = np.exp(log_f - shift)
    w = np.exp(log_f - shift - log_q) / t
    w[~np.isfinite(w)] = 0.0
    side = hi - lo
    volume = float(np.prod(side))
    width = side / n_cells
    cell_volume = float(np.prod(width))
    cells = cell_index(x, lo, hi, n_cells)  # binned once for every bandwidth
    inside = cells >= 0
    # points the envelope already covers at a known point's cells need no cover by the
    # estimate: the held-out check is left to the points nothing else covers
    held_out = inside & ~_covered_by(x, log_f, known, lo, hi, n_cells)
    if core is not None:
        held_out &= np.all((x >= core[0]) & (x <= core[1]), axis=1)
    hist = _histogram(cells, w, width, n_cells)
    f_bar = float(w[inside].sum()) / volume
    rho = paper_rate(t, d, smoothness, delta)
    h0 = side * paper_bandwidth(t, d, smoothness, delta)

    check_choice("estimator", estimator, ("auto", "log-linear", "kernel"))
    # log f relative to the largest value; zeros of f are floored 40 nats below it
    y = np.maximum(log_f - shift, -40.0)

    def log_linear(h):
        tab, loo = log_linear_table(cells[inside], y[inside], n_cells, width, h)
        held = np.zeros(t)
        held[inside] = np.exp(np.minimum(loo, 2.0))
        return np.exp(np.minimum(tab, 2.0)), held

    def kernel(h):
        full = _smooth_table(hist, h / width)
        # leave-one-out: remove each point's own kernel peak w_i K_h(0) from its cell
        own = w / np.prod(np.sqrt(2 * np.pi) * np.maximum(h, width / np.sqrt(2 * np.pi)))
        return full, np.maximum(np.where(inside, full.ravel()[cells], 0.0) - own, 0.0)

    # (fit, smallest bandwidth in cells, first bandwidth as a power of 1/2 of h0)
    estimators = {"log-linear": (log_linear, 1.0, LOG_LINEAR_FIRST), "kernel": (kernel, 0.5, 0)}
    if envelope_scale is not None:
        name = "kernel" if estimator == "auto" else estimator
        full, _ = estimators[name][0](h0)
        best = (1.0, envelope_scale * f_bar * rho, h0, full, 0.0, name)
    else:
        best = None
        names = ("log-linear", "kernel") if estimator == "auto" else (estimator,)
        if estimator == "auto" and n_cells**d * (d + 1) ** 2 > LOG_LINEAR_MAX_FLOATS:
            names = ("kernel",)  # the local-linear moments would not fit in memory
        for name in names:
            fit, min_cells, first = estimators[name]
            worse = 0
            for j in range(first, first + n_bandwidths):
                h = np.maximum(h0 * 2.0**-j, min_cells * width)
                full, held = fit(h)
                kappa, r, mass = _scales(
                    f[held_out],
                    held[held_out],
                    float(full.sum()) * cell_volume,
                    volume,
                    FLOOR_SCALE * f_bar * rho,
                )
                if best is None or mass < best[4]:
                    best = (kappa, r, h, full, mass, name)
                    worse = 0
                else:
                    worse += 1
                if worse == 2 or np.all(h <= min_cells * width):
                    break
    kappa, r, h, full, _, chosen = best
    log_cells = np.log(kappa * full.ravel() + r) + shift
    log_m = -np.inf
    if tail is not None:
        # M >= f/g at the design points outside the box (all points if none is outside)
        finite = np.isfinite(log_f)
        outside = ~inside & finite
        use = outside if outside.any() else finite
        log_m = float(np.max(log_f[use] - tail.logpdf(x[use]))) + np.log(VIOLATION_MARGIN)
    env = PliableEnvelope(
        lo=lo.copy(),
        hi=hi.copy(),
        log_cells=log_cells,
        n_cells=n_cells,
        tail=tail,
        log_m=log_m,
        bandwidth=h,
        kappa=kappa,
        r=r,
        log_shift=shift,
        estimator=chosen,
    )
    env.cover(x, log_f)
    if known is not None:
        z, log_fz = known
        keep = np.isfinite(log_fz) & (env.cell_of(z) >= 0)
        env.cover(z[keep], log_fz[keep])
    return env

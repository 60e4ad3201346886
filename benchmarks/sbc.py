r"""Simulation-based calibration of the racing steps (Talts et al. 2018).

For a parameter :math:`\theta` with prior :math:`\pi` and likelihood
:math:`p(y \mid \theta)`: draw :math:`\tilde\theta \sim \pi`, then
:math:`\tilde y \sim p(\cdot \mid \tilde\theta)`, then :math:`L` posterior draws
:math:`\theta_1, \dots, \theta_L` given :math:`\tilde y`, and keep the rank

.. math:: r = \#\{\ell : \theta_\ell < \tilde\theta\} \in \{0, \dots, L\}.

If the sampler draws from the exact posterior, :math:`r` is uniform on
:math:`\{0,\dots,L\}` (Talts et al. 2018, Theorem 1) whatever the model. Over
``reps`` replications the rank histogram is tested for uniformity by a
chi-square test on equal bins of ranks. Ties (discrete parameters) are broken
uniformly at random, which keeps the rank uniform.

Each replication is one real ``pm.sample`` run (one chain, no progress bar, no
convergence checks) with the step under test; the model and the step are built
once per setting and the data are swapped with ``pm.set_data`` between
replications (the racing steps take them up with ``data_changed``). Posterior
draws are thinned by ``thin`` to reduce autocorrelation (Talts et al. 2018,
Sec. 5.1).

Problems (each one small, so that every step does real work):

* ``selector``: :math:`k \sim \text{Categorical}(1/5, \dots)`,
  :math:`y_n \sim N(\mu_k, 1)`, :math:`n = 1..2000`, :math:`\mu_k = 0.03 k`: the
  means are about :math:`1.3/\sqrt N` apart, so the posterior of :math:`k` keeps
  mass on two or three values; :class:`~pymc_subsample.SubsampledCategoricalGibbs`.
* ``logistic``: :math:`w \sim N(0, I_3)`, :math:`x_n \sim N(0, I_2)`,
  :math:`y_n \sim \text{Bernoulli}(\text{logit}^{-1}(w_0 + x_n^\top w_{1:}))`,
  :math:`N = 3000`; :class:`~pymc_subsample.RacingMetropolis`.
* ``bimodal``: :math:`\theta \sim N(0, I_2)`, :math:`y_n \sim N(\theta_0^2, 1)`,
  :math:`z_n \sim N(\theta_1, 1)`, :math:`n = 1..10`: the posterior of
  :math:`\theta_0` has two modes :math:`\pm` of equal weight whenever
  :math:`|\tilde\theta_0|` is not small; :class:`~pymc_subsample.PliableRejection`
  on the 2-D block.

The ``delta`` study reruns ``selector`` with the race on its whole doubling
schedule (``exact_fraction=1``, ``batch_size=50``) at growing :math:`\delta`
with 1,000 replications each, to find the :math:`\delta` at which the
approximation becomes detectable.

Run ``python benchmarks/sbc.py [--quick] [--reps R] [--only selector,logistic,bimodal,delta]``;
writes ``docs/results/tables/sbc.md`` (or ``sbc_quick.md``), ``docs/results/tables/sbc.json``
and the figures ``docs/results/figures/sbc_*.png``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pymc as pm
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "docs" / "results" / "tables"
FIGURES = ROOT / "docs" / "results" / "figures"


# -- ranks and the uniformity test ------------------------------------------------------


def sbc_rank(prior_value: float, draws: np.ndarray, rng: np.random.Generator) -> int:
    r"""Rank of the prior draw among the posterior draws, ties broken at random.

    Parameters
    ----------
    prior_value : float
        :math:`\tilde\theta`.
    draws : ndarray, shape (L,)
        Posterior draws :math:`\theta_1, \dots, \theta_L`.
    rng : numpy.random.Generator
        For the ties.

    Returns
    -------
    int
        :math:`\#\{\theta_\ell < \tilde\theta\} + U`, :math:`U` uniform on
        :math:`\{0, \dots, \#\{\theta_\ell = \tilde\theta\}\}`: uniform on
        :math:`\{0, \dots, L\}` when the draws are exact and independent of
        each other given the data.
    """
    draws = np.asarray(draws)
    below = int(np.sum(draws < prior_value))
    ties = int(np.sum(draws == prior_value))
    return below + int(rng.integers(0, ties + 1))


def rank_uniformity(ranks: np.ndarray, n_draws: int, n_bins: int) -> tuple[float, float]:
    r"""Chi-square test that ranks in :math:`\{0..L\}` are uniform, on equal bins.

    Parameters
    ----------
    ranks : ndarray of int
        Ranks from :func:`sbc_rank`.
    n_draws : int
        :math:`L`; :math:`L + 1` must be a multiple of ``n_bins``.
    n_bins : int
        Number of bins :math:`B` of :math:`(L+1)/B` consecutive ranks each.

    Returns
    -------
    statistic, p_value : float
        :math:`X^2 = \sum_b (O_b - R/B)^2 / (R/B)` over :math:`R` ranks and its
        :math:`\chi^2_{B-1}` upper tail.
    """
    if (n_draws + 1) % n_bins:
        raise ValueError(f"L + 1 = {n_draws + 1} is not a multiple of n_bins = {n_bins}")
    counts = np.bincount(np.asarray(ranks) // ((n_draws + 1) // n_bins), minlength=n_bins)
    res = stats.chisquare(counts)
    return float(res.statistic), float(res.pvalue)


# -- problems -----------------------------------------------------------------------------


@dataclass
class Problem:
    """A model with ``pm.Data`` inputs, its simulator and the step under test.

    Attributes
    ----------
    name : str
        Short name (figures, table rows).
    model : pymc.Model
        Built once; its data are swapped with ``pm.set_data``.
    quantities : dict
        Ranked scalar quantities: name -> function of the parameter dict.
    simulate : callable
        ``simulate(rng) -> (params, data)``: a prior draw and data from the
        likelihood, as dicts of arrays (``data`` keyed by ``pm.Data`` names).
    make_step : callable
        ``make_step(model, **settings)``: the step (or list of steps) under test.
    settings : dict
        Setting name -> keyword arguments of ``make_step``.
    tune, thin : int
        Tuning draws and thinning of each ``pm.sample`` run.
    """

    name: str
    model: pm.Model
    quantities: dict[str, Callable[[dict], float]]
    simulate: Callable[[np.random.Generator], tuple[dict, dict]]
    make_step: Callable[..., object]
    settings: dict[str, dict] = field(default_factory=dict)
    tune: int = 100
    thin: int = 1


SELECTOR_D, SELECTOR_N, SELECTOR_GAP = 5, 2000, 0.03


def selector_problem(n_obs: int = SELECTOR_N, seed: int = 0) -> Problem:
    """Discrete selector: ``k ~ Categorical(1/D)``, ``y_n ~ N(0.03 k, 1)``."""
    from pymc_subsample import SubsampledCategoricalGibbs

    means = SELECTOR_GAP * np.arange(SELECTOR_D)

    def simulate(rng):
        k = int(rng.integers(SELECTOR_D))
        return {"k": k}, {"y_data": rng.normal(means[k], 1.0, n_obs)}

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        y = pm.Data("y_data", data["y_data"])
        k = pm.Categorical("k", p=np.full(SELECTOR_D, 1.0 / SELECTOR_D))
        pm.Normal("y", pm.math.constant(means)[k], 1.0, observed=y)

    def make_step(model, **settings):
        with model:
            return SubsampledCategoricalGibbs([model["k"]], **settings)

    return Problem(
        "selector",
        model,
        {"k": lambda p: p["k"]},
        simulate,
        make_step,
        {
            "defaults": {},
            "race whole schedule": {"exact_fraction": 1.0, "batch_size": 50},
            "exact": {"bound": "exact"},
        },
        tune=5,
        thin=1,
    )


def logistic_problem(n_obs: int = 3000, seed: int = 0) -> Problem:
    """Logistic regression with an intercept and two covariates, RacingMetropolis on ``w``."""
    from pymc_subsample import RacingMetropolis

    def simulate(rng):
        w = rng.normal(size=3)
        x = rng.normal(size=(n_obs, 2))
        p = 1.0 / (1.0 + np.exp(-(w[0] + x @ w[1:])))
        return {"w": w}, {"x_data": x, "y_data": (rng.random(n_obs) < p).astype(np.int64)}

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        x = pm.Data("x_data", data["x_data"])
        y = pm.Data("y_data", data["y_data"])
        w = pm.Normal("w", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=w[0] + x @ w[1:], observed=y)

    def make_step(model, **settings):
        with model:
            return RacingMetropolis([model["w"]], **settings)

    return Problem(
        "logistic",
        model,
        {f"w[{i}]": (lambda p, i=i: p["w"][i]) for i in range(3)},
        simulate,
        make_step,
        {"defaults": {}, "exact": {"bound": "exact"}},
        tune=150,
        thin=3,
    )


def bimodal_problem(n_obs: int = 10, seed: int = 0) -> Problem:
    """2-D block with a bimodal posterior: ``y_n ~ N(theta_0^2, 1)``, ``z_n ~ N(theta_1, 1)``."""
    from pymc_subsample import PliableRejection

    def simulate(rng):
        theta = rng.normal(size=2)
        return {"theta": theta}, {
            "y_data": rng.normal(theta[0] ** 2, 1.0, n_obs),
            "z_data": rng.normal(theta[1], 1.0, n_obs),
        }

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        y = pm.Data("y_data", data["y_data"])
        z = pm.Data("z_data", data["z_data"])
        theta = pm.Normal("theta", 0.0, 1.0, shape=2)
        pm.Normal("y", theta[0] ** 2, 1.0, observed=y)
        pm.Normal("z", theta[1], 1.0, observed=z)

    def make_step(model, **settings):
        with model:
            return PliableRejection([model["theta"]], **settings)

    return Problem(
        "bimodal",
        model,
        {f"theta[{i}]": (lambda p, i=i: p["theta"][i]) for i in range(2)},
        simulate,
        make_step,
        {"defaults": {}, "rebuild always": {"rebuild": "always"}},
        tune=16,
        thin=1,
    )


PROBLEMS = {"selector": selector_problem, "logistic": logistic_problem, "bimodal": bimodal_problem}


# -- the SBC loop -----------------------------------------------------------------------


@dataclass
class SBCResult:
    """Ranks of one step setting on one problem, with the uniformity tests."""

    problem: str
    setting: str
    n_draws: int
    n_bins: int
    ranks: dict[str, np.ndarray]
    seconds: float
    audits: int = 0
    audit_errors: int = 0
    info: str = ""

    @property
    def pvalues(self) -> dict[str, float]:
        """Chi-square p-value of each quantity's rank histogram."""
        return {
            q: rank_uniformity(r, self.n_draws, self.n_bins)[1] for q, r in self.ranks.items()
        }


def run_sbc(
    problem: Problem,
    step,
    reps: int,
    *,
    n_draws: int = 19,
    n_bins: int = 10,
    seed: int = 0,
    setting: str = "",
) -> SBCResult:
    r"""SBC of ``step`` on ``problem``: ``reps`` replications of ``L = n_draws`` draws.

    Each replication draws :math:`(\tilde\theta, \tilde y)` from the prior
    predictive, sets the data, runs ``pm.sample`` (one chain, ``problem.tune``
    tuning draws, :math:`L \cdot` ``problem.thin`` draws kept every
    ``problem.thin``-th) and ranks :math:`\tilde\theta` among the draws.

    Parameters
    ----------
    problem : Problem
        Model, simulator and ranked quantities.
    step : step method or list
        Built once on ``problem.model``; its ``data_changed`` (if any) is
        called after each ``pm.set_data``.
    reps : int
        Replications :math:`R`.
    n_draws : int
        :math:`L`.
    n_bins : int
        Bins of the chi-square test (:func:`rank_uniformity`).
    seed : int
        Seeds the simulator, the chains and the tie-breaking.
    setting : str
        Label of the step's setting (kept in the result).

    Returns
    -------
    SBCResult
    """
    rng = np.random.default_rng(seed)
    steps = step if isinstance(step, list) else [step]
    ranks = {q: np.empty(reps, dtype=np.int64) for q in problem.quantities}
    audits = errors = 0
    start = time.perf_counter()
    for r in range(reps):
        params, data = problem.simulate(rng)
        pm.set_data(data, model=problem.model)
        for s in steps:
            if hasattr(s, "data_changed"):
                s.data_changed()
        with problem.model, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # audits are counted below
            trace = pm.sample(
                draws=n_draws * problem.thin,
                tune=problem.tune,
                step=steps,
                chains=1,
                cores=1,
                random_seed=int(rng.integers(2**31)),
                progressbar=False,
                compute_convergence_checks=False,
                return_inferencedata=False,
            )
        point_draws = {v: trace.get_values(v)[problem.thin - 1 :: problem.thin] for v in params}
        for q, fn in problem.quantities.items():
            post = np.array([fn({v: d[i] for v, d in point_draws.items()}) for i in range(n_draws)])
            ranks[q][r] = sbc_rank(fn(params), post, rng)
        for s in steps:
            audits += getattr(s, "n_audits", 0)
            errors += getattr(s, "n_disagreements", 0)
    return SBCResult(
        problem.name,
        setting,
        n_draws,
        n_bins,
        ranks,
        time.perf_counter() - start,
        audits,
        errors,
    )


def sbc_setting(problem: Problem, setting: str, reps: int, **kwargs) -> SBCResult:
    """Build the step of ``setting`` once and run :func:`run_sbc`; note its resolved settings."""
    step = problem.make_step(problem.model, **problem.settings[setting])
    res = run_sbc(problem, step, reps, setting=setting, **kwargs)
    if hasattr(step, "exact_after"):
        res.info = (
            f"batch_size={step.batch_size}, exact after {step.exact_after} of "
            f"{step.terms.n_obs} ({'exact' if step.decides_exactly else 'racing'})"
        )
    return res


# -- figures and tables ----------------------------------------------------------------


def plot_ranks(results: list[SBCResult], path: Path, title: str) -> None:
    """Rank histograms (one panel per setting and quantity) with the 99% band of uniform counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quantities = list(results[0].ranks)
    fig, axes = plt.subplots(
        len(results),
        len(quantities),
        figsize=(3.2 * len(quantities), 2.4 * len(results)),
        squeeze=False,
        sharex=True,
    )
    for row, res in zip(axes, results, strict=True):
        for ax, q in zip(row, quantities, strict=True):
            ranks = res.ranks[q]
            width = (res.n_draws + 1) // res.n_bins
            counts = np.bincount(ranks // width, minlength=res.n_bins)
            expected = len(ranks) / res.n_bins
            lo, hi = stats.binom.interval(0.99, len(ranks), 1.0 / res.n_bins)
            ax.axhspan(lo, hi, color="0.85", label="99% band (uniform)")
            ax.axhline(expected, color="0.5", lw=0.8)
            ax.bar(np.arange(res.n_bins) * width, counts, width=width * 0.9, align="edge")
            p = rank_uniformity(ranks, res.n_draws, res.n_bins)[1]
            ax.set_title(f"{res.setting}: {q}\np = {p:.3f}", fontsize=9)
            ax.tick_params(labelsize=8)
        row[0].set_ylabel("count", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel(f"rank among L = {results[0].n_draws} draws", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_rows(results: list[SBCResult]) -> list[str]:
    """Markdown rows: problem, setting, replications, p-value per quantity, audits, time."""
    rows = []
    for res in results:
        ps = ", ".join(f"{q}: {p:.3f}" for q, p in res.pvalues.items())
        audit = f"{res.audit_errors}/{res.audits}" if res.audits else "–"
        rows.append(
            f"| {res.problem} | {res.setting} | {len(next(iter(res.ranks.values())))} | {ps} | "
            f"{audit} | {res.seconds:.0f} | {res.info} |"
        )
    return rows


# -- the delta study ----------------------------------------------------------------------


def delta_study(deltas, reps: int, n_draws: int, n_bins: int, seed: int) -> list[SBCResult]:
    """SBC of the selector's whole-schedule race at each ``delta`` (step built once per delta)."""
    problem = selector_problem()
    out = []
    for delta in deltas:
        step = problem.make_step(problem.model, delta=delta, exact_fraction=1.0, batch_size=50)
        res = run_sbc(
            problem,
            step,
            reps,
            n_draws=n_draws,
            n_bins=n_bins,
            seed=seed,
            setting=f"delta={delta:g}",
        )
        print(f"  delta={delta:g}: p={res.pvalues['k']:.4f}, {res.seconds:.0f} s", flush=True)
        out.append(res)
    return out


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few replications, no files kept")
    parser.add_argument("--reps", type=int, default=None, help="replications per setting")
    parser.add_argument("--delta-reps", type=int, default=None)
    parser.add_argument("--only", default="selector,logistic,bimodal,delta")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    reps = args.reps or (30 if args.quick else 200)
    delta_reps = args.delta_reps or (50 if args.quick else 1000)
    n_draws, n_bins = 19, 10
    only = args.only.split(",")
    suffix = "_quick" if args.quick else ""
    FIGURES.mkdir(parents=True, exist_ok=True)
    summary = {"reps": reps, "L": n_draws, "bins": n_bins, "results": []}
    lines = [
        "| problem | setting | replications | chi-square p (per quantity) | audits wrong/run "
        "| seconds | resolved settings |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in (n for n in only if n in PROBLEMS):
        problem = PROBLEMS[name]()
        results = []
        for setting in problem.settings:
            print(f"{name} / {setting}", flush=True)
            res = sbc_setting(
                problem, setting, reps, n_draws=n_draws, n_bins=n_bins, seed=args.seed
            )
            print(f"  {res.pvalues}, {res.seconds:.0f} s {res.info}", flush=True)
            results.append(res)
        lines += table_rows(results)
        plot_ranks(
            results,
            FIGURES / f"sbc_{name}{suffix}.png",
            f"SBC, {name}: {reps} replications, L = {n_draws}",
        )
        summary["results"] += [
            {
                "problem": r.problem,
                "setting": r.setting,
                "pvalues": r.pvalues,
                "seconds": r.seconds,
                "audits": r.audits,
                "audit_errors": r.audit_errors,
                "info": r.info,
            }
            for r in results
        ]
    if "delta" in only:
        deltas = [0.05, 0.2, 0.4, 0.6, 0.8] if not args.quick else [0.05, 0.8]
        print("delta study", flush=True)
        results = delta_study(deltas, delta_reps, n_draws, 20, args.seed)
        lines += ["", "| δ (selector, whole schedule) | replications | chi-square p | seconds |"]
        lines += ["|---|---|---|---|"]
        lines += [
            f"| {r.setting.split('=')[1]} | {delta_reps} | {r.pvalues['k']:.4f} | "
            f"{r.seconds:.0f} |"
            for r in results
        ]
        plot_ranks(
            results,
            FIGURES / f"sbc_delta{suffix}.png",
            f"SBC of the selector's race by delta: {delta_reps} replications, L = {n_draws}",
        )
        summary["delta"] = [{"delta": r.setting, "p": r.pvalues["k"]} for r in results]
    lines += [
        "",
        f"L = {n_draws} thinned draws per replication, chi-square on {n_bins} bins "
        "(δ study: 20); `python benchmarks/sbc.py"
        + (" --quick" if args.quick else "")
        + f"` (seed {args.seed}).",
    ]
    TABLES.mkdir(parents=True, exist_ok=True)
    (TABLES / f"sbc{suffix}.md").write_text("\n".join(lines) + "\n")
    (TABLES / f"sbc{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

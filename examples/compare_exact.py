"""Compare SubsampledCategoricalGibbs with PyMC's exact step in ArviZ.

Model: Student-t regression of N = 200,000 observations whose degrees of
freedom nu are a discrete hyperparameter, q indexing a grid of values; the
location and scale are continuous (NUTS). The same model is sampled twice:
q by ``pm.CategoricalGibbsMetropolis`` (exact; its default uniform proposal:
``proposal="proportional"`` divides by zero once the conditional is a point
mass, as it is here) and by
``SubsampledCategoricalGibbs`` (racing), with the same NUTS step for the rest.
The script prints the side-by-side summary from
:func:`pymc_subsample.compare_runs` and saves a forest plot and the
posterior distributions of both runs.

Run: ``python examples/compare_exact.py [--quick] [--out DIR]``; writes
``compare_forest.png``, ``compare_dist.png`` and ``compare_table.md`` into ``--out``
(default: the working directory; ``--out docs/examples`` regenerates the documentation's).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_subsample import SubsampledCategoricalGibbs, compare_runs
from pymc_subsample.options import AuditOptions, RaceOptions

matplotlib.use("Agg")
NU_GRID = np.round(np.linspace(3.55, 4.45, 10), 2)  # a fine grid: the posterior spreads


def build_model(n_obs: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    y = 0.3 + 1.5 * rng.standard_t(4.0, size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        mu = pm.Normal("mu", 0.0, 5.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        q = pm.Categorical("q", p=np.full(len(NU_GRID), 1.0 / len(NU_GRID)))
        pm.StudentT("y", nu=pt.as_tensor(NU_GRID)[q], mu=mu, sigma=sigma, observed=y_data)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller N and fewer draws")
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="output directory (default: working directory)"
    )
    args = parser.parse_args()
    out = args.out
    n_obs, draws = (20_000, 300) if args.quick else (200_000, 1000)
    model = build_model(n_obs)
    runs = {}
    with model:
        q = model["q"]
        print(f"N = {n_obs}: sampling with the exact CategoricalGibbsMetropolis ...")
        t0 = time.perf_counter()
        runs["exact"] = pm.sample(
            draws=draws,
            tune=500,
            chains=2,
            random_seed=1,
            step=[pm.CategoricalGibbsMetropolis([q])],
            progressbar=True,
        )
        print(f"  {time.perf_counter() - t0:.1f} s")
        print("sampling with SubsampledCategoricalGibbs ...")
        t0 = time.perf_counter()
        # heavy-tailed likelihoods: a larger first batch keeps the normal approximation honest
        step = SubsampledCategoricalGibbs(
            [q], delta=0.05, race=RaceOptions(batch_size=200), audit=AuditOptions(every=10)
        )
        runs["subsampled"] = pm.sample(
            draws=draws, tune=500, chains=2, random_seed=1, step=[step], progressbar=True
        )
        print(f"  {time.perf_counter() - t0:.1f} s")

    table = compare_runs(runs, var_names=["mu", "sigma", "q"])
    cols = [
        "mean",
        "sd",
        "ess_bulk",
        "r_hat",
        "sampling_time",
        "ess_bulk_per_s",
        "mean_frac_evals",
        "audited",
        "audit_error_rate",
    ]
    print(table[cols].to_string())

    out.mkdir(parents=True, exist_ok=True)
    pc = az.plot_forest(runs, var_names=["mu", "sigma", "q"], combined=True)
    pc.add_legend("model")
    pc.savefig(out / "compare_forest.png")
    pc = az.plot_dist(runs, var_names=["mu", "sigma", "q"])
    pc.add_legend("model")
    pc.savefig(out / "compare_dist.png")
    (out / "compare_table.md").write_text(table[cols].to_markdown(floatfmt=".4g") + "\n")
    print(
        f"wrote {out / 'compare_forest.png'}, {out / 'compare_dist.png'}, "
        f"{out / 'compare_table.md'}"
    )


if __name__ == "__main__":
    main()

"""A bimodal posterior drawn exactly by PliableRejection, next to NUTS.

Model: Minka's clutter problem in 2-D (Erraqabi et al. 2016, Sec. 4.3) as a PyMC model:
20 points in the plane, half in [-5, -3]^2 and half in [2, 4]^2; each is either
a N(theta, I) signal or N(0, 10 I) clutter (weight 1/2), and theta ~ N(0, 100 I).
The posterior of theta has two separated modes. NUTS (4 chains) moves between
them rarely, if ever, so the share of draws in each mode depends on where the
chains started; PliableRejection draws theta from its conditional (here the
whole posterior) by rejection from a learned envelope, so its draws are i.i.d.
and visit both modes in the right proportion. The exact posterior comes from
quadrature on a grid.

Prints P(theta[0] > 0) for the three and the sampler statistics; saves
``pliable_clutter.png`` and ``pliable_clutter.md`` into ``--out`` (default: the
working directory; ``--out docs/examples`` regenerates the documentation's).

Run: ``python examples/pliable_clutter.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pymc as pm
from scipy import integrate, special, stats

from pymc_subsample import PliableRejection

matplotlib.use("Agg")


def clutter_data(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(-5, -3, (10, 2)), rng.uniform(2, 4, (10, 2))])


def build_model(x: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 10.0, shape=2)
        components = [
            pm.MvNormal.dist(theta, cov=np.eye(2)),
            pm.MvNormal.dist(np.zeros(2), cov=10.0 * np.eye(2)),
        ]
        pm.Mixture("x", w=[0.5, 0.5], comp_dists=components, observed=x)
    return model


def exact_theta(x: np.ndarray):
    """Marginal posterior density of theta[0] on a grid, by quadrature over theta[1]."""
    grid = np.linspace(-10, 10, 801)
    t0, t1 = np.meshgrid(grid, grid, indexing="ij")
    log_post = stats.norm.logpdf(t0, 0, 10) + stats.norm.logpdf(t1, 0, 10)
    for xi in x:
        log_post += np.logaddexp(
            np.log(0.5) + stats.norm.logpdf(xi[0], t0, 1) + stats.norm.logpdf(xi[1], t1, 1),
            np.log(0.5) + stats.multivariate_normal.logpdf(xi, np.zeros(2), 10 * np.eye(2)),
        )
    dens = integrate.trapezoid(np.exp(log_post - special.logsumexp(log_post)), grid, axis=1)
    dens /= integrate.trapezoid(dens, grid)
    return grid, dens


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="output directory (default: working directory)"
    )
    args = parser.parse_args()
    out = args.out
    x = clutter_data()
    grid, dens = exact_theta(x)
    p_exact = integrate.trapezoid(dens[grid > 0], grid[grid > 0])
    model = build_model(x)
    print("sampling the clutter posterior: NUTS, 4 chains ...", flush=True)
    with model:
        t0 = time.perf_counter()
        nuts = pm.sample(draws=2000, tune=1000, chains=4, random_seed=1, progressbar=True)
        t_nuts = time.perf_counter() - t0
        print("sampling the clutter posterior: PliableRejection on theta, 4 chains ...")
        t0 = time.perf_counter()
        prs = pm.sample(
            draws=2000,
            tune=200,
            chains=4,
            step=[PliableRejection([model["theta"]])],
            random_seed=1,
            progressbar=True,
        )
        t_prs = time.perf_counter() - t0
    rows = []
    for name, idata, sec in (("NUTS", nuts, t_nuts), ("PliableRejection", prs, t_prs)):
        th = idata.posterior["theta"].values[..., 0]
        per_chain = ", ".join(f"{np.mean(c > 0):.2f}" for c in th)
        rhat = float(az.rhat(idata, var_names=["theta"])["theta"].max())
        rows.append(
            f"| {name} | {np.mean(th > 0):.3f} | {per_chain} | {rhat:.2f} | "
            f"{float(az.ess(idata, var_names=['theta'])['theta'].min()):.0f} | {sec:.1f} |"
        )
    st = prs.sample_stats
    table = "\n".join(
        [
            f"Exact P(theta[0] > 0) = {p_exact:.3f} (quadrature).",
            "",
            "| sampler | P(theta[0] > 0) | per chain | max R-hat | min ESS | seconds |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"PliableRejection: mean accept {float(st['accept'].mean()):.3f}, "
            f"first proposal accepted {float(st['accepted_first'].mean()):.3f}, "
            f"{float(st['n_evals'].mean()):.2f} evaluations a draw, "
            f"{int(st['envelope_violations'].sum())} envelope violations.",
        ]
    )
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pliable_clutter.md").write_text(table + "\n")

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    bins = np.linspace(-7, 6, 131)
    ax.plot(grid, dens, "k-", lw=2, label="exact (quadrature)")
    for name, idata, color in (("NUTS", nuts, "C1"), ("PliableRejection", prs, "C0")):
        ax.hist(
            idata.posterior["theta"].values[..., 0].ravel(),
            bins=bins,
            density=True,
            histtype="step",
            lw=1.5,
            color=color,
            label=name,
        )
    ax.set_xlim(-7, 6)
    ax.set_xlabel("theta[0]")
    ax.set_ylabel("posterior density")
    ax.set_title("Clutter problem: posterior of the mean (4 chains x 2000 draws each)")
    ax.legend()
    fig.tight_layout()
    path = out / "pliable_clutter.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path} and {out / 'pliable_clutter.md'}")


if __name__ == "__main__":
    main()

"""Bayesian ARCH lag-order selection on S&P 500 returns (Chen & Ghahramani 2016, Sec. 5.2).

Daily S&P 500 log returns (in %) from 1999 to 2018, as shipped by the ``arch``
package (``arch.data.sp500``; no network). The model, as in the paper up to
the candidate set and priors:

    r_t ~ StudentT(nu, 0, sigma_t),  sigma_t^2 = a0 + sum_{j <= Q[q]} a_j r_{t-j}^2,

with the lag order q a discrete variable over Q = (1, 2, 3, 4, 6, 8),
a0 ~ HalfNormal(1), a_j ~ HalfNormal(0.3) and nu - 2 ~ Exponential(0.1). The
lagged squared returns are a pm.Data matrix, so each day's term depends on
the parameters only through its own row and the likelihood splits by day.

Two runs, same seed: PyMC's exact steps (CategoricalGibbsMetropolis for q,
NUTS for the rest, as pm.sample assigns them) and the paper's subsampling
sampler (SubsampledCategoricalGibbs for q; RacingMetropolis with the
SGLD-type Langevin proposal and control variates for the continuous block).
Prints the posterior of q from both, ArviZ's summary side by side and the
data fraction; saves ``docs/examples/arch_q.png`` and
``docs/examples/arch_table.md``.

Run: ``python examples/arch_selection.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib
import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs, compare_runs

matplotlib.use("Agg")
OUT = Path(__file__).resolve().parent.parent / "docs" / "examples"
Q_GRID = np.array([1, 2, 3, 4, 6, 8])
Q_MAX = int(Q_GRID.max())
PROPOSAL = dict(proposal="normal", elemwise=True)


def sp500_returns() -> np.ndarray:
    """Daily log returns of the S&P 500 in percent, 1999-2018 (arch's data set)."""
    from arch.data import sp500

    close = sp500.load()["Adj Close"].to_numpy(dtype=float)
    return 100 * np.diff(np.log(close))


def build_model(r: np.ndarray) -> pm.Model:
    lags = np.column_stack([r[Q_MAX - j : len(r) - j] ** 2 for j in range(1, Q_MAX + 1)])
    with pm.Model() as model:
        r_data = pm.Data("r_data", r[Q_MAX:])
        lag_data = pm.Data("lag2", lags)
        q = pm.Categorical("q", p=np.full(len(Q_GRID), 1 / len(Q_GRID)))
        a0 = pm.HalfNormal("a0", 1.0)
        a = pm.HalfNormal("a", 0.3, shape=Q_MAX)
        nu_m2 = pm.Exponential("nu_m2", 0.1)
        mask = pt.arange(1, Q_MAX + 1) <= pt.as_tensor(Q_GRID)[q]
        sigma2 = a0 + (lag_data * (a * mask)).sum(axis=1)
        pm.StudentT("r", nu=nu_m2 + 2, mu=0.0, sigma=pt.sqrt(sigma2), observed=r_data)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws")
    args = parser.parse_args()
    draws, tune = (500, 1000) if args.quick else (1500, 1500)
    r = sp500_returns()
    model = build_model(r)
    print(f"ARCH selection on {len(r) - Q_MAX} S&P 500 daily returns, q in {Q_GRID.tolist()}")
    # sequential chains: the timings compare the samplers on one core each
    kw = {
        "draws": draws,
        "tune": tune,
        "chains": 2,
        "cores": 1,
        "random_seed": 3,
        "progressbar": True,
    }
    with model:
        print("exact steps: CategoricalGibbsMetropolis for q, NUTS for a0, a, nu ...", flush=True)
        t0 = time.perf_counter()
        exact = pm.sample(**kw)
        t_exact = time.perf_counter() - t0
        print("subsampling steps: SubsampledCategoricalGibbs + RacingMetropolis ...", flush=True)
        steps = [
            SubsampledCategoricalGibbs([model["q"]], delta=0.05),
            RacingMetropolis(
                [model["a0"], model["a"], model["nu_m2"]],
                **PROPOSAL,
                control_variates=True,
                delta=0.05,
                scaling=0.05,
                tune_interval=50,
                audit_every=20,
            ),
        ]
        t0 = time.perf_counter()
        sub = pm.sample(step=steps, **kw)
        t_sub = time.perf_counter() - t0
    rows = ["| q | " + " | ".join(str(v) for v in Q_GRID) + " | seconds |"]
    rows.append("|---" * (len(Q_GRID) + 2) + "|")
    for name, idata, sec in (("exact", exact, t_exact), ("subsampled", sub, t_sub)):
        qs = idata.posterior["q"].values.ravel()
        probs = np.bincount(qs, minlength=len(Q_GRID)) / len(qs)
        rows.append(f"| {name} | " + " | ".join(f"{p:.3f}" for p in probs) + f" | {sec:.0f} |")
    st = sub.sample_stats
    audits = st["audit_agree"].values
    done = audits >= 0
    notes = (
        f"Subsampled run: data fraction {float(st['frac_evals'].mean()):.3f} per step "
        f"(both steps' stats are averaged); audited racing-MH draws with a wrong decision: "
        f"{float((audits[done] == 0).mean()) if done.any() else float('nan'):.3f}."
    )
    summary = compare_runs({"exact": exact, "subsampled": sub}, var_names=["a0", "nu_m2"])
    table = "\n".join(
        [
            "Posterior of the lag order q (share of draws):",
            "",
            *rows,
            "",
            notes,
            "",
            summary.to_markdown(),
        ]
    )
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "arch_table.md").write_text(table + "\n")

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    width = 0.38
    runs = (("exact (Gibbs + NUTS)", exact), ("subsampled (racing)", sub))
    for k, (name, idata) in enumerate(runs):
        qs = idata.posterior["q"].values.ravel()
        probs = np.bincount(qs, minlength=len(Q_GRID)) / len(qs)
        axes[0].bar(np.arange(len(Q_GRID)) + (k - 0.5) * width, probs, width, label=name)
        for ax, var, label in ((axes[1], "a0", "a0"), (axes[2], "nu_m2", "nu - 2")):
            ax.hist(
                idata.posterior[var].values.ravel(),
                bins=40,
                density=True,
                histtype="step",
                lw=1.5,
                label=name,
            )
            ax.set_xlabel(label)
    axes[0].set_xticks(np.arange(len(Q_GRID)), [str(v) for v in Q_GRID])
    axes[0].set_xlabel("ARCH lag order q")
    axes[0].set_ylabel("posterior probability")
    axes[1].set_ylabel("posterior density")
    axes[0].legend(loc="upper left")
    fig.suptitle(f"S&P 500 daily returns 1999-2018 (N = {len(r) - Q_MAX})")
    fig.tight_layout()
    path = OUT / "arch_q.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path} and {OUT / 'arch_table.md'}")


if __name__ == "__main__":
    main()

r"""The main job at N = 1,000,000: a discrete and a continuous block, ours against PyMC's steps.

Model: a linear regression of a million rows whose noise scale is chosen from a
grid by a discrete variable,

.. math::

    q \sim \mathrm{Categorical}(1/K, \dots, 1/K), \quad
    a, b_k \sim N(0, 5^2), \quad
    y_n \sim N(a + x_n^\top b, s_q^2),

with ``x`` and ``y`` in ``pm.Data``. The same model is sampled twice, with the
same draws, chains and seed:

- our steps: ``SubsampledCategoricalGibbs([q])`` and ``RacingMetropolis([a, b])``,
  defaults only;
- PyMC's exact steps of the same kinds, as a user would pick them:
  ``pm.CategoricalGibbsMetropolis([q])`` and ``pm.NUTS([a, b])``.

Both runs sample their chains one after the other (``cores=1``). NUTS reads
every row at each gradient, so the exact run is shorter (``--exact-draws``,
100 tuning and 100 kept draws a chain by default): its effective draws per
second are a rate, comparable with ours. The script prints the time to first
draw of each run (building the steps, compiling their functions, PyMC's
set-up, up to the first draw), :func:`pymc_subsample.compare_runs`'
side-by-side ArviZ summary, and a one-line verdict (effective draws per second
of the continuous block's slowest coefficient after the first draw, and
counting it; whether the posteriors agree within their Monte Carlo errors); it
saves one figure, ``demo.png`` (posterior marginals of both runs, and where the
time went).

Run: ``python examples/demo.py [--n N] [--exact-draws M] [--out DIR]`` (``make demo``); writes
``demo.png`` into ``--out`` (default: the working directory).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib
import numpy as np
import pymc as pm

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs, compare_runs

matplotlib.use("Agg")

#: Candidate noise scales; the data are simulated with the middle one.
SCALES = np.array([0.5, 0.8, 1.0, 1.25, 2.0])
#: True intercept and slopes of the simulated data.
TRUE_A, TRUE_B = 1.0, np.array([0.5, -0.3, 0.2])
#: Posterior summary columns printed.
COLUMNS = [
    "mean",
    "sd",
    "mcse_mean",
    "ess_bulk",
    "r_hat",
    "sampling_time",
    "ess_bulk_per_s",
    "mean_frac_evals",
]


def build_model(n_obs: int, seed: int = 0) -> pm.Model:
    """Simulate the data and build the model (``x``, ``y`` in ``pm.Data``)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_obs, len(TRUE_B)))
    y = TRUE_A + x @ TRUE_B + rng.normal(0.0, SCALES[2], size=n_obs)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y", y)
        q = pm.Categorical("q", p=np.full(len(SCALES), 1.0 / len(SCALES)))
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0, shape=len(TRUE_B))
        sigma = pm.Deterministic("sigma", pm.math.constant(SCALES)[q])
        pm.Normal("obs", mu=a + x_data @ b, sigma=sigma, observed=y_data)
    return model


def run(model: pm.Model, make_steps, *, draws: int, tune: int, chains: int, seed: int):
    """Build the steps and sample; return the result and (time to first draw, total time).

    The time to first draw runs from building the steps to the first draw of
    ``pm.sample``: the steps' construction, their compiled functions and PyMC's
    own set-up. Functions compiled later, at their first use, count in the
    sampling time.
    """
    first: list[float] = []

    def callback(trace, draw):
        if not first:
            first.append(time.perf_counter())

    with model:
        t0 = time.perf_counter()
        steps = make_steps(model)
        idata = pm.sample(
            draws=draws,
            tune=tune,
            chains=chains,
            cores=1,
            step=steps,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
            callback=callback,
        )
        total = time.perf_counter() - t0
    return idata, (first[0] - t0, total)


def ours(model: pm.Model):
    """Our steps, defaults only."""
    return [
        SubsampledCategoricalGibbs([model["q"]]),
        RacingMetropolis([model["a"], model["b"]]),
    ]


def pymc_exact(model: pm.Model):
    """PyMC's exact steps of the same kinds."""
    return [pm.CategoricalGibbsMetropolis([model["q"]]), pm.NUTS([model["a"], model["b"]])]


def agreement(table, names: list[str]) -> tuple[bool, float]:
    """Do the two runs' means agree? Largest ``|difference| / combined MCSE`` over ``names``."""
    exact, sub = table.loc["PyMC exact"], table.loc["ours"]
    z = 0.0
    for name in names:
        err = np.hypot(exact.loc[name, "mcse_mean"], sub.loc[name, "mcse_mean"])
        diff = abs(exact.loc[name, "mean"] - sub.loc[name, "mean"])
        z = max(z, diff / err if err > 0 else (0.0 if diff == 0 else np.inf))
    return z < 4.0, z


def figure(runs: dict, times: dict, ess: dict, path: Path) -> None:
    """Save the posterior marginals of both runs and the time per effective draw, in one PNG.

    Time per 1,000 effective draws (min bulk ESS of a and b), not wall time: the
    runs keep different numbers of draws.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    for label, idata in runs.items():
        post = idata["posterior"]
        for ax, (name, values) in zip(
            axes[:2], [("a", post["a"].values), ("b[0]", post["b"].values[..., 0])], strict=True
        ):
            ax.hist(values.ravel(), bins=40, density=True, histtype="step", lw=1.6, label=label)
            ax.set_title(f"posterior of {name}")
        counts = np.bincount(post["q"].values.ravel(), minlength=len(SCALES))
        width = 0.38 if label == "ours" else -0.38
        axes[2].bar(np.arange(len(SCALES)) + width / 2, counts / counts.sum(), width, label=label)
    axes[2].set_xticks(np.arange(len(SCALES)), [f"{s:g}" for s in SCALES])
    axes[2].set_title("posterior of the noise scale $s_q$")
    labels = list(times)
    start = [1000 * times[k][0] / ess[k] for k in labels]
    rest = [1000 * (times[k][1] - times[k][0]) / ess[k] for k in labels]
    axes[3].barh(labels, start, color="0.6", label="time to first draw")
    axes[3].barh(labels, rest, left=start, color="C2", label="sampling")
    axes[3].set_xlabel("seconds per 1,000 effective draws of a, b")
    axes[3].set_title("time per effective draw")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="observations (default 1e6)")
    parser.add_argument("--draws", type=int, default=1000, help="draws per chain")
    parser.add_argument("--tune", type=int, default=1000, help="tuning draws per chain")
    parser.add_argument(
        "--exact-draws",
        type=int,
        default=100,
        help="draws and tuning draws per chain of the exact run (its time budget)",
    )
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    args = parser.parse_args()
    kw = {"draws": args.draws, "tune": args.tune, "chains": args.chains, "seed": args.seed}

    t0 = time.perf_counter()
    model = build_model(args.n)
    print(f"N = {args.n:,} rows, data and model built in {time.perf_counter() - t0:.1f} s")
    runs, times = {}, {}
    exact_kw = {**kw, "draws": args.exact_draws, "tune": args.exact_draws}
    for label, make_steps, what, how in [
        ("ours", ours, "SubsampledCategoricalGibbs([q]) + RacingMetropolis([a, b])", kw),
        (
            "PyMC exact",
            pymc_exact,
            "pm.CategoricalGibbsMetropolis([q]) + pm.NUTS([a, b])",
            exact_kw,
        ),
    ]:
        print(
            f"{label}: {what}, {args.chains} chains of {how['tune']} + {how['draws']} ...",
            flush=True,
        )
        if label == "PyMC exact" and args.exact_draws < args.draws:
            print(
                f"  (NUTS reads all {args.n:,} rows at each of its few gradients a draw: "
                f"{args.exact_draws} + {args.exact_draws} draws a chain keep the demo short; "
                "effective draws per second compare rates, not totals)",
                flush=True,
            )
        runs[label], times[label] = run(model, make_steps, **how)
        sampling = float(runs[label]["sample_stats"].attrs["sampling_time"])
        print(
            f"  time to first draw {times[label][0]:.1f} s (steps built, functions compiled); "
            f"sampling {sampling:.1f} s; in all {times[label][1]:.1f} s",
            flush=True,
        )

    table = compare_runs(runs, var_names=["a", "b", "q"])
    print(table[COLUMNS].to_string(float_format=lambda v: f"{v:.4g}"))

    names = ["a", *(f"b[{k}]" for k in range(len(TRUE_B)))]
    ess = {k: table.loc[k].loc[names, "ess_bulk"].min() for k in runs}
    # steady state: after the first draw; in all: the time to first draw included
    ess_per_s = {k: ess[k] / (times[k][1] - times[k][0]) for k in runs}
    ess_per_s_all = {k: ess[k] / times[k][1] for k in runs}
    agree, z = agreement(table, names)
    q_same = all(
        np.array_equal(
            np.bincount(runs[k]["posterior"]["q"].values.ravel(), minlength=len(SCALES)) > 0,
            np.bincount(runs["PyMC exact"]["posterior"]["q"].values.ravel(), minlength=len(SCALES))
            > 0,
        )
        for k in runs
    )
    frac = float(table.loc["ours", "mean_frac_evals"].iloc[0])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "demo.png"
    figure(runs, times, ess, path)
    print(
        f"verdict: ours {ess_per_s['ours'] / ess_per_s['PyMC exact']:.1f}x PyMC's effective "
        f"draws per second after the first draw (min ESS_bulk of a, b a second: "
        f"{ess_per_s['ours']:.3g} against {ess_per_s['PyMC exact']:.3g}; "
        f"{ess_per_s_all['ours'] / ess_per_s_all['PyMC exact']:.1f}x counting the time to "
        f"first draw), reading {100 * frac:.2g}% of the observations a decision; "
        f"posteriors {'agree' if agree and q_same else 'DIFFER'} (largest mean difference "
        f"{z:.1f} combined MCSE; q {'same' if q_same else 'different'} support)"
    )
    print(
        "time to first draw: "
        + ", ".join(f"{k} {times[k][0]:.1f} s" for k in runs)
        + f"; figure: {path}"
    )


if __name__ == "__main__":
    main()

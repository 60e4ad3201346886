"""Seed 002's experiments: acceptance of PRS, PRS with refinement, A* and simple rejection.

Acceptance rate = accepted i.i.d. draws / evaluations of f (PRS: the initial
phase included; its N = n^((2s+d)/(3s+d)) for budget n, s = 2, delta = 0.01;
N/2 with refinement, ``default_n_init``).
Each sampler spends the budget n (PRS and simple rejection stop at the first
call that reaches it). Targets (``pymc_subsample.prs.targets``):

* Fig. 3: peakiness f ~ exp(-x)/(1+x)^a on [0, 10], a in {2, 5, 10, 15, 20},
  n in {1e5, 1e6};
* Table 1: the 2-D sine target on [0, 1]^2, n = 1e6;
* Table 2: the clutter problem in 1-D and 2-D, n = 1e5.

A*'s acceptance does not depend on n (each draw is independent), so A* runs
with a budget of 1e5 evaluations everywhere (pure Python, about 30 us per
evaluation); simple rejection uses A*'s proposal q and bound exp(max o).
10 trials (seeds) each; mean and standard deviation.

Writes ``docs/results/tables/prs_study.md`` and
``docs/results/figures/prs_peakiness.png``. Run:
``python benchmarks/prs_study.py [--quick]`` (``--quick``: 3 trials, peakiness at 1e5
only, written to ``prs_study_quick.md`` and ``prs_peakiness_quick.png``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from pymc_subsample.prs import PliableRejectionSampler, default_n_init
from pymc_subsample.prs.baselines import AStarSampler, simple_rejection
from pymc_subsample.prs.targets import clutter_target, peakiness_target, sine_target

ROOT = Path(__file__).resolve().parent.parent / "docs" / "results"
PEAKS = (2, 5, 10, 15, 20)
ASTAR_BUDGET = 100_000
PAPER = {  # seed 002, Tables 1 and 2: PRS, A*, simple rejection
    "sine 2-D": (0.664, 0.761, 0.250),
    "clutter 1-D": (0.795, 0.894, 0.176),
    "clutter 2-D": (0.510, 0.561, 2e-5),
}


def make_target(name: str):
    if name.startswith("peak"):
        return peakiness_target(float(name.split("=")[1]))
    if name == "sine":
        return sine_target()
    return clutter_target(int(name[-1]))


def one_trial(args) -> tuple[str, int, str, float, int, float]:
    """Run one method on one target with one seed; return its acceptance rate."""
    name, budget, method, seed = args
    target = make_target(name)
    t0 = time.perf_counter()
    violations = 0
    if method == "A*":
        s = AStarSampler(target, rng=seed)
        s.sample_budget(min(budget, ASTAR_BUDGET))
        rate = s.acceptance_rate
    elif method == "SRS":
        x, n = simple_rejection(target, budget, rng=seed)
        rate = len(x) / n
    else:
        s = PliableRejectionSampler(
            target.logpdf,
            target.bounds,
            n_init=default_n_init(budget, target.dim, refine=method == "PRS refine"),
            refine=method == "PRS refine",
            rng=seed,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            while s.n_evaluations < budget:
                s.rvs(max(1000, budget // 100))
        rate, violations = s.acceptance_rate, s.envelope_violations
    return name, budget, method, rate, violations, time.perf_counter() - t0


METHODS = ("PRS", "PRS refine", "A*", "SRS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 trials, peakiness at 1e5 only")
    opts = parser.parse_args()
    trials = 3 if opts.quick else 10
    budgets = (100_000,) if opts.quick else (100_000, 1_000_000)
    jobs = [(f"peak a={a}", n, m) for n in budgets for a in PEAKS for m in METHODS]
    jobs += [("sine", 1_000_000, m) for m in METHODS]
    jobs += [(f"clutter {d}", 100_000, m) for d in (1, 2) for m in METHODS]
    tasks = [(*j, seed) for j in jobs for seed in range(trials)]
    print(f"prs_study: {len(tasks)} runs ({trials} trials) on 2 processes", flush=True)
    results: dict[tuple, list] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        for i, (name, n, m, rate, viol, sec) in enumerate(pool.map(one_trial, tasks)):
            results.setdefault((name, n, m), []).append((rate, viol, sec))
            if (i + 1) % trials == 0:
                rates = [r for r, _, _ in results[(name, n, m)]]
                print(
                    f"  {name:>12} n={n:>8,} {m:<10} acceptance {np.mean(rates):.3f} "
                    f"± {np.std(rates):.3f}   ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    suffix = "_quick" if opts.quick else ""  # a quick run never overwrites the full results
    write_table(results, trials, suffix)
    plot(results, budgets, suffix)


def cell(results, key) -> str:
    rates = np.array([r for r, _, _ in results[key]])
    return f"{100 * rates.mean():.1f} ± {100 * rates.std():.1f}"


def write_table(results, trials, suffix: str = "") -> None:
    lines = [
        f"Acceptance rate (%), mean ± sd over {trials} trials. PRS: accepted / evaluations, "
        "initial phase included; A* measured at 1e5 evaluations. Paper (seed 002) in brackets.",
        "",
        "| target | n | PRS | PRS refine | A* | simple rejection | PRS violations |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, n, label in [
        ("sine", 1_000_000, "sine 2-D"),
        ("clutter 1", 100_000, "clutter 1-D"),
        ("clutter 2", 100_000, "clutter 2-D"),
    ]:
        paper = PAPER[label]
        viol = np.mean([v for _, v, _ in results[(name, n, "PRS")]])
        lines.append(
            f"| {label} | {n:.0e} | {cell(results, (name, n, 'PRS'))} ({100 * paper[0]:.1f}) "
            f"| {cell(results, (name, n, 'PRS refine'))} "
            f"| {cell(results, (name, n, 'A*'))} ({100 * paper[1]:.1f}) "
            f"| {cell(results, (name, n, 'SRS'))} ({100 * paper[2]:.3g}) | {viol:.1f} |"
        )
    for n in sorted({k[1] for k in results if k[0].startswith("peak")}):
        for a in PEAKS:
            name = f"peak a={a}"
            viol = np.mean([v for _, v, _ in results[(name, n, "PRS")]])
            lines.append(
                f"| peakiness a={a} | {n:.0e} | {cell(results, (name, n, 'PRS'))} "
                f"| {cell(results, (name, n, 'PRS refine'))} | {cell(results, (name, n, 'A*'))} "
                f"| {cell(results, (name, n, 'SRS'))} | {viol:.1f} |"
            )
    path = ROOT / "tables" / f"prs_study{suffix}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


def plot(results, budgets, suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets), 4), squeeze=False)
    for ax, n in zip(axes[0], budgets, strict=True):
        for m, style in zip(METHODS, ("o-", "s-", "^--", "x:"), strict=True):
            rates = [np.array([r for r, _, _ in results[(f"peak a={a}", n, m)]]) for a in PEAKS]
            ax.errorbar(
                PEAKS, [r.mean() for r in rates], yerr=[r.std() for r in rates], fmt=style, label=m
            )
        ax.set_title(f"f ∝ exp(-x)/(1+x)^a on [0, 10], budget n = {n:.0e}")
        ax.set_xlabel("peakiness a")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = ROOT / "figures" / f"prs_peakiness{suffix}.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

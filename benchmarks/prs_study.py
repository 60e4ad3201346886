"""Erraqabi et al.'s (2016) experiments: acceptance of PRS, PRS with refinement, A*, rejection.

Acceptance rate = accepted i.i.d. draws / evaluations of f. PRS: the initial
phase included; its N = n^((2s+d)/(3s+d)) for budget n, s = 2, delta = 0.01;
N/2 with refinement (``default_n_init``). Every sampler spends the budget n
(PRS and simple rejection stop at the first call that reaches it). Targets
(``tests/support/targets.py``):

* Fig. 3: peakiness f ~ exp(-x)/(1+x)^a on [0, 10], a in {2, 5, 10, 15, 20},
  n in {1e5, 1e6};
* Table 1: the 2-D sine target on [0, 1]^2, n = 1e6;
* Table 2: the clutter problem in 1-D and 2-D, n = 1e5.

Methods: ``PRS`` and ``PRS refine`` (the defaults: two-stage design, envelope
estimate chosen by mass between the log-space local-linear and the kernel
one); ``PRS Alg. 1`` (uniform design, kernel estimate: the previous default,
on the three tables only); A* sampling as in Maddison, Tarlow & Minka's (2014)
released code (one Gumbel process for all draws) at the same budget n, its
acceptance reported per evaluation of f and per evaluation of f or of its
bound (the count that reproduces the paper's A* figures; see
``docs/results/prs.md``); simple rejection from A*'s proposal q with the bound
exp(max o). 10 trials (seeds) each, except A* on the peakiness target at
n = 1e6 (3 trials: pure Python, about 30 s each, sd below 0.1 points).

Writes ``docs/results/tables/prs_study.md`` and
``docs/results/figures/prs_peakiness.png``. Run (one process per ``--workers``):
``python benchmarks/prs_study.py [--quick] [--workers 1]`` (``--quick``: 3
trials, peakiness at 1e5 only, written to ``prs_study_quick.md`` and
``prs_peakiness_quick.png``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import numpy as np

from pymc_subsample.prs import PliableRejectionSampler, default_n_init
from support.baselines import AStarSampler, simple_rejection
from support.targets import clutter_target, peakiness_target, sine_target

ROOT = Path(__file__).resolve().parent.parent / "docs" / "results"
PEAKS = (2, 5, 10, 15, 20)
PAPER = {  # Erraqabi et al. (2016), Tables 1 and 2: PRS, A*, simple rejection
    "sine 2-D": (0.664, 0.761, 0.250),
    "clutter 1-D": (0.795, 0.894, 0.176),
    "clutter 2-D": (0.510, 0.561, 2e-5),
}
METHODS = ("PRS", "PRS refine", "PRS Alg. 1", "A*", "SRS")


def make_target(name: str):
    if name.startswith("peak"):
        return peakiness_target(float(name.split("=")[1]))
    if name == "sine":
        return sine_target()
    return clutter_target(int(name[-1]))


def one_trial(args) -> tuple:
    """Run one method on one target with one seed; return its acceptance rates."""
    name, budget, method, seed = args
    target = make_target(name)
    t0 = time.perf_counter()
    violations, paper_rate = 0, np.nan
    if method == "A*":
        s = AStarSampler(target, rng=seed)
        s.sample_budget(budget)
        rate = s.acceptance_rate
        paper_rate = s.n_draws / (s.n_evaluations + s.n_bounds)
    elif method == "SRS":
        x, n = simple_rejection(target, budget, rng=seed)
        rate = len(x) / n
    else:
        refine = method == "PRS refine"
        old = method == "PRS Alg. 1"
        s = PliableRejectionSampler(
            target.logpdf,
            target.bounds,
            n_init=default_n_init(budget, target.dim, refine=refine),
            refine=refine,
            rng=seed,
            design="uniform" if old else "two-stage",
            estimator="kernel" if old else "auto",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            while s.n_evaluations < budget:
                s.rvs(max(1000, budget // 100))
        rate, violations = s.acceptance_rate, s.envelope_violations
    return name, budget, method, rate, paper_rate, violations, time.perf_counter() - t0


def jobs_for(quick: bool) -> list[tuple[str, int, str, int]]:
    trials = 3 if quick else 10
    budgets = (100_000,) if quick else (100_000, 1_000_000)
    tasks = []
    for n in budgets:
        for a in PEAKS:
            for m in ("PRS", "PRS refine", "A*", "SRS"):
                k = 3 if (m == "A*" and n == 1_000_000) else trials
                tasks += [(f"peak a={a}", n, m, seed) for seed in range(k)]
    for name, n in (("sine", 1_000_000), ("clutter 1", 100_000), ("clutter 2", 100_000)):
        tasks += [(name, n, m, seed) for m in METHODS for seed in range(trials)]
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 trials, peakiness at 1e5 only")
    parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    opts = parser.parse_args()
    tasks = jobs_for(opts.quick)
    print(f"prs_study: {len(tasks)} runs on {opts.workers} process(es)", flush=True)
    results: dict[tuple, list] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=opts.workers) as pool:
        for name, n, m, rate, paper_rate, viol, sec in pool.map(one_trial, tasks):
            results.setdefault((name, n, m), []).append((rate, paper_rate, viol, sec))
            print(
                f"  {name:>12} n={n:>9,} {m:<10} acceptance {rate:.3f} "
                f"(paper count {paper_rate:.3f}) violations {viol}  {sec:.1f} s "
                f"[{time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
    suffix = "_quick" if opts.quick else ""  # a quick run never overwrites the full results
    write_table(results, suffix)
    plot(results, sorted({k[1] for k in results if k[0].startswith("peak")}), suffix)


def cell(results, key, col: int = 0) -> str:
    rates = np.array([r[col] for r in results[key]])
    return f"{100 * rates.mean():.1f} ± {100 * rates.std():.1f}"


def viol(results, key) -> str:
    return f"{np.mean([r[2] for r in results[key]]):.1f}"


def write_table(results, suffix: str = "") -> None:
    trials = len(results[("clutter 1", 100_000, "PRS")])
    lines = [
        f"Acceptance rate (%), mean ± sd over {trials} trials (A* on the peakiness target at "
        "1e6: 3 trials). PRS: accepted / evaluations of f, initial phase included. A*: draws "
        "per evaluation of f, and per evaluation of f or of its bound (the paper's count). "
        "Erraqabi et al. (2016) in brackets. Violations: envelope violations per run "
        "(PRS / PRS refine).",
        "",
        "| target | n | PRS | PRS refine | PRS Alg. 1 (uniform, kernel) | A* per f | "
        "A* per f or bound | simple rejection | violations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, n, label in [
        ("sine", 1_000_000, "sine 2-D"),
        ("clutter 1", 100_000, "clutter 1-D"),
        ("clutter 2", 100_000, "clutter 2-D"),
    ]:
        paper = PAPER[label]
        lines.append(
            f"| {label} | {n:.0e} | {cell(results, (name, n, 'PRS'))} ({100 * paper[0]:.1f}) "
            f"| {cell(results, (name, n, 'PRS refine'))} "
            f"| {cell(results, (name, n, 'PRS Alg. 1'))} "
            f"| {cell(results, (name, n, 'A*'))} "
            f"| {cell(results, (name, n, 'A*'), 1)} ({100 * paper[1]:.1f}) "
            f"| {cell(results, (name, n, 'SRS'))} ({100 * paper[2]:.3g}) "
            f"| {viol(results, (name, n, 'PRS'))} / {viol(results, (name, n, 'PRS refine'))} |"
        )
    for n in sorted({k[1] for k in results if k[0].startswith("peak")}):
        for a in PEAKS:
            name = f"peak a={a}"
            lines.append(
                f"| peakiness a={a} | {n:.0e} | {cell(results, (name, n, 'PRS'))} "
                f"| {cell(results, (name, n, 'PRS refine'))} | – "
                f"| {cell(results, (name, n, 'A*'))} | {cell(results, (name, n, 'A*'), 1)} "
                f"| {cell(results, (name, n, 'SRS'))} "
                f"| {viol(results, (name, n, 'PRS'))} / {viol(results, (name, n, 'PRS refine'))} |"
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
    series = (
        ("PRS", 0, "o-", "PRS"),
        ("PRS refine", 0, "s-", "PRS refine"),
        ("A*", 0, "^--", "A* per f"),
        ("A*", 1, "v--", "A* per f or bound"),
        ("SRS", 0, "x:", "simple rejection"),
    )
    for ax, n in zip(axes[0], budgets, strict=True):
        for m, col, style, label in series:
            rates = [np.array([r[col] for r in results[(f"peak a={a}", n, m)]]) for a in PEAKS]
            ax.errorbar(
                PEAKS,
                [r.mean() for r in rates],
                yerr=[r.std() for r in rates],
                fmt=style,
                label=label,
            )
        ax.set_title(f"f ∝ exp(-x)/(1+x)^a on [0, 10], budget n = {n:.0e}")
        ax.set_xlabel("peakiness a")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = ROOT / "figures" / f"prs_peakiness{suffix}.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

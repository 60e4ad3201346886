"""Reproduce the synthetic bandit study of Chen & Ghahramani (2016, Sec. 5.1, Fig. 1).

For D arms and N rewards per arm drawn from Normal, Uniform or LogNormal(0, 2)
(standardized, scaled by sigma, totals fixed to log p), draw X by Gumbel-max
racing and record (a) the empirical error (X differs from the exact argmax for
the same Gumbel noise) and (b) the fraction of the N*D rewards drawn, for
Racing-Normal, Racing-EBS and adapted lil'UCB, against delta.

Writes ``docs/results/bandit_study.md`` and PNG figures under
``docs/results/figures/``. ``--quick`` runs a reduced study (N = 1e4, fewer
repetitions, < 5 minutes on 2 cores) and prints the table.

Run: ``python benchmarks/bandit_study.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import numpy as np

from support.synthetic import (
    REWARD_DISTRIBUTIONS,
    bandit_population,
    gumbel_race_errors,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results"
ALGORITHMS = {"normal": "Racing-Normal", "ebs": "Racing-EBS", "lilucb": "lil'UCB"}


def run_setting(dist, bound, variance, n_arms, n_obs, sigma, delta, reps, seed):
    """Error rate and mean fraction of rewards drawn for one setting."""
    table, log_p = bandit_population(dist, n_arms, n_obs, sigma, rng=seed)
    # tight C = max_{n,n'} (l_in - l_in') as in the paper (EBS bound, lil'UCB scale)
    crange = float((table.max(axis=1) - table.min(axis=1)).max())

    errors, evals = gumbel_race_errors(
        table,
        log_p,
        reps,
        np.random.default_rng(seed + 1000),
        delta=delta,
        bound=bound,
        variance=variance,
        batch_size=2 if bound == "ebs" else 50,
        reward_range=None if bound == "normal" else crange,
    )
    return errors, evals.sum() / (reps * n_arms * n_obs)


def study(settings, deltas, reps_for, log):
    rows = []
    for name, dist, bound, variance, n_arms, n_obs, sigma in settings:
        for delta in deltas:
            reps = reps_for(bound, n_arms)
            t0 = time.perf_counter()
            errors, frac = run_setting(
                dist, bound, variance, n_arms, n_obs, sigma, delta, reps, seed=17
            )
            dt = time.perf_counter() - t0
            err = errors / reps
            se = np.sqrt(max(err, 1.0 / reps) * (1 - err) / reps)
            rows.append(
                dict(
                    study=name,
                    dist=dist,
                    bound=bound,
                    variance=variance,
                    D=n_arms,
                    N=n_obs,
                    sigma=sigma,
                    delta=delta,
                    reps=reps,
                    errors=errors,
                    error=err,
                    se=se,
                    frac=frac,
                    seconds=dt,
                )
            )
            log(
                f"  {name:14s} {dist:9s} {ALGORITHMS[bound]:13s} {variance:8s} D={n_arms:<3d} "
                f"delta={delta:<6g} error={err:.4f} (+-{se:.4f}, {reps} reps) "
                f"rewards={frac:.3f} ({dt:.1f}s)"
            )
    return rows


def markdown(rows, title, command):
    lines = [
        f"# {title}",
        "",
        f"Regenerate with `{command}`.",
        "",
        "| study | rewards | algorithm | variance | D | N | sigma | delta | reps | "
        "error | ± se | error ≤ delta | fraction of N·D drawn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r["error"] <= r["delta"] + 2 * r["se"] else "**no**"
        lines.append(
            f"| {r['study']} | {r['dist']} | {ALGORITHMS[r['bound']]} | {r['variance']} | "
            f"{r['D']} | {r['N']:.0e} | {r['sigma']:.0e} | {r['delta']:g} | {r['reps']} | "
            f"{r['error']:.4f} | {r['se']:.4f} | {ok} | {r['frac']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows, study_name, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = [r for r in rows if r["study"] == study_name]
    dists = [d for d in REWARD_DISTRIBUTIONS if any(r["dist"] == d for r in sub)]
    fig, axes = plt.subplots(2, len(dists), figsize=(4.2 * len(dists), 7.5), squeeze=False)
    for j, dist in enumerate(dists):
        for bound, label in ALGORITHMS.items():
            rs = [r for r in sub if r["dist"] == dist and r["bound"] == bound]
            if not rs:
                continue
            d = np.array([r["delta"] for r in rs])
            err = np.array([r["error"] for r in rs])
            reps = np.array([r["reps"] for r in rs])
            se = np.sqrt(np.maximum(err, 1e-12) * (1 - err) / reps)
            seen = err > 0
            line = axes[0, j].errorbar(
                d[seen],
                err[seen],
                yerr=[np.minimum(2 * se[seen], 0.9 * err[seen]), 2 * se[seen]],
                marker="o",
                capsize=3,
                label=label,
            )
            # no error seen: mark the one-sided 95% upper bound 3/reps (rule of three)
            axes[0, j].scatter(d[~seen], 3.0 / reps[~seen], marker="v", color=line[0].get_color())
            axes[1, j].plot(d, [r["frac"] for r in rs], marker="o", label=label)
        axes[0, j].plot(d, d, "k--", lw=1, label="error = δ")
        axes[0, j].scatter([], [], marker="v", color="gray", label="no error seen: 95% bound")
        axes[0, j].set(
            xscale="log",
            yscale="log",
            xlabel="δ",
            ylabel="empirical error",
            title=f"{dist} rewards",
            ylim=(1e-5, 0.5),
        )
        axes[1, j].set(
            xscale="log",
            yscale="log",
            xlabel="δ",
            ylabel="fraction of N·D rewards drawn",
            ylim=(1e-3, 1.5),
        )
        axes[0, j].legend(fontsize=8)
        axes[1, j].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_table(path):
    """Rows of a table written by this script (to redraw the figures)."""
    inverse = {v: k for k, v in ALGORITHMS.items()}
    rows = []
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 13 or cells[0] in ("study", "---"):
            continue
        rows.append(
            dict(
                study=cells[0],
                dist=cells[1],
                bound=inverse[cells[2]],
                variance=cells[3],
                D=int(cells[4]),
                N=int(float(cells[5])),
                sigma=float(cells[6]),
                delta=float(cells[7]),
                reps=int(cells[8]),
                error=float(cells[9]),
                se=float(cells[10]),
                frac=float(cells[12]),
            )
        )
    return rows


FIGURES = [
    ("D=10 σ=0.0001", "bandit_D10_sigma1e-4.png"),
    ("D=10 σ=0.001", "bandit_D10_sigma1e-3.png"),
    ("D=2", "bandit_D2.png"),
    ("D=100", "bandit_D100.png"),
    ("marginal", "bandit_marginal.png"),
]


def draw_figures(rows, n_obs):
    figs = OUT / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    for name, fname in FIGURES:
        if any(r["study"] == name for r in rows):
            plot(
                rows,
                name,
                figs / fname,
                f"Synthetic study (Chen & Ghahramani 2016), {name}, N = {n_obs:.0e}",
            )
            print(f"wrote {figs / fname}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced study (< 5 min)")
    parser.add_argument(
        "--replot",
        action="store_true",
        help="redraw the figures from docs/results/tables/bandit_study.md",
    )
    args = parser.parse_args()
    if args.replot:
        draw_figures(read_table(OUT / "tables" / "bandit_study.md"), 100_000)
        return

    if args.quick:
        n_obs, sigma, deltas = 10_000, 1e-3, [0.01, 0.05, 0.1]
        reps_for = lambda bound, d: {"lilucb": 30}.get(bound, 300)  # noqa: E731
        extra = []
    else:
        n_obs, sigma, deltas = 100_000, 1e-4, [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]

        def reps_for(bound, d):
            if bound == "lilucb":
                return 200 if d <= 10 else 50
            return 2000 if d <= 10 else 300

        extra = (
            [
                ("D=2", dist, b, "pairwise", 2, n_obs, sigma)
                for dist in REWARD_DISTRIBUTIONS
                for b in ALGORITHMS
            ]
            + [
                ("D=100", dist, b, "pairwise", 100, n_obs, sigma)
                for dist in ("normal",)
                for b in ("normal", "ebs")
            ]
            + [
                ("marginal", dist, b, "marginal", 10, n_obs, sigma)
                for dist in REWARD_DISTRIBUTIONS
                for b in ("normal", "ebs")
            ]
        )
    sigmas = [sigma] if args.quick else [1e-4, 1e-3]
    main_settings = [
        (f"D=10 σ={s:g}", dist, b, "pairwise", 10, n_obs, s)
        for s in sigmas
        for dist in REWARD_DISTRIBUTIONS
        for b in ALGORITHMS
    ]
    print(
        f"Synthetic bandit study ({'quick' if args.quick else 'full'}): N={n_obs:.0e}, "
        f"sigma={sigma:g}, deltas={deltas}"
    )
    t0 = time.perf_counter()
    rows = study(main_settings + extra, deltas, reps_for, print)
    print(f"done in {time.perf_counter() - t0:.0f}s")

    if args.quick:
        print()
        print(
            markdown(
                rows, "Synthetic bandit study (quick)", "python benchmarks/bandit_study.py --quick"
            )
        )
        return
    draw_figures(rows, n_obs)
    md = OUT / "tables" / "bandit_study.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(
        markdown(rows, "Synthetic bandit study: table", "python benchmarks/bandit_study.py")
    )
    print(f"wrote {md}")


if __name__ == "__main__":
    main()

"""SubsampledCategoricalGibbs against pm.CategoricalGibbsMetropolis, same model, same run.

Model: y_n ~ Normal(mu[q], 1) (cheap terms) or StudentT(4, mu[q], 1) (terms
about ten times dearer), n = 1..N, q ~ Categorical(uniform over D), with fixed
means. "concentrated": means 1/D apart, the data generated from the
middle one, so the conditional of q is a point mass. "diffuse": means
0.5/sqrt(N) apart, so several values keep posterior mass and races run long.

For each (N, D, posterior) the time per draw is measured by calling each
step's ``step(point)`` in a loop (after a warm-up that compiles), and the
per-observation terms evaluated per draw are counted (the exact step
evaluates the joint log density at every candidate: N*D terms a draw).

Writes ``docs/results/tables/categorical_gibbs.md`` (``--quick``: ``categorical_gibbs_quick.md``).
Run:
``python benchmarks/categorical_gibbs.py [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pymc as pm

from pymc_subsample import SubsampledCategoricalGibbs

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "categorical_gibbs.md"


def make_model(n_obs, n_cat, kind, likelihood="normal", seed=0):
    rng = np.random.default_rng(seed)
    if kind == "concentrated":
        mus = np.linspace(0.0, 1.0, n_cat)
    else:
        mus = np.arange(n_cat) * 0.5 / np.sqrt(n_obs)
    y = rng.normal(mus[n_cat // 2], 1.0, size=n_obs)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.full(n_cat, 1.0 / n_cat))
        if likelihood == "normal":
            pm.Normal("y", pm.math.constant(mus)[q], 1.0, observed=y_data)
        else:
            pm.StudentT("y", nu=4.0, mu=pm.math.constant(mus)[q], sigma=1.0, observed=y_data)
    return model, q


def time_step(step, point, draws):
    for _ in range(3):  # warm-up: first calls compile
        point, _ = step.step(point)
    t0 = time.perf_counter()
    evals = 0
    for _ in range(draws):
        point, stats = step.step(point)
        if stats and "n_evals" in stats[0]:
            evals += stats[0]["n_evals"]
    return (time.perf_counter() - t0) / draws, evals / draws


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N <= 1e5 only")
    args = parser.parse_args()
    global OUT
    if args.quick:  # never overwrite the full results
        OUT = OUT.with_name("categorical_gibbs_quick.md")
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rows = []
    for likelihood, n_obs, n_cat, kind in itertools.product(
        ("normal", "studentt"), sizes, (2, 10, 100), ("concentrated", "diffuse")
    ):
        model, q = make_model(n_obs, n_cat, kind, likelihood)
        point = model.initial_point()
        draws = min(max(5, int(1e7 / (n_obs * n_cat))), 200)
        print(
            f"{likelihood} N={n_obs:.0e} D={n_cat} {kind}: {draws} draws each ...",
            flush=True,
        )
        with model:
            exact = pm.CategoricalGibbsMetropolis([q], proposal="proportional")
            race = SubsampledCategoricalGibbs([q])
        baseline = "pymc"
        try:
            t_exact, _ = time_step(exact, point, draws)
        except ValueError:  # PyMC's proportional proposal fails on point-mass conditionals
            with model:
                exact = SubsampledCategoricalGibbs([q], bound="exact")
            t_exact, _ = time_step(exact, point, draws)
            baseline = "bound='exact'"
        t_race, evals = time_step(race, point, draws)
        rows.append(
            (likelihood, n_obs, n_cat, kind, baseline, t_exact, t_race, evals / (n_obs * n_cat))
        )
        print(
            f"  exact {t_exact * 1e3:.3f} ms/draw, racing {t_race * 1e3:.3f} ms/draw, "
            f"speed-up {t_exact / t_race:.1f}x, terms {evals / (n_obs * n_cat):.4f} "
            "of N*D",
            flush=True,
        )
    lines = [
        "# SubsampledCategoricalGibbs vs CategoricalGibbsMetropolis",
        "",
        "Regenerate with `python benchmarks/categorical_gibbs.py`. Time per draw of "
        '`step.step(point)` for `pm.CategoricalGibbsMetropolis(proposal="proportional")` '
        "(exact, N·D terms a draw; where it fails on a point-mass conditional, "
        "\"Probabilities do not sum to 1\", our `bound='exact'` step stands in) and "
        "`SubsampledCategoricalGibbs(delta=0.05)`, measured "
        "in the same run.",
        "",
        "| likelihood | N | D | posterior | exact step | exact ms/draw | racing ms/draw | "
        "speed-up | terms evaluated (fraction of N·D) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for likelihood, n_obs, n_cat, kind, base, te, tr, frac in rows:
        lines.append(
            f"| {likelihood} | {n_obs:.0e} | {n_cat} | {kind} | {base} | {te * 1e3:.3f} | "
            f"{tr * 1e3:.3f} | {te / tr:.2f}× | {frac:.4f} |"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

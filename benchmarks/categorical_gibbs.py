"""SubsampledCategoricalGibbs against pm.CategoricalGibbsMetropolis, same model, same run.

Model: y_n ~ Normal(mu[q], 1) (cheap terms) or StudentT(4, mu[q], 1) (terms
about ten times dearer), n = 1..N, q ~ Categorical(uniform over D), with fixed
means. "concentrated": means 1/D apart, the data generated from the
middle one, so the conditional of q is a point mass. "diffuse": means
0.5/sqrt(N) apart, so several values keep posterior mass and races cannot
decide early.

Each step runs at its defaults (``SubsampledCategoricalGibbs([q])``: first
batch and exact switch chosen by timing at construction; the redraw of the
row permutation, every N/10 draws, is timed apart and added, amortized). Time
per draw is measured by calling each step's ``step(point)`` in interleaved
blocks of about 0.2 s (at least 5 draws) each, after a warm-up that compiles
and lets the back-off settle (up to 40 draws or 2 s), median over blocks, so
that all sides see the same machine load and each is timed in its steady
state. Also reported: our own exact Gibbs step (``bound="exact"``: one
fused pass), the per-observation terms evaluated per draw, the looks per
draw, and the limit the race is measured against: terms evaluated x fused
per-term cost + looks x compiled-call floor, both units timed in the same
interleaved blocks as the steps (a fused pass over all N·D terms; a look at
one observation).

Writes ``docs/results/tables/categorical_gibbs.md`` (``--quick``:
``categorical_gibbs_quick.md``). Run:
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
from pymc_subsample.mcmc.cost import median_seconds
from pymc_subsample.options import RaceOptions

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "categorical_gibbs.md"
#: Warm-up of each step before timing: up to this many draws, or this many seconds (at
#: least two draws), so that a racing step is timed after its back-off has settled, as in
#: a chain of thousands of draws (its first few races on a diffuse conditional all run).
WARMUP_DRAWS, WARMUP_SECONDS = 40, 2.0
#: Interleaved timing blocks per step (the median is reported): a row of 10-20 ms per draw
#: gets about a dozen draws a block, and five blocks left it to a passing load.
BLOCKS = 9


class Timed:
    """A function timed beside the steps, in the same interleaved blocks, as a 'step'."""

    def __init__(self, fn):
        self.fn = fn

    def step(self, point):
        """Call the function once; return the point unchanged and empty stats."""
        self.fn()
        return point, [{}]


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


def interleaved(steps, point, seconds=0.2, blocks=BLOCKS):
    """Median seconds per draw of each step, timed in alternating blocks; racing stats.

    Each step's block lasts about ``seconds`` (its length in draws is set from
    a timed warm-up), so that every step is timed in its steady state rather
    than right after another step has flushed the caches.
    """
    points = dict.fromkeys(steps, point)
    sizes = {}
    for name, step in list(steps.items()):
        try:
            t_start = time.perf_counter()
            for k in range(WARMUP_DRAWS):  # first calls compile; the back-off settles
                points[name], _ = step.step(points[name])
                if k >= 1 and time.perf_counter() - t_start > WARMUP_SECONDS:
                    break
            t0 = time.perf_counter()
            for _ in range(3):
                points[name], _ = step.step(points[name])
            # blocks of about `seconds`: a cap of 2,000 draws made an easy draw's blocks
            # about 30 ms long, so that one audit (an exact pass) could fill half a block
            sizes[name] = int(np.clip(seconds * 3 / (time.perf_counter() - t0), 5, 100_000))
        except ValueError:  # PyMC's proportional proposal on a point-mass conditional
            del steps[name]
    times = {name: [] for name in steps}
    evals, rounds = [], []
    for _ in range(blocks):
        for name, step in list(steps.items()):
            block = sizes[name]
            t0 = time.perf_counter()
            for _ in range(block):
                try:
                    points[name], stats = step.step(points[name])
                except ValueError:  # PyMC's proportional proposal on a point-mass conditional
                    del steps[name], times[name]
                    break
                if name == "racing":
                    evals.append(stats[0]["n_evals"])
                    rounds.append(stats[0]["n_rounds"])
            else:
                times[name].append((time.perf_counter() - t0) / block)
    return {k: float(np.median(v)) for k, v in times.items()}, np.mean(evals), np.mean(rounds)


def unit_costs(step, point, n_cat):
    """Return the limit's units, to time beside the steps: a fused pass, a one-row look.

    Returns ``Timed`` functions: one fused pass over all N observations and D
    values (its time over N·D is the fused per-term cost), and a look at one
    observation (the compiled-call floor).
    """
    cands = [np.arange(n_cat)]
    one = np.zeros(1, dtype=np.int64)
    return {
        "fused": Timed(lambda: step.terms.loglik_sum(cands, point)),
        "floor": Timed(lambda: step.terms.loglik_batch(cands, one, point)),
    }


def shuffle_seconds_per_draw(step):
    """Return the time of a redraw of the row permutation per draw (amortized)."""
    seconds = median_seconds(lambda: step.terms.shuffle(np.random.default_rng(0)), 3)
    return seconds / step.shuffle_every


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N <= 1e5 only")
    parser.add_argument(
        "--only", default="", help='rows whose "likelihood N D posterior" contains this (e.g. '
        '"studentt 1e+04"); written to categorical_gibbs_only.md'
    )  # fmt: skip
    args = parser.parse_args()
    out = OUT.with_name("categorical_gibbs_quick.md") if args.quick else OUT
    out = out.with_name("categorical_gibbs_only.md") if args.only else out
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    grid = list(
        itertools.product(("normal", "studentt"), sizes, (2, 10, 100), ("concentrated", "diffuse"))
    )
    if not args.quick:
        grid += [("normal", 10_000_000, d, k) for d in (2, 10) for k in ("concentrated", "diffuse")]
    grid = [row for row in grid if args.only in f"{row[0]} {row[1]:.0e} {row[2]} {row[3]}"]
    rows = []
    for likelihood, n_obs, n_cat, kind in grid:
        model, q = make_model(n_obs, n_cat, kind, likelihood)
        point = model.initial_point()
        print(f"{likelihood} N={n_obs:.0e} D={n_cat} {kind} ...", flush=True)
        with model:
            steps = {
                "pymc": pm.CategoricalGibbsMetropolis([q], proposal="proportional"),
                "exact": SubsampledCategoricalGibbs([q], race=RaceOptions(bound="exact")),
                "racing": SubsampledCategoricalGibbs([q]),
            }
        for name in ("exact", "racing"):  # timed in the compiled tier a long chain reaches
            steps[name].finish_compiling()
        baseline = "pymc"
        try:
            steps["pymc"].step(point)
        except ValueError:  # PyMC's proportional proposal fails on point-mass conditionals
            del steps["pymc"]
            baseline = "bound='exact'"
        steps.update(unit_costs(steps["racing"], point, n_cat))  # timed under the same load
        times, evals, looks = interleaved(steps, point)
        times["racing"] += shuffle_seconds_per_draw(steps["racing"])  # rare, so add it here
        if "pymc" not in times:
            baseline = "bound='exact'"
        fused, floor = times["fused"] / (n_obs * n_cat), times["floor"]
        limit = evals * fused + looks * floor
        t_base = times.get("pymc", times["exact"])
        racing = steps["racing"]
        rows.append(
            (likelihood, n_obs, n_cat, kind, baseline, t_base, times["exact"], times["racing"],
             evals / (n_obs * n_cat), looks, limit, racing.batch_size, racing.exact_after)
        )  # fmt: skip
        print(
            f"  baseline {t_base * 1e3:.3f} ms, exact {times['exact'] * 1e3:.3f} ms, racing "
            f"{times['racing'] * 1e3:.3f} ms ({t_base / times['racing']:.1f}x), terms "
            f"{evals / (n_obs * n_cat):.4f} of N*D, looks {looks:.1f}, limit {limit * 1e3:.3f} ms",
            flush=True,
        )
    lines = [
        "# SubsampledCategoricalGibbs vs CategoricalGibbsMetropolis",
        "",
        "Regenerate with `python benchmarks/categorical_gibbs.py`. Milliseconds per draw of "
        f"`step.step(point)`, median of {BLOCKS} interleaved blocks of about 0.2 s (at least 5 "
        "draws) per step, after a warm-up of up to 40 draws or 2 s (compilation; the back-off "
        "settles): "
        '`pm.CategoricalGibbsMetropolis(proposal="proportional")` '
        '(the baseline; where it fails on a point-mass conditional, "Probabilities do not sum '
        "to 1\", our `bound='exact'` step stands in), our exact step (`bound='exact'`, one fused "
        "pass) and `SubsampledCategoricalGibbs([q])` at its defaults (delta = 0.05; "
        "m1 and the exact switch are chosen by timing at construction and shown; batches are "
        "whole random blocks of a row-permuted copy, and the redraw of that permutation every "
        "N/10 draws is added, amortized). "
        '"limit" is terms evaluated x fused per-term cost + looks x compiled-call floor, '
        "the cost of the same decisions with free bookkeeping; its two units (a fused pass "
        "over all N·D terms, a look at one observation) are timed in the same interleaved "
        "blocks as the steps.",
        "",
        "| likelihood | N | D | posterior | baseline | baseline ms | our exact ms | racing ms | "
        "speed-up vs baseline | vs our exact | terms (fraction of N·D) | looks | limit ms | "
        "m1 | exact switch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lik, n, d, kind, base, tb, te, tr, frac, looks, limit, m1, after in rows:
        lines.append(
            f"| {lik} | {n:.0e} | {d} | {kind} | {base} | {tb * 1e3:.3f} | {te * 1e3:.3f} | "
            f"{tr * 1e3:.3f} | {tb / tr:.2f}× | {te / tr:.2f}× | {frac:.4f} | {looks:.1f} | "
            f"{limit * 1e3:.3f} | {m1} | {after} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

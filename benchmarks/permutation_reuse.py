"""Error rates when races reuse one row permutation for K draws (blocks and windows).

The PyMC steps read each race's batches as whole random blocks (default) or
contiguous windows of a row-permuted copy of the data and redraw the
permutation every ``shuffle_every`` = K draws. Every single race is still a
uniformly random sample without replacement; races that share a permutation
are dependent. This measures whether that dependence shows in the error rate:

* the synthetic bandit study's populations (Racing-Normal, pairwise, D = 10,
  N = 1e4, the hard setting sigma = 2e-3), 3,000 Gumbel-max races per K,
  against fresh random index draws for every race;
* audits on a PyMC model: ``SubsampledCategoricalGibbs`` on a diffuse
  selector (N = 2e5, D = 6), every draw audited against the exact decision,
  per layout and K;
* chains on a small population (N = 1,000), where a chain can keep one
  permutation throughout: the spread of the chains' audited rates.

Writes ``docs/results/tables/permutation_reuse.md``. Run:
``python benchmarks/permutation_reuse.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from unittest import mock

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy import stats

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions
from support.synthetic import bandit_population, gumbel_race_errors

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "permutation_reuse.md"
KS = [1, 10, 100, 1000]


def interval(k, n):
    """95% Clopper–Pearson interval of a binomial rate."""
    lo = stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return lo, hi


#: A stress setting: blocks this long at N = 1e4 leave 78 blocks, a hundred times fewer than
#: the steps ever use (block_rows keeps at least MIN_BLOCKS = 8192 when blocks exceed 16 rows).
LONG_BLOCK = 128


@contextlib.contextmanager
def forced_block_rows(rows):
    """Make every race read blocks of ``rows`` rows (Python and compiled drivers)."""
    if rows is None:
        yield
        return
    with (
        mock.patch("pymc_subsample.racing.schedule.block_rows", lambda n: rows),
        mock.patch("pymc_subsample.racing.compiled.block_rows", lambda n: rows),
    ):
        yield


def bandit_rows(reps, delta=0.05):
    rows = []
    for dist in ("normal", "lognormal"):
        table, log_p = bandit_population(dist, 10, 10_000, 2e-3, rng=3)
        settings = [(None, "random", None)]
        settings += [(k, lay, None) for lay in ("blocks", "windows") for k in KS]
        settings += [(k, "blocks", LONG_BLOCK) for k in (1, 1000)]
        for k, layout, block in settings:
            with forced_block_rows(block):
                errors, evals = gumbel_race_errors(
                    table, log_p, reps, np.random.default_rng(11), shuffle_every=k, delta=delta,
                    layout=layout,
                )  # fmt: skip
            lo, hi = interval(errors, reps)
            label = "fresh index draws" if k is None else f"{layout}, K = {k}"
            if block is not None:
                label = f"blocks of {block} rows ({-(-table.shape[1] // block)} blocks), K = {k}"
            frac = evals.mean() / table.size
            rows.append(
                f"| {dist} | {label} | {reps} | {errors / reps:.4f} [{lo:.4f}, {hi:.4f}] "
                f"| {frac:.3f} |"
            )
            print(rows[-1], flush=True)
    return rows


def audited_rate(model, var, draws, rng, **race):
    """Audited disagreement count and number of audits of one chain of the Gibbs step.

    ``race``: fields of its :class:`~pymc_subsample.options.RaceOptions`.
    """
    with model:
        step = SubsampledCategoricalGibbs(
            [var],
            rng=rng,
            race=RaceOptions(exact_fraction=1.0, backoff=False, **race),
            audit=AuditOptions(every=1),
        )  # every draw races (no back-off to exact draws) and is audited
    point = model.initial_point()
    for _ in range(draws):
        point, _ = step.step(point)
    return step.n_disagreements, step.n_audits


def model_rows(draws):
    rng = np.random.default_rng(0)
    n_obs = 200_000
    mus = np.arange(6) * 1.0 / np.sqrt(n_obs)
    with pm.Model() as model:
        y = pm.Data("y_data", rng.normal(mus[3], 1.0, size=n_obs))
        q = pm.Categorical("q", p=np.full(6, 1 / 6))
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y)
    rows = []
    settings = [(layout, k, None) for layout in ("blocks", "windows") for k in KS]
    settings += [("blocks", k, LONG_BLOCK) for k in (1, 1000)]
    for layout, k, block in settings:
        with forced_block_rows(block):
            wrong, n = audited_rate(model, q, draws, rng=1, shuffle_every=k, batches=layout)
        lo, hi = interval(wrong, n)
        label = layout if block is None else f"blocks of {block} rows ({-(-n_obs // block)})"
        rows.append(f"| {label} | K = {k} | {n} | {wrong / n:.4f} [{lo:.4f}, {hi:.4f}] |")
        print(rows[-1], flush=True)
    return rows


def small_population_rows(chains, draws):
    """Chains on N = 1,000: one permutation can serve a whole chain, and its luck shows."""
    rng = np.random.default_rng(4)
    n_obs = 1000
    with pm.Model() as model:
        y = pm.Data("y_data", rng.normal(0.05, 1.0, size=n_obs))
        z = pm.Bernoulli("z", p=0.3)
        pm.Normal("y", 0.1 * z, 1.0, observed=y)
    settings = [
        ("random (fresh rows every race)", {"batches": "random"}),
        ("blocks, K = 1", {"batches": "blocks", "shuffle_every": 1}),
        ("blocks, K = N/10 = 100 (default)", {"batches": "blocks"}),
        ("blocks, K = 1000", {"batches": "blocks", "shuffle_every": 1000}),
        ("windows, K = 1000", {"batches": "windows", "shuffle_every": 1000}),
    ]
    rows = []
    for label, kw in settings:
        rates = []
        for seed in range(chains):
            wrong, n = audited_rate(model, z, draws, rng=seed, batch_size=50, **kw)
            rates.append(wrong / n)
        rates = np.array(rates)
        rows.append(
            f"| {label} | {chains} × {draws} | {rates.mean():.4f} | {rates.std():.4f} | "
            f"{rates.max():.4f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer races")
    args = parser.parse_args()
    out = OUT.with_name("permutation_reuse_quick.md") if args.quick else OUT
    reps, draws = (500, 200) if args.quick else (3000, 2000)
    lines = [
        "# Reusing a row permutation for K draws",
        "",
        "Regenerate with `python benchmarks/permutation_reuse.py`. Error rate with a 95% "
        "Clopper–Pearson interval; delta = 0.05 throughout.",
        "",
        "Blocks are 16 rows at these N (`block_rows`); the rows with blocks of 128 are a "
        "stress setting, far fewer blocks than the steps use (they keep at least 8,192 blocks "
        "when blocks exceed 16 rows, as from N = 2^18).",
        "",
        "Synthetic populations (Racing-Normal, pairwise, D = 10, N = 1e4, sigma = 2e-3):",
        "",
        "| rewards | batches | races | error rate | fraction of rewards drawn |",
        "|---|---|---|---|---|",
        *bandit_rows(reps),
        "",
        "Audits on a PyMC model (diffuse selector, N = 2e5, D = 6, "
        "`SubsampledCategoricalGibbs` racing the whole schedule, every draw audited):",
        "",
        "| batches | shuffle_every | audited draws | disagreement rate |",
        "|---|---|---|---|",
        *model_rows(draws),
        "",
        "Chains on a small population (a Bernoulli selector, N = 1,000, first batch 50, "
        "racing the whole schedule, every draw audited): the disagreement rate of each chain, "
        "its mean and spread over chains. A chain that keeps one permutation reads its races "
        "from it throughout, so the permutation's luck shows in the chain's rate (averaged "
        "over permutations, the rate is that of fresh rows whatever K is):",
        "",
        "| batches | chains × draws | mean rate | sd over chains | largest |",
        "|---|---|---|---|---|",
        *small_population_rows(*((4, 500) if args.quick else (8, 1500))),
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Racing bookkeeping cost per look, excluding the reward evaluation.

For D in {2, 10, 100}, both variance modes and batches of 50, 1,000 and 10,000
new observations a look: a schedule of 40 looks on arms that never separate
(all D arms alive at every look, the worst case), then the exact pass (a
fused-totals callback returning zeros; the population is four times the
looks' total, so the draws stay in the bitmap regime every race with an exact
switch runs in), the reward callback returning a preallocated C-ordered array,
so nearly all the time is the race's own work: the positions (random blocks,
the default layout), the compiled look (running means, spread statistics,
elimination), the driver. Reported per
look, with the first column (batch 50) the "cost of a look" at D = 10.

A second table gives the same looks in a compiled race (``race_compiled``),
whose reward function is a compiled one returning zeros. A third gives the
per-term cost of a race's look on a PyMC model
(y ~ Normal(mu[q], 1), N = 1e6 and 1e7, D = 10 candidates), positions drawn
afresh for every look as a race draws them (so memory is cold), for each
layout: random blocks of the row-permuted copy (the default), contiguous
windows of it, and scattered random rows; against one fused pass over all N.

Writes ``docs/results/tables/racing_overhead.md``. Run:
``python benchmarks/racing_overhead.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from numba import njit

from pymc_subsample.options import RaceOptions
from pymc_subsample.racing import RaceConfig, race_shared
from pymc_subsample.racing.compiled import CompiledRewards, race_compiled
from pymc_subsample.racing.schedule import ExactSwitch

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "racing_overhead.md"


def per_look(n_arms: int, variance: str, batch: int, looks: int = 40, reps: int = 10) -> float:
    buffers = {}

    def rewards(arms, idx):  # preallocated zeros of the right shape (blocks round batches up)
        shape = (len(arms), len(idx))
        if shape not in buffers:
            buffers[shape] = np.zeros(shape)
        return buffers[shape]

    config = RaceConfig(
        schedule=tuple(batch * (k + 1) for k in range(looks)),
        batches="blocks",
        variance=variance,
        exact=ExactSwitch.after_size(batch * looks),
    )
    n_obs = 4 * batch * (looks + 1)  # as in the compiled race: the exact pass before half

    def totals(arms):
        return np.zeros(len(arms))

    rng = np.random.default_rng(0)
    race_shared(rewards, n_arms, n_obs, config, rng=rng, totals=totals)  # compile, cache
    best = np.inf
    for _ in range(15):  # the machine's noise comes in bursts: the best of many short runs
        t0 = time.perf_counter()
        for _ in range(reps):
            race_shared(rewards, n_arms, n_obs, config, rng=rng, totals=totals)
        best = min(best, (time.perf_counter() - t0) / (reps * looks))
    return best * 1e6


@njit
def _zero_rewards(cand, rows):  # the compiled race's reward function: zeros, no model
    return (np.zeros((len(cand), len(rows))),)


def per_look_compiled(n_arms: int, variance: str, batch: int, looks: int = 40, reps: int = 10):
    """Microseconds per look of a compiled race (race_compiled), rewards of zeros (allocated)."""
    config = RaceConfig(
        schedule=tuple(batch * (k + 1) for k in range(looks)),
        batches="blocks",
        variance=variance,
        exact=ExactSwitch.after_size(batch * looks),
    )
    n_obs = 4 * batch * (looks + 1)  # the exact pass comes before half of the data
    data = CompiledRewards(_zero_rewards, [np.zeros(n_obs)])
    cand, offsets = np.arange(n_arms, dtype=float), np.zeros(n_arms)
    rng = np.random.default_rng(0)

    def run():
        race_compiled(
            data, cand, (), n_obs, config, rng=rng, offsets=offsets,
            totals=lambda arms: np.zeros(len(arms)),
        )  # fmt: skip

    run()  # compile
    best = np.inf
    for _ in range(15):  # the machine's noise comes in bursts: the best of many short runs
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        best = min(best, (time.perf_counter() - t0) / (reps * looks))
    return best * 1e6


def per_term_costs(n_obs, batch_sizes=(1_000, 10_000, 100_000)):
    """Ns per term of a look (positions and rewards) per layout, and of the fused sum."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from categorical_gibbs import make_model

    from pymc_subsample import SubsampledCategoricalGibbs
    from pymc_subsample.mcmc.cost import median_seconds
    from pymc_subsample.racing.schedule import position_stream

    n_cat = 10
    model, q = make_model(n_obs, n_cat, "concentrated")
    point = model.initial_point()
    rng = np.random.default_rng(0)
    streams = {
        layout: (lambda layout=layout: position_stream(layout, n_obs, rng))
        for layout in ("blocks", "windows", "random")
    }
    cands = [np.arange(n_cat)]
    costs = {}
    for layout, stream in streams.items():
        with model:
            step = SubsampledCategoricalGibbs(
                [q], race=RaceOptions(exact_fraction=1.0, batch_size=50, batches=layout)
            )
        terms = step.terms
        for m in batch_sizes:

            def look(m=m, terms=terms, stream=stream):
                return terms.loglik_batch(cands, stream().take(m), point)

            costs[layout, m] = median_seconds(look, 15) / (m * n_cat)
    fused = median_seconds(lambda: terms.loglik_sum(cands, point), 15) / (n_obs * n_cat)
    return [
        (m, costs["blocks", m], costs["windows", m], costs["random", m], fused) for m in batch_sizes
    ]


def look_header(batches) -> list[str]:
    """Header lines of a per-look table."""
    return [
        "| D | variance | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|---|" + "---|" * len(batches),
    ]


def look_rows(per_look_fn, batches) -> list[str]:
    """Table rows of ``per_look_fn(D, variance, batch)`` microseconds, printed as they come."""
    rows = []
    for n_arms in (2, 10, 100):
        for variance in ("pairwise", "marginal"):
            cells = [per_look_fn(n_arms, variance, b) for b in batches]
            rows.append(
                f"| {n_arms} | {variance} | " + " | ".join(f"{c:.1f}" for c in cells) + " |"
            )
            print(rows[-1], flush=True)
    return rows


def main():
    batches = (50, 1000, 10_000)
    lines = [
        "# Racing bookkeeping cost per look",
        "",
        "Regenerate with `python benchmarks/racing_overhead.py`. Microseconds per look, "
        "rewards excluded, all D arms alive (best of 15 repetitions).",
        "",
        *look_header(batches),
    ]
    lines += look_rows(per_look, batches)
    lines += [
        "",
        "The same looks in a compiled race (`race_compiled`, what the Gibbs step runs for a "
        "lone scalar at large N): microseconds per look, the reward function a compiled one "
        "that allocates zeros, 40 looks then the exact pass.",
        "",
        *look_header(batches),
    ]
    lines += look_rows(per_look_compiled, batches)
    lines += [
        "",
        "Per-term cost of a look (drawing its positions and evaluating its terms, memory "
        "cold), y ~ Normal(mu[q], 1), D = 10 candidates (ns per term; ratio to one fused pass "
        "over all N):",
        "",
        "| N | batch | random blocks (default) | windows | scattered rows | fused pass | "
        "blocks / fused | windows / fused | rows / fused |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n_obs in (1_000_000, 10_000_000):
        for m, blocks, window, rows, fused in per_term_costs(n_obs):
            lines.append(
                f"| {n_obs:.0e} | {m} | {blocks * 1e9:.3f} | {window * 1e9:.3f} | "
                f"{rows * 1e9:.3f} | {fused * 1e9:.3f} | {blocks / fused:.1f}× | "
                f"{window / fused:.1f}× | {rows / fused:.1f}× |"
            )
            print(lines[-1], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

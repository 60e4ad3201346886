"""Racing bookkeeping cost per round, excluding reward evaluation.

Two measurements, for D = 10 and D = 100 and both variance modes:

* per round at a fixed batch of 50 (a schedule of 40 looks, 50 new indices
  each, on arms that never separate; the reward callback returns a view of a
  zero array, so nearly all the time is the race's own work: index draws,
  running statistics, bounds, elimination);
* per race on the synthetic study's population (D arms, N = 1e5, doubling
  schedule), where the time spent inside the reward callback is subtracted.

Writes ``docs/results/racing_overhead.md``. Run:
``python benchmarks/racing_overhead.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pymc_subsample.racing import race, sample_categorical
from pymc_subsample.racing.synthetic import bandit_population

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "racing_overhead.md"


def fixed_batch(n_arms, variance, looks=40, batch=50, reps=30):
    n_obs = batch * (looks + 1)
    schedule = [batch * (k + 1) for k in range(looks)]
    zeros = np.zeros((n_arms, n_obs))

    def rewards(arms, idx):
        return zeros[: len(arms), : len(idx)]

    race(rewards, n_arms, n_obs, schedule=schedule, variance=variance)  # cache B
    rounds = 0
    t0 = time.perf_counter()
    for r in range(reps):
        rounds += race(rewards, n_arms, n_obs, schedule=schedule, variance=variance, rng=r).n_rounds
    return (time.perf_counter() - t0) / rounds * 1e6


def doubling(n_arms, variance, n_obs=100_000, reps=100):
    table, _ = bandit_population("normal", n_arms, n_obs, 1e-4, rng=0)
    spent = [0.0]

    def rewards(arms, idx):
        t = time.perf_counter()
        out = table[np.ix_(arms, idx)]
        spent[0] += time.perf_counter() - t
        return out

    sample_categorical(np.zeros(n_arms), rewards, n_obs, variance=variance, rng=0)
    spent[0] = 0.0
    rounds = evals = 0
    t0 = time.perf_counter()
    for r in range(reps):
        _, res = sample_categorical(np.zeros(n_arms), rewards, n_obs, variance=variance, rng=r)
        rounds += res.n_rounds
        evals += res.n_evaluations
    own = time.perf_counter() - t0 - spent[0]
    return own / rounds * 1e6, own / evals * 1e9, rounds / reps, evals / reps


def main():
    lines = [
        "# Racing bookkeeping cost",
        "",
        "Regenerate with `python benchmarks/racing_overhead.py`. Times exclude the reward "
        "callback.",
        "",
        "| D | variance | µs per round, batch 50 | µs per round, doubling race | "
        "ns per reward drawn | rounds per race | rewards per race |",
        "|---|---|---|---|---|---|---|",
    ]
    for n_arms in (10, 100):
        for variance in ("pairwise", "marginal"):
            print(f"measuring D={n_arms} {variance} ...")
            fixed = fixed_batch(n_arms, variance)
            per_round, per_reward, rounds, evals = doubling(n_arms, variance)
            lines.append(
                f"| {n_arms} | {variance} | {fixed:.0f} | {per_round:.0f} | "
                f"{per_reward:.0f} | {rounds:.1f} | {evals:.0f} |"
            )
            print("  " + lines[-1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

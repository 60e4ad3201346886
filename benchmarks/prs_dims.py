"""How far in dimension a tabulated pliable envelope goes: d = 1..6.

Targets on the box [-6, 6]^d:

* a correlated Gaussian, N(0, S) with S = 0.5 I + 0.5 (all correlations 0.5);
* a two-component mixture 0.5 N(m, I) + 0.5 N(-m, I), m = (1.5, ..., 1.5).

For each d, PRS (``build_envelope`` then ``draw``, the defaults: two-stage
design, estimator chosen by mass) runs on a budget of n = 1e5 evaluations with
N = n^((2s+d)/(3s+d)) initial points, on a grid of about 1e6 cells
(``CELLS``: 4096, 512, 64, 32, 16, 10 per side), optionally refitting the
envelope each time the evaluations grow by half. Reported: acceptance
(accepted draws / evaluations, initial phase included), envelope violations,
seconds, and the peak memory traced during a run (the log-linear fit
needs (d+1)^2 floats per cell while it runs, so from d = 4 the default
estimator uses the kernel estimate only). 2 seeds each.

Writes ``docs/results/tables/prs_dims.md``. Run:
``python benchmarks/prs_dims.py [--max-dim 6] [--seeds 2]``.
"""

from __future__ import annotations

import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from pymc_subsample.prs import build_envelope, default_n_init, draw, refit_envelope

ROOT = Path(__file__).resolve().parent.parent / "docs" / "results"
CELLS = {1: 4096, 2: 512, 3: 64, 4: 32, 5: 16, 6: 10}
BUDGET = 100_000
SEEDS = 2


def gaussian(d: int):
    cov = 0.5 * np.eye(d) + 0.5
    return stats.multivariate_normal(np.zeros(d), cov).logpdf


def mixture(d: int):
    m = np.full(d, 1.5)
    a, b = stats.multivariate_normal(m), stats.multivariate_normal(-m)

    def logpdf(x):
        return np.logaddexp(a.logpdf(x), b.logpdf(x)) + np.log(0.5)

    return logpdf


def run(target: str, d: int, refine: bool, seed: int) -> tuple[float, int, float, float]:
    logpdf = (gaussian if target == "gaussian" else mixture)(d)

    def lp(x):
        return np.atleast_1d(logpdf(x))

    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    tracemalloc.start()
    n_init = default_n_init(BUDGET, d, refine=refine)
    env = build_envelope(lp, rng, n_init, bounds=[(-6.0, 6.0)] * d, n_cells=CELLS[d])
    used, accepted, violations, rate = n_init, 0, 0, 0.5
    next_refit = 1.5 * used
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        while used < BUDGET:
            want = max(1, min(int((BUDGET - used) * rate) + 1, 5_000))
            res = draw(
                env,
                lp,
                rng,
                want,
                rate=rate,
                record=env.design if refine else None,
                max_batch=1024 + used // 16,
            )
            used += res.n_evaluations
            accepted += len(res.x)
            violations += res.violations
            rate = max(len(res.x) / max(res.n_evaluations, 1), 0.02)
            if refine and used >= next_refit:
                env = refit_envelope(env)
                next_refit = 1.5 * used
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return accepted / used, violations, time.perf_counter() - t0, peak / 2**20


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-dim", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    opts = parser.parse_args()
    lines = [
        f"PRS in d dimensions, budget {BUDGET:.0e}, box [-6, 6]^d, mean ± sd over {opts.seeds} "
        "seed(s). "
        "Acceptance (%) counts the initial phase; memory is the peak traced by Python during "
        "one run (the envelope fit dominates).",
        "",
        "| target | d | cells per side | PRS | PRS refine | violations (PRS / refine) "
        "| seconds (PRS / refine) | peak memory MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target in ("gaussian", "mixture"):
        for d in range(1, opts.max_dim + 1):
            out = {}
            for refine in (False, True):
                out[refine] = [run(target, d, refine, s) for s in range(opts.seeds)]
                r = np.array([o[0] for o in out[refine]])
                print(
                    f"{target} d={d} refine={refine}: {100 * r.mean():.1f} ± {100 * r.std():.1f}"
                    f"  {np.mean([o[2] for o in out[refine]]):.1f} s",
                    flush=True,
                )

            def cell(refine, k=0, scale=100.0, fmt=".1f", out=out):
                v = np.array([o[k] for o in out[refine]]) * scale
                return f"{v.mean():{fmt}} ± {v.std():{fmt}}" if k == 0 else f"{v.mean():{fmt}}"

            name = "correlated Gaussian" if target == "gaussian" else "2-component mixture"
            lines.append(
                f"| {name} | {d} | {CELLS[d]} | {cell(False)} | {cell(True)} "
                f"| {cell(False, 1, 1.0)} / {cell(True, 1, 1.0)} "
                f"| {cell(False, 2, 1.0)} / {cell(True, 2, 1.0)} "
                f"| {max(o[3] for o in out[False] + out[True]):.0f} |"
            )
    path = ROOT / "tables" / "prs_dims.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""RacingMetropolis with control variates on a logistic regression of a million rows.

Model: y ~ Bernoulli(logit^-1(a + X b)), X with 4 standard-normal covariates,
N = 1,000,000 rows in pm.Data (``tests/support/models.py``, the model of the
benchmarks). The same model is sampled with NUTS and with
RacingMetropolis with hand settings of an earlier release (a random walk on one
coordinate at a time from scale 4/sqrt(N), tuned as pm.Metropolis does; the
defaults are measured in ``benchmarks/racing_metropolis.py``). The script prints
:func:`pymc_subsample.compare_runs` (posterior summaries, ESS per second, data
fraction, audit error) and saves the posterior marginals of both runs.

Run: ``python examples/logistic_large_n.py [--quick] [--out DIR]`` (``--quick``:
N = 100,000); writes ``logistic_marginals.png`` and ``logistic_table.md`` into ``--out``
(default: the working directory; ``--out docs/examples`` regenerates the documentation's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import matplotlib
import numpy as np
import pymc as pm

from pymc_subsample import RacingMetropolis, compare_runs
from pymc_subsample.options import AuditOptions, ProposalOptions

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the study support package (tests/support)
from support.models import logistic_data, logistic_model  # noqa: E402

matplotlib.use("Agg")


def build_model(n_obs: int, seed: int = 0) -> pm.Model:
    return logistic_model(*logistic_data(n_obs, seed))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 100,000")
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="output directory (default: working directory)"
    )
    args = parser.parse_args()
    out = args.out
    n_obs = 100_000 if args.quick else 1_000_000
    model = build_model(n_obs)
    kw = {"chains": 2, "cores": 1, "random_seed": 1, "progressbar": True}
    runs = {}
    with model:
        print(f"N = {n_obs:,}: NUTS, 2 chains of 300 draws ...", flush=True)
        t0 = time.perf_counter()
        runs["NUTS"] = pm.sample(draws=300, tune=300, **kw)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
        print(f"N = {n_obs:,}: RacingMetropolis, 2 chains of 1000 draws ...", flush=True)
        step = RacingMetropolis(
            [model["a"], model["b"]],
            audit=AuditOptions(every=20),
            proposal_options=ProposalOptions(elemwise=True, tune_interval=50),
            scaling=4 / np.sqrt(n_obs),
        )
        t0 = time.perf_counter()
        runs["RacingMetropolis"] = pm.sample(draws=1000, tune=500, step=[step], **kw)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    table = compare_runs(runs, var_names=["a", "b"])
    cols = ["mean", "sd", "ess_bulk", "r_hat", "ess_bulk_per_s", "mean_frac_evals"]
    text = table[[c for c in cols if c in table.columns]].round(4).to_markdown()
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logistic_table.md").write_text(text + "\n")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(15, 3))
    for name, idata in runs.items():
        post = idata.posterior
        columns = [post["a"].values.ravel()] + [post["b"].values[..., k].ravel() for k in range(4)]
        for ax, values, label in zip(
            axes, columns, ["a", *(f"b[{k}]" for k in range(4))], strict=True
        ):
            ax.hist(values, bins=30, density=True, histtype="step", lw=1.5, label=name)
            ax.set_xlabel(label)
    axes[0].set_ylabel("posterior density")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Logistic regression, N = {n_obs:,}: posterior marginals of both runs")
    fig.tight_layout()
    path = out / "logistic_marginals.png"
    fig.savefig(path, dpi=110)
    print(f"wrote {path} and {out / 'logistic_table.md'}")


if __name__ == "__main__":
    main()

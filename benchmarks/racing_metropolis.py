"""RacingMetropolis against pm.Metropolis and NUTS on logistic regression, same run.

Logistic regression with d = 5 covariates (intercept included) and N in
{1e5, 1e6}. Each sampler runs 2 chains with the same seed, started at the true
coefficients (the bulk of the posterior: this measures mixing, not burn-in); reported: minimum
bulk ESS over the coefficients, sampling time (``pm.sample``'s own,
tuning included), ESS per second, per-observation terms evaluated during the
kept draws (RacingMetropolis: its ``n_evals`` stat; pm.Metropolis: 2N per
decision, one decision per dimension, as its ``delta_logp`` evaluates both
points; NUTS: N per gradient evaluation, ``n_steps`` per draw), ESS per million terms and, for
RacingMetropolis, the mean data fraction ``frac_evals`` and the audit error
rate. RacingMetropolis runs twice: with its default control variates (races
on Taylor residuals; the expansion passes over the data during tuning are
counted in ``n_evals`` of tuning draws only) and with ``control_variates=False``.
Both Metropolis samplers use the same proposal: a random walk on one
dimension at a time (``elemwise=True``, pm.Metropolis's default for vector
variables) with PyMC's per-dimension scale tuning (every 50 draws) from the same
initial scale, 4/sqrt(N).

Writes ``docs/results/tables/racing_metropolis.md`` (with ``--only N``:
``racing_metropolis_N.md``, one size; with ``--quick``: ``racing_metropolis_quick.md``). Run:
``python benchmarks/racing_metropolis.py [--quick] [--only N]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

from pymc_subsample import RacingMetropolis

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
OUT = OUT / "racing_metropolis.md"


TRUE_BETA = np.array([0.8, -0.5, 0.3, 0.0])


def make_model(n_obs: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_obs, 4))
    y = rng.binomial(1, 1 / (1 + np.exp(-(0.2 + x @ TRUE_BETA))))
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=4)
        pm.Bernoulli("y", logit_p=a + x_data @ b, observed=y_data)
    return model


def run(model, kind, draws, tune, seed=1):
    # both Metropolis samplers start at the scale of the posterior sd (about 2/sqrt(N)
    # for these coefficients, times 2 for one-dimension-at-a-time moves)
    scaling = 4.0 / np.sqrt(model["x"].get_value().shape[0])
    with model:
        if kind in ("racing", "racing_cv"):
            step = [
                RacingMetropolis(
                    [model["a"], model["b"]],
                    scaling=scaling,
                    tune_interval=50,
                    elemwise=True,
                    audit_every=20,
                    control_variates=kind == "racing_cv",
                )
            ]
        elif kind == "metropolis":
            step = [pm.Metropolis([model["a"], model["b"]], scaling=scaling, tune_interval=50)]
        else:
            step = None
        t0 = time.perf_counter()
        idata = pm.sample(
            initvals={"a": 0.2, "b": TRUE_BETA},  # start in the bulk: measure mixing, not burn-in
            draws=draws,
            tune=tune,
            chains=2,
            step=step,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
        wall = time.perf_counter() - t0
    return idata, wall


def row(label, n_obs, idata, wall):
    ess = az.ess(idata, var_names=["a", "b"])
    min_ess = float(min(float(ess[v].min()) for v in ("a", "b")))
    seconds = float(idata["sample_stats"].attrs.get("sampling_time", wall))
    ss = idata.sample_stats
    if "n_evals" in ss:
        evals = float(ss["n_evals"].sum())
        frac = float(ss["frac_evals"].mean())
        audits = ss["audit_agree"].values
        err = float((audits[audits >= 0] == 0).mean()) if (audits >= 0).any() else np.nan
    elif "n_steps" in ss:
        evals, frac, err = float(ss["n_steps"].sum()) * n_obs, np.nan, np.nan
    else:
        # one decision per dimension (5), each computing the log density at both points
        evals, frac, err = float(ss["accepted"].size) * 5 * 2 * n_obs, np.nan, np.nan
    return dict(
        sampler=label,
        N=n_obs,
        ess=min_ess,
        seconds=seconds,
        ess_s=min_ess / seconds,
        evals=evals,
        ess_per_m=min_ess / evals * 1e6,
        frac=frac,
        audit_err=err,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1e5 only, fewer draws")
    parser.add_argument("--only", type=int, help="run this N only (table gets a suffix)")
    args = parser.parse_args()
    global OUT
    plan = {100_000: (600, 300, 200)} if not args.quick else {100_000: (300, 300, 150)}
    if not args.quick:
        plan[1_000_000] = (200, 100, 100)
    if args.only:
        plan = {args.only: plan[args.only]}
        OUT = OUT.with_name(f"racing_metropolis_{args.only}.md")
    if args.quick:  # never overwrite the full results
        OUT = OUT.with_name("racing_metropolis_quick.md")
    rows = []
    for n_obs, (draws, tune, nuts_draws) in plan.items():
        model = make_model(n_obs)
        for label, kind, d, t in [
            ("RacingMetropolis (control variates, default)", "racing_cv", draws, tune),
            ("RacingMetropolis without control variates", "racing", draws, tune),
            ("pm.Metropolis", "metropolis", draws, tune),
            ("NUTS", "nuts", nuts_draws, nuts_draws),
        ]:
            print(f"N={n_obs:.0e}: {label}, {d} draws + {t} tune, 2 chains ...", flush=True)
            idata, wall = run(model, kind, d, t)
            r = row(label, n_obs, idata, wall)
            rows.append(r)
            print(
                f"  min ESS {r['ess']:.0f}, {r['seconds']:.1f} s, ESS/s {r['ess_s']:.2f}, "
                f"ESS per 1e6 terms {r['ess_per_m']:.3f}, data fraction {r['frac']:.3f}",
                flush=True,
            )
    lines = [
        "# RacingMetropolis vs pm.Metropolis and NUTS (logistic regression, d = 5)",
        "",
        "Regenerate with `python benchmarks/racing_metropolis.py`. Same run, 2 chains.",
        "",
        "| N | sampler | min ESS | seconds | ESS/s | terms evaluated | ESS per 10⁶ terms "
        "| data fraction | audited draws with a wrong decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['N']:.0e} | {r['sampler']} | {r['ess']:.0f} | {r['seconds']:.1f} | "
            f"{r['ess_s']:.2f} | {r['evals']:.3g} | {r['ess_per_m']:.3f} | "
            f"{r['frac']:.3f} | {r['audit_err']:.3f} |"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

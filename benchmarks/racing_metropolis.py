"""RacingMetropolis at its defaults against the samplers a user would pick instead.

Models (``tests/support/models.py`` builds the data and the PyMC models): a logistic
regression with an intercept and four covariates at N in {1e5, 1e6, 1e7}, and a
robust (Student-t, 4 degrees of freedom) regression at N = 1e6. Samplers, in
the same run, chains one after the other:

* ``RacingMetropolis([a, b])`` exactly as a new user writes it: no ``initvals``,
  no ``scaling`` (chains start at ``model.initial_point()``; the step finds the
  bulk itself). 2 chains, 500 tuning + 500 kept draws. Its construction
  (compilation) is reported apart; its sampling time includes the warm-up
  (Newton passes over the data).
* A separate audited run (1 chain, every decision replayed exactly) gives the
  error rate per decision.
* Peers (the optional ``peers`` extra; skipped with a message when absent):
  numpyro NUTS on all data, numpyro HMCECS (NUTS inner kernel, Taylor proxy at
  a full-data MAP found by BFGS, subsample 1000), nutpie, and PyMC's NUTS at
  N = 1e5. Compilation is reported apart. nutpie and PyMC's NUTS run at
  N = 1e5 only (their gradients on this model take minutes per chain above),
  and at N = 1e7 numpyro's NUTS runs one chain.

Reported: min bulk ESS over the coefficients, seconds, ESS/s, agreement of the
posterior means with the reference (numpyro NUTS, else PyMC NUTS) in units of
the combined Monte Carlo standard error, and for RacingMetropolis the
observations read per decision (median and mean: the batch a decision needs,
which theory says does not grow with N) and the audited error per decision.

Writes ``docs/results/tables/racing_metropolis_<tag>.md`` and ``.json`` per
(model, N); ``--figure`` then draws ``docs/results/figures/racing_metropolis_batch.png``
and the combined table ``racing_metropolis.md`` from all the JSON files. Run:
``python benchmarks/racing_metropolis.py --n 100000 [--model studentt]``, then
``python benchmarks/racing_metropolis.py --figure``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import arviz as az
import numpy as np
import peers
import pymc as pm

from pymc_subsample import RacingMetropolis
from pymc_subsample.mcmc.surrogate import TaylorSurrogate
from pymc_subsample.options import AuditOptions
from support import models

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "docs" / "results" / "tables"
FIGURES = ROOT / "docs" / "results" / "figures"
COEFS = list(models.COEFS)


def summarise(idata, names):
    """Min bulk ESS over the coefficients; means, sds and MCSEs per coefficient."""
    summ = az.summary(idata, var_names=names, kind="all")
    rows = [r for r in summ.index if r.split("[")[0] in ("a", "b")]
    return (
        float(summ.loc[rows, "ess_bulk"].astype(float).min()),
        {r: float(summ.loc[r, "mean"]) for r in summ.index},
        {r: float(summ.loc[r, "sd"]) for r in summ.index},
        {r: float(summ.loc[r, "mcse_mean"]) for r in summ.index},
    )


def ours(model, names, draws=500, tune=500, chains=2, seed=1):
    with model:
        t0 = time.perf_counter()
        step = RacingMetropolis([model[v] for v in names])
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        idata = pm.sample(
            draws=draws, tune=tune, chains=chains, cores=1, step=[step], random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
    min_ess, means, sds, mcses = summarise(idata, names)
    ss = idata.sample_stats
    sur = step.surrogate
    if isinstance(sur, TaylorSurrogate):  # value, first and second derivative, two points
        per_point = 6
    else:  # the stencil's points and the two points, or the two points alone
        per_point = sur.n_points + 2 if sur is not None else 2
    obs = ss["n_evals"].values.ravel() / per_point  # observations read per decision
    return {
        "sampler": "RacingMetropolis (defaults)",
        "min_ess": min_ess,
        "seconds": seconds,
        "compile_seconds": build,
        "means": means,
        "sds": sds,
        "mcses": mcses,
        "obs_median": float(np.median(obs)),
        "obs_mean": float(obs.mean()),
        "accept": float(ss["accepted"].mean()),
        "chains": chains,
        "draws": draws,
    }


def audited(model, names, draws, seed=3):
    with model:
        step = RacingMetropolis([model[v] for v in names], audit=AuditOptions(every=1))
        idata = pm.sample(
            draws=draws, tune=200, chains=1, cores=1, step=[step], random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    ss = idata.sample_stats
    return int(ss["n_wrong"].sum()), int(ss["n_audited"].sum())


def pymc_nuts(model, names, draws=500, tune=500, chains=2, seed=2):
    with model:
        t0 = time.perf_counter()
        idata = pm.sample(
            draws=draws, tune=tune, chains=chains, cores=1, random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
    seconds = float(idata["sample_stats"].attrs.get("sampling_time", wall))
    min_ess, means, sds, mcses = summarise(idata, names)
    return {
        "sampler": "PyMC NUTS", "min_ess": min_ess, "seconds": seconds,
        "compile_seconds": wall - seconds, "means": means, "sds": sds, "mcses": mcses,
        "chains": chains, "draws": draws,
    }  # fmt: skip


def from_peer(res) -> dict:
    return {
        "sampler": res.name, "min_ess": res.min_ess, "seconds": res.seconds,
        "compile_seconds": res.compile_seconds, "means": res.means, "sds": res.sds,
        "mcses": res.mcses, "chains": res.chains, "draws": res.draws,
    }  # fmt: skip


def agreement(row, ref) -> float:
    """Largest |mean difference| over the coefficients, in combined MCSEs."""
    worst = 0.0
    for c in COEFS:
        se = np.hypot(row["mcses"][c], ref["mcses"][c])
        worst = max(worst, abs(row["means"][c] - ref["means"][c]) / se)
    return worst


def run(model_kind: str, n_obs: int) -> None:
    big = n_obs >= 10_000_000
    data = models.logistic_data if model_kind == "logistic" else models.studentt_data
    build = models.logistic_model if model_kind == "logistic" else models.studentt_model
    x, y = data(n_obs)
    model = build(x, y)
    names = ["a", "b"] + (["sigma"] if model_kind == "studentt" else [])
    rows = []
    print(f"{model_kind} N={n_obs:.0e}: RacingMetropolis ...", flush=True)
    rows.append(ours(model, names))
    print(f"  {rows[-1]['min_ess']:.0f} ESS in {rows[-1]['seconds']:.1f} s", flush=True)
    wrong, n_audit = audited(model, names, 60 if big else 200)
    print(f"  audits: {wrong} of {n_audit} decisions differ", flush=True)
    reasons = peers.available()
    nuts_fn = getattr(peers, f"{model_kind}_numpyro_nuts")
    ecs_fn = getattr(peers, f"{model_kind}_numpyro_hmcecs")
    skipped = []
    for key, fn, label in [
        ("numpyro_nuts", nuts_fn, "numpyro NUTS"),
        ("numpyro_hmcecs", ecs_fn, "numpyro HMCECS"),
    ]:
        if reasons[key]:
            skipped.append(f"{label}: {reasons[key]}")
            print(f"  skipped {label}: {reasons[key]}", flush=True)
            continue
        print(f"  {label} ...", flush=True)
        rows.append(from_peer(fn(x, y, chains=1 if big and key == "numpyro_nuts" else 2)))
        print(f"  {rows[-1]['min_ess']:.0f} ESS in {rows[-1]['seconds']:.1f} s", flush=True)
    if n_obs > 100_000:
        skipped.append(
            "nutpie: run at N = 1e5 only (its Bernoulli-logit gradient costs about 1 ms per "
            "2e4 rows here, so 2 x 1000 draws at N = 1e6 take over ten minutes)"
        )
    elif reasons["nutpie"]:
        skipped.append(f"nutpie: {reasons['nutpie']}")
    else:
        print("  nutpie ...", flush=True)
        rows.append(from_peer(peers.nutpie_sample(model)))
    if n_obs <= 100_000:
        print("  PyMC NUTS ...", flush=True)
        rows.append(pymc_nuts(model, names))
    else:
        skipped.append("PyMC NUTS: run at N = 1e5 only (about 0.1 s a draw per 1e5 rows)")
    ref = next((r for r in rows if r["sampler"].startswith("numpyro NUTS")), None)
    ref = ref or next((r for r in rows if r["sampler"] == "PyMC NUTS"), None)
    for r in rows:
        r["ess_s"] = r["min_ess"] / r["seconds"]
        r["agree"] = agreement(r, ref) if ref is not None and r is not ref else None
    result = {
        "model": model_kind, "N": n_obs, "rows": rows, "audit_wrong": wrong,
        "audit_decisions": n_audit, "skipped": skipped,
        "reference": None if ref is None else ref["sampler"],
    }  # fmt: skip
    tag = f"{model_kind}_{n_obs:.0e}".replace("+", "")
    TABLES.mkdir(parents=True, exist_ok=True)
    (TABLES / f"racing_metropolis_{tag}.json").write_text(json.dumps(result, indent=1))
    print(table([result]))


def table(results) -> str:
    lines = [
        "| model | N | sampler | chains × draws | min ESS | seconds | ESS/s | compile s | "
        "max |Δ mean| / MCSE | observations per decision (median, mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["rows"]:
            agree = "reference" if r["agree"] is None else f"{r['agree']:.1f}"
            obs = f"{r['obs_median']:.0f}, {r['obs_mean']:.0f}" if "obs_median" in r else ""
            lines.append(
                f"| {res['model']} | {res['N']:.0e} | {r['sampler']} | "
                f"{r['chains']} × {r['draws']} | {r['min_ess']:.0f} | {r['seconds']:.1f} | "
                f"{r['ess_s']:.1f} | {r['compile_seconds']:.1f} | {agree} | {obs} |"
            )
    lines.append("")
    for res in results:
        lines.append(
            f"- {res['model']}, N = {res['N']:.0e}: audited decisions that differed from exact "
            f"MH: {res['audit_wrong']} of {res['audit_decisions']}."
            + "".join(f" Skipped: {s}." for s in res["skipped"])
        )
    return "\n".join(lines)


def figure() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(p.read_text()) for p in sorted(TABLES.glob("racing_metropolis_*.json"))]
    results.sort(key=lambda r: (r["model"], r["N"]))
    (TABLES / "racing_metropolis.md").write_text(
        "# RacingMetropolis at its defaults against the peers\n\n"
        "Regenerate with `python benchmarks/racing_metropolis.py --n N [--model studentt]` "
        "per row group, then `--figure`.\n\n" + table(results) + "\n"
    )
    logistic = [r for r in results if r["model"] == "logistic"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["N"] for r in logistic]
    ours_rows = [next(x for x in r["rows"] if "obs_median" in x) for r in logistic]
    axes[0].loglog(ns, [o["obs_median"] for o in ours_rows], "o-", label="median")
    axes[0].loglog(ns, [o["obs_mean"] for o in ours_rows], "s--", label="mean (with exact passes)")
    axes[0].set_xlabel("N (observations)")
    axes[0].set_ylabel("observations read per MH decision")
    axes[0].set_title("Batch a decision needs (second-order control variates)")
    axes[0].legend()
    for name in ("RacingMetropolis (defaults)", "numpyro NUTS", "numpyro HMCECS", "nutpie"):
        pts = [(r["N"], x["ess_s"]) for r in logistic for x in r["rows"] if x["sampler"] == name]
        if pts:
            axes[1].loglog(*zip(*pts, strict=True), "o-", label=name)
    axes[1].set_xlabel("N (observations)")
    axes[1].set_ylabel("min bulk ESS per second")
    axes[1].set_title("Logistic regression, d = 5")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURES / "racing_metropolis_batch.png", dpi=110)
    print(f"wrote {FIGURES / 'racing_metropolis_batch.png'} and the combined table")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, help="number of observations")
    parser.add_argument("--model", choices=("logistic", "studentt"), default="logistic")
    parser.add_argument("--figure", action="store_true", help="figure and combined table")
    args = parser.parse_args()
    if args.figure:
        figure()
    else:
        run(args.model, args.n or 100_000)


if __name__ == "__main__":
    main()

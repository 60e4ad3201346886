r"""Simulation-based calibration of the three steps (Talts et al. 2018).

For each problem of :mod:`support.sbc` (a discrete selector for
SubsampledCategoricalGibbs, a logistic regression for RacingMetropolis, a 2-D
bimodal block for PliableRejection) and each setting of its step, ``R``
replications: draw :math:`\tilde\theta` from the prior, simulate data, run
``pm.sample`` with the step (model and step built once, data swapped with
``pm.set_data``), thin, and rank :math:`\tilde\theta` among :math:`L = 19`
draws. The rank histograms are tested for uniformity by chi-square on 10 bins.
Each problem also runs a deliberately wrong step (``broken``), which the test
should reject.

The δ study reruns the selector's race on its whole doubling schedule
(``RaceOptions(exact_fraction=1, batch_size=50)``) at growing δ with every decision
audited (``AuditOptions(every=1)``: the exact decision for the same Gumbel noise,
which reads no random numbers), giving the per-decision error rate next to the
SBC test of 1,000 replications and the test's estimated power at 1,000
replications (:func:`support.sbc.detection_power`).

Run ``python benchmarks/sbc.py [--quick] [--reps R] [--only selector,logistic,bimodal,delta]``.
Writes ``docs/results/tables/sbc.md`` and ``sbc.json`` (``--quick``:
``sbc_quick.*``) and the figures ``docs/results/figures/sbc_*.png``; parts run
later are merged into the JSON record. ``--only delta --deltas 0.4,0.8,0.95
--seed 2`` repeats part of the δ grid with another seed (kept apart, and pooled
with the first run in the table); ``--rewrite`` recomputes the tables and
figures from the ranks kept in the JSON record.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import numpy as np
from scipy import stats

from pymc_subsample.options import AuditOptions, RaceOptions
from support.sbc import (
    PROBLEMS,
    SBCResult,
    detection_power,
    rank_counts,
    reps_for_power,
    run_sbc,
    selector_problem,
)

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "docs" / "results" / "tables"
FIGURES = ROOT / "docs" / "results" / "figures"

#: Replications per setting (full, quick).
REPS = {"selector": (1000, 100), "logistic": (400, 40), "bimodal": (100, 8)}
DELTAS = ((0.05, 0.2, 0.4, 0.6, 0.8, 0.95), (0.05, 0.95))
DELTA_REPS = (1000, 100)
N_DRAWS, N_BINS, ALPHA = 19, 10, 0.01
DELTA_TITLE = "SBC of the selector's race (whole schedule) by δ"


def sbc_setting(problem, setting: str, reps: int, seed: int) -> SBCResult:
    """Build the step of ``setting`` once and run SBC; note its resolved settings."""
    step = problem.make_step(problem.model, **problem.settings[setting])
    res = run_sbc(problem, step, reps, n_draws=N_DRAWS, n_bins=N_BINS, seed=seed, setting=setting)
    if getattr(step, "bound", None) == "exact":
        res.info = "bound='exact': every decision on all N observations"
    elif hasattr(step, "exact_after"):
        mode = "exact" if step.decides_exactly else "racing"
        res.info = (
            f"{mode}: batch_size={step.batch_size}, exact after {step.exact_after} "
            f"of {step.terms.n_obs}"
        )
    elif hasattr(step, "n_init"):
        res.info = f"n_init={step.n_init}"
    return res


# -- figures and tables ----------------------------------------------------------------


def plot_ranks(results: list[SBCResult], path: Path, title: str) -> None:
    """Rank histograms with the 99% band of a uniform bin count.

    A row per setting and a column per quantity; a single row of settings when
    there is one quantity.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quantities = list(results[0].ranks)
    panels = [[(res, q) for q in quantities] for res in results]
    if len(quantities) == 1:  # rows of at most four settings
        flat = [row[0] for row in panels]
        per_row = min(4, len(flat)) if len(flat) != 6 else 3
        panels = [flat[i : i + per_row] for i in range(0, len(flat), per_row)]
    n_rows, n_cols = len(panels), max(len(row) for row in panels)
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(2.7 * n_cols + 0.5, 1.9 * n_rows + 0.9),
        squeeze=False,
    )
    for ax in axes.ravel()[sum(len(row) for row in panels) :]:
        ax.set_visible(False)
    for row_axes, row in zip(axes, panels, strict=True):
        for ax, (res, q) in zip(row_axes, row, strict=False):
            counts = rank_counts(res.ranks[q], res.n_draws, res.n_bins)
            width = (res.n_draws + 1) // res.n_bins
            lo, hi = stats.binom.interval(0.99, res.reps, 1.0 / res.n_bins)
            ax.axhspan(lo, hi, color="0.88", lw=0)
            ax.axhline(res.reps / res.n_bins, color="0.5", lw=0.8)
            color = "C3" if res.pvalues[q] < ALPHA else "C0"
            left = np.arange(res.n_bins) * width
            ax.bar(left, counts, width=width * 0.9, align="edge", color=color)
            ax.set_xticks(np.arange(0, res.n_draws + 2, 4))
            ax.set_title(f"{res.setting}: {q}\np = {res.pvalues[q]:.3g}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlabel(f"rank among L = {res.n_draws}", fontsize=7)
        row_axes[0].set_ylabel(f"count of {row[0][0].reps} reps", fontsize=7)
    fig.suptitle(title + "\ngrey: 99% band of a uniform bin count; red: p < 0.01", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table_rows(results: list[SBCResult]) -> list[str]:
    """Markdown rows: problem, setting, replications, p-values, audits, time, settings."""
    rows = []
    for res in results:
        ps = ", ".join(f"{q}: {p:.3g}" for q, p in res.pvalues.items())
        audit = f"{res.audit_errors} / {res.audits}" if res.audits else "–"
        continuous = res.problem != "selector"
        frozen = res.frozen if res.frozen is not None and continuous else "–"
        rows.append(
            f"| {res.problem} | {res.setting} | {res.reps} | {ps} | {res.min_pvalue:.3g} | "
            f"{audit} | {frozen} | {res.seconds:.0f} | {res.info} |"
        )
    return rows


def summary(res: SBCResult) -> dict:
    """JSON record of a result (ranks included, so that figures can be redrawn)."""
    return {
        "problem": res.problem,
        "setting": res.setting,
        "reps": res.reps,
        "pvalues": res.pvalues,
        "statistics": res.statistics,
        "seconds": res.seconds,
        "audits": res.audits,
        "audit_errors": res.audit_errors,
        "info": res.info,
        "frozen": res.frozen,
        "ranks": {q: r.tolist() for q, r in res.ranks.items()},
    }


def from_summary(d: dict) -> SBCResult:
    """Rebuild a result from its JSON record (:func:`summary`)."""
    return SBCResult(
        d["problem"],
        d["setting"],
        N_DRAWS,
        N_BINS,
        {q: np.asarray(r) for q, r in d["ranks"].items()},
        d["seconds"],
        d["audits"],
        d["audit_errors"],
        d["info"],
        d.get("frozen"),
    )


def pool(runs: list[SBCResult]) -> SBCResult:
    """Concatenate the replications of runs of the same setting (different seeds)."""
    first = runs[0]
    return SBCResult(
        first.problem,
        first.setting,
        first.n_draws,
        first.n_bins,
        {q: np.concatenate([r.ranks[q] for r in runs]) for q in first.ranks},
        sum(r.seconds for r in runs),
        sum(r.audits for r in runs),
        sum(r.audit_errors for r in runs),
        first.info,
    )


# -- the delta study ----------------------------------------------------------------------


def delta_study(deltas, reps: int, seed: int) -> list[SBCResult]:
    """SBC of the selector's whole-schedule race at each ``delta``, every decision audited."""
    problem = selector_problem()
    out = []
    for delta in deltas:
        step = problem.make_step(
            problem.model,
            delta=delta,
            race=RaceOptions(exact_fraction=1.0, batch_size=50),
            audit=AuditOptions(every=1),
        )
        res = run_sbc(
            problem,
            step,
            reps,
            n_draws=N_DRAWS,
            n_bins=N_BINS,
            seed=seed,
            setting=f"delta={delta:g}",
        )
        print(
            f"  delta={delta:g}: p={res.pvalues['k']:.4g}, errors {res.audit_errors}/{res.audits}, "
            f"{res.seconds:.0f} s",
            flush=True,
        )
        out.append(res)
    return out


def delta_rows(results: list[SBCResult], target_reps: int) -> list[str]:
    """Markdown rows of the δ study: error rate, X², p, effect size, power at ``target_reps``."""
    rows = [
        "| δ | replications | audited decisions | wrong (rate) | X² (9 d.o.f.) | p | ŵ² ± se "
        f"| power at {target_reps} reps, α = {ALPHA:g}: at ŵ², at ŵ² + 2 se "
        "| reps for power 0.8 at ŵ² + 2 se |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        x2 = res.statistics["k"]
        w2, power = detection_power(x2, res.reps, res.n_bins, target_reps, ALPHA)
        se = np.sqrt(2 * (res.n_bins - 1) + 4 * w2 * res.reps) / res.reps
        need = reps_for_power(w2 + 2 * se, res.n_bins, 0.8, ALPHA)
        upper = detection_power(
            (res.n_bins - 1) + (w2 + 2 * se) * res.reps, res.reps, res.n_bins, target_reps, ALPHA
        )[1]
        rate = res.audit_errors / res.audits if res.audits else float("nan")
        rows.append(
            f"| {res.setting.split('=')[1]} | {res.reps} | {res.audits} | "
            f"{res.audit_errors} ({rate:.2%}) | {x2:.1f} | {res.pvalues['k']:.3g} | "
            f"{w2:.4f} ± {se:.4f} | {power:.2f}, {upper:.2f} | {need:,.0f} |"
        )
    return rows


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few replications (minutes)")
    parser.add_argument("--reps", type=int, default=None, help="replications per setting")
    parser.add_argument("--delta-reps", type=int, default=None)
    parser.add_argument("--only", default="selector,logistic,bimodal,delta")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--deltas", default=None, help="δ grid, e.g. 0.8,0.95 (a repeat: kept apart by its seed)"
    )
    parser.add_argument(
        "--rewrite", action="store_true", help="only rewrite the Markdown table from the JSON"
    )
    args = parser.parse_args()
    mode = 1 if args.quick else 0
    only = args.only.split(",")
    suffix = "_quick" if args.quick else ""
    FIGURES.mkdir(parents=True, exist_ok=True)
    TABLES.mkdir(parents=True, exist_ok=True)
    json_path = TABLES / f"sbc{suffix}.json"
    record = json.loads(json_path.read_text()) if json_path.exists() else {}
    record.update({"L": N_DRAWS, "bins": N_BINS})
    record.setdefault("seed", args.seed)
    record.setdefault("problems", {})
    if args.rewrite:  # tables recomputed from the ranks kept in the JSON record
        for name, results in record["problems"].items():
            results = [from_summary(d) for d in results]
            record[f"rows_{name}"] = table_rows(results)
            plot_ranks(results, FIGURES / f"sbc_{name}{suffix}.png", f"SBC, {name}")
        by_delta: dict[str, list[SBCResult]] = {}
        for key in [k for k in record if k.startswith("delta")]:
            results = [from_summary(d) for d in record[key]]
            record[f"rows_{key}"] = delta_rows(results, 1000)
            if key == "delta":
                plot_ranks(results, FIGURES / f"sbc_delta{suffix}.png", DELTA_TITLE)
            for res in results:
                by_delta.setdefault(res.setting, []).append(res)
        pooled = [pool(runs) for runs in by_delta.values() if len(runs) > 1]
        if pooled:
            record["rows_delta_pooled_seeds"] = delta_rows(pooled, 1000)
        write(record, suffix, args)
        return
    for name in (n for n in only if n in PROBLEMS):
        problem = PROBLEMS[name]()
        reps = args.reps or REPS[name][mode]
        results = []
        for setting in problem.settings:
            print(f"{name} / {setting}", flush=True)
            res = sbc_setting(problem, setting, reps, args.seed)
            print(f"  {res.pvalues}, {res.seconds:.0f} s, {res.info}", flush=True)
            results.append(res)
        plot_ranks(results, FIGURES / f"sbc_{name}{suffix}.png", f"SBC, {name}")
        record["problems"][name] = [summary(r) for r in results]
        record[f"rows_{name}"] = table_rows(results)
        write(record, suffix, args)
    if "delta" in only:
        delta_reps = args.delta_reps or DELTA_REPS[mode]
        print("delta study", flush=True)
        deltas = [float(d) for d in args.deltas.split(",")] if args.deltas else DELTAS[mode]
        results = delta_study(deltas, delta_reps, args.seed)
        key = "delta" if args.deltas is None else f"delta_repeat_seed{args.seed}"
        if key == "delta":
            plot_ranks(results, FIGURES / f"sbc_delta{suffix}.png", DELTA_TITLE)
        record[key] = [summary(r) for r in results]
        record[f"rows_{key}"] = delta_rows(results, 1000)
        write(record, suffix, args)


def write(record: dict, suffix: str, args) -> None:
    """Write the JSON record and the Markdown tables of every part run so far."""
    (TABLES / f"sbc{suffix}.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "# Simulation-based calibration",
        "",
        f"Regenerate with `python benchmarks/sbc.py{' --quick' if args.quick else ''}` "
        f"(seed {args.seed}). L = {N_DRAWS} thinned draws per replication; chi-square on "
        f"{N_BINS} bins of 2 ranks.",
        "",
        "| problem | setting | replications | chi-square p per quantity | smallest p "
        "| audits wrong / run | chains that never moved | seconds | resolved settings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in PROBLEMS:
        lines += record.get(f"rows_{name}", [])
    for key in [k for k in record if k.startswith("rows_delta")]:
        if key.endswith("pooled_seeds"):
            label = "δ study, the replications of both seeds pooled"
        else:
            label = f"δ study (seed {key.split('seed')[1] if 'seed' in key else record['seed']})"
        lines += ["", label + ":", "", *record[key]]
    (TABLES / f"sbc{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()

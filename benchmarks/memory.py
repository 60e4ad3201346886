"""Memory of the steps: build, kept after build, peak RSS, against PyMC's exact steps.

Two models, N float64 observations each:

* "categorical": y_n ~ Normal(mu[q], 1), q ~ Categorical(uniform over 10
  values), fixed means 1/9 apart, data drawn from the middle one (the model of
  ``benchmarks/categorical_gibbs.py``, "concentrated"); the data are one
  N-vector. Steps: ``SubsampledCategoricalGibbs([q], batches=...)`` and
  ``pm.CategoricalGibbsMetropolis([q])``.
* "design": y_n ~ Normal(x_n^T beta, 1), a 10-column design matrix X (N x 10),
  beta ~ Normal(0, 1) (10 coordinates). Steps: ``RacingMetropolis([beta],
  batches=...)`` and ``pm.Metropolis([beta])``.

Each configuration runs in a fresh subprocess, so that the peak resident set
(``resource.getrusage(...).ru_maxrss`` of the child) is its own: the child
builds the model and its data, reads its resident set (``/proc/self/statm``),
resets the kernel's peak (``/proc/self/clear_refs``), builds the step (timed),
collects garbage and reads it again ("kept after build": what the step
holds), runs 200 draws of ``step.step(point)`` (timed) and reads it once more
("after draws", against the resident set before the build), then the peak
since the reset (``VmHWM``: "peak from build", the data's construction left
out). Our steps run with each row layout, ``batches="blocks"`` (the default),
``"windows"`` and ``"random"``. The ratio is the peak from the build on
against that of PyMC's step on the same model.

With ``--zarr`` (needs the ``big`` extra), our steps run once more on the
same model with its data in a zarr store (``pymc_subsample.Data``, layout
"zarr": ``batches="windows"``): the child writes the data chunk by chunk into a
temporary store (never whole in memory) and starts a ``dask.distributed``
cluster of two worker processes before the baseline; the worker processes'
memory is not counted (the table is this process's).

Writes ``docs/results/tables/memory.md`` (``--quick``: ``memory_quick.md``, N =
10^6; ``--n`` another N, ``memory_<N>.md``). Run:
``python benchmarks/memory.py [--quick | --n N]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pymc_subsample.options import RaceOptions

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
DRAWS = 200
LAYOUTS = ("blocks", "windows", "random")
N_CAT, N_COLS = 10, 10


def _rss() -> int:
    """Resident set of this process now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Reset the kernel's peak resident set of this process (Linux); False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _peak_since_reset() -> int:
    """Peak resident set since :func:`_reset_peak` (``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


#: Rows per chunk of the zarr store of layout "zarr".
ZARR_CHUNK = 1_000_000


def _zarr_model(kind: str, n_obs: int, path: str):
    """Return the model of ``kind``, its data written chunk by chunk to a zarr store at ``path``."""
    import pymc as pm
    import zarr

    import pymc_subsample as pms

    group = zarr.open_group(path, mode="w")
    cols = () if kind == "categorical" else (N_COLS,)
    ys = group.create_array("y", shape=(n_obs,), chunks=(ZARR_CHUNK,), dtype="f8")
    xs = (
        None
        if not cols
        else group.create_array("x", shape=(n_obs, *cols), chunks=(ZARR_CHUNK, *cols), dtype="f8")
    )
    mus = np.linspace(0.0, 1.0, N_CAT)
    truth = np.random.default_rng(0).normal(size=N_COLS) * 0.1
    for i, a in enumerate(range(0, n_obs, ZARR_CHUNK)):
        rng = np.random.default_rng([0, i])
        m = min(ZARR_CHUNK, n_obs - a)
        if xs is None:
            ys[a : a + m] = rng.normal(mus[N_CAT // 2], 1.0, size=m)
        else:
            x = rng.normal(size=(m, N_COLS))
            xs[a : a + m] = x
            ys[a : a + m] = x @ truth + rng.normal(size=m)
    with pm.Model() as model:
        y_data = pms.Data("y_data", group["y"])
        if xs is None:
            block = pm.Categorical("q", p=np.full(N_CAT, 1.0 / N_CAT))
            pm.Normal("y", pm.math.constant(mus)[block], 1.0, observed=y_data)
        else:
            block = pm.Normal("beta", 0.0, 1.0, shape=N_COLS)
            pm.Normal("y", pms.Data("x_data", group["x"]) @ block, 1.0, observed=y_data)
    return model, block


def _model(kind: str, n_obs: int):
    import pymc as pm

    rng = np.random.default_rng(0)
    with pm.Model() as model:
        if kind == "categorical":
            mus = np.linspace(0.0, 1.0, N_CAT)
            y = rng.normal(mus[N_CAT // 2], 1.0, size=n_obs)
            y_data = pm.Data("y_data", y)
            q = pm.Categorical("q", p=np.full(N_CAT, 1.0 / N_CAT))
            pm.Normal("y", pm.math.constant(mus)[q], 1.0, observed=y_data)
            block = q
        else:
            x = rng.normal(size=(n_obs, N_COLS))
            truth = rng.normal(size=N_COLS) * 0.1
            y = x @ truth + rng.normal(size=n_obs)
            x_data = pm.Data("x_data", x)
            y_data = pm.Data("y_data", y)
            beta = pm.Normal("beta", 0.0, 1.0, shape=N_COLS)
            pm.Normal("y", x_data @ beta, 1.0, observed=y_data)
            block = beta
        del y
    return model, block


def _step(kind: str, layout: str, model, block):
    import pymc as pm

    from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs

    with model:
        if layout == "pymc":
            if kind == "categorical":
                return pm.CategoricalGibbsMetropolis([block])
            return pm.Metropolis([block])
        batches = "windows" if layout == "zarr" else layout
        if kind == "categorical":
            return SubsampledCategoricalGibbs([block], race=RaceOptions(batches=batches), rng=0)
        return RacingMetropolis([block], race=RaceOptions(batches=batches), rng=0)


def child(kind: str, layout: str, n_obs: int) -> dict:
    """Build the model and the step, run the draws; return the measurements (bytes, s)."""
    import pymc  # noqa: F401  (imported before the baseline, as in any session)

    import pymc_subsample  # noqa: F401

    if layout == "zarr":
        import tempfile

        from distributed import Client, LocalCluster

        from pymc_subsample.model.out_of_core_passes import use_client

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
        use_client(Client(cluster))
        tmp = tempfile.TemporaryDirectory()
        model, block = _zarr_model(kind, n_obs, os.path.join(tmp.name, "data.zarr"))
    else:
        model, block = _model(kind, n_obs)
    point = model.initial_point()
    gc.collect()
    before = _rss()
    whole_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    reset = _reset_peak()
    start = time.perf_counter()
    step = _step(kind, layout, model, block)
    build = time.perf_counter() - start
    gc.collect()
    kept = _rss() - before
    start = time.perf_counter()
    for _ in range(DRAWS):
        point, _stats = step.step(point)
    draws = time.perf_counter() - start
    gc.collect()
    after = _rss() - before
    step_peak = _peak_since_reset() if reset else 0
    peak = max(whole_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {
        "build": build, "kept": kept, "after": after, "draws": draws, "peak": peak,
        "step_peak": step_peak - before, "before": before,
    }  # fmt: skip


def run(kind: str, layout: str, n_obs: int) -> dict:
    """Run :func:`child` in a fresh interpreter; return its measurements."""
    cmd = [sys.executable, __file__, "--child", kind, layout, "--n", str(n_obs)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{kind}/{layout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(x: float) -> str:
    return f"{x / 2**20:+,.0f} MB"


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f} GB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1e6")
    parser.add_argument("--n", type=float, default=None, help="number of observations (2e7)")
    parser.add_argument("--models", default="categorical,design", help="comma-separated")
    parser.add_argument("--zarr", action="store_true", help="also our steps on zarr data")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    n_obs = int(args.n if args.n is not None else (1e6 if args.quick else 2e7))
    if args.child:
        print(json.dumps(child(*args.child, n_obs)))
        return
    names = {
        "categorical": ("SubsampledCategoricalGibbs", "pm.CategoricalGibbsMetropolis"),
        "design": ("RacingMetropolis", "pm.Metropolis"),
    }
    lines = [
        f"N = {n_obs:.0e} float64 observations; {DRAWS} draws; each row a fresh process. "
        "Kept: resident set after the build (garbage collected) minus before it (the model "
        "and its data built); after draws: the same after the draws; peak from build: the "
        "largest resident set from the build on (the kernel's peak, reset before the build); "
        "ratio: that peak against PyMC's step on the same model; whole-process peak: "
        "`ru_maxrss`, which includes building the data.",
        "",
        "| model | step | batches | build | kept after build | after draws | peak from build | "
        f"peak / PyMC | whole-process peak | {DRAWS} draws |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in args.models.split(","):
        results = {}
        for layout in ("pymc", *LAYOUTS, *(("zarr",) if args.zarr else ())):
            results[layout] = r = run(kind, layout, n_obs)
            print(kind, layout, r, flush=True)
        base = results["pymc"]["before"] + results["pymc"]["step_peak"]
        for layout, r in results.items():
            ours, theirs = names[kind]
            step = theirs if layout == "pymc" else ours
            from_build = r["before"] + r["step_peak"]
            lines.append(
                f"| {kind} | `{step}` | {'' if layout == 'pymc' else layout} | "  # zarr: on disk
                f"{r['build']:.2f} s | {_mb(r['kept'])} | {_mb(r['after'])} | "
                f"{_gb(from_build)} | {from_build / base:.2f} | {_gb(r['peak'])} | "
                f"{r['draws']:.2f} s |"
            )
    if args.quick:
        name = "memory_quick.md"
    elif args.n is not None and n_obs != int(2e7):
        name = f"memory_{n_obs:.0e}.md".replace("+", "")
    else:
        name = "memory.md"
    (OUT / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

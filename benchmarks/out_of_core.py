"""Logistic regression on data bigger than memory: our steps on zarr against Dask peers.

The data: N rows of d float32 covariates (standard normal) and an int8
response, y_n ~ Bernoulli(logit^-1(x_n^T beta)), beta fixed, simulated chunk by
chunk (a seed per chunk) into a zarr store and never held whole in memory
(``--store``, default ``/tmp/pymc_subsample_bench/logistic_<N>_<d>.zarr``; kept
and reused when it exists). The prior is beta ~ Normal(0, 1).

Each method runs in a fresh subprocess, so that its peak resident set
(``VmHWM``) is its own; the Dask workers (a ``LocalCluster`` of ``--workers``
single-threaded processes) are measured apart, as their resident sets at the
end. Methods (``--methods``):

* ``ours``: ``RacingMetropolis([beta])`` on ``pymc_subsample.Data`` inputs,
  ``batches="windows"``; the time to the first draw includes the one-time
  passes (scan, the row-permuted copy unless a complete one is in the store,
  the Laplace fit) and compilation.
* ``in_memory``: the same step on ``pm.Data`` (every row read into memory:
  only where the data fit), for the time per draw against ``ours``.
* ``reference``: the exact posterior's Laplace approximation, Newton's method
  with every gradient and Hessian a Dask reduction over the chunks (at large N
  the posterior is Gaussian to within Monte Carlo error of these runs); the
  other methods' means and standard deviations are compared with it.
* ``nuts_dask``: PyMC's NUTS on a model whose log-likelihood is one PyTensor
  Op evaluated by a Dask reduction (value and gradient in one pass): exact
  NUTS as a Dask user would run it; ``--peer-draws`` draws (run it long enough
  to estimate its ESS/s).
* ``mh_dask``: random-walk Metropolis, the proposal the reference covariance
  scaled by 2.38^2/d, every log density a Dask reduction.
* ``nuts_subsample``: PyMC's NUTS on a 1% uniformly random subsample (read with
  Dask, held in memory), as the full data: its posterior standard deviation is
  about 10 times too wide (reported as the ratio to the reference's).

``--model normal``: the conjugate Normal model instead, y_n ~ Normal(mu, 1) (float32,
mu = 0.3), mu ~ Normal(0, 10), whose exact posterior is Normal with precision
N + 1/100 and mean sum(y) / (N + 1/100): ``reference`` is then that, from one Dask
sum; methods ``reference``, ``ours``, ``in_memory`` and ``nuts_subsample``.

Writes ``docs/results/tables/out_of_core_<N>.json`` and ``.md`` (``--model normal``:
``out_of_core_normal_<N>``). Run:
``python benchmarks/out_of_core.py --n 1e8`` (``--n 1e6`` checks it works in
about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "tables"
BETA_SCALE = 0.5
#: The conjugate Normal model's true mean, prior sd and noise sd.
NORMAL_MU, NORMAL_PRIOR_SD = 0.3, 10.0


def true_beta(d: int) -> np.ndarray:
    return BETA_SCALE * np.random.default_rng(12345).normal(size=d)


def store_path(args) -> str:
    if args.store:
        return args.store
    if args.model == "normal":
        return f"/tmp/pymc_subsample_bench/normal_{int(args.n)}.zarr"
    return f"/tmp/pymc_subsample_bench/logistic_{int(args.n)}_{args.d}.zarr"


def likelihood(args, x, y):
    """Add the prior and the likelihood to the model in context; return the free variable."""
    import pymc as pm

    if args.model == "normal":
        mu = pm.Normal("beta", 0, NORMAL_PRIOR_SD, shape=1)
        pm.Normal("obs", mu[0], 1.0, observed=y)
        return mu
    beta = pm.Normal("beta", 0, 1, shape=args.d)
    pm.Bernoulli("obs", logit_p=x @ beta, observed=y)
    return beta


def write_store(args) -> str:
    """Simulate the data chunk by chunk into the store (kept when complete); return its path."""
    import zarr

    path = store_path(args)
    n, d, chunk = int(args.n), args.d, int(args.chunk)
    normal = args.model == "normal"
    try:
        group = zarr.open_group(path, mode="r")
        if group.attrs.get("complete") and group["y"].shape == (n,):
            return path
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.GroupNotFoundError):
        pass
    group = zarr.open_group(path, mode="w")
    ys = group.create_array("y", shape=(n,), chunks=(chunk,), dtype="f4" if normal else "i1")
    xs = None if normal else group.create_array("X", shape=(n, d), chunks=(chunk, d), dtype="f4")
    beta = true_beta(d)
    start = time.perf_counter()
    for i, a in enumerate(range(0, n, chunk)):
        rng = np.random.default_rng([7, i])
        m = min(chunk, n - a)
        if normal:
            ys[a : a + m] = (NORMAL_MU + rng.normal(size=m)).astype("f4")
            continue
        x = rng.normal(size=(m, d)).astype("f4")
        xs[a : a + m] = x
        ys[a : a + m] = (rng.random(m) < 1.0 / (1.0 + np.exp(-(x @ beta)))).astype("i1")
    group.attrs["complete"] = True
    print(f"wrote {n} rows to {path} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _client(workers: int):
    from distributed import Client, LocalCluster

    from pymc_subsample.model.out_of_core_passes import use_client

    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    use_client(client)
    return client


def _worker_rss(client) -> int:
    import psutil

    return int(sum(client.run(lambda: psutil.Process().memory_info().rss).values()))


def _ess(draws: np.ndarray) -> np.ndarray:
    import arviz as az

    return np.asarray(
        [float(az.ess(draws[None, :, k])) for k in range(draws.shape[1])], dtype=float
    )


# -- Dask reductions of the log-likelihood ---------------------------------------------------


def _chunk_terms(x, y, beta, order: int):
    eta = x.astype(np.float64) @ beta
    p = 1.0 / (1.0 + np.exp(-eta))
    value = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    if order == 0:
        return value, None, None
    grad = x.T.astype(np.float64) @ (y - p)
    if order == 1:
        return value, grad, None
    w = p * (1 - p)
    hess = -(x.T.astype(np.float64) * w) @ x.astype(np.float64)
    return value, grad, hess


class DaskLogLik:
    """Log-likelihood, gradient (and Hessian) of the logistic model by Dask reductions."""

    def __init__(self, path: str, client):
        import dask.array as da
        import zarr

        group = zarr.open_group(path, mode="r")
        self.x = da.from_zarr(group["X"])
        self.y = da.from_zarr(group["y"])
        self.client = client
        self.passes = 0

    def __call__(self, beta: np.ndarray, order: int = 1):
        """Return (value, gradient or None, Hessian or None) at ``beta``: one Dask pass."""
        from dask import delayed

        xs = self.x.to_delayed().ravel()
        ys = self.y.to_delayed().ravel()
        tasks = [delayed(_chunk_terms)(x, y, beta, order) for x, y in zip(xs, ys, strict=True)]
        parts = self.client.gather(self.client.compute(tasks))
        self.passes += 1
        value = sum(p[0] for p in parts)
        grad = None if order == 0 else sum(p[1] for p in parts)
        hess = None if order < 2 else sum(p[2] for p in parts)
        return value, grad, hess


def laplace(loglik: DaskLogLik, d: int, iters: int = 30):
    """Newton's method on the log posterior (prior N(0, 1)); return mean and covariance."""
    beta = np.zeros(d)
    for _ in range(iters):
        _, g, h = loglik(beta, order=2)
        g, h = g - beta, h - np.eye(d)
        step = np.linalg.solve(h, g)
        beta = beta - step
        if np.max(np.abs(step)) < 1e-10:
            break
    _, _, h = loglik(beta, order=2)
    return beta, np.linalg.inv(np.eye(d) - h)


# -- methods -----------------------------------------------------------------------------------


def run_ours(args, path: str, in_memory: bool = False) -> dict:
    import warnings

    import pymc as pm
    import zarr

    import pymc_subsample as pms
    from pymc_subsample.options import RaceOptions

    client = None if in_memory else _client(args.workers)
    group = zarr.open_group(path, mode="r")
    start = time.perf_counter()
    normal = args.model == "normal"
    with pm.Model():
        if in_memory:  # the same step on pm.Data: every row read into memory
            x = None if normal else pm.Data("X", group["X"][:])
            y = pm.Data("y", group["y"][:])
        else:
            x = None if normal else pms.Data("X", group["X"])
            y = pms.Data("y", group["y"])
        beta = likelihood(args, x, y)
        step = pms.RacingMetropolis([beta], race=RaceOptions(batches="windows"), rng=0)
        build = time.perf_counter() - start
        point = step.initial_point
        point, _ = step.step(point)
        first = time.perf_counter() - start
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            idata = pm.sample(
                step=[step],
                tune=args.tune,
                draws=args.draws,
                chains=1,
                cores=1,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
            )
            seconds = time.perf_counter() - t0
    draws = idata.posterior["beta"].values[0]
    stats = idata.sample_stats
    return {
        "build_s": build,
        "first_draw_s": first,
        "sampling_s": seconds,
        "draws": draws.tolist(),
        "frac_evals": float(stats["frac_evals"].mean()) if "frac_evals" in stats else None,
        "draw_ms": 1e3 * seconds / (args.tune + args.draws),
        **({} if client is None else {"workers_rss": _worker_rss(client)}),
    }


def run_reference(args, path: str) -> dict:
    client = _client(args.workers)
    if args.model == "normal":  # conjugate: the exact posterior from one Dask sum
        import dask.array as da
        import zarr

        start = time.perf_counter()
        y = da.from_zarr(zarr.open_group(path, mode="r")["y"])
        total = float(client.compute(y.astype("f8").sum()).result())
        precision = int(args.n) + NORMAL_PRIOR_SD**-2
        return {
            "seconds": time.perf_counter() - start,
            "passes": 1,
            "mean": [total / precision],
            "cov": [[1.0 / precision]],
            "workers_rss": _worker_rss(client),
        }
    loglik = DaskLogLik(path, client)
    start = time.perf_counter()
    mean, cov = laplace(loglik, args.d)
    return {
        "seconds": time.perf_counter() - start,
        "passes": loglik.passes,
        "mean": mean.tolist(),
        "cov": cov.tolist(),
        "workers_rss": _worker_rss(client),
    }


def run_mh_dask(args, path: str, reference: dict) -> dict:
    client = _client(args.workers)
    loglik = DaskLogLik(path, client)
    rng = np.random.default_rng(0)
    chol = np.linalg.cholesky(np.asarray(reference["cov"]) * 2.38**2 / args.d)
    beta = np.asarray(reference["mean"]) + chol @ rng.normal(size=args.d)
    current = loglik(beta, order=0)[0] - 0.5 * beta @ beta
    start = time.perf_counter()
    draws = []
    for _ in range(args.peer_draws):
        prop = beta + chol @ rng.normal(size=args.d)
        value = loglik(prop, order=0)[0] - 0.5 * prop @ prop
        if np.log(rng.random()) < value - current:
            beta, current = prop, value
        draws.append(beta.copy())
    return {
        "sampling_s": time.perf_counter() - start,
        "draws": np.asarray(draws).tolist(),
        "workers_rss": _worker_rss(client),
    }


def run_nuts_dask(args, path: str) -> dict:
    import warnings

    import pymc as pm
    import pytensor.tensor as pt
    from pytensor.graph.basic import Apply
    from pytensor.graph.op import Op

    client = _client(args.workers)
    loglik = DaskLogLik(path, client)
    memo: dict = {}

    def value_grad(beta):
        key = beta.tobytes()
        if key not in memo:  # one pass gives both; NUTS asks for them at the same point
            memo.clear()
            memo[key] = loglik(beta, order=1)
        return memo[key]

    class Grad(Op):
        def make_node(self, beta):
            return Apply(self, [beta], [beta.type()])

        def perform(self, node, inputs, out):
            out[0][0] = np.asarray(value_grad(np.asarray(inputs[0], dtype=float))[1])

    class LogLik(Op):
        def make_node(self, beta):
            return Apply(self, [beta], [pt.dscalar()])

        def perform(self, node, inputs, out):
            out[0][0] = np.asarray(value_grad(np.asarray(inputs[0], dtype=float))[0])

        def grad(self, inputs, g):
            return [g[0] * Grad()(inputs[0])]

    with pm.Model():
        beta = pm.Normal("beta", 0, 1, shape=args.d)
        pm.Potential("loglik", LogLik()(beta))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata, seconds = _one_chain(
                args.peer_draws, args.peer_draws, compile_kwargs={"mode": "FAST_COMPILE"}
            )
    return {
        "sampling_s": seconds,
        "passes": loglik.passes,
        "draws": idata.posterior["beta"].values[0].tolist(),
        "workers_rss": _worker_rss(client),
    }


def _one_chain(tune: int, draws: int, **kwargs):
    """Sample one chain with PyMC's NUTS in the model context; return it and its seconds."""
    import pymc as pm

    start = time.perf_counter()
    idata = pm.sample(
        tune=tune, draws=draws, chains=1, cores=1, random_seed=1, progressbar=False,
        compute_convergence_checks=False, nuts_sampler="pymc", **kwargs,
    )  # fmt: skip
    return idata, time.perf_counter() - start


def run_nuts_subsample(args, path: str) -> dict:
    import warnings

    import dask.array as da
    import pymc as pm
    import zarr

    group = zarr.open_group(path, mode="r")
    n = int(args.n)
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(n, size=max(n // 100, 100), replace=False))
    start = time.perf_counter()
    normal = args.model == "normal"
    x = None if normal else da.from_zarr(group["X"])[idx].compute()
    y = da.from_zarr(group["y"])[idx].compute()
    read = time.perf_counter() - start
    with pm.Model():
        likelihood(args, None if normal else pm.Data("X", x), pm.Data("y", y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata, seconds = _one_chain(args.tune, args.draws)
    return {
        "read_s": read,
        "sampling_s": seconds,
        "draws": idata.posterior["beta"].values[0].tolist(),
    }


METHODS = ("reference", "ours", "in_memory", "nuts_dask", "mh_dask", "nuts_subsample")


def child(args) -> None:
    path = store_path(args)
    if args.child == "reference":
        out = run_reference(args, path)
    elif args.child == "ours":
        out = run_ours(args, path)
    elif args.child == "in_memory":
        out = run_ours(args, path, in_memory=True)
    elif args.child == "nuts_dask":
        out = run_nuts_dask(args, path)
    elif args.child == "mh_dask":
        out = run_mh_dask(args, path, json.loads(Path(args.reference).read_text()))
    else:
        out = run_nuts_subsample(args, path)
    out["peak_rss"] = _peak()
    print("RESULT " + json.dumps(out))


def summarize(name: str, out: dict, ref: dict) -> dict:
    row = {"method": name, "peak_rss_mb": out["peak_rss"] / 2**20}
    if "workers_rss" in out:
        row["workers_rss_mb"] = out["workers_rss"] / 2**20
    if "draws" in out:
        draws = np.asarray(out["draws"])
        ess = _ess(draws)
        sd_ref = np.sqrt(np.diag(np.asarray(ref["cov"])))
        row["min_ess"] = float(ess.min())
        row["ess_per_s"] = float(ess.min() / out["sampling_s"])
        row["max_mean_err_sd"] = float(np.max(np.abs(draws.mean(0) - ref["mean"]) / sd_ref))
        row["sd_ratio"] = float(np.median(draws.std(0) / sd_ref))
    keys = ("first_draw_s", "build_s", "sampling_s", "seconds", "read_s", "frac_evals", "draw_ms")
    for key in keys:
        if out.get(key) is not None:
            row[key] = out[key]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e6, help="rows (1e8, 1e9 for the study)")
    parser.add_argument("--model", choices=("logistic", "normal"), default="logistic")
    parser.add_argument("--d", type=int, default=4, help="covariates")
    parser.add_argument("--chunk", type=float, default=1e6, help="rows per chunk of the store")
    parser.add_argument("--store", help="zarr store of the data (written when missing)")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--peer-draws", type=int, default=200, help="draws of the Dask peers")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    write_store(args)
    methods = [m for m in args.methods.split(",") if m]
    if "reference" not in methods:
        methods.insert(0, "reference")
    results: dict = {}
    if args.model == "normal":
        methods = [m for m in methods if m in ("reference", "ours", "in_memory", "nuts_subsample")]
    tag = f"out_of_core_{'normal_' if args.model == 'normal' else ''}{int(args.n)}"
    ref_file = OUT / f"{tag}_reference.json"
    for method in methods:
        cmd = [sys.executable, __file__, "--child", method, "--store", store_path(args)]
        for flag in ("model", "n", "d", "chunk", "workers", "draws", "tune", "peer_draws"):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        if method == "mh_dask":
            cmd += ["--reference", str(ref_file)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"{method} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[method] = json.loads(lines[-1][len("RESULT ") :])
        if method == "reference":
            OUT.mkdir(parents=True, exist_ok=True)
            ref_file.write_text(json.dumps(results[method]))
        print(f"{method} done", file=sys.stderr)
    ref = results["reference"]
    rows = [summarize(m, results[m], ref) for m in methods if m in results]
    stem = OUT / tag
    stem.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    keys = sorted({k for r in rows for k in r if k != "method"})
    lines = ["| method | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
    for r in rows:
        cells = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    title = (
        f"Conjugate Normal model, N = {int(args.n)}"
        if args.model == "normal"
        else f"Logistic regression, N = {int(args.n)}, d = {args.d}"
    )
    stem.with_suffix(".md").write_text(
        f"{title}, `python benchmarks/out_of_core.py {' '.join(sys.argv[1:])}`\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()

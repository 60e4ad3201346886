"""Time to the first draw on a model new to the machine: our steps against PyMC's exact steps.

A user builds a model, samples, looks, edits the model and samples again: each
new model pays its compilation before its first draw. This script times, for
each model below, the run a user makes (``pm.sample`` with the steps built
just before, one chain), from building the steps to the first draw, and the
effective draws per second counting that time; for our steps (defaults only)
and for PyMC's exact steps of the same kinds (``pm.CategoricalGibbsMetropolis``
for a discrete block, ``pm.NUTS`` for a continuous one).

Every run is a fresh Python process with a fresh PyTensor base compile directory
(``PYTENSOR_FLAGS=base_compiledir=...``: PyTensor 3 caches its Numba-compiled
graphs in ``base_compiledir/numba``, so a fresh ``compiledir`` alone does not
make a model new): the model is new to the machine, and no compiled graph of a
previous run applies. The library's own Numba kernels stay
in their on-disk cache ("warm machine"), except in the ``fresh machine`` row,
which also empties the Numba cache (``NUMBA_CACHE_DIR``) for both sides: a first
run after installing. With the ``peers`` extra installed, nutpie samples the models
without a discrete block too (``--no-peers`` leaves it out). Times are wall clock
and CPU (user + system, compiler subprocesses included) of that process. Each
model and side then runs a second time, in a new process on the caches the first
run left, once the compilations the first run handed to other processes have ended
(a user looks at a run's results before the next; the wait is recorded as
``background_wait_s``): the user's next run of the same model.

Our runs also record where the seconds go (``_compile_trace.CompileTrace``):
each PyTensor function compiled (by the line that asked for it: graph rewrites,
construction, first call, where Numba compiles the graph), the library's Numba
kernels (loaded or compiled), and the probe, expansion and mode sections.

Models (``--models``; sizes with ``--scale``):

* ``demo``: ``examples/demo.py``'s regression, N = 1e6, a Categorical noise scale
  (Gibbs) and four coefficients (RacingMetropolis);
* ``poisson_link``: Poisson regression with an exposure, N = 1e6, a Categorical
  choosing the link (identity-softplus, log, sqrt-square) (Gibbs) and three
  coefficients (RacingMetropolis);
* ``studentt_nu``: Student-t regression with unknown nu and sigma, N = 3,000,
  RacingMetropolis on all four;
* ``hierarchical``: regression with 100 group intercepts, N = 1e5,
  RacingMetropolis on all 104 parameters (PyMC: NUTS);
* ``logistic``: logistic regression, five coefficients, N = 1e5, RacingMetropolis;
* ``mixture``: a Categorical choosing one of ten component means, N = 1e6,
  SubsampledCategoricalGibbs alone;
* ``readme``: the README's example (N = 5e5);
* ``negbin``: negative binomial regression with group effects, N = 1e5, a Categorical
  dispersion (Gibbs) and six coefficients (RacingMetropolis): a likelihood whose
  graph has operations with no NumPy function (softplus, gammaln).

Run by name only (``--models``, :data:`EXTRA_MODELS`), models of users' shapes timed
after the rules above were built: a gamma GLM with a Categorical shape (N = 2e5), an
ordered logistic regression (1e5), a zero-inflated Poisson regression (2e5), a censored
Weibull regression (1e5), a cubic Student-t regression (1e5) and a two-component
normal mixture with a Categorical choosing one scale (1e5).

Writes ``docs/results/tables/first_draw.json`` and ``first_draw.md``. Run:
``python benchmarks/first_draw.py [--models demo,logistic] [--quick] [--skip-fresh]``.
One model and side: ``python benchmarks/first_draw.py --one demo --side ours``
(prints a JSON line; no fresh directories: the caller's environment applies).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "docs" / "results" / "tables"

#: Draws of each run: (tune, draws) for ours and for PyMC's exact steps, by model.
DRAWS = {
    "demo": ((500, 500), (100, 100)),
    "poisson_link": ((500, 500), (100, 100)),
    "studentt_nu": ((1000, 1000), (1000, 1000)),
    "hierarchical": ((500, 500), (200, 200)),
    "logistic": ((500, 500), (200, 200)),
    "mixture": ((200, 200), (100, 100)),
    "readme": ((500, 500), (100, 100)),
    "negbin": ((500, 500), (100, 100)),
}
#: The default models (``--models``); the ones below run when named.
MODELS = list(DRAWS)
#: Models of users' shapes added after the tables' rules were built, run by name
#: (``--models gamma_glm,...``): a gamma GLM choosing its shape, an ordered logistic
#: regression, a zero-inflated Poisson regression, a censored Weibull regression, a cubic
#: Student-t regression and a two-component mixture choosing one scale.
EXTRA_MODELS = ["gamma_glm", "ordered", "zip", "weibull_cens", "poly_student", "mix_choice"]
DRAWS.update({name: ((500, 500), (200, 200)) for name in EXTRA_MODELS})
#: Models nutpie can sample whole (no discrete block): its column in the table.
NUTPIE_MODELS = ("studentt_nu", "hierarchical", "logistic")


# -- models -------------------------------------------------------------------------------


def _demo(n):
    sys.path.insert(0, str(ROOT / "examples"))
    import demo

    model = demo.build_model(n)
    return model, [["q"], ["a", "b"]]


def _readme(n):
    import pymc as pm

    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    y = 1.0 + 0.5 * x + rng.normal(0.0, 1.0, size=n)
    scales = np.array([0.5, 0.8, 1.0, 1.25, 2.0])
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y", y)
        q = pm.Categorical("q", p=np.full(len(scales), 1 / len(scales)))
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0)
        sigma = pm.Deterministic("sigma", pm.math.constant(scales)[q])
        pm.Normal("obs", mu=a + b * x_data, sigma=sigma, observed=y_data)
    return model, [["q"], ["a", "b"]]


def _poisson_link(n):
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2))
    exposure = rng.uniform(0.5, 2.0, size=n)
    rate = exposure * np.exp(0.3 + x @ np.array([0.4, -0.2]))
    y = rng.poisson(rate)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        e_data = pm.Data("exposure", exposure)
        y_data = pm.Data("y", y)
        link = pm.Categorical("link", p=np.full(3, 1 / 3))
        a = pm.Normal("a", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 2.0, shape=2)
        eta = a + x_data @ b
        mean = pt.stack([pt.softplus(eta), pt.exp(eta), pt.square(eta) + 1e-6])[link]
        pm.Poisson("obs", mu=e_data * mean, observed=y_data)
    return model, [["link"], ["a", "b"]]


def _studentt_nu(n):
    from support.models import studentt_data, studentt_nu_model

    x, y = studentt_data(n)
    return studentt_nu_model(x, y), [[], ["a", "b", "sigma", "nu"]]


def _hierarchical(n):
    from support.models import hierarchical_data, hierarchical_model

    x, g, y = hierarchical_data(n)
    return hierarchical_model(x, g, y), [[], ["mu_a", "tau", "alpha", "b", "sigma"]]


def _logistic(n):
    from support.models import logistic_data, logistic_model

    x, y = logistic_data(n)
    return logistic_model(x, y), [[], ["a", "b"]]


def _mixture(n):
    import pymc as pm

    means = np.linspace(-1.0, 1.0, 10)
    rng = np.random.default_rng(0)
    y = rng.normal(means[6], 1.0, size=n)
    with pm.Model() as model:
        y_data = pm.Data("y", y)
        q = pm.Categorical("q", p=np.full(len(means), 1 / len(means)))
        pm.Normal("obs", mu=pm.math.constant(means)[q], sigma=1.0, observed=y_data)
    return model, [["q"], []]


def _negbin(n):
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 2))
    g = rng.integers(0, 3, n)
    mu = np.exp(0.5 + x @ np.array([0.3, -0.4]) + np.array([0.0, 0.2, -0.1])[g])
    y = rng.negative_binomial(5.0, 5.0 / (5.0 + mu))
    alphas = np.array([1.0, 2.0, 5.0, 10.0, 20.0])
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        g_data = pm.Data("g", g)
        y_data = pm.Data("y", y)
        k = pm.Categorical("k", p=np.full(len(alphas), 1 / len(alphas)))
        b0 = pm.Normal("b0", 0.0, 2.0)
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        u = pm.Normal("u", 0.0, 0.5, shape=3)
        mean = pm.math.exp(b0 + x_data @ b + u[g_data])
        pm.NegativeBinomial("obs", mu=mean, alpha=pt.constant(alphas)[k], observed=y_data)
    return model, [["k"], ["b0", "b", "u"]]


def _gamma_glm(n):
    import pymc as pm

    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3))
    mu = np.exp(0.2 + x @ np.array([0.3, -0.2, 0.1]))
    y = rng.gamma(2.0, mu / 2.0)
    shapes = np.array([0.5, 1.0, 2.0, 4.0])
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", y)
        k = pm.Categorical("k", p=np.full(4, 0.25))
        b0 = pm.Normal("b0", 0, 2)
        b = pm.Normal("b", 0, 1, shape=3)
        m = pm.math.exp(b0 + xd @ b)
        alpha = pm.math.constant(shapes)[k]
        pm.Gamma("obs", alpha=alpha, beta=alpha / m, observed=yd)
    return model, [["k"], ["b0", "b"]]


def _ordered(n):
    import pymc as pm

    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, 2))
    eta = x @ np.array([0.8, -0.5])
    cuts = np.array([-1.0, 0.0, 1.2])
    u = rng.logistic(size=n) + eta
    y = (u[:, None] > cuts).sum(axis=1)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", y)
        b = pm.Normal("b", 0, 1, shape=2)
        c = pm.Normal(
            "c", mu=[-1, 0, 1], sigma=2, shape=3, transform=pm.distributions.transforms.ordered
        )
        pm.OrderedLogistic("obs", eta=xd @ b, cutpoints=c, observed=yd)
    return model, [[], ["b", "c"]]


def _zip(n):
    import pymc as pm

    rng = np.random.default_rng(6)
    x = rng.normal(size=n)
    lam = np.exp(0.5 + 0.4 * x)
    y = np.where(rng.random(n) < 0.3, 0, rng.poisson(lam))
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", y)
        psi = pm.Beta("psi", 2, 2)
        a = pm.Normal("a", 0, 2)
        b = pm.Normal("b", 0, 1)
        pm.ZeroInflatedPoisson("obs", psi=psi, mu=pm.math.exp(a + b * xd), observed=yd)
    return model, [[], ["psi", "a", "b"]]


def _weibull_cens(n):
    import pymc as pm

    rng = np.random.default_rng(7)
    x = rng.normal(size=n)
    t = rng.weibull(1.5, size=n) * np.exp(0.3 * x)
    c = 1.5
    yobs = np.minimum(t, c)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", yobs)
        k = pm.HalfNormal("k", 2)
        b = pm.Normal("b", 0, 1)
        pm.Censored(
            "obs",
            pm.Weibull.dist(alpha=k, beta=pm.math.exp(b * xd)),
            lower=None,
            upper=c,
            observed=yd,
        )
    return model, [[], ["k", "b"]]


def _poly_student(n):
    import pymc as pm

    rng = np.random.default_rng(8)
    x = rng.uniform(-2, 2, size=n)
    y = 0.5 + 0.3 * x - 0.2 * x**2 + 0.05 * x**3 + rng.standard_t(5, size=n) * 0.5
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", y)
        b = pm.Normal("b", 0, 1, shape=4)
        s = pm.HalfNormal("s", 1)
        mu = b[0] + b[1] * xd + b[2] * xd**2 + b[3] * xd**3
        pm.StudentT("obs", nu=5, mu=mu, sigma=s, observed=yd)
    return model, [[], ["b", "s"]]


def _mix_choice(n):
    import pymc as pm
    import pytensor.tensor as pt

    rng = np.random.default_rng(9)
    y = np.where(rng.random(n) < 0.3, rng.normal(-1, 0.5, n), rng.normal(1.5, 1.0, n))
    with pm.Model() as model:
        yd = pm.Data("y", y)
        k = pm.Categorical("k", p=np.full(3, 1 / 3))  # which scale family for comp 2
        w = pm.Beta("w", 2, 2)
        mu = pm.Normal("mu", 0, 2, shape=2)
        sd2 = pt.constant(np.array([0.5, 1.0, 2.0]))[k]
        pm.NormalMixture(
            "obs", w=pt.stack([w, 1 - w]), mu=mu, sigma=pt.stack([0.5, sd2]), observed=yd
        )
    return model, [["k"], ["w", "mu"]]


BUILDERS = {
    "demo": (_demo, 1_000_000),
    "poisson_link": (_poisson_link, 1_000_000),
    "studentt_nu": (_studentt_nu, 3_000),
    "hierarchical": (_hierarchical, 100_000),
    "logistic": (_logistic, 100_000),
    "mixture": (_mixture, 1_000_000),
    "readme": (_readme, 500_000),
    "negbin": (_negbin, 100_000),
    "gamma_glm": (_gamma_glm, 200_000),
    "ordered": (_ordered, 100_000),
    "zip": (_zip, 200_000),
    "weibull_cens": (_weibull_cens, 100_000),
    "poly_student": (_poly_student, 100_000),
    "mix_choice": (_mix_choice, 100_000),
}


# -- one run, in this process ---------------------------------------------------------------


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _make_steps(model, blocks, side):
    import pymc as pm

    from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs

    discrete, continuous = blocks
    steps = []
    if discrete:
        rvs = [model[v] for v in discrete]
        steps.append(
            SubsampledCategoricalGibbs(rvs)
            if side == "ours"
            else pm.CategoricalGibbsMetropolis(rvs)
        )
    if continuous:
        rvs = [model[v] for v in continuous]
        steps.append(RacingMetropolis(rvs) if side == "ours" else pm.NUTS(rvs))
    return steps


def run_one(name: str, side: str, scale: float, draws_scale: float, trace: bool) -> dict:
    """Build the model, then time steps + ``pm.sample`` to the first draw; return a record."""
    sys.path.insert(0, str(HERE))
    import _paths  # noqa: F401  (tests/support on the path)
    import arviz as az
    import pymc as pm
    from _compile_trace import CompileTrace

    t0 = time.perf_counter()
    import pymc_subsample  # noqa: F401  (imported before the model, as a user does)

    import_s = time.perf_counter() - t0
    build, n_default = BUILDERS[name]
    n_obs = max(200, int(n_default * scale))
    model, blocks = build(n_obs)
    (tune, draws) = DRAWS[name][0 if side == "ours" else 1]
    tune, draws = max(20, int(tune * draws_scale)), max(20, int(draws * draws_scale))
    first: list[tuple[float, float]] = []

    def callback(trace, draw):
        if not first:
            first.append((time.perf_counter(), _cpu_seconds()))

    if side == "nutpie":
        return _run_nutpie(name, model, blocks, n_obs, tune, draws, import_s)
    recorder = CompileTrace() if trace else None
    with model:
        w0, c0 = time.perf_counter(), _cpu_seconds()
        if recorder is not None:
            recorder.__enter__()
        try:
            steps = _make_steps(model, blocks, side)
            built = time.perf_counter() - w0
            idata = pm.sample(
                draws=draws,
                tune=tune,
                chains=1,
                cores=1,
                step=steps,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
                callback=callback,
            )
        finally:
            if recorder is not None:
                recorder.__exit__(None, None, None)
        total_w, total_c = time.perf_counter() - w0, _cpu_seconds() - c0
    cont = [v for v in blocks[1]]
    ess_vars = cont or blocks[0]
    ess = az.ess(idata["posterior"].to_dataset(), var_names=ess_vars, method="bulk")
    min_ess = float(min(float(np.min(ess[v].values)) for v in ess_vars))
    record = {
        "model": name,
        "side": side,
        "n_obs": n_obs,
        "tune": tune,
        "draws": draws,
        "import_s": import_s,
        "build_steps_s": built,
        "first_draw_s": first[0][0] - w0,
        "first_draw_cpu_s": first[0][1] - c0,
        "total_s": total_w,
        "total_cpu_s": total_c,
        "min_ess_bulk": min_ess,
        "ess_per_s_after_first": min_ess / max(total_w - (first[0][0] - w0), 1e-9),
        "ess_per_s_counting_first": min_ess / total_w,
    }
    if recorder is not None:
        record["trace"] = recorder.summary()
    return record


def _run_nutpie(name, model, blocks, n_obs, tune, draws, import_s) -> dict:
    """Run nutpie on the whole model (continuous blocks only): compile, then one chain.

    nutpie reports no per-draw callback: its first draw is counted at the end of its
    compilation plus one draw's share of the sampling time.
    """
    import arviz as az
    import nutpie

    w0, c0 = time.perf_counter(), _cpu_seconds()
    compiled = nutpie.compile_pymc_model(model)
    compile_w, compile_c = time.perf_counter() - w0, _cpu_seconds() - c0
    result = nutpie.sample(compiled, draws=draws, tune=tune, chains=1, seed=1, progress_bar=False)
    total_w, total_c = time.perf_counter() - w0, _cpu_seconds() - c0
    per_draw = (total_w - compile_w) / (tune + draws)
    per_draw_c = (total_c - compile_c) / (tune + draws)
    posterior = (
        result["posterior"].to_dataset()
        if hasattr(result["posterior"], "to_dataset")
        else result["posterior"]
    )
    ess = az.ess(posterior, var_names=blocks[1], method="bulk")
    min_ess = float(min(float(np.min(ess[v].values)) for v in blocks[1]))
    first_w, first_c = compile_w + per_draw, compile_c + per_draw_c
    return {
        "model": name,
        "side": "nutpie",
        "n_obs": n_obs,
        "tune": tune,
        "draws": draws,
        "import_s": import_s,
        "build_steps_s": compile_w,
        "first_draw_s": first_w,
        "first_draw_cpu_s": first_c,
        "total_s": total_w,
        "total_cpu_s": total_c,
        "min_ess_bulk": min_ess,
        "ess_per_s_after_first": min_ess / max(total_w - first_w, 1e-9),
        "ess_per_s_counting_first": min_ess / total_w,
    }


# -- driver ---------------------------------------------------------------------------------


def _wait_for_background(tmp: Path, limit: float = 300.0) -> float:
    """Wait until no process names ``tmp`` (the run's background compilations); return seconds."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        found = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True)
        if not found.stdout.strip():
            break
        time.sleep(0.5)
    return time.perf_counter() - t0


def spawn(name: str, side: str, args, *, fresh_numba: bool) -> dict:
    """Run one model and side in a fresh process, fresh PyTensor (and Numba) caches."""
    tmp = Path(tempfile.mkdtemp(prefix="first_draw_"))
    env = dict(os.environ)
    # PyTensor 3 keeps its Numba-compiled graphs under base_compiledir/numba, not in the
    # compiledir: a fresh base_compiledir is what makes the model new to the machine
    env["PYTENSOR_FLAGS"] = f"base_compiledir={tmp / 'pytensor'}"
    if fresh_numba:
        env["NUMBA_CACHE_DIR"] = str(tmp / "numba")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--one", name, "--side", side]
    cmd += ["--scale", str(args.scale), "--draws-scale", str(args.draws_scale)]

    def run(extra: list[str]) -> dict:
        out = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, check=False)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            raise RuntimeError(f"{name} ({side}) failed:\n{out.stderr[-3000:]}")
        return json.loads(lines[-1])

    try:
        record = run([])
        # the same model again in a new process, on the caches the first run left, once
        # the compilations it handed to other processes have ended (a user looks at the
        # first run's results before the next)
        record["background_wait_s"] = _wait_for_background(tmp)
        record["second"] = run(["--no-trace"])
        _wait_for_background(tmp)  # they write into tmp: let them end before it goes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record["fresh_machine"] = fresh_numba
    return record


def _row(ours: dict, exact: dict, label: str, nutpie: dict | None = None) -> str:
    ratio = ours["first_draw_s"] / exact["first_draw_s"]
    ratio_cpu = ours["first_draw_cpu_s"] / exact["first_draw_cpu_s"]
    ess = ours["ess_per_s_counting_first"] / exact["ess_per_s_counting_first"]
    n = ours["trace"]["n_functions"] if "trace" in ours else "-"
    again, exact_again = ours.get("second"), exact.get("second")
    if again and exact_again:
        ess2 = again["ess_per_s_counting_first"] / exact_again["ess_per_s_counting_first"]
        second = [
            f"{again['first_draw_s']:.1f} ({exact_again['first_draw_s']:.1f})",
            f"{again['ess_per_s_counting_first']:.3g} "
            f"({exact_again['ess_per_s_counting_first']:.3g})",
            f"{ess2:.2f}x",
        ]
    else:
        second = ["-", "-", "-"]
    cells = [
        label,
        f"{ours['n_obs']:,}",
        f"{ours['first_draw_s']:.1f} ({ours['first_draw_cpu_s']:.1f})",
        f"{exact['first_draw_s']:.1f} ({exact['first_draw_cpu_s']:.1f})",
        f"{ratio:.1f}x ({ratio_cpu:.1f}x)",
        str(n),
        f"{ours['ess_per_s_counting_first']:.3g}",
        f"{exact['ess_per_s_counting_first']:.3g}",
        f"{ess:.2f}x",
        *second,
        f"{nutpie['first_draw_s']:.1f} ({nutpie['first_draw_cpu_s']:.1f})" if nutpie else "-",
        f"{nutpie['ess_per_s_counting_first']:.3g}" if nutpie else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def _breakdown(record: dict) -> list[str]:
    t = record["trace"]
    lines = [
        f"**{record['model']}{' (fresh machine)' if record.get('fresh_machine') else ''}**: "
        f"first draw after {record['first_draw_s']:.1f} s "
        f"({record['first_draw_cpu_s']:.1f} s CPU); "
        f"{t['n_functions']} PyTensor functions compiled: rewrites {t['rewrite_s']:.1f} s, "
        f"construction {t['construct_s']:.1f} s, first calls {t['first_call_s']:.1f} s "
        f"(Numba compiles the graph at the first call); other Numba kernels "
        f"{sum(t['kernels'].values()):.1f} s.",
        "",
        "| compiled by | functions | rewrites (s) | construction (s) | first call (s) |",
        "|---|---|---|---|---|",
    ]
    rows = sorted(
        t["functions"].items(), key=lambda kv: -kv[1]["first_call_s"] - kv[1]["construct_s"]
    )
    for caller, row in rows:
        lines.append(
            f"| `{caller}` | {row['n']} | {row['rewrite_s']:.2f} | {row['construct_s']:.2f} "
            f"| {row['first_call_s']:.2f} |"
        )
    if t["kernels"]:
        kern = ", ".join(
            f"{f'`{k}`' if k else 'per-model drivers (chunk loop, compiled race)'} {v:.2f} s"
            for k, v in sorted(t["kernels"].items(), key=lambda kv: -kv[1])
        )
        lines += ["", f"Numba kernels outside PyTensor (load or compile, by module): {kern}."]
    if t["sections"]:
        sec = ", ".join(f"{k} {v:.2f} s" for k, v in t["sections"].items())
        lines += ["", f"Sections (inclusive, compilations inside them included): {sec}."]
    return lines + [""]


def write_tables(records: list[dict], path_md: Path, command: str) -> None:
    by = {(r["model"], r["side"], r.get("fresh_machine", False)): r for r in records}
    lines = [
        f"Written by `{command}` on {time.strftime('%Y-%m-%d')}. Each run: a fresh process and a "
        "fresh PyTensor base compile directory (the model new to the machine), one chain, "
        "`pm.sample` with the steps built just before. Times: wall clock (CPU, user + system, "
        "compiler subprocesses included, in brackets), from building the steps to the first "
        "draw. ESS/s: minimum bulk ESS of the continuous block (of the discrete one when "
        "alone) per second of the whole run, its first draw counted. Second run: the same "
        "model again in a new process on the caches the first run left (PyMC's in brackets). "
        "nutpie (models without a discrete block): its compilation plus one draw's share of "
        "its sampling (it reports no per-draw callback), ESS/s counting both.",
        "",
        "| model | N | ours: to first draw, s | PyMC exact: to first draw, s | ratio | PyTensor "
        "functions compiled (ours, both tiers) | ours ESS/s | PyMC ESS/s | ESS/s ratio "
        "| second run: to first draw, s | second run: ESS/s | second run: ESS/s ratio "
        "| nutpie: to first draw, s | nutpie ESS/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, side, fresh), ours in by.items():
        if side != "ours":
            continue
        exact = by.get((model, "pymc", fresh)) or by.get((model, "pymc", False))
        if exact is None:
            continue
        label = f"{model}, fresh machine" if fresh else model
        lines.append(_row(ours, exact, label, None if fresh else by.get((model, "nutpie", False))))
    lines += ["", "## Where our seconds go", ""]
    for r in records:
        if r["side"] == "ours" and "trace" in r:
            lines += _breakdown(r)
    path_md.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every N")
    parser.add_argument("--draws-scale", type=float, default=1.0, help="multiplies draws")
    parser.add_argument("--quick", action="store_true", help="N / 10, draws / 5")
    parser.add_argument("--skip-fresh", action="store_true", help="no fresh-machine row")
    parser.add_argument("--fresh-model", default="demo", help="model of the fresh-machine row")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--tag", default="", help="suffix of the output files")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="no nutpie")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--no-trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.scale, args.draws_scale = args.scale / 10, args.draws_scale / 5
    if args.one:
        record = run_one(args.one, args.side, args.scale, args.draws_scale, not args.no_trace)
        print(json.dumps(record))
        return
    command = "python benchmarks/first_draw.py " + " ".join(sys.argv[1:])
    records = []
    # the library's kernels in their disk cache first ("warm machine")
    spawn("mixture", "ours", argparse.Namespace(scale=0.01, draws_scale=0.1), fresh_numba=False)
    jobs = [(m, s, False) for m in args.models.split(",") for s in ("ours", "pymc")]
    if args.peers:
        try:
            import nutpie  # noqa: F401
        except ImportError:
            print("nutpie is not installed (pip install -e '.[peers]'): no nutpie column")
        else:  # nutpie samples a whole model with NUTS: the models without a discrete block
            jobs += [(m, "nutpie", False) for m in args.models.split(",") if m in NUTPIE_MODELS]
    if not args.skip_fresh:
        jobs += [(args.fresh_model, "ours", True), (args.fresh_model, "pymc", True)]
    for model, side, fresh in jobs:
        record = spawn(model, side, args, fresh_numba=fresh)
        records.append(record)
        print(
            f"{model:13s} {side:5s}{' fresh' if fresh else '':6s} first draw "
            f"{record['first_draw_s']:6.1f} s (CPU {record['first_draw_cpu_s']:6.1f}), "
            f"ESS/s counting it {record['ess_per_s_counting_first']:.3g}; second run "
            f"{record['second']['first_draw_s']:.1f} s, "
            f"{record['second']['ess_per_s_counting_first']:.3g} ESS/s",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"first_draw{args.tag}"
    (args.out / f"{name}.json").write_text(json.dumps(records, indent=1) + "\n")
    write_tables(records, args.out / f"{name}.md", command)
    print(f"wrote {args.out / name}.md")


if __name__ == "__main__":
    main()

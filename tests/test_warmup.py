"""The racing kernels compile in another process on a new machine; steps decide exactly meanwhile.

A machine whose Numba cache lacks the racing kernels compiles them in a process
of its own (:mod:`pymc_subsample.racing.warmup`); the kernels it leaves in the
cache are the ones a step's races call (no compilation left for the sampling
process), and a step that decided exactly while they compiled, then raced,
samples the same law.
"""

import json
import os
import subprocess
import sys
import textwrap

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from scipy import stats
from test_gibbs import assert_matches, draw_many, exact_conditional

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import RaceOptions
from pymc_subsample.racing import warmup

#: In a new process: the racing kernels' compilations that missed the disk cache.
_MISSES = """
import numba
from pymc_subsample.racing import compiled, draws, kernels, packed
misses = {
    f"{m.__name__}.{name}": sum(d.stats.cache_misses.values())
    for m in (kernels, draws, packed, compiled)
    for name, d in vars(m).items()
    if isinstance(d, numba.core.registry.CPUDispatcher)
}
hits = sum(
    sum(d.stats.cache_hits.values())
    for m in (kernels, draws)
    for d in vars(m).values()
    if isinstance(d, numba.core.registry.CPUDispatcher)
)
"""

_WARM_UP = """
import time
from pymc_subsample.racing import warmup
first = warmup.ready()
start = time.monotonic()
while not warmup.ready():
    time.sleep(0.2)
    assert time.monotonic() - start < 600
print(json.dumps({"first": first, "held": all(warmup._held(d) for d in warmup.kernels()),
                  "seconds": time.monotonic() - start}))
"""

_SAMPLE = (
    """
import numpy as np, pymc as pm, pytensor.tensor as pt
from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.racing import warmup
rng = np.random.default_rng(0)
n = 20_001
x = rng.normal(size=n)
mus = np.array([0.0, 0.02, 0.05, 0.5])
with pm.Model() as model:
    xd = pm.Data("x", x)
    yd = pm.Data("y", 0.3 * x + 0.02 + rng.normal(size=n))
    q = pm.Categorical("q", p=np.full(4, 0.25))
    b = pm.Normal("b", 0, 1)
    pm.Normal("obs", pt.as_tensor(mus)[q] + b * xd, 1.0, observed=yd)
    steps = [SubsampledCategoricalGibbs([q]), RacingMetropolis([b])]
    pending = [s._kernels_pending for s in steps]
    idata = pm.sample(tune=30, draws=30, chains=1, step=steps, random_seed=1,
                      progressbar=False, compute_convergence_checks=False)
raced = int(idata.sample_stats["n_raced"].sum())
"""
    + _MISSES
    + """
print(json.dumps({"pending": pending, "raced": raced, "misses": misses, "hits": hits}))
"""
)


def _run(code: str, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_machine_warms_up_the_kernels_a_step_races_with(tmp_path):
    """Empty Numba cache: the warm-up's kernels serve a step's races with no compilation left.

    The first process finds the kernels missing and starts the warm-up; once
    it has ended, a new process's steps plan races at once (nothing pending)
    and race without compiling any racing kernel.
    """
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYMC_SUBSAMPLE_BACKGROUND="1")
    first = _run(_WARM_UP, env)
    assert first["first"] is False  # nothing cached: the warm-up started
    assert first["held"]
    assert not list((tmp_path / "numba").rglob("*.lock"))  # the warm-up removed its lock
    second = _run(_SAMPLE, env)
    assert second["pending"] == [False, False]
    assert second["raced"] > 0
    assert second["hits"] > 0 and len(second["misses"]) > 10  # loaded from the cache
    assert sum(second["misses"].values()) == 0, second["misses"]


@pytest.fixture
def pending_for(monkeypatch):
    """Make :func:`warmup.ready` say "not yet" for its first ``k`` calls, then "ready"."""

    def arm(k: int):
        calls = [0]

        def ready():
            calls[0] += 1
            return calls[0] > k

        monkeypatch.setattr(warmup, "IN_BACKGROUND", True)
        monkeypatch.setattr(warmup, "ready", ready)

    return arm


def test_gibbs_draws_match_enumeration_through_the_switch_to_races(pending_for):
    rng = np.random.default_rng(0)
    mus = np.array([0.0, 0.03, 0.06, 0.09, 0.12])
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(0.06, 1.0, size=2000))
        q = pm.Categorical("q", p=np.array([0.1, 0.2, 0.3, 0.2, 0.2]))
        pm.Normal("y", pt.as_tensor(mus)[q], 1.0, observed=y_data)
    point = model.initial_point()
    probs = exact_conditional(model, "q", 5, point)
    pending_for(300)
    with model:  # the paper's race after the switch: the whole doubling schedule
        step = SubsampledCategoricalGibbs(
            [q], rng=6, race=RaceOptions(exact_fraction=1.0, backoff=False)
        )
    assert step.decides_exactly
    draws, st = draw_many(step, point, 1200, "q")
    raced = np.array([s["n_raced"] for s in st])
    assert raced[:290].sum() == 0 and raced[310:].mean() > 0.9
    assert not step.decides_exactly
    assert_matches(draws, probs, 5)


def test_metropolis_matches_the_exact_posterior_through_the_switch_to_races(pending_for):
    """A Normal mean, N = 5,000: the conjugate posterior, decided exactly and then raced."""
    rng = np.random.default_rng(1)
    n, prior_sd = 5000, 10.0
    y = rng.normal(0.3, 1.0, size=n)
    post_var = 1.0 / (n + 1.0 / prior_sd**2)
    post_mean, post_sd = post_var * y.sum(), np.sqrt(post_var)
    pending_for(400)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("y", mu, 1.0, observed=pm.Data("y_data", y))
        step = RacingMetropolis([mu], proposal="normal", race=RaceOptions(backoff=False))
        assert step.decides_exactly
        idata = pm.sample(
            draws=3000,
            tune=500,
            step=[step],
            chains=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert not step.decides_exactly
    assert int(idata.sample_stats["n_raced"].sum()) > 1000
    x = idata.posterior["mu"].values.ravel()
    ess = float(az.ess(x[None, :]))
    assert abs(x.mean() - post_mean) < 4 * post_sd / np.sqrt(ess)
    # se of a sample sd of a normal: sd / sqrt(2 ess)
    assert abs(x.std() / post_sd - 1) < 4 / np.sqrt(2 * ess)
    assert stats.normaltest(x[::5]).pvalue > 1e-3


def test_in_process_without_background():
    assert warmup.IN_BACKGROUND is False  # the suite compiles in process (conftest)
    assert warmup.ready()


def test_a_lock_counts_while_its_warm_up_lives(tmp_path):
    lock = tmp_path / "warmup.lock"
    assert not warmup._other_runs(lock)  # no lock: nothing runs
    lock.write_text("")
    assert warmup._other_runs(lock)  # just taken, its id not written yet
    lock.write_text(str(os.getpid()))
    assert warmup._other_runs(lock)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    lock.write_text(dead.stdout.decode().strip())
    assert not warmup._other_runs(lock)  # a warm-up that was stopped is not awaited

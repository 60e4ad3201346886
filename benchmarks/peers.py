"""Peer samplers for the benchmarks: numpyro NUTS, numpyro HMCECS and nutpie.

The peers are the samplers a user would pick instead of ours: NUTS (Hoffman &
Gelman 2014) in numpyro and in nutpie, and HMC with energy conserving
subsampling, HMCECS (Dang et al. 2019), in numpyro, with a NUTS inner kernel
and a second-order Taylor proxy (Bardenet et al. 2017) as numpyro documents.
They run on the same data and models as ours, so that a benchmark script can
put them in its table in the same run. Install them with
``pip install -e '.[peers]'``; :func:`available` says which are usable, and why
not.

Models: those of ``tests/support/models.py`` (data and PyMC models), the
numpyro versions written here to match (coefficients named ``a``, ``b[0]`` ...
``b[3]``):

- logistic regression, ``a ~ Normal(0, 3)``, ``b ~ Normal(0, 3)`` (4 entries),
  ``y ~ Bernoulli(logit_p = a + x @ b)``;
- robust regression, same priors, ``sigma ~ HalfNormal(1)``,
  ``y ~ StudentT(nu = 4, mu = a + x @ b, sigma)``.

Timing. Every peer runs its chains one after the other on the CPU; ``seconds``
is wall time of sampling with tuning, compilation excluded, and
``compile_seconds`` is the compilation. For numpyro, one call is timed and JAX's
own compile events (tracing, lowering to MLIR, XLA compilation; JAX's
``jax.monitoring`` durations) are summed into ``compile_seconds`` and taken off
the wall time. A second, "warm" call would not do: numpyro recompiles its
sampling loop for every sequential chain and for warm-up and sampling apart.
The data are arguments, not constants (``jit_model_args=True``); JAX's default
float32 is kept, as a user would. For HMCECS the reference point of the Taylor
proxy is found as a user would, with no start at the truth: a full-data MAP by
BFGS (``jax.scipy.optimize.minimize``) from the prior median, compiled ahead of
time; its compilation goes to ``compile_seconds``, its run to
``reference_seconds``, which ``seconds`` includes. For nutpie,
``compile_seconds`` is ``nutpie.compile_pymc_model`` (numba) plus a 10-draw
warm-up call, and ``seconds`` the wall time of the timed ``nutpie.sample``.

Run ``python benchmarks/peers.py --n 100000`` for a table of the available peers
on the logistic model (``--model studentt`` for the robust regression).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import dataclass, field

import _paths  # noqa: F401 (puts tests/, home of the support package, on sys.path)
import numpy as np

from support.models import logistic_data, logistic_model, studentt_data, studentt_model

PEERS = ("numpyro_nuts", "numpyro_hmcecs", "nutpie")
#: Groups of the hierarchical model's numpyro version (``support.models.hierarchical_data``).
HIERARCHICAL_GROUPS = 100
INSTALL = "pip install -e '.[peers]'"


@dataclass
class PeerResult:
    """What one peer run reports.

    Attributes
    ----------
    name : str
        Peer and model, e.g. ``"numpyro NUTS"``.
    min_ess : float
        Minimum bulk ESS (``az.ess``) over the coefficients ``a``, ``b[0..3]``.
    seconds : float
        Sampling time, tuning included, compilation excluded (for HMCECS, the
        reference-point search is included).
    compile_seconds : float
        JIT or compile time, reported separately.
    gradient_evals : int or None
        Gradient evaluations (leapfrog steps), summed over chains, tuning
        included; None if the peer does not expose them.
    obs_per_gradient : int
        Observations one gradient evaluation touches: N for NUTS, the
        subsample size for HMCECS.
    means, sds, mcses : dict of str to float
        Posterior mean, sd and Monte Carlo standard error of the mean per
        parameter (coefficients, and ``sigma`` for the Student-t model).
    draws, chains : int
        Kept draws per chain, and chains.
    reference_seconds : float
        Time of the reference-point search (HMCECS only; part of ``seconds``).
    extra : dict of str to float
        Peer-specific figures: numpyro's mean ``accept_prob`` over kept draws
        (for HMCECS that of the subsample update, not of the NUTS trajectory),
        and HMCECS's Taylor reference point as ``ref_a``, ``ref_b[0]``, ...
    """

    name: str
    min_ess: float
    seconds: float
    compile_seconds: float
    gradient_evals: int | None
    obs_per_gradient: int
    means: dict[str, float]
    sds: dict[str, float]
    mcses: dict[str, float]
    draws: int
    chains: int
    reference_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ess_per_second(self) -> float:
        """Minimum bulk ESS per second of sampling (compilation excluded)."""
        return self.min_ess / self.seconds


# ---------------------------------------------------------------------- availability


def available() -> dict[str, str | None]:
    """Say which peers are usable.

    Returns
    -------
    dict of str to str or None
        For each of ``"numpyro_nuts"``, ``"numpyro_hmcecs"`` and ``"nutpie"``:
        None if usable, else a one-line reason with the install command.
    """
    missing = {
        name: importlib.util.find_spec(name) is None for name in ("jax", "numpyro", "nutpie")
    }
    numpyro_reason = None
    if missing["numpyro"] or missing["jax"]:
        absent = " and ".join(n for n in ("numpyro", "jax") if missing[n])
        numpyro_reason = f"{absent} not installed: {INSTALL}"
    nutpie_reason = None
    if missing["nutpie"]:
        nutpie_reason = f"nutpie not installed: {INSTALL}"
    elif importlib.util.find_spec("numba") is None:
        nutpie_reason = f"numba (nutpie's PyMC backend) not installed: {INSTALL}"
    return {
        "numpyro_nuts": numpyro_reason,
        "numpyro_hmcecs": numpyro_reason,
        "nutpie": nutpie_reason,
    }


# --------------------------------------------------------------------------- summary


def _flatten(samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Split (chain, draw, ...) arrays into (chain, draw) arrays named ``b[0]``, ..."""
    out = {}
    for name, arr in samples.items():
        arr = np.asarray(arr, dtype=float)
        if arr.ndim == 2:
            out[name] = arr
        else:
            for i in range(arr.shape[2]):
                out[f"{name}[{i}]"] = arr[:, :, i]
    return out


def _summarise(
    name: str,
    samples: dict[str, np.ndarray],
    *,
    seconds: float,
    compile_seconds: float,
    gradient_evals: int | None,
    obs_per_gradient: int,
    reference_seconds: float = 0.0,
    extra: dict[str, float] | None = None,
    ess_of: tuple[str, ...] | None = ("a", "b"),
) -> PeerResult:
    """Turn (chain, draw, ...) arrays into a :class:`PeerResult` (ESS and MCSE by arviz).

    ``min_ess`` is over the entries of the variables ``ess_of`` (all when None).
    """
    import arviz as az

    flat = _flatten(samples)
    ess = {k: float(az.ess(v, method="bulk")) for k, v in flat.items()}
    chains, draws = next(iter(flat.values())).shape
    counted = [k for k in flat if ess_of is None or k.split("[")[0] in ess_of]
    return PeerResult(
        name=name,
        min_ess=min(ess[k] for k in counted),
        seconds=seconds,
        compile_seconds=compile_seconds,
        gradient_evals=gradient_evals,
        obs_per_gradient=obs_per_gradient,
        means={k: float(v.mean()) for k, v in flat.items()},
        sds={k: float(v.std(ddof=1)) for k, v in flat.items()},
        mcses={k: float(az.mcse(v, method="mean")) for k, v in flat.items()},
        draws=draws,
        chains=chains,
        reference_seconds=reference_seconds,
        extra=extra or {},
    )


# --------------------------------------------------------------------------- numpyro


def _numpyro_model(kind: str, subsample_size: int | None = None):
    """Return the numpyro model of ``kind`` on its data arrays (subsampled plate if asked).

    ``kind``: ``"logistic"`` (any number of covariates), ``"studentt"`` (``nu = 4``),
    ``"studentt_nu"`` (``nu ~ Gamma(2, 0.1)``), each called as ``model(x, y)``, or
    ``"hierarchical"``, called as ``model(x, g, y)`` with 100 groups; the priors of
    ``tests/support/models.py``.
    """
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def model(*data):
        x, y = data[0], data[-1]
        k = x.shape[1]
        if kind == "hierarchical":
            mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 3.0))
            tau = numpyro.sample("tau", dist.HalfNormal(1.0))
            alpha = numpyro.sample(
                "alpha", dist.Normal(mu_a, tau).expand([HIERARCHICAL_GROUPS]).to_event(1)
            )
        else:
            a = numpyro.sample("a", dist.Normal(0.0, 3.0))
        b = numpyro.sample("b", dist.Normal(0.0, 3.0).expand([k]).to_event(1))
        sigma = None
        if kind != "logistic":
            sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1)) if kind == "studentt_nu" else 4.0
        with numpyro.plate("N", x.shape[0], subsample_size=subsample_size):
            xb = numpyro.subsample(x, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            if kind == "hierarchical":
                gb = numpyro.subsample(data[1], event_dim=0)
                numpyro.sample("y", dist.Normal(alpha[gb] + jnp.matmul(xb, b), sigma), obs=yb)
                return
            eta = a + jnp.matmul(xb, b)
            if kind == "logistic":
                numpyro.sample("y", dist.Bernoulli(logits=eta), obs=yb)
            else:
                numpyro.sample("y", dist.StudentT(nu, eta, sigma), obs=yb)

    return model


def _map_reference(model, data: tuple, seed: int) -> tuple[dict, float, float]:
    """Full-data MAP by BFGS from the prior median, as a user would find a reference.

    Returns the constrained MAP, the compile time (ahead-of-time lowering and
    compilation of the whole optimisation) and the run time.
    """
    import jax
    from jax.flatten_util import ravel_pytree
    from jax.scipy.optimize import minimize
    from numpyro.infer import init_to_median
    from numpyro.infer.util import initialize_model

    info = initialize_model(  # dynamic_args: the data are arguments of the jitted solve
        jax.random.key(seed),
        model,
        model_args=data,
        init_strategy=init_to_median,
        dynamic_args=True,
    )
    z0 = dict(info.param_info.z)
    flat0, unravel = ravel_pytree(z0)

    def solve(flat, *data):
        def objective(f):
            return info.potential_fn(*data)(unravel(f))

        return minimize(objective, flat, method="BFGS", options={"maxiter": 200}).x

    t0 = time.perf_counter()
    compiled = jax.jit(solve).lower(flat0, *data).compile()
    t1 = time.perf_counter()
    flat = compiled(flat0, *data).block_until_ready()
    t2 = time.perf_counter()
    constrained = info.postprocess_fn(*data)(unravel(flat))
    ref = {k: constrained[k] for k in z0}
    return ref, t1 - t0, t2 - t1


class _jax_compile_clock:
    """Context manager summing JAX's tracing, lowering and XLA compile durations.

    It listens to JAX's monitoring events (``/jax/core/compile/...``), so that a
    single run splits into compile time (``seconds``) and the rest. Numpyro's
    sequential chains recompile their sampling loop for every chain and for
    warm-up and sampling separately, so a second, "warm" call would not avoid
    compilation; counting the compile events does.
    """

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self) -> None:
        self.seconds = 0.0

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event in self.EVENTS:
            self.seconds += duration

    def __enter__(self) -> _jax_compile_clock:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listen)


def _numpyro_run(
    label: str,
    kind: str,
    data: tuple,
    *,
    subsample_size: int | None,
    num_blocks: int,
    draws: int,
    tune: int,
    chains: int,
    seed: int,
    ess_of: tuple[str, ...] | None = ("a", "b"),
) -> PeerResult:
    """Run numpyro NUTS (``subsample_size=None``) or HMCECS; compile time from JAX's events."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import HMCECS, MCMC, NUTS

    model = _numpyro_model(kind, subsample_size)
    # float32 as a user's JAX default; group labels stay integers
    arrays = tuple(
        jnp.asarray(a) if np.issubdtype(np.asarray(a).dtype, np.integer)
        else jnp.asarray(a, dtype=jnp.float32)
        for a in data
    )  # fmt: skip
    compile_ref = run_ref = 0.0
    if subsample_size is None:
        kernel = NUTS(model)
        steps_field = "num_steps"
        obs_per_gradient = len(data[-1])
        ref = {}
    else:
        ref, compile_ref, run_ref = _map_reference(_numpyro_model(kind), arrays, seed)
        kernel = HMCECS(NUTS(model), num_blocks=num_blocks, proxy=HMCECS.taylor_proxy(ref))
        steps_field = "hmc_state.num_steps"
        obs_per_gradient = subsample_size
    mcmc = MCMC(
        kernel,
        num_warmup=tune,
        num_samples=draws,
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
        jit_model_args=True,
    )

    with _jax_compile_clock() as compile_clock:
        k_warm, _ = jax.random.split(jax.random.key(seed))
        t0 = time.perf_counter()
        mcmc.warmup(k_warm, *arrays, collect_warmup=True, extra_fields=(steps_field,))
        warm_steps = int(np.sum(mcmc.get_extra_fields()[steps_field]))
        mcmc.run(mcmc.post_warmup_state.rng_key, *arrays, extra_fields=(steps_field, "accept_prob"))
        samples = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(samples)
        wall = time.perf_counter() - t0
    fields = mcmc.get_extra_fields()
    steps = warm_steps + int(np.sum(fields[steps_field]))
    accept = float(np.mean(fields["accept_prob"]))
    compile_mcmc = min(compile_clock.seconds, wall)
    seconds = wall - compile_mcmc
    samples = {k: np.asarray(v) for k, v in samples.items()}
    extra = {"accept_prob": accept}
    for k, v in ref.items():  # the Taylor proxy's reference point, for the record
        v = np.ravel(np.asarray(v))
        extra.update(
            {f"ref_{k}": float(v[0])}
            if v.size == 1
            else {f"ref_{k}[{i}]": float(vi) for i, vi in enumerate(v)}
        )
    return _summarise(
        label,
        samples,
        seconds=seconds + run_ref,
        compile_seconds=compile_mcmc + compile_ref,
        gradient_evals=steps,
        obs_per_gradient=obs_per_gradient,
        reference_seconds=run_ref,
        extra=extra,
        ess_of=ess_of,
    )


def logistic_numpyro_nuts(
    x: np.ndarray,
    y: np.ndarray,
    *,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro NUTS (Hoffman & Gelman 2014) on the full-data logistic model.

    Parameters
    ----------
    x : ndarray, shape (N, 4)
        Design.
    y : ndarray, shape (N,)
        Outcomes in {0, 1}.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (run one after the
        other).
    seed : int
        Seed of the timed run.

    Returns
    -------
    PeerResult
        Draws of the second (timed) call; compilation is the first call's extra
        wall time (see the module docstring).
    """
    return _numpyro_run(
        "numpyro NUTS", "logistic", (x, y), subsample_size=None, num_blocks=1,
        draws=draws, tune=tune, chains=chains, seed=seed,
    )  # fmt: skip


def logistic_numpyro_hmcecs(
    x: np.ndarray,
    y: np.ndarray,
    *,
    subsample_size: int = 1000,
    num_blocks: int = 100,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro HMCECS (Dang et al. 2019) on the logistic model.

    NUTS inner kernel, second-order Taylor proxy at a full-data MAP found by
    BFGS from the prior median (never at the truth); the search's run time is
    part of ``seconds``, its compilation of ``compile_seconds``. HMCECS targets
    a perturbed posterior (its likelihood estimate is bias-corrected, not
    exact), unlike exact MCMC.

    Parameters
    ----------
    x : ndarray, shape (N, 4)
        Design.
    y : ndarray, shape (N,)
        Outcomes in {0, 1}.
    subsample_size : int
        Observations in the subsample of each likelihood estimate.
    num_blocks : int
        Blocks of the subsample indices; one block is refreshed per step
        (numpyro's example uses 100).
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (run one after the
        other).
    seed : int
        Seed of the timed run and of the MAP's initialisation.

    Returns
    -------
    PeerResult
        Draws of the second (timed) call; see the module docstring for timing.
    """
    return _numpyro_run(
        "numpyro HMCECS", "logistic", (x, y), subsample_size=subsample_size,
        num_blocks=num_blocks, draws=draws, tune=tune, chains=chains, seed=seed,
    )  # fmt: skip


def studentt_numpyro_nuts(
    x: np.ndarray,
    y: np.ndarray,
    *,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro NUTS on the full-data robust (Student-t, nu = 4) regression.

    Parameters
    ----------
    x : ndarray, shape (N, 4)
        Design.
    y : ndarray, shape (N,)
        Outcomes.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (run one after the
        other).
    seed : int
        Seed of the timed run.

    Returns
    -------
    PeerResult
        As :func:`logistic_numpyro_nuts`; ``means`` and ``sds`` include ``sigma``.
    """
    return _numpyro_run(
        "numpyro NUTS", "studentt", (x, y), subsample_size=None, num_blocks=1,
        draws=draws, tune=tune, chains=chains, seed=seed,
    )  # fmt: skip


def studentt_numpyro_hmcecs(
    x: np.ndarray,
    y: np.ndarray,
    *,
    subsample_size: int = 1000,
    num_blocks: int = 100,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro HMCECS on the robust (Student-t, nu = 4) regression.

    Same recipe as :func:`logistic_numpyro_hmcecs`: NUTS inner kernel, Taylor
    proxy at a full-data BFGS MAP (``sigma`` included), never at the truth.

    Parameters
    ----------
    x : ndarray, shape (N, 4)
        Design.
    y : ndarray, shape (N,)
        Outcomes.
    subsample_size : int
        Observations in the subsample of each likelihood estimate.
    num_blocks : int
        Blocks of the subsample indices; one block is refreshed per step.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (run one after the
        other).
    seed : int
        Seed of the timed run and of the MAP's initialisation.

    Returns
    -------
    PeerResult
        As :func:`logistic_numpyro_hmcecs`; ``means`` and ``sds`` include ``sigma``.
    """
    return _numpyro_run(
        "numpyro HMCECS", "studentt", (x, y), subsample_size=subsample_size,
        num_blocks=num_blocks, draws=draws, tune=tune, chains=chains, seed=seed,
    )  # fmt: skip


def numpyro_nuts(
    kind: str,
    data: tuple,
    *,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro NUTS on the full data of any model of :func:`_numpyro_model`.

    Parameters
    ----------
    kind : str
        ``"logistic"``, ``"studentt"``, ``"studentt_nu"`` or ``"hierarchical"``.
    data : tuple of ndarray
        ``(x, y)``, or ``(x, g, y)`` for ``"hierarchical"``.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (one after the other).
    seed : int
        Seed of the run.

    Returns
    -------
    PeerResult
        ``min_ess`` over every parameter; timing as :func:`logistic_numpyro_nuts`.
    """
    return _numpyro_run(
        "numpyro NUTS", kind, data, subsample_size=None, num_blocks=1, draws=draws,
        tune=tune, chains=chains, seed=seed, ess_of=None,
    )  # fmt: skip


def numpyro_hmcecs(
    kind: str,
    data: tuple,
    *,
    subsample_size: int = 1000,
    num_blocks: int = 100,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro HMCECS (Dang et al. 2019) on any model of :func:`_numpyro_model`.

    The recipe of :func:`logistic_numpyro_hmcecs` (NUTS inner kernel, Taylor proxy
    at a full-data BFGS MAP from the prior median).

    Parameters
    ----------
    kind : str
        ``"logistic"``, ``"studentt"``, ``"studentt_nu"`` or ``"hierarchical"``.
    data : tuple of ndarray
        ``(x, y)``, or ``(x, g, y)`` for ``"hierarchical"``.
    subsample_size, num_blocks : int
        As :func:`logistic_numpyro_hmcecs`.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains (one after the other).
    seed : int
        Seed of the run and of the MAP's initialisation.

    Returns
    -------
    PeerResult
        ``min_ess`` over every parameter.
    """
    return _numpyro_run(
        "numpyro HMCECS", kind, data, subsample_size=subsample_size, num_blocks=num_blocks,
        draws=draws, tune=tune, chains=chains, seed=seed, ess_of=None,
    )  # fmt: skip


def pymc_numpyro_nuts(
    pymc_model,
    *,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
) -> PeerResult:
    """Numpyro NUTS on a PyMC model translated to JAX by PyMC (``nuts_sampler="numpyro"``).

    For models without a hand-written numpyro version (the ARCH models). Chains one
    after the other; JAX's compile events are summed into ``compile_seconds`` and
    taken off the wall time, as :func:`_numpyro_run` does. PyMC's translation keeps
    float64.

    Parameters
    ----------
    pymc_model : pymc.Model
        The model.
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains.
    seed : int
        Seed of the run.

    Returns
    -------
    PeerResult
        ``min_ess`` over every free variable's entries; no gradient count.
    """
    import pymc as pm

    with _jax_compile_clock() as clock, pymc_model:
        t0 = time.perf_counter()
        idata = pm.sample(
            draws=draws, tune=tune, chains=chains, nuts_sampler="numpyro", random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
            nuts_sampler_kwargs={"chain_method": "sequential"},
        )  # fmt: skip
        wall = time.perf_counter() - t0  # the draws are NumPy arrays by now: JAX has finished
    compile_seconds = min(clock.seconds, wall)
    names = [v.name for v in pymc_model.free_RVs]
    samples = {k: idata["posterior"][k].values for k in names}
    return _summarise(
        "numpyro NUTS",
        samples,
        seconds=wall - compile_seconds,
        compile_seconds=compile_seconds,
        gradient_evals=None,
        obs_per_gradient=int(np.prod(pymc_model.observed_RVs[0].shape.eval())),
        ess_of=None,
    )


# ---------------------------------------------------------------------------- nutpie


def nutpie_sample(
    pymc_model,
    *,
    draws: int = 500,
    tune: int = 500,
    chains: int = 2,
    seed: int = 0,
    ess_of: tuple[str, ...] | None = ("a", "b"),
) -> PeerResult:
    """Nutpie's NUTS on a PyMC model (numba backend), chains one after the other.

    Parameters
    ----------
    pymc_model : pymc.Model
        The model, e.g. from ``support.models.logistic_model``;
        its free variables must include ``a`` and ``b`` (shape 4).
    draws, tune, chains : int
        Kept draws and tuning draws per chain, and chains.
    seed : int
        Seed of the timed call.
    ess_of : tuple of str or None
        The variables whose entries ``min_ess`` is over (all when None).

    Returns
    -------
    PeerResult
        ``compile_seconds`` is ``nutpie.compile_pymc_model`` plus a 10-draw
        warm-up call; ``seconds`` the wall time of the timed ``nutpie.sample``
        call, tuning included.
    """
    import nutpie

    t0 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(pymc_model)
    nutpie.sample(compiled, draws=5, tune=5, chains=1, cores=1, seed=seed + 1000,
                  progress_bar=False)  # fmt: skip
    compile_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = nutpie.sample(
        compiled, draws=draws, tune=tune, chains=chains, cores=1, seed=seed, progress_bar=False
    )
    seconds = time.perf_counter() - t0
    names = [v.name for v in pymc_model.free_RVs]
    samples = {k: trace["posterior"][k].values for k in names}
    steps = None
    groups = [g for g in ("sample_stats", "warmup_sample_stats") if g in trace.children]
    if groups and all("n_steps" in trace[g] for g in groups):
        steps = int(sum(trace[g]["n_steps"].values.sum() for g in groups))
    n_obs = int(np.prod(pymc_model.observed_RVs[0].shape.eval()))
    return _summarise(
        "nutpie NUTS",
        samples,
        seconds=seconds,
        compile_seconds=compile_seconds,
        gradient_evals=steps,
        obs_per_gradient=n_obs,
        ess_of=ess_of,
    )


# ------------------------------------------------------------------------------ main


def format_table(results: list[PeerResult]) -> str:
    """Format results as a markdown table.

    Parameters
    ----------
    results : list of PeerResult
        Results to list, one row each.

    Returns
    -------
    str
        The table, with min ESS, seconds, ESS/s, compile seconds, gradient
        evaluations and the posterior means (MCSE) of ``a`` and ``b[0]``.
    """
    lines = [
        "| peer | min ESS | seconds | ESS/s | compile s | grad evals | obs/grad "
        "| mean a (MCSE) | mean b[0] (MCSE) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        grads = "?" if r.gradient_evals is None else f"{r.gradient_evals}"
        lines.append(
            f"| {r.name} | {r.min_ess:.0f} / {r.draws * r.chains} | {r.seconds:.2f} | "
            f"{r.ess_per_second:.1f} | {r.compile_seconds:.1f} | {grads} | "
            f"{r.obs_per_gradient} | {r.means['a']:.4f} ({r.mcses['a']:.4f}) | "
            f"{r.means['b[0]']:.4f} ({r.mcses['b[0]']:.4f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run every available peer on one model (``--model``, logistic by default); print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="observations N")
    parser.add_argument(
        "--model", choices=("logistic", "studentt"), default="logistic", help="model to sample"
    )
    parser.add_argument("--draws", type=int, default=500, help="kept draws per chain")
    parser.add_argument("--tune", type=int, default=500, help="tuning draws per chain")
    parser.add_argument("--chains", type=int, default=2, help="chains, run one after another")
    parser.add_argument("--subsample", type=int, default=1000, help="HMCECS subsample size")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (data seed is 0)")
    args = parser.parse_args()
    common = dict(draws=args.draws, tune=args.tune, chains=args.chains, seed=args.seed)
    if args.model == "logistic":
        x, y = logistic_data(args.n)
        nuts, hmcecs, pymc_model = logistic_numpyro_nuts, logistic_numpyro_hmcecs, logistic_model
        title = "Logistic regression, d = 5"
    else:
        x, y = studentt_data(args.n)
        nuts, hmcecs, pymc_model = studentt_numpyro_nuts, studentt_numpyro_hmcecs, studentt_model
        title = "Student-t (nu = 4) regression, d = 5 and sigma"
    runs = {
        "numpyro_nuts": lambda: nuts(x, y, **common),
        "numpyro_hmcecs": lambda: hmcecs(x, y, subsample_size=args.subsample, **common),
        "nutpie": lambda: nutpie_sample(pymc_model(x, y), **common),
    }
    results = []
    for peer, reason in available().items():
        if reason is not None:
            print(f"skipping {peer}: {reason}", flush=True)
            continue
        print(f"N={args.n:.0e}: {peer} ...", flush=True)
        r = runs[peer]()
        results.append(r)
        ref = {k[4:]: round(v, 4) for k, v in r.extra.items() if k.startswith("ref_")}
        if ref:
            print(f"  Taylor reference (MAP, {r.reference_seconds:.2f} s): {ref}", flush=True)
    print()
    print(f"{title}, N = {args.n}, {args.chains} chains one after another, "
          f"{args.tune} tuning + {args.draws} kept draws each")  # fmt: skip
    print()
    print(format_table(results))
    if len(results) > 1:
        print()
        print("max |mean difference| / combined MCSE over all parameters, against the first peer:")
        base = results[0]
        for r in results[1:]:
            z = max(
                abs(r.means[k] - base.means[k]) / np.hypot(r.mcses[k], base.mcses[k])
                for k in base.means
            )
            print(f"  {r.name}: {z:.2f}")


if __name__ == "__main__":
    main()

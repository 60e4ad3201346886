r"""Simulation-based calibration (Talts et al. 2018) of the steps inside ``pm.sample``.

For a parameter :math:`\theta` with prior :math:`\pi` and likelihood
:math:`p(y \mid \theta)`: draw :math:`\tilde\theta \sim \pi`, then
:math:`\tilde y \sim p(\cdot \mid \tilde\theta)`, then :math:`L` posterior draws
:math:`\theta_1, \dots, \theta_L` given :math:`\tilde y`, and keep the rank

.. math:: r = \#\{\ell : \theta_\ell < \tilde\theta\} \in \{0, \dots, L\}.

If the sampler draws independently from the exact posterior, :math:`r` is
uniform on :math:`\{0,\dots,L\}` (Talts et al. 2018, Theorem 1) whatever the
model. Over :math:`R` replications the rank histogram is tested for uniformity
by a chi-square test on equal bins of ranks (:func:`rank_uniformity`). Ties
(discrete parameters) are broken uniformly at random, which keeps the rank
uniform (:func:`sbc_rank`).

Each replication is one real ``pm.sample`` run (one chain, no progress bar, no
convergence checks) with the step under test (:func:`run_sbc`). The model and
the step are built once per setting and the data are swapped with
``pm.set_data`` between replications (the racing steps take them up with
``data_changed``), so that PyTensor compiles once per model. Posterior draws are
thinned to reduce autocorrelation (Talts et al. 2018, Sec. 5.1).

The problems (:func:`selector_problem`, :func:`logistic_problem`,
:func:`bimodal_problem`) are small, so that each step does real work in a
fraction of a second per replication. :class:`OffsetGibbs` and
:class:`OffsetMetropolis` are deliberately wrong steps: the tests and the study
check that the same SBC rejects them.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
from scipy import optimize, stats

from pymc_subsample import PliableRejection, RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions

__all__ = [
    "PROBLEMS",
    "OffsetGibbs",
    "OffsetMetropolis",
    "Problem",
    "SBCResult",
    "bimodal_problem",
    "detection_power",
    "logistic_problem",
    "rank_counts",
    "rank_uniformity",
    "reps_for_power",
    "run_sbc",
    "sbc_rank",
    "selector_problem",
]


# -- ranks and the uniformity test ------------------------------------------------------


def sbc_rank(prior_value: float, draws: np.ndarray, rng: np.random.Generator) -> int:
    r"""Rank of the prior draw among the posterior draws, ties broken at random.

    Parameters
    ----------
    prior_value : float
        :math:`\tilde\theta`.
    draws : ndarray, shape (L,)
        Posterior draws :math:`\theta_1, \dots, \theta_L`.
    rng : numpy.random.Generator
        For the ties.

    Returns
    -------
    int
        :math:`\#\{\theta_\ell < \tilde\theta\} + U`, :math:`U` uniform on
        :math:`\{0, \dots, \#\{\theta_\ell = \tilde\theta\}\}`: uniform on
        :math:`\{0, \dots, L\}` when the draws are exact and independent of
        each other given the data.
    """
    draws = np.asarray(draws)
    below = int(np.sum(draws < prior_value))
    ties = int(np.sum(draws == prior_value))
    return below + int(rng.integers(0, ties + 1))


def rank_counts(ranks: np.ndarray, n_draws: int, n_bins: int) -> np.ndarray:
    r"""Histogram of ranks in :math:`\{0..L\}` on ``n_bins`` bins of equal width.

    Parameters
    ----------
    ranks : ndarray of int
        Ranks from :func:`sbc_rank`.
    n_draws : int
        :math:`L`; :math:`L + 1` must be a multiple of ``n_bins``.
    n_bins : int
        Number of bins :math:`B` of :math:`(L+1)/B` consecutive ranks each.

    Returns
    -------
    ndarray of int, shape (n_bins,)
    """
    if (n_draws + 1) % n_bins:
        raise ValueError(f"L + 1 = {n_draws + 1} is not a multiple of n_bins = {n_bins}")
    return np.bincount(np.asarray(ranks) // ((n_draws + 1) // n_bins), minlength=n_bins)


def rank_uniformity(ranks: np.ndarray, n_draws: int, n_bins: int) -> tuple[float, float]:
    r"""Chi-square test that ranks in :math:`\{0..L\}` are uniform, on equal bins.

    Parameters
    ----------
    ranks : ndarray of int
        Ranks from :func:`sbc_rank`.
    n_draws, n_bins : int
        As for :func:`rank_counts`.

    Returns
    -------
    statistic, p_value : float
        :math:`X^2 = \sum_b (O_b - R/B)^2 / (R/B)` over :math:`R` ranks and its
        :math:`\chi^2_{B-1}` upper tail.
    """
    res = stats.chisquare(rank_counts(ranks, n_draws, n_bins))
    return float(res.statistic), float(res.pvalue)


def detection_power(
    statistic: float, n_reps: int, n_bins: int, target_reps: int = 1000, alpha: float = 0.01
) -> tuple[float, float]:
    r"""Power of the chi-square rank test at ``target_reps`` replications, from one run.

    Under a fixed miscalibration the statistic of :math:`R` replications is
    approximately noncentral :math:`\chi^2_{B-1}(\lambda)` with
    :math:`\lambda = R\,w^2`, :math:`w^2 = \sum_b (p_b - 1/B)^2 / (1/B)` the
    squared effect size of the rank distribution's bin probabilities
    :math:`p_b`. The run's statistic :math:`X^2` gives the moment estimate
    :math:`\hat w^2 = \max(X^2 - (B - 1), 0) / R` (standard error about
    :math:`\sqrt{2(B-1) + 4\lambda} / R`), and the power at :math:`R'` replications and level
    :math:`\alpha` is :math:`P(\chi^2_{B-1}(R' \hat w^2) > \chi^2_{B-1, 1-\alpha})`.

    Parameters
    ----------
    statistic : float
        :math:`X^2` of the run (:func:`rank_uniformity`).
    n_reps : int
        :math:`R`, the run's replications.
    n_bins : int
        :math:`B`.
    target_reps : int
        :math:`R'`.
    alpha : float
        Level of the test.

    Returns
    -------
    w2, power : float
        :math:`\hat w^2` and the estimated power (``alpha`` when :math:`\hat w^2 = 0`).
    """
    dof = n_bins - 1
    w2 = max(statistic - dof, 0.0) / n_reps
    crit = stats.chi2.ppf(1.0 - alpha, dof)
    if w2 == 0.0:
        return 0.0, alpha
    return w2, float(stats.ncx2.sf(crit, dof, w2 * target_reps))


def reps_for_power(w2: float, n_bins: int, power: float = 0.8, alpha: float = 0.01) -> float:
    r"""Replications at which the chi-square rank test reaches ``power`` for effect size ``w2``.

    The smallest :math:`R` with :math:`P(\chi^2_{B-1}(R\,w^2) > \chi^2_{B-1, 1-\alpha})
    \ge` ``power`` (see :func:`detection_power`); ``inf`` when ``w2`` is 0.

    Parameters
    ----------
    w2 : float
        Squared effect size :math:`w^2` of the rank distribution.
    n_bins : int
        :math:`B`.
    power, alpha : float
        Target power and level of the test.

    Returns
    -------
    float
    """
    if w2 <= 0.0:
        return float("inf")
    dof = n_bins - 1
    crit = stats.chi2.ppf(1.0 - alpha, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, dof, x) - power, 1e-9, 1e6)
    return float(lam / w2)


# -- problems -----------------------------------------------------------------------------


@dataclass
class Problem:
    """A model with ``pm.Data`` inputs, its simulator and the step under test.

    Attributes
    ----------
    name : str
        Short name (figures, table rows).
    model : pymc.Model
        Built once; its data are swapped with ``pm.set_data``.
    quantities : dict
        Ranked scalar quantities: name -> function of the parameter dict.
    simulate : callable
        ``simulate(rng) -> (params, data)``: a prior draw and data from the
        likelihood, as dicts of arrays (``data`` keyed by ``pm.Data`` names).
    make_step : callable
        ``make_step(model, **settings)``: the step under test.
    settings : dict
        Setting name -> keyword arguments of ``make_step``.
    tune, thin : int
        Tuning draws and thinning of each ``pm.sample`` run.
    """

    name: str
    model: pm.Model
    quantities: dict[str, Callable[[dict], float]]
    simulate: Callable[[np.random.Generator], tuple[dict, dict]]
    make_step: Callable[..., object]
    settings: dict[str, dict] = field(default_factory=dict)
    tune: int = 100
    thin: int = 1


class OffsetGibbs(SubsampledCategoricalGibbs):
    r"""A wrong SubsampledCategoricalGibbs: ``offset * i`` nats added to the conditional of ``i``.

    Every draw (raced or exact) uses :math:`\log f_0(i) + \text{offset} \cdot i`,
    so the chain targets a posterior tilted towards the larger values. Used to
    check that the SBC test rejects a wrong sampler. Audits are off by default:
    they would find it wrong and switch it to exact draws.
    """

    def __init__(self, vars, *, offset: float = 1.0, **kwargs):
        kwargs.setdefault("audit", AuditOptions(every=0))
        super().__init__(vars, **kwargs)
        self.offset = float(offset)
        log_f0 = self.terms.log_f0

        def tilted(cands, point):
            out = np.array(log_f0(cands, point), dtype=np.float64)
            out += self.offset * np.arange(len(out))
            return out

        self.terms.log_f0 = tilted


class OffsetMetropolis(RacingMetropolis):
    r"""A wrong RacingMetropolis: ``offset`` times the move of the first coordinate in the ratio.

    The accept test from :math:`\theta` to :math:`\theta'` reads
    :math:`\log u < \log r + \text{offset}\,(\theta'_0 - \theta_0)`, so the
    chain targets the posterior tilted by :math:`e^{\text{offset}\,\theta_0}`,
    whose mean of :math:`\theta_0` is off by about :math:`\text{offset}\,
    \sigma_0^2` (:math:`\sigma_0` its posterior sd). Used to check that the
    SBC test rejects a wrong sampler. Audits are off by default: they would
    find it wrong and switch it to exact decisions.
    """

    def __init__(self, vars, *, offset: float = 1.0, **kwargs):
        kwargs.setdefault("audit", AuditOptions(every=0))
        super().__init__(vars, **kwargs)
        self.offset = float(offset)

    def _decide(self, x, x_new, extra, point, audit, log):
        extra = extra + self.offset * (x_new[0] - x[0])
        return super()._decide(x, x_new, extra, point, audit, log)


SELECTOR_D, SELECTOR_N, SELECTOR_GAP = 5, 2000, 0.03


def selector_problem(n_obs: int = SELECTOR_N, seed: int = 0) -> Problem:
    r"""Build a discrete selector for :class:`~pymc_subsample.SubsampledCategoricalGibbs`.

    :math:`k \sim \text{Categorical}(1/5, \dots, 1/5)`, :math:`y_n \sim N(\mu_k, 1)`,
    :math:`\mu_k = 0.03 k`, :math:`n = 1..N` (default 2,000): the means are
    :math:`1.34/\sqrt N` apart, so the posterior of :math:`k` keeps mass on two or
    three values and the races cannot decide early. The step is a Gibbs draw
    of the only free variable, so successive draws are independent.

    Settings: ``defaults``; ``racing`` (``RaceOptions(exact_fraction=1, batch_size=50)``:
    the race on its whole doubling schedule, as in Chen & Ghahramani 2016;
    the defaults decide exactly at this :math:`N`); ``exact``
    (``RaceOptions(bound="exact")``, the reference); ``broken`` (:class:`OffsetGibbs`,
    one nat on :math:`k = 0`, racing as ``racing``).

    Parameters
    ----------
    n_obs : int
        :math:`N`.
    seed : int
        Seeds the data the model is built with (replaced by every replication).
    """
    means = SELECTOR_GAP * np.arange(SELECTOR_D)

    def simulate(rng):
        k = int(rng.integers(SELECTOR_D))
        return {"k": k}, {"y_data": rng.normal(means[k], 1.0, n_obs)}

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        y = pm.Data("y_data", data["y_data"])
        k = pm.Categorical("k", p=np.full(SELECTOR_D, 1.0 / SELECTOR_D))
        pm.Normal("y", pm.math.constant(means)[k], 1.0, observed=y)

    def make_step(model, broken: float | None = None, **settings):
        with model:
            if broken is not None:
                return OffsetGibbs([model["k"]], offset=broken, **settings)
            return SubsampledCategoricalGibbs([model["k"]], **settings)

    racing = {"race": RaceOptions(exact_fraction=1.0, batch_size=50)}
    return Problem(
        "selector",
        model,
        {"k": lambda p: p["k"]},
        simulate,
        make_step,
        {
            "defaults": {},
            "racing": racing,
            "exact": {"race": RaceOptions(bound="exact")},
            "broken": {"broken": 1.0, **racing},
        },
        tune=0,
        thin=1,
    )


def logistic_problem(n_obs: int = 3000, seed: int = 0) -> Problem:
    r"""Build a logistic regression for :class:`~pymc_subsample.RacingMetropolis` on ``w``.

    :math:`w \sim N(0, I_3)`, :math:`x_n \sim N(0, I_2)`,
    :math:`y_n \sim \text{Bernoulli}(\text{logit}^{-1}(w_0 + x_n^\top w_{1:}))`,
    :math:`N` = 3,000 (the design is simulated afresh each replication).
    Settings: ``defaults``, ``exact`` (``RaceOptions(bound="exact")``) and ``broken``
    (:class:`OffsetMetropolis` with offset 10: a tilt that moves the
    posterior mean of :math:`w_0` by about half a posterior sd).

    Parameters
    ----------
    n_obs : int
        :math:`N`.
    seed : int
        Seeds the data the model is built with.
    """

    def simulate(rng):
        w = rng.normal(size=3)
        x = rng.normal(size=(n_obs, 2))
        p = 1.0 / (1.0 + np.exp(-(w[0] + x @ w[1:])))
        return {"w": w}, {"x_data": x, "y_data": (rng.random(n_obs) < p).astype(np.int64)}

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        x = pm.Data("x_data", data["x_data"])
        y = pm.Data("y_data", data["y_data"])
        w = pm.Normal("w", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=w[0] + x @ w[1:], observed=y)

    def make_step(model, broken: float | None = None, **settings):
        with model:
            if broken is not None:
                return OffsetMetropolis([model["w"]], offset=broken, **settings)
            return RacingMetropolis([model["w"]], **settings)

    return Problem(
        "logistic",
        model,
        {f"w[{i}]": (lambda p, i=i: p["w"][i]) for i in range(3)},
        simulate,
        make_step,
        {
            # at this N the defaults draw with NUTS ("small_n"): the race is asked for
            "racing": {"proposal": "hmc"},
            "exact": {"race": RaceOptions(bound="exact")},
            "broken": {"broken": 10.0},
        },
        tune=150,
        thin=3,
    )


def bimodal_problem(n_obs: int = 10, seed: int = 0) -> Problem:
    r"""Build a 2-D block with a bimodal posterior for :class:`~pymc_subsample.PliableRejection`.

    :math:`\theta \sim N(0, I_2)`, :math:`y_n \sim N(\theta_0^2, 1)`,
    :math:`z_n \sim N(\theta_1, 1)`, :math:`n = 1..10`: the posterior of
    :math:`\theta_0` has two modes :math:`\pm\sqrt{\bar y}` of equal weight
    whenever :math:`|\tilde\theta_0|` is not small. Settings: ``defaults``
    (PliableRejection has no racing bound, hence no exact reference) and
    ``small envelope`` (``n_init=50``: a rough envelope that often fails to
    bound the conditional, where only the Metropolis correction keeps the
    step exact). The block is the whole model, so its conditional never changes
    and tuning would only refit the same envelope: the runs have no tuning
    draws (the first step builds the envelope, a few seconds' work).

    Parameters
    ----------
    n_obs : int
        Observations of each of :math:`y` and :math:`z`.
    seed : int
        Seeds the data the model is built with.
    """

    def simulate(rng):
        theta = rng.normal(size=2)
        return {"theta": theta}, {
            "y_data": rng.normal(theta[0] ** 2, 1.0, n_obs),
            "z_data": rng.normal(theta[1], 1.0, n_obs),
        }

    _, data = simulate(np.random.default_rng(seed))
    with pm.Model() as model:
        y = pm.Data("y_data", data["y_data"])
        z = pm.Data("z_data", data["z_data"])
        theta = pm.Normal("theta", 0.0, 1.0, shape=2)
        pm.Normal("y", theta[0] ** 2, 1.0, observed=y)
        pm.Normal("z", theta[1], 1.0, observed=z)

    def make_step(model, **settings):
        with model:
            return PliableRejection([model["theta"]], **settings)

    return Problem(
        "bimodal",
        model,
        {f"theta[{i}]": (lambda p, i=i: p["theta"][i]) for i in range(2)},
        simulate,
        make_step,
        {"defaults": {}, "small envelope": {"n_init": 50}},
        tune=0,
        thin=1,
    )


#: Problem builders by name.
PROBLEMS = {"selector": selector_problem, "logistic": logistic_problem, "bimodal": bimodal_problem}


# -- the SBC loop -----------------------------------------------------------------------


@dataclass
class SBCResult:
    """Ranks of one step setting on one problem, with the uniformity tests.

    Attributes
    ----------
    problem, setting : str
        Labels.
    n_draws, n_bins : int
        :math:`L` and the bins of the chi-square test.
    ranks : dict
        Quantity name -> ranks, one per replication.
    seconds : float
        Wall-clock time of the replications.
    audits, audit_errors : int
        Audited decisions of the racing step and those that differed from
        the exact decision, summed over replications.
    info : str
        The step's resolved settings.
    frozen : int or None
        Replications in which a continuous parameter kept one value over all
        :math:`L` kept draws (a chain that never moved); None when not counted.
    """

    problem: str
    setting: str
    n_draws: int
    n_bins: int
    ranks: dict[str, np.ndarray]
    seconds: float
    audits: int = 0
    audit_errors: int = 0
    info: str = ""
    frozen: int | None = None

    @property
    def reps(self) -> int:
        """Replications :math:`R`."""
        return len(next(iter(self.ranks.values())))

    @property
    def statistics(self) -> dict[str, float]:
        """Chi-square statistic of each quantity's rank histogram."""
        return {q: rank_uniformity(r, self.n_draws, self.n_bins)[0] for q, r in self.ranks.items()}

    @property
    def pvalues(self) -> dict[str, float]:
        """Chi-square p-value of each quantity's rank histogram."""
        return {q: rank_uniformity(r, self.n_draws, self.n_bins)[1] for q, r in self.ranks.items()}

    @property
    def min_pvalue(self) -> float:
        """Smallest p-value over the quantities."""
        return min(self.pvalues.values())


def run_sbc(
    problem: Problem,
    step,
    reps: int,
    *,
    n_draws: int = 19,
    n_bins: int = 10,
    seed: int = 0,
    setting: str = "",
    driver: str = "pm.sample",
) -> SBCResult:
    r"""SBC of ``step`` on ``problem``: ``reps`` replications of :math:`L` = ``n_draws`` draws.

    Each replication draws :math:`(\tilde\theta, \tilde y)` from the prior
    predictive, sets the data with ``pm.set_data`` (and calls the step's
    ``data_changed``), runs ``pm.sample`` (one chain, ``problem.tune``
    tuning draws, :math:`L \cdot` ``problem.thin`` draws of which every
    ``problem.thin``-th is kept) and ranks :math:`\tilde\theta` among the draws.

    Parameters
    ----------
    problem : Problem
        Model, simulator and ranked quantities.
    step : step method
        Built once on ``problem.model``.
    reps : int
        Replications :math:`R`.
    n_draws : int
        :math:`L`.
    n_bins : int
        Bins of the chi-square test (:func:`rank_uniformity`).
    seed : int
        Seeds the simulator, the chains and the tie-breaking.
    setting : str
        Label of the step's setting (kept in the result).
    driver : {"pm.sample", "loop"}
        ``"pm.sample"`` (default): each replication is a ``pm.sample`` call,
        which rebuilds the model's log density graph and compiles its trace
        and initial-point functions every time (tens of milliseconds per
        call, more than the selector's draws cost). ``"loop"``:
        the chain loop of ``pm.sample`` for one chain without that set-up
        (``setup_chain``, ``reset_tuning``, ``stop_tuning`` after the tuning
        draws, ``step``), from the model's initial point computed once; the
        fast tests use it.

    Returns
    -------
    SBCResult
    """
    if driver not in ("pm.sample", "loop"):
        raise ValueError(f"driver must be 'pm.sample' or 'loop', got {driver!r}")
    rng = np.random.default_rng(seed)
    init = problem.model.initial_point() if driver == "loop" else None
    ranks = {q: np.empty(reps, dtype=np.int64) for q in problem.quantities}
    audits = errors = frozen = 0
    log = logging.getLogger("pymc")
    level = log.level
    start = time.perf_counter()
    try:
        log.setLevel(logging.ERROR)
        for r in range(reps):
            params, data = problem.simulate(rng)
            pm.set_data(data, model=problem.model)
            if hasattr(step, "data_changed"):
                step.data_changed()
            chain_seed = int(rng.integers(2**31))
            if driver == "loop":
                draws = _loop_chain(problem, step, init, n_draws * problem.thin, chain_seed)
            else:
                draws = _pm_sample_chain(problem, step, n_draws * problem.thin, chain_seed)
            kept = {v: draws[v][problem.thin - 1 :: problem.thin] for v in params}
            frozen += any(
                np.issubdtype(d.dtype, np.floating) and np.all(d == d[0]) for d in kept.values()
            )
            for q, fn in problem.quantities.items():
                post = np.array([fn({v: d[i] for v, d in kept.items()}) for i in range(n_draws)])
                ranks[q][r] = sbc_rank(fn(params), post, rng)
            audits += getattr(step, "n_audits", 0)
            errors += getattr(step, "n_disagreements", 0)
    finally:
        log.setLevel(level)
    return SBCResult(
        problem.name,
        setting,
        n_draws,
        n_bins,
        ranks,
        time.perf_counter() - start,
        audits,
        errors,
        frozen=frozen,
    )


def _pm_sample_chain(problem: Problem, step, draws: int, seed: int) -> dict[str, np.ndarray]:
    """One ``pm.sample`` chain of ``draws`` draws after ``problem.tune``: value -> draws."""
    with problem.model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # audits are counted by the caller
        warnings.filterwarnings("ignore", ".*return_inferencedata", FutureWarning)
        trace = pm.sample(
            draws=draws,
            tune=problem.tune,
            step=step,
            chains=1,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
            return_inferencedata=False,
        )
    return {v: trace.get_values(v) for v in trace.varnames}


def _loop_chain(problem: Problem, step, start: dict, draws: int, seed: int) -> dict:
    """Run the chain loop of ``pm.sample`` (one chain) without its per-call set-up.

    Draws are keyed by value variable: the ranked parameters of the problems
    are untransformed, so these are their names.
    """
    tune = problem.tune
    step.setup_chain(np.random.default_rng(seed), tune, draws)
    step.tune = bool(tune)
    step.reset_tuning()
    point = dict(start)
    kept: dict[str, list] = {name: [] for name in point}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # audits are counted by the caller
        for i in range(tune + draws):
            if i == tune:
                step.stop_tuning()
            point, _ = step.step(point)
            if i >= tune:
                for name, value in point.items():
                    kept[name].append(np.array(value, copy=True))
    return {name: np.stack(values) for name, values in kept.items()}

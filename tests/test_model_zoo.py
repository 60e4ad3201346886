"""A zoo of models of the shapes PyMC users write: each is right or refused with a clear error.

Every model runs with each step that applies. A step's draws of its block,
with the rest of the model held at a fixed point, are compared with the
exact conditional: by enumeration for SubsampledCategoricalGibbs (total
variation within the Monte Carlo error of as many i.i.d. draws, plus delta),
by quadrature for RacingMetropolis on a scalar (mean and three quantiles
within four Monte Carlo standard errors, from batch means). Models whose
terms read across observations must be refused with a ModelSplitError that
names the feature. The default run uses N = 300 with small batches and an
early exact switch, so that races run, and draws a subset (AT_SCALE_DEFAULT, and
the SUPPORT models) at N = 20,000 with the steps' defaults; the slow run draws
every model there.
"""

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import ModelSplitError, RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.mcmc.regime import SMALL_N
from pymc_subsample.options import AuditOptions, RaceOptions

FAST = RaceOptions(batch_size=25, exact_fraction=0.5)


def _data(n):
    rng = np.random.default_rng(42)
    x = rng.normal(size=n)
    return {
        "rng": rng,
        "x": x,
        "X": np.column_stack([x, rng.normal(size=n), rng.uniform(-1, 1, n)]),
        "g": rng.integers(0, 5, n),
        "t": np.arange(n),
    }


def normal_grid(d, n):
    q = pm.Categorical("q", np.ones(5) / 5)
    mu = pm.Normal("mu", 0, 1)
    sigma = pm.HalfNormal("sigma", 2)
    y = 0.3 + d["rng"].normal(size=n)
    pm.Normal(
        "y", mu + pt.as_tensor([0.0, 0.1, 0.2, 0.3, 0.4])[q], sigma, observed=pm.Data("yd", y)
    )
    return {"gibbs": "q", "mh": "sigma_log__"}


def linear_regression_discrete_scale(d, n):
    """The README's pairing: a discrete variable in the continuous block's noise scale."""
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    b = pm.Normal("b", 0, 1, size=3)
    y = 1.0 + d["X"] @ np.array([0.5, -0.3, 0.2]) + d["rng"].normal(size=n)
    sigma = pt.as_tensor([0.5, 1.0, 2.0])[q]
    pm.Normal("y", a + pm.Data("X", d["X"]) @ b, sigma, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a"}


def logistic_spike_and_slab(d, n):
    z = pm.Bernoulli("z", 0.5)
    a = pm.Normal("a", 0, 2)
    b = pm.Normal("b", 0, 1)
    p = 1 / (1 + np.exp(-(0.3 + 0.8 * d["x"])))
    y = d["rng"].binomial(1, p)
    pm.Bernoulli("y", logit_p=a + z * b * pm.Data("x", d["x"]), observed=pm.Data("yd", y))
    return {"gibbs": "z", "mh": "a", "point": {"b": 0.8}}


def poisson_offset(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    offset = np.log(d["rng"].uniform(0.5, 2.0, n))
    y = d["rng"].poisson(np.exp(0.5 + 0.3 * d["x"] + offset))
    scale = pt.as_tensor([0.0, 0.3, 0.6])[q]
    rate = pt.exp(a + scale * pm.Data("x", d["x"]) + pm.Data("offset", offset))
    pm.Poisson("y", rate, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a"}


def hierarchical_intercepts(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    alpha = pm.Normal("alpha", 0, 1, size=5)
    b = pm.Normal("b", 0, 1)
    y = np.linspace(-1, 1, 5)[d["g"]] + 0.5 * d["x"] + d["rng"].normal(size=n)
    mu = alpha[pm.Data("g", d["g"])] + (b + pt.as_tensor([-0.2, 0.0, 0.2])[q]) * pm.Data(
        "x", d["x"]
    )
    pm.Normal("y", mu, 1, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "b", "point": {"alpha": np.linspace(-1, 1, 5)}}


def two_observed_same_length(d, n):
    q = pm.Categorical("q", np.ones(4) / 4)
    mu = pm.Normal("mu", 0, 1)
    shift = pt.as_tensor([0.0, 0.1, 0.2, 0.3])[q]
    pm.Normal("y1", mu + shift, 1, observed=pm.Data("y1d", 0.2 + d["rng"].normal(size=n)))
    pm.Normal("y2", 2 * mu - shift, 1, observed=pm.Data("y2d", 0.3 + d["rng"].normal(size=n)))
    return {"gibbs": "q", "mh": "mu"}


def potential(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Normal("mu", 0, 1)
    pm.Potential("pull", -0.5 * (mu - 1.0) ** 2 - 0.3 * q)
    mu_q = mu + pt.as_tensor([0.0, 0.1, 0.2])[q]
    pm.Normal("y", mu_q, 1, observed=pm.Data("yd", 0.5 + d["rng"].normal(size=n)))
    return {"gibbs": "q", "mh": "mu"}


def custom_dist_laplace(d, n):
    def logp(value, mu, b):
        return -pt.abs(value - mu) / b - pt.log(2 * b)

    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Normal("mu", 0, 1)
    b = pt.as_tensor([0.5, 1.0, 2.0])[q]
    y = d["rng"].laplace(0.2, 1.0, n)
    pm.CustomDist("y", mu, b, logp=logp, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "mu"}


def normal_mixture(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    m1 = pm.Normal("m1", 0, 3)
    comp = d["rng"].random(n) < 0.3
    y = np.where(comp, -1.0, 2.0) + d["rng"].normal(size=n)
    sigma = pt.as_tensor([0.7, 1.0, 1.4])[q]
    mus = pt.stack([m1, pt.as_tensor(2.0)])
    pm.NormalMixture("y", w=np.array([0.3, 0.7]), mu=mus, sigma=sigma, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "m1", "point": {"m1": -1.0}}


def censored(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Normal("mu", 0, 2)
    y = np.clip(0.4 + d["rng"].normal(size=n), -1.0, 1.0)
    dist = pm.Normal.dist(mu + pt.as_tensor([0.0, 0.2, 0.4])[q], 1)
    pm.Censored("y", dist, lower=-1.0, upper=1.0, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "mu"}


def mv_normal_rows(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    s = pm.Normal("s", 0, 1)
    y = np.column_stack([0.3 + d["rng"].normal(size=n), -0.3 + d["rng"].normal(size=n)])
    cov = pt.as_tensor([0.5, 1.0, 2.0])[q] * np.array([[1.0, 0.3], [0.3, 1.0]])
    pm.MvNormal("y", pt.stack([s, -s]), cov, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "s"}


def student_t(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    nu = pm.Gamma("nu", 2, 0.1)
    y = d["rng"].standard_t(4, n)
    pm.StudentT(
        "y", nu=nu, mu=pt.as_tensor([-0.1, 0.0, 0.1])[q], sigma=1, observed=pm.Data("yd", y)
    )
    return {"gibbs": "q", "mh": "nu_log__"}


def binomial_trials_in_data(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    trials = d["rng"].integers(1, 20, n)
    p = 1 / (1 + np.exp(-(-0.5 + 0.4 * d["x"])))
    y = d["rng"].binomial(trials, p)
    logit = a + pt.as_tensor([0.0, 0.4, 0.8])[q] * pm.Data("x", d["x"])
    pm.Binomial("y", pm.Data("n", trials), logit_p=logit, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a"}


def negative_binomial(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    alpha = pm.Exponential("alpha", 0.5)
    y = d["rng"].negative_binomial(3, 3 / (3 + 4.0), n)
    mu = pt.as_tensor([3.0, 4.0, 5.0])[q]
    pm.NegativeBinomial("y", mu=mu, alpha=alpha, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "alpha_log__"}


def gamma_glm(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    mean = np.exp(0.5 + 0.3 * d["x"])
    y = d["rng"].gamma(2.0, mean / 2.0)
    mu = pt.exp(a + pt.as_tensor([0.0, 0.3, 0.6])[q] * pm.Data("x", d["x"]))
    pm.Gamma("y", alpha=2.0, beta=2.0 / mu, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a"}


def truncated_normal(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Normal("mu", 0, 2)
    y = np.clip(0.3 + d["rng"].normal(size=4 * n), -2, 2)
    y = y[(y > -2) & (y < 2)][:n]
    sigma = pt.as_tensor([0.7, 1.0, 1.4])[q]
    pm.TruncatedNormal("y", mu, sigma, lower=-2, upper=2, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "mu"}


def zero_inflated_poisson(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Gamma("mu", 2, 1)
    y = np.where(d["rng"].random(n) < 0.3, 0, d["rng"].poisson(3.0, n))
    psi = pt.as_tensor([0.5, 0.7, 0.9])[q]
    pm.ZeroInflatedPoisson("y", psi=psi, mu=mu, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "mu_log__", "point": {"mu_log__": np.log(3.0)}}


def ordered_logistic_outcome(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    b = pm.Normal("b", 0, 2)
    latent = 0.8 * d["x"] + d["rng"].logistic(size=n)
    y = np.digitize(latent, [-1.0, 1.0])
    cut = pt.as_tensor([0.8, 1.0, 1.2])[q] * np.array([-1.0, 1.0])
    pm.OrderedLogistic("y", eta=b * pm.Data("x", d["x"]), cutpoints=cut, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "b"}


def deterministic_mean(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    mu = pm.Deterministic("m", a + pt.as_tensor([0.0, 0.3, 0.6])[q] * pm.Data("x", d["x"]))
    y = 0.2 + 0.3 * d["x"] + d["rng"].normal(size=n)
    pm.Normal("y", mu, 1, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a"}


def with_dims(d, n):
    pm.modelcontext(None).add_coord("obs", np.arange(n))
    q = pm.Categorical("q", np.ones(3) / 3)
    mu = pm.Normal("mu", 0, 2)
    yd = pm.Data("yd", 0.1 + d["rng"].normal(size=n), dims="obs")
    pm.Normal("y", mu + pt.as_tensor([0.0, 0.1, 0.2])[q], 1, observed=yd, dims="obs")
    return {"gibbs": "q", "mh": "mu"}


def change_point_discrete_uniform(d, n):
    n_values = min(n, 1000)  # a change point every n / n_values rows (MAX_CATEGORIES)
    s = pm.DiscreteUniform("s", 0, n_values)
    early = pm.Exponential("early", 1.0)
    y = np.where(d["t"] < n // 2, d["rng"].poisson(2.0, n), d["rng"].poisson(5.0, n))
    rate = pt.switch(pm.Data("t", d["t"]) < s * (n // n_values), early, 5.0)
    pm.Poisson("y", rate, observed=pm.Data("yd", y))
    return {"gibbs": "s", "mh": "early_log__", "point": {"early_log__": np.log(2.0)}}


def binomial_latent_scale(d, n):
    k = pm.Binomial("k", 4, 0.5)
    mu = pm.Normal("mu", 0, 1)
    y = 0.1 + 1.2 * d["rng"].normal(size=n)
    pm.Normal("y", mu, 0.5 + 0.25 * k, observed=pm.Data("yd", y))
    return {"gibbs": "k", "mh": "mu"}


def several_data_columns_robust(d, n):
    q = pm.Categorical("q", np.ones(3) / 3)
    a = pm.Normal("a", 0, 2)
    b = pm.Normal("b", 0, 1, size=3)
    y = 0.5 + d["X"] @ np.array([0.3, 0.0, -0.2]) + d["rng"].standard_t(5, n)
    nu = pt.as_tensor([3.0, 5.0, 30.0])[q]
    pm.StudentT("y", nu=nu, mu=a + pm.Data("X", d["X"]) @ b, sigma=1, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "a", "point": {"b": np.array([0.3, 0.0, -0.2])}}


def observed_of_different_lengths(d, n):
    """Two observed variables of lengths N and N/2 sharing the blocks, y2 with a covariate."""
    mu = pm.Normal("mu", 0, 1)
    q = pm.Categorical("q", np.ones(3) / 3)
    pm.Normal("y1", mu + 0.1 * q, 1, observed=pm.Data("y1d", d["x"]))
    m = n // 2
    x2 = d["rng"].normal(size=m)
    y2 = 0.5 * x2 + 2 * d["rng"].normal(size=m)
    pm.Normal("y2", mu - 0.1 * q + 0.5 * pm.Data("x2", x2), 2, observed=pm.Data("y2d", y2))
    return {"gibbs": "q", "mh": "mu"}


def threshold_switch(d, n):
    """A continuous threshold entering through a comparison only: no useful gradient."""
    q = pm.Categorical("q", np.ones(3) / 3)
    tau = pm.Uniform("tau", -2, 2)
    x = d["rng"].uniform(-2, 2, n)
    y = np.where(x < 0.3, -0.5, 0.5) + d["rng"].normal(size=n)
    mean = pt.switch(pm.Data("xs", x) < tau, -0.5, 0.5) + pt.as_tensor([0.0, 0.1, 0.2])[q]
    pm.Normal("y", mean, 1, observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "tau_interval__"}


def change_point_continuous(d, n):
    """A continuous change point in a Poisson rate (the switch's condition): no gradient."""
    q = pm.Categorical("q", np.ones(3) / 3)
    tau = pm.Uniform("tau", 0, n)
    y = d["rng"].poisson(np.where(d["t"] < 0.4 * n, 2.0, 5.0))
    late = pt.as_tensor([4.5, 5.0, 5.5])[q]
    pm.Poisson("y", pt.switch(pm.Data("t", d["t"]) < tau, 2.0, late), observed=pm.Data("yd", y))
    return {"gibbs": "q", "mh": "tau_interval__"}


ACCEPTED = [
    normal_grid,
    linear_regression_discrete_scale,
    logistic_spike_and_slab,
    poisson_offset,
    hierarchical_intercepts,
    two_observed_same_length,
    potential,
    custom_dist_laplace,
    normal_mixture,
    censored,
    mv_normal_rows,
    student_t,
    binomial_trials_in_data,
    negative_binomial,
    gamma_glm,
    truncated_normal,
    zero_inflated_poisson,
    ordered_logistic_outcome,
    deterministic_mean,
    with_dims,
    change_point_discrete_uniform,
    binomial_latent_scale,
    several_data_columns_robust,
    observed_of_different_lengths,
    threshold_switch,
    change_point_continuous,
]


def hand_written_lag(d, n):
    phi = pm.Normal("phi", 0, 0.5)
    q = pm.Categorical("q", np.ones(3) / 3)
    y = pm.Data("yd", d["rng"].normal(size=n))
    coef = phi + pt.as_tensor([0.0, 0.3, 0.6])[q]
    pm.Normal("y", pt.concatenate([pt.zeros(1), coef * y[:-1]]), 1, observed=y)
    return {"gibbs": "q", "mh": "phi"}


def ar_distribution(d, n):
    rho = pm.Normal("rho", 0, 0.5)
    q = pm.Categorical("q", np.ones(3) / 3)
    sigma = pt.as_tensor([0.5, 1.0, 2.0])[q]
    init = pm.Normal.dist(0, 1)
    pm.AR("y", rho=[rho], sigma=sigma, init_dist=init, observed=pm.Data("yd", d["x"]))
    return {"gibbs": "q", "mh": "rho"}


def random_walk_mean(d, n):
    drift = pm.Normal("drift", 0, 1)
    q = pm.Categorical("q", np.ones(3) / 3)
    steps = pm.Data("steps", d["rng"].normal(size=n))
    level = pt.cumsum(steps) * (drift + pt.as_tensor([0.0, 0.1, 0.2])[q])
    pm.Normal("y", level, 1, observed=pm.Data("yd", d["x"]))
    return {"gibbs": "q", "mh": "drift"}


def per_observation_latent(d, n):
    mu = pm.Normal("mu", 0, 1)
    q = pm.Categorical("q", np.ones(3) / 3)
    z = pm.Normal("z", 0, 1, shape=n)
    pm.Normal("y", mu + z + 0.1 * q, 1, observed=pm.Data("yd", d["x"]))
    return {"gibbs": "q", "mh": "mu"}


def per_observation_label(d, n):
    """A mixture with one discrete label per row, the label as the Gibbs block."""
    mu = pm.Normal("mu", 0, 3, shape=2)
    z = pm.Categorical("z", np.array([0.3, 0.7]), shape=n)
    pm.Normal("y", mu[z], 1, observed=pm.Data("yd", d["x"]))
    return {"gibbs": "z", "mh": "mu"}


def centred_on_the_data_mean(d, n):
    mu = pm.Normal("mu", 0, 1)
    q = pm.Categorical("q", np.ones(3) / 3)
    y = pm.Data("yd", d["x"])
    pm.Normal("y", mu + 0.1 * q + y.mean(), 1, observed=y)
    return {"gibbs": "q", "mh": "mu"}


def uniform_window(d, n):
    """A support bounded by the parameter on three rows: z ~ Uniform(m - 5, m + 5).

    The Normal rows favour a shift of 0, which the three rows at 5.005 make impossible.
    """
    q = pm.Categorical("q", np.ones(5) / 5)
    mu = pm.Normal("mu", 0, 1)
    y = d["rng"].normal(size=n)
    y -= y.mean()
    z = d["rng"].uniform(-1, 1, n)
    z[[n // 7, n // 3, n // 2]] = 5.005
    m = mu + pt.as_tensor([-0.02, -0.01, 0.0, 0.01, 0.02])[q]
    pm.Normal("y", m, 1, observed=pm.Data("yd", y))
    pm.Uniform("z", m - 5, m + 5, observed=pm.Data("zd", z))
    # mu = 0 and q = 0 (the initial point) lie outside the support: the Gibbs check holds mu
    # there, the Metropolis one starts inside (as pm.sample's start must be)
    return {"gibbs": "q", "mh": "mu", "mh_point": {"mu": 0.03}}


def discrete_uniform_bound(d, n):
    """DiscreteUniform(1, M) observed: every M below the largest count is impossible."""
    big_m = pm.DiscreteUniform("M", 1, 60)
    y = d["rng"].integers(1, 13, n)
    y[[n // 5, n // 2, n - 2]] = [40, 45, 50]
    pm.DiscreteUniform("y", 1, big_m, observed=pm.Data("yd", y))
    return {"gibbs": "M"}


def binomial_count_capped(d, n):
    """Counts capped by the candidate: Binomial(n=M, p) with three large counts."""
    big_m = pm.DiscreteUniform("M", 5, 60)
    y = d["rng"].binomial(10, 0.3, n)
    y[[n // 5, n // 2, n - 2]] = [14, 15, 16]
    pm.Binomial("y", n=big_m, p=0.3, observed=pm.Data("yd", y))
    return {"gibbs": "M"}


def truncation_point(d, n):
    """A truncation point chosen by a Categorical: the tighter ones exclude a few rows."""
    k = pm.Categorical("k", np.ones(4) / 4)
    lower = pt.as_tensor([-3.0, -2.0, -1.0, 0.0])[k]
    y = d["rng"].normal(size=4 * n)
    y = y[y > -1.0][:n]
    y[[n // 4, n // 2, n - 3]] = [-1.2, -1.5, -1.9]
    pm.Truncated("y", pm.Normal.dist(0, 1), lower=lower, observed=pm.Data("yd", y))
    return {"gibbs": "k"}


#: Models whose terms are -inf on a few rows for some values of the block (a support that
#: depends on the drawn value): right at N = 20,000 with the steps' defaults and no audits.
SUPPORT = [uniform_window, discrete_uniform_bound, binomial_count_capped, truncation_point]


REFUSED = {
    hand_written_lag: r"slice along the observation axis.*pm\.Data columns built outside",
    ar_distribution: r"nothing to subsample",
    random_walk_mean: r"cumulative sum",
    per_observation_latent: r"latent variable",
    per_observation_label: r"per-observation latent",
    centred_on_the_data_mean: r"reduction",
}


def _build(builder, n):
    with pm.Model() as model:
        spec = builder(_data(n), n)
    point = model.initial_point()
    for name, value in spec.get("point", {}).items():
        point[name] = np.asarray(value, dtype=point[name].dtype)
    return model, spec, point


def _tv_bound(p, n_draws, rng, level=0.99):
    """Quantile of the total variation of ``n_draws`` i.i.d. exact draws from ``p``."""
    counts = rng.multinomial(n_draws, p, size=400) / n_draws
    return float(np.quantile(0.5 * np.abs(counts - p).sum(axis=1), level))


def check_gibbs(model, name, point, n_draws, race, audit=None):
    with model:
        step = SubsampledCategoricalGibbs([model[name]], rng=1, race=race, audit=audit)
    values = step.candidate_values[0]
    logp = model.compile_logp()
    lps = np.array([logp(point | {name: np.asarray(v, dtype=point[name].dtype)}) for v in values])
    probs = np.exp(lps - lps.max())
    probs /= probs.sum()
    draws = []
    current = dict(point)
    for _ in range(n_draws):
        current, _ = step.step(current)
        draws.append(int(current[name]))
    index = np.searchsorted(values, draws)
    freq = np.bincount(index, minlength=len(values)) / n_draws
    tv = 0.5 * np.abs(freq - probs).sum()
    bound = _tv_bound(probs, n_draws, np.random.default_rng(0)) + step.delta
    assert tv <= bound, (name, tv, bound)
    return step


def _conditional_grid(model, name, point, n_grid=4001):
    """Exact conditional of the scalar ``name`` on a fine grid around its mode."""
    logp = model.compile_logp()
    dtype = point[name].dtype

    def at(grid):
        return np.array([logp(point | {name: np.asarray(v, dtype=dtype)}) for v in grid])

    coarse = np.linspace(-10, 10, 801)
    lp = at(coarse)
    mode = coarse[np.nanargmax(lp)]
    mass = np.exp(lp - np.nanmax(lp))
    keep = coarse[mass > 1e-12]
    grid = np.linspace(min(keep.min(), mode) - 0.05, max(keep.max(), mode) + 0.05, n_grid)
    lp = at(grid)
    w = np.exp(lp - np.nanmax(lp))
    w = np.where(np.isfinite(w), w, 0.0)
    return grid, w / w.sum()


def _batch_se(values, n_batches=25):
    means = np.array([b.mean() for b in np.array_split(values, n_batches)])
    return means.std(ddof=1) / np.sqrt(n_batches)


def check_metropolis(model, name, point, n_tune, n_draws, race, audit=None):
    value_var = next(v for v in model.value_vars if v.name == name)
    with model:
        step = RacingMetropolis([model.values_to_rvs[value_var]], rng=1, race=race, audit=audit)
    grid, w = _conditional_grid(model, name, point)
    cdf = np.cumsum(w)
    step.setup_chain(np.random.default_rng(2), tune=n_tune, draws=n_draws)
    current = dict(point)
    draws = []
    for i in range(n_tune + n_draws):
        if i == n_tune:
            step.stop_tuning()
        current, _ = step.step(current)
        if i >= n_tune:
            draws.append(float(current[name]))
    draws = np.array(draws)
    mean = float(grid @ w)
    assert abs(draws.mean() - mean) <= 4 * _batch_se(draws) + 1e-3 * np.sqrt(grid**2 @ w - mean**2)
    for level in (0.1, 0.5, 0.9):
        below = (draws <= grid[np.searchsorted(cdf, level)]).astype(float)
        assert abs(below.mean() - level) <= 4 * _batch_se(below) + 0.02, (name, level)
    return step


#: Models whose RacingMetropolis check runs by default (one per kind of likelihood); the
#: others' runs are marked slow, to keep the default suite short.
METROPOLIS_DEFAULT = {
    normal_grid,
    linear_regression_discrete_scale,
    logistic_spike_and_slab,
    poisson_offset,
    custom_dist_laplace,
    censored,
    student_t,
    change_point_discrete_uniform,
    threshold_switch,
    change_point_continuous,
}


@pytest.mark.parametrize("builder", ACCEPTED, ids=lambda f: f.__name__)
def test_zoo_model_is_drawn_right_by_gibbs(builder):
    model, spec, point = _build(builder, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # e.g. a tuning note on a tiny N
        check_gibbs(model, spec["gibbs"], point, 600, FAST)


@pytest.mark.parametrize(
    "builder",
    [b if b in METROPOLIS_DEFAULT else pytest.param(b, marks=pytest.mark.slow) for b in ACCEPTED],
    ids=lambda f: f.__name__,
)
def test_zoo_model_is_drawn_right_by_racing_metropolis(builder):
    model, spec, point = _build(builder, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check_metropolis(model, spec["mh"], point, 200, 1200, FAST)


#: Models drawn at N = 20,000 with the steps' defaults in the default run (where races,
#: not exact passes, make most decisions): one per kind of difficulty, the rest slow.
AT_SCALE_DEFAULT = {normal_grid, poisson_offset, linear_regression_discrete_scale, student_t}


@pytest.mark.parametrize(
    "builder",
    [b if b in AT_SCALE_DEFAULT else pytest.param(b, marks=pytest.mark.slow) for b in ACCEPTED],
    ids=lambda f: f.__name__,
)
def test_zoo_model_is_drawn_right_at_scale_with_defaults(builder):
    # just above the small-N rule, where RacingMetropolis at its defaults races
    model, spec, point = _build(builder, SMALL_N + 1)
    quick = builder in AT_SCALE_DEFAULT
    check_gibbs(model, spec["gibbs"], point, 600 if quick else 1500, None)
    check_metropolis(model, spec["mh"], point, 300 if quick else 500, 1500 if quick else 2000, None)


@pytest.mark.parametrize("builder", SUPPORT, ids=lambda f: f.__name__)
def test_zoo_support_bounded_by_the_block_is_right_at_scale_without_audits(builder):
    """No candidate impossible on a few rows is ever drawn, by the rule alone (no audits)."""
    model, spec, point = _build(builder, 20_000)
    off = AuditOptions(every=0)
    step = check_gibbs(model, spec["gibbs"], point, 400, None, audit=off)
    assert step.row_support.mode == "bounds" and not step._support_exact
    if "mh" in spec:
        point = point | {
            k: np.asarray(v, dtype=point[k].dtype) for k, v in spec["mh_point"].items()
        }
        step = check_metropolis(model, spec["mh"], point, 300, 1500, None, audit=off)
        assert step.row_support.mode == "bounds"


@pytest.mark.parametrize("builder", list(REFUSED), ids=lambda f: f.__name__)
def test_zoo_model_is_refused_with_the_reason(builder):
    model, spec, _ = _build(builder, 300)
    with model:
        with pytest.raises(ModelSplitError, match=REFUSED[builder]):
            SubsampledCategoricalGibbs([model[spec["gibbs"]]])
        with pytest.raises(ModelSplitError, match=REFUSED[builder]):
            RacingMetropolis([model[spec["mh"]]])


def test_zoo_per_row_label_is_drawn_exactly_by_row_latent_gibbs():
    """The label refused above, drawn by RowLatentGibbs: joint enumeration at N = 6 (64 values)."""
    import itertools

    from pymc_subsample import RowLatentGibbs

    model, _, point = _build(per_observation_label, 6)
    point["mu"] = np.array([-1.0, 1.0])
    with model:
        step = RowLatentGibbs([model["z"]], rng=4)
    logp = model.compile_logp()
    states = list(itertools.product(range(2), repeat=6))
    lps = np.array([logp(point | {"z": np.array(s, dtype="int64")}) for s in states])
    probs = np.exp(lps - lps.max())
    probs /= probs.sum()
    n_draws = 3000
    counts = np.zeros(len(states))
    current = dict(point)
    for _ in range(n_draws):
        current, _ = step.step(current)
        counts[int(np.dot(current["z"], 2 ** np.arange(5, -1, -1)))] += 1
    tv = 0.5 * np.abs(counts / n_draws - probs).sum()
    assert tv <= _tv_bound(probs, n_draws, np.random.default_rng(0)), tv


def test_zoo_counts():
    assert len(ACCEPTED) + len(REFUSED) >= 25


def test_zoo_pairing_with_two_processes():
    """The README's pairing under ``pm.sample(cores=2)``: both chains right (q by enumeration)."""
    model, spec, point = _build(linear_regression_discrete_scale, 300)
    with model:
        steps = [
            SubsampledCategoricalGibbs([model["q"]]),
            RacingMetropolis([model["a"], model["b"]]),
        ]
        idata = pm.sample(
            step=steps, tune=300, draws=300, chains=2, cores=2, random_seed=5,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    # with 300 rows, sigma = 1 (q = 1) is all but certain: each chain must find it
    q = idata.posterior["q"].values
    assert q.shape == (2, 300) and (q == 1).mean(axis=1).min() > 0.95
    a = idata.posterior["a"].values
    assert abs(a.mean() - 1.0) < 0.25


def test_a_dims_length_input_keeps_the_race_in_python_at_compiled_sizes():
    """A ``dims`` length is an input of its own of the compiled terms: the compiled race,
    which passes the candidates, the rows and the other value variables only, is not used
    (it failed to type before), and the draws match enumeration."""
    model, spec, point = _build(with_dims, 12_000)
    step = check_gibbs(model, spec["gibbs"], point, 300, None)
    assert not step.compiled

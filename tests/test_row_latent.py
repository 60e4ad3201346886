"""A discrete latent with one value per row: refused by the subsampling steps by name, drawn
exactly by RowLatentGibbs (against enumeration of the joint conditional)."""

import itertools
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import ModelSplitError, RowLatentGibbs, SubsampledCategoricalGibbs

MU = np.array([-1.0, 0.5, 2.0])


def _mixture(n, seed=0, potential=False, total=False):
    rng = np.random.default_rng(seed)
    y = MU[rng.integers(0, 3, n)] + rng.normal(size=n)
    with pm.Model() as model:
        w = pm.Dirichlet("w", np.ones(3))
        mu = pm.Normal("mu", 0, 3, shape=3)
        z = pm.Categorical("z", w, shape=n)
        mean = mu[z] + (0.01 * z.sum() if total else 0.0)
        pm.Normal("y", mean, 1, observed=pm.Data("yd", y))
        if potential:
            pm.Potential("balance", -0.1 * pt.eq(z, 0).sum())
    point = model.initial_point()
    point["mu"] = MU.copy()
    point["w_simplex__"] = np.array([0.3, -0.2])
    return model, point


def test_subsampled_gibbs_names_a_per_row_latent_and_the_fix():
    model, _ = _mixture(200)
    with model, pytest.raises(ModelSplitError) as err:
        SubsampledCategoricalGibbs([model["z"]])
    message = str(err.value)
    assert "z (shape (200,)) is a per-observation latent" in message
    assert "RowLatentGibbs([z])" in message and "CategoricalGibbsMetropolis" in message
    assert "NormalMixture" in message and "accepted_models.md" in message
    assert "lagged" not in message  # not the lag's fix


def test_row_latent_gibbs_matches_enumeration_of_the_joint_conditional():
    """N = 4, K = 3: all 81 joint values enumerated with the model's log density; the
    step's draws (independent given the rest) within the multinomial TV quantile."""
    model, point = _mixture(4)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        step = RowLatentGibbs([model["z"]], rng=3)
    logp = model.compile_logp()
    states = list(itertools.product(range(3), repeat=4))
    lps = np.array([logp(point | {"z": np.array(s, dtype="int64")}) for s in states])
    probs = np.exp(lps - lps.max())
    probs /= probs.sum()
    n_draws = 4000
    index = {s: i for i, s in enumerate(states)}
    counts = np.zeros(len(states))
    current = dict(point)
    for _ in range(n_draws):
        current, (stats,) = step.step(current)
        counts[index[tuple(int(v) for v in current["z"])]] += 1
    tv = 0.5 * np.abs(counts / n_draws - probs).sum()
    sims = np.random.default_rng(0).multinomial(n_draws, probs, size=400) / n_draws
    bound = np.quantile(0.5 * np.abs(sims - probs).sum(axis=1), 0.99)
    assert tv <= bound, (tv, bound)
    assert step.terms_of == ("z", "y")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [({"potential": True}, "potential 'balance'"), ({"total": True}, "read other rows")],
)
def test_row_latent_gibbs_refuses_a_conditional_that_does_not_split(kwargs, why):
    model, _ = _mixture(50, **kwargs)
    with model, pytest.raises(ModelSplitError, match=why):
        RowLatentGibbs([model["z"]])


@pytest.mark.slow
def test_row_latent_gibbs_in_pm_sample_with_nuts_for_the_rest():
    model, _ = _mixture(300, seed=1)
    with model:
        idata = pm.sample(
            step=[RowLatentGibbs([model["z"]])], tune=200, draws=200, chains=1,
            random_seed=2, progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    assert "row_latent_changed" in idata.sample_stats
    assert idata.posterior["z"].shape == (1, 200, 300)


def test_a_bernoulli_label_per_row_is_drawn_from_its_exact_conditionals():
    """Each element's conditional by enumeration of its two values with the joint density
    (the rest fixed): the step's frequencies within four binomial standard errors."""
    rng = np.random.default_rng(5)
    y = rng.normal(size=5) + 1.0
    with pm.Model() as model:
        z = pm.Bernoulli("z", 0.4, shape=5)
        pm.Normal("y", 2.0 * z, 1, observed=pm.Data("yd", y))
        step = RowLatentGibbs([z], rng=6)
    point = model.initial_point()
    logp = model.compile_logp()
    exact = []
    for n in range(5):
        lp = [logp(point | {"z": np.where(np.arange(5) == n, v, 0).astype("int8")}) for v in (0, 1)]
        exact.append(1 / (1 + np.exp(lp[0] - lp[1])))
    n_draws = 3000
    total = np.zeros(5)
    current = dict(point)
    for _ in range(n_draws):
        current, _ = step.step(current)
        total += current["z"]
    exact = np.array(exact)
    assert np.all(np.abs(total / n_draws - exact) <= 4 * np.sqrt(exact * (1 - exact) / n_draws))


def test_racing_metropolis_names_a_continuous_per_row_latent_and_nuts():
    with pm.Model() as model:
        z = pm.Normal("z", 0, 1, shape=100)
        pm.Normal("y", z, 1, observed=pm.Data("yd", np.zeros(100)))
    with (
        model,
        pytest.raises(ModelSplitError, match=r"z \(shape \(100,\)\) is a per-observation.*NUTS"),
    ):
        from pymc_subsample import RacingMetropolis

        RacingMetropolis([z])

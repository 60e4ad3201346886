"""``frac_evals`` has one meaning in both racing steps: the share of the N rows a decision read."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions

N_OBS = 5000


def test_gibbs_frac_evals_is_the_share_of_rows_a_decision_read():
    """Candidates far from the data drop at the first look; the two close ones race on.

    A decision then reads more rows for its survivors than for the dropped
    candidates: ``frac_evals * N`` (the rows of the longest-raced candidate)
    exceeds ``n_evals / D`` (the rows per candidate on average), which the
    former definition, ``n_evals / (N D)``, made equal.
    """
    rng = np.random.default_rng(0)
    mus = np.array([0.0, 0.02, 1.0, 2.0, 3.0])
    with pm.Model() as model:
        y = pm.Data("y", rng.normal(0.01, 1.0, size=N_OBS))
        q = pm.Categorical("q", p=np.full(5, 0.2))
        pm.Normal("obs", pt.as_tensor(mus)[q], 1.0, observed=y)
        step = SubsampledCategoricalGibbs(
            [q],
            rng=1,
            race=RaceOptions(batch_size=50, exact_fraction=1.0, backoff=False),
            audit=AuditOptions(every=0),
        )
    point = model.initial_point()
    fracs, evals = [], []
    for _ in range(40):
        point, (st,) = step.step(point)
        fracs.append(st["frac_evals"])
        evals.append(st["n_evals"])
    fracs, evals = np.array(fracs), np.array(evals)
    assert np.all((fracs > 0) & (fracs <= 1))
    rows = fracs * N_OBS
    assert np.allclose(rows, np.round(rows))  # a count of rows
    assert np.all(rows * 5 >= evals)  # no candidate read more rows than the decision
    assert np.mean(rows > evals / 5 + 1) > 0.5  # the dropped candidates read fewer


def test_gibbs_exact_draws_read_every_row():
    rng = np.random.default_rng(1)
    with pm.Model() as model:
        y = pm.Data("y", rng.normal(size=500))
        q = pm.Categorical("q", p=np.full(3, 1 / 3), shape=2)  # two decisions per draw
        pm.Normal("obs", q[0] - q[1], 1.0, observed=y)
        step = SubsampledCategoricalGibbs([q], rng=1, race=RaceOptions(bound="exact"))
    _, (st,) = step.step(model.initial_point())
    assert st["frac_evals"] == 1.0 and st["n_evals"] == 2 * 3 * 500


def test_metropolis_frac_evals_leaves_the_warm_up_to_n_evals():
    """The first draw fits the surrogate (passes over the data, in ``n_evals``): its one
    exact decision read every row once, ``frac_evals`` 1 (it was ``n_evals / 2N`` > 1)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=N_OBS)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        yd = pm.Data("y", 0.5 * x + rng.normal(size=N_OBS))
        b = pm.Normal("b", 0.0, 5.0)
        pm.Normal("obs", b * xd, 1.0, observed=yd)
        step = RacingMetropolis([b], rng=3, race=RaceOptions(bound="exact"))
    _, (st,) = step.step(model.initial_point())
    assert st["n_evals"] > 2 * N_OBS  # the warm-up's passes
    assert st["frac_evals"] == 1.0
    racing = RacingMetropolis([b], rng=3, model=model, audit=AuditOptions(every=0))
    point = model.initial_point()
    fracs = []
    for _ in range(30):
        point, (st,) = racing.step(point)
        fracs.append(st["frac_evals"])
    assert all(0 < f <= 1 for f in fracs)
    assert np.median(fracs) < 0.5  # the races read a small share of the rows

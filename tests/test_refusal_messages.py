"""Refusals that name the model feature and the fix: pm.Minibatch, observations on a later axis."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_subsample import ModelSplitError, RacingMetropolis, SubsampledCategoricalGibbs

N = 300
STEPS = [(SubsampledCategoricalGibbs, "q"), (RacingMetropolis, "mu")]


def _minibatch_model(total_size: bool):
    y = np.random.default_rng(0).normal(0.3, 1.0, N)
    with pm.Model() as model:
        q = pm.Categorical("q", np.ones(3) / 3)
        mu = pm.Normal("mu", 0.0, 1.0)
        yb = pm.Minibatch(pm.Data("yd", y), batch_size=50)
        kw = {"total_size": N} if total_size else {}
        pm.Normal("y", mu + pt.as_tensor([0.0, 0.1, 0.2])[q], 1.0, observed=yb, **kw)
    return model


@pytest.mark.parametrize("total_size", [True, False])
@pytest.mark.parametrize(("cls", "name"), STEPS)
def test_minibatch_is_refused_by_name(total_size, cls, name):
    model = _minibatch_model(total_size)
    with model, pytest.raises(ModelSplitError, match=r"pm\.Minibatch.*without pm\.Minibatch"):
        cls([model[name]])


@pytest.mark.parametrize(("cls", "name"), STEPS)
def test_observations_on_the_second_axis_get_the_transpose_hint(cls, name):
    y = np.random.default_rng(0).normal(0.3, 1.0, (2, N))
    with pm.Model() as model:
        q = pm.Categorical("q", np.ones(3) / 3)
        mu = pm.Normal("mu", 0.0, 1.0)
        loc = (mu + pt.as_tensor([0.0, 0.1, 0.2])[q]) * pt.ones((2, 1))
        pm.Normal("y", loc, 1.0, observed=pm.Data("Yd", y))
    with model, pytest.raises(ModelSplitError, match=r"'Yd' has shape \(2, 300\).*Y\.T"):
        cls([model[name]])

"""A built step takes new race options only to switch its bound to "exact" and back."""

from dataclasses import replace

import numpy as np
import pymc as pm
import pytest

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.options import RaceOptions


@pytest.fixture(scope="module")
def step():
    y = np.random.default_rng(0).normal(0.2, 1.0, 2_000)
    with pm.Model() as model:
        q = pm.Categorical("q", np.ones(3) / 3)
        pm.Normal(
            "y", pm.math.constant(np.array([0.0, 0.2, 0.4]))[q], 1.0, observed=pm.Data("yd", y)
        )
    with model:
        return SubsampledCategoricalGibbs(
            [q], race=RaceOptions(batch_size=100, exact_fraction=1.0), rng=0
        )


def test_bound_switches_to_exact_and_back(step):
    racing = step.race
    assert not step.decides_exactly
    step.race = replace(racing, bound="exact")
    assert step.decides_exactly
    step.race = racing
    assert not step.decides_exactly


@pytest.mark.parametrize(
    "change", [{"batch_size": 400}, {"batches": "random"}, {"backoff": False}, {"bound": "ebs"}]
)
def test_other_changes_are_refused_not_ignored(step, change):
    with pytest.raises(ValueError, match="build a new step"):
        step.race = replace(step.race, **change)
    assert step.race.batch_size == 100 and step.race.bound == "normal"


def test_race_must_be_race_options(step):
    with pytest.raises(TypeError, match="race"):
        step.race = {"bound": "exact"}

"""Racing core: best-arm identification on finite reward populations.

Pure NumPy/SciPy and Numba (no PyMC import). The module layers, bottom up:
:mod:`~pymc_subsample.racing.common` (result type and checks),
:mod:`~pymc_subsample.racing.bounds`, :mod:`~pymc_subsample.racing.draws`
(compiled draws without replacement), :mod:`~pymc_subsample.racing.schedule`
(schedules and index streams) and :mod:`~pymc_subsample.racing.kernels` (a
look's compiled statistics); :mod:`~pymc_subsample.racing.config` (a race's
settings and plan) and :mod:`~pymc_subsample.racing.state` (the race's state
machine: init, update, finish); its two drivers,
:mod:`~pymc_subsample.racing.race` (Python, with the one-call :func:`race`)
and :mod:`~pymc_subsample.racing.compiled` (one compiled call per race, its
state packed in two arrays: :mod:`~pymc_subsample.racing.packed`); the
other races (:mod:`~pymc_subsample.racing.lilucb`,
:mod:`~pymc_subsample.racing.independent`), and the samplers built on them
(:func:`sample_categorical`, :func:`mh_test`, :func:`residual_callbacks`).
"""

from .bounds import (
    EBSBound,
    NormalBound,
    ebs_width,
    normal_threshold,
    normal_width,
    rare_event_floor,
    union_threshold,
)
from .common import BOUNDS, VARIANCES, RaceResult
from .config import RaceConfig, RacePlan
from .gumbel import sample_categorical
from .independent import race_independent
from .lilucb import lil_ucb
from .mh import MHDecision, mh_test
from .race import race, race_exact, race_shared
from .residuals import Residuals, residual_callbacks
from .schedule import (
    CyclicWindows,
    ExactSwitch,
    IndexStream,
    RandomBlocks,
    doubling_schedule,
    random_positions,
    skip_taken,
)
from .state import RaceState, SharedRace

__all__ = [
    "BOUNDS",
    "VARIANCES",
    "CyclicWindows",
    "EBSBound",
    "ExactSwitch",
    "IndexStream",
    "RandomBlocks",
    "MHDecision",
    "NormalBound",
    "RaceConfig",
    "RacePlan",
    "RaceResult",
    "RaceState",
    "Residuals",
    "SharedRace",
    "doubling_schedule",
    "ebs_width",
    "lil_ucb",
    "mh_test",
    "normal_threshold",
    "normal_width",
    "race",
    "race_exact",
    "race_independent",
    "race_shared",
    "random_positions",
    "rare_event_floor",
    "residual_callbacks",
    "sample_categorical",
    "skip_taken",
    "union_threshold",
]

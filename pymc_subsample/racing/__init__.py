"""Racing core: best-arm identification on finite reward populations.

Pure NumPy/SciPy and Numba (no PyMC import). The module layers, bottom up:
:mod:`~pymc_subsample.racing.common` (result type and checks),
:mod:`~pymc_subsample.racing.bounds`, :mod:`~pymc_subsample.racing.schedule`
and :mod:`~pymc_subsample.racing.kernels`, the races
(:mod:`~pymc_subsample.racing.race`, :mod:`~pymc_subsample.racing.lilucb`,
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
from .gumbel import sample_categorical
from .independent import race_independent
from .lilucb import lil_ucb
from .mh import MHDecision, mh_test
from .race import RaceConfig, RaceState, SharedRace, race, race_exact, race_shared
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

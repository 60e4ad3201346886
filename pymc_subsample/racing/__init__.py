"""Racing core: best-arm identification on finite reward populations.

Pure NumPy/SciPy (no PyMC import). See ``ALGORITHMS.md`` §1–2 and seed 000.
"""

from .bounds import (
    ebs_width,
    normal_threshold,
    normal_width,
    rare_event_floor,
    union_threshold,
)
from .gumbel import sample_categorical
from .lilucb import lil_ucb
from .race import BOUNDS, VARIANCES, RaceResult, race
from .schedule import IndexStream, doubling_schedule, random_positions, skip_taken

__all__ = [
    "BOUNDS",
    "VARIANCES",
    "IndexStream",
    "RaceResult",
    "doubling_schedule",
    "ebs_width",
    "lil_ucb",
    "normal_threshold",
    "normal_width",
    "race",
    "random_positions",
    "rare_event_floor",
    "sample_categorical",
    "skip_taken",
    "union_threshold",
]

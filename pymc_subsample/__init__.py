"""pymc-subsample: PyMC step methods that evaluate only as much likelihood as needed."""

from . import (
    _numba_trigamma,  # noqa: F401 (registers a Numba lowering)
    prs,
    racing,
)
from .diagnostics import compare_runs
from .model.blocks import ModelSplitError
from .model.out_of_core import Data, OutOfCoreReadError
from .model.terms import ObservationTerms
from .racing import RaceResult, race, sample_categorical
from .steps.gibbs import SubsampledCategoricalGibbs
from .steps.metropolis import RacingMetropolis
from .steps.pliable import PliableRejection
from .steps.row_latent import RowLatentGibbs

__version__ = "0.1.0.dev0"

__all__ = [
    "Data",
    "ModelSplitError",
    "ObservationTerms",
    "OutOfCoreReadError",
    "PliableRejection",
    "RaceResult",
    "RacingMetropolis",
    "RowLatentGibbs",
    "SubsampledCategoricalGibbs",
    "__version__",
    "compare_runs",
    "prs",
    "race",
    "racing",
    "sample_categorical",
]

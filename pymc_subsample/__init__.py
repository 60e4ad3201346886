"""pymc-subsample: PyMC step methods that evaluate only as much likelihood as needed."""

from . import _numba_trigamma, prs, racing  # noqa: F401 (registers a Numba lowering)
from .compare import compare_runs
from .gibbs import SubsampledCategoricalGibbs
from .graph import ModelSplitError, ObservationTerms
from .metropolis import RacingMetropolis
from .pliable import PliableRejection
from .racing import RaceResult, race, sample_categorical

__version__ = "0.1.0.dev0"

__all__ = [
    "ModelSplitError",
    "ObservationTerms",
    "PliableRejection",
    "RaceResult",
    "RacingMetropolis",
    "SubsampledCategoricalGibbs",
    "__version__",
    "compare_runs",
    "prs",
    "race",
    "racing",
    "sample_categorical",
]

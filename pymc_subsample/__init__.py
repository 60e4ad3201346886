"""pymc-subsample: PyMC step methods that evaluate only as much likelihood as needed."""

from . import racing
from .racing import RaceResult, race, sample_categorical

__version__ = "0.1.0.dev0"

__all__ = ["RaceResult", "__version__", "race", "racing", "sample_categorical"]

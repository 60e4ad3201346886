"""Pliable rejection sampling (Erraqabi et al. 2016): sampler, envelope, rejection loop, baselines.

Pure NumPy/SciPy (no PyMC import). :func:`build_envelope` and :func:`draw` are
the one rejection loop that the standalone :class:`PliableRejectionSampler` and
the PyMC step :class:`~pymc_subsample.PliableRejection` share.
"""

from .envelope import (
    MAX_DIM,
    PliableEnvelope,
    default_n_cells,
    fit_envelope,
    kernel_table,
    log_linear_table,
    paper_bandwidth,
    paper_rate,
)
from .proposal import MixtureProposal, ProductProposal
from .rejection import Design, Draws, build_envelope, draw, evaluate, refit_envelope
from .sampler import PliableRejectionSampler, check_envelope_settings, default_n_init

__all__ = [
    "MAX_DIM",
    "Design",
    "Draws",
    "MixtureProposal",
    "PliableEnvelope",
    "PliableRejectionSampler",
    "ProductProposal",
    "build_envelope",
    "check_envelope_settings",
    "default_n_cells",
    "default_n_init",
    "draw",
    "evaluate",
    "fit_envelope",
    "kernel_table",
    "log_linear_table",
    "paper_bandwidth",
    "paper_rate",
    "refit_envelope",
]

"""Pliable rejection sampling (seed 002): standalone sampler, envelope and baselines.

Pure NumPy/SciPy (no PyMC import). See ``ALGORITHMS.md`` §6.
"""

from .envelope import PliableEnvelope, fit_envelope, kernel_table, paper_bandwidth, paper_rate
from .proposal import MixtureProposal, ProductProposal
from .sampler import MAX_DIM, PliableRejectionSampler, default_n_init

__all__ = [
    "MAX_DIM",
    "MixtureProposal",
    "PliableEnvelope",
    "PliableRejectionSampler",
    "ProductProposal",
    "default_n_init",
    "fit_envelope",
    "kernel_table",
    "paper_bandwidth",
    "paper_rate",
]

"""Suite-wide settings.

Functions that have paid their budget compile in this process, not in a background
one (:data:`~pymc_subsample.model.tiered.BACKGROUND_COMPILE`), and so do the racing
kernels (:data:`~pymc_subsample.racing.warmup.IN_BACKGROUND`): a test's steps move
and race when their rules say, whatever the machine's load and caches, and no
process outlives the suite. Tests of the background compilations set them back.
The environment variable does the same in the worker processes of ``pm.sample``
(``cores > 1``), which import the package anew.
"""

import os

import pytest

os.environ["PYMC_SUBSAMPLE_BACKGROUND"] = "0"


@pytest.fixture(autouse=True)
def compile_in_process(monkeypatch):
    from pymc_subsample.model import tiered
    from pymc_subsample.racing import warmup

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", False)
    monkeypatch.setattr(warmup, "IN_BACKGROUND", False)

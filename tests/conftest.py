"""Suite-wide settings.

Functions that have paid their budget compile in this process, not in a background
one (:data:`~pymc_subsample.model.tiered.BACKGROUND_COMPILE`): a test's steps
move when their rule says, whatever the machine's load, and no process outlives
the suite. Tests of the background compilation set it back.
"""

import pytest


@pytest.fixture(autouse=True)
def compile_in_process(monkeypatch):
    from pymc_subsample.model import tiered

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", False)

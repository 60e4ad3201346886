"""Study support: fixtures shared by the tests, benchmarks and examples (not installed).

Nothing here is part of :mod:`pymc_subsample`: these are the populations,
targets, baselines and models that the studies of the results pages use.
The package lives in ``tests/support`` and is imported as ``support``:

* pytest adds ``tests`` to ``sys.path`` (``pythonpath`` in ``pyproject.toml``);
* ``python benchmarks/<script>.py`` adds it through ``benchmarks/_paths.py``;
* the examples and the documentation build add ``tests`` to ``sys.path``
  themselves.

Modules: :mod:`support.synthetic` (the reward populations of the bandit study
of Chen & Ghahramani 2016), :mod:`support.targets` and
:mod:`support.baselines` (the targets and baselines of Erraqabi et al. 2016),
:mod:`support.models` (the regression models of the RacingMetropolis
benchmarks), :mod:`support.sbc` (simulation-based calibration of the steps).
"""

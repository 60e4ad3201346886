"""When :class:`~pymc_subsample.SubsampledCategoricalGibbs` races compiled, planned once.

A lone scalar variable without control variates races in one compiled call per draw
(:class:`~pymc_subsample.racing.compiled.CompiledRace`, the same decisions as the
Python race) when its population is large and its plan supports it; see
:ref:`gibbs-step`. :class:`CompiledRacePlanner` holds that planning; the compiled
draw itself stays with the step.
"""

from __future__ import annotations

import numpy as np

from ..mcmc.cost import compiled_look_cost
from ..model.blocks import prior_points
from ..racing.compiled import CompiledRace, driver_compiled, supports
from ..racing.state import sparse_arms

__all__ = ["COMPILED_MIN_OBS", "DRIVER_SECONDS", "CompiledRacePlanner"]

#: Seconds of Python races (and of exact decisions, which a plan timed on compiled looks
#: may race) a step spends before it compiles its race driver (a Numba function generated
#: for each model's rows kernel, a few seconds of LLVM, compiled anew in every process):
#: the first draws do not wait for it, and a short run never pays it.
DRIVER_SECONDS = 1.0

#: Populations from this size on race in one compiled call per draw where they can
#: (:func:`~pymc_subsample.racing.compiled.CompiledRace`, built with the step);
#: smaller ones race in Python (there a Python look's bookkeeping costs more than its
#: terms; below it the defaults mostly decide exactly).
COMPILED_MIN_OBS = 10_000


class CompiledRacePlanner:
    """Mixin of :class:`~pymc_subsample.SubsampledCategoricalGibbs`: plan its compiled races.

    Decides whether the step's races run compiled (its ``compiled``), re-chooses
    the "auto" first batch and exact switch by timing compiled looks, and builds
    and warms up the :class:`~pymc_subsample.racing.compiled.CompiledRace` (its
    ``compiled_race``). Reads the step's terms, values, plan and settings.
    """

    def _plan_compiled(self, point=None, now: bool = False) -> None:
        """Use compiled races (:class:`CompiledRace`) where they apply; compile them when paid.

        A compiled look costs a few microseconds where a Python one costs tens,
        so the "auto" first batch and exact switch, chosen by timing Python
        looks, are chosen again by timing compiled ones
        (:func:`~pymc_subsample.mcmc.cost.compiled_look_cost`), whatever the Python
        timing chose (even deciding at once), when the compiled race applies
        with the new plan. Timed and warmed up at ``point`` (default: the
        initial point). The driver is compiled once the step's Python races have
        cost :data:`DRIVER_SECONDS` (or ``now``, or when this process holds it
        already); until then the races run in Python on their Python-timed
        plan (:meth:`_count_python_race` plans again then). Either driver makes
        a race of the same settings: the chain's law is unchanged.
        """
        self._compiled = False
        self._driver_due = False
        if not self._compiled_structure() or self._sparse_differences():
            return
        rows = self.terms.compiled_rows()
        paid = self._python_race_seconds >= DRIVER_SECONDS
        if not (now or paid or driver_compiled(rows.fn, len(rows.data), len(self._others(point)))):
            self._driver_due = True
            return
        terms = self.terms
        n_cat, n_obs = self.n_categories[0], terms.n_obs
        point = self.initial_point if point is None else point
        others = self._others(point)
        if any(self._auto_plan) and self._exact_seconds is not None:
            before = (self.batch_size, self.exact_switch, self.race_config)
            look = compiled_look_cost(
                terms.compiled_rows(), self._values[0], others, n_obs, np.random.default_rng(0)
            )
            self._choose_plan(look)
            if not self._compiled_applies():  # keep the Python-timed plan
                self.batch_size, self.exact_switch, self.race_config = before
        self._compiled = self._compiled_applies()
        if not self._compiled:
            return
        self._reads_others = bool(others)  # a race reads the other inputs at each draw
        rows = terms.compiled_rows()
        key = (rows.fn, self.race_config, n_cat, n_obs, len(others))
        if getattr(self, "_compiled_race_key", None) == key:
            return  # the driver built for this plan serves it (a replan changed nothing)
        # compile the driver before sampling (a second or two, once)
        self._compiled_race = CompiledRace(rows, self.race_config, n_cat, n_obs, len(others))
        self._compiled_race_key = key
        self._race_compiled(np.zeros(n_cat), point, seed=np.zeros(1, dtype=np.uint64))

    def _others(self, point) -> tuple:
        """Return the terms' other inputs at ``point`` (default: the initial point)."""
        return tuple(self.terms.other_arrays(self.initial_point if point is None else point))

    def _count_python_race(self, seconds: float, point) -> None:
        """Count a Python race's (or exact decision's) seconds; compile the driver once paid."""
        self._python_race_seconds += seconds
        if self._driver_due and self._python_race_seconds >= DRIVER_SECONDS:
            self._plan_compiled(point, now=True)

    def _sparse_differences(self, rows: int = 512, arms: int = 4096) -> bool:
        """Return True when values' terms equal the best one's on most rows of a probe.

        At the initial point and two draws from the prior, on ``rows`` random
        rows (:func:`~pymc_subsample.racing.state.sparse_arms`). Races of such
        a variable (a change point, a value that touches few observations)
        keep those values to an exact pass, which the Python race does at
        every look; the compiled race does not, so it is not used.
        """
        terms, values = self.terms, self._values[0]
        rng = np.random.default_rng(0)
        for point in [self.initial_point, *prior_points(self.model, 2, seed=1)]:
            idx = np.sort(rng.choice(terms.n_obs, size=min(rows, terms.n_obs), replace=False))
            batch = np.concatenate(
                [
                    terms.loglik_subset([values[a : a + arms]], idx, point)
                    for a in range(0, len(values), arms)
                ]
            )
            finite = np.isfinite(batch).all(axis=1)
            if finite.sum() > 1:
                batch = batch[finite]
                if sparse_arms(batch, int(batch.mean(axis=1).argmax())).any():
                    return True
        return False

    def _compiled_structure(self) -> bool:
        """Return True for a lone scalar, no control variates, compiled rows, large N."""
        terms = self.terms
        return bool(
            terms.n_obs >= COMPILED_MIN_OBS
            and self.bound == "normal"
            and not self.control_variates
            and self._lone
            and terms.compiled_rows() is not None
        )

    def _compiled_applies(self) -> bool:
        """Return True when the step races compiled.

        :meth:`_compiled_structure` holds and the plan :func:`supports` a
        compiled race (and does not decide every draw exactly).
        """
        return bool(
            self._compiled_structure()
            and self.race_config is not None
            and not self.decides_exactly
            and supports(self.race_config, self.n_categories[0], self.terms.n_obs, totals=True)
        )

r"""RowLatentGibbs: exact Gibbs draws of a discrete latent with one value per observation.

A mixture written with a label per row, :math:`z_n \sim \mathrm{Categorical}(w)`,
:math:`y_n \sim f(\cdot \mid \theta_{z_n})`, has a block :math:`z = (z_1, \dots, z_N)`
that no subset of rows can estimate: row :math:`n` is the only one that
reads :math:`z_n`. When every log density that involves :math:`z` is a sum of
per-row terms :math:`g_n(z_n)` (the prior of :math:`z_n` and the likelihood of
row :math:`n`), the full conditional factorises,

.. math:: p(z \mid \text{rest}) = \prod_{n=1}^N p(z_n \mid \text{rest}),
          \qquad p(z_n = k \mid \text{rest}) \propto e^{g_n(k)},

so all :math:`N` elements are drawn at once and exactly: :math:`K` evaluations
of the :math:`N` terms (one per candidate value, all rows at a time) and a
Gumbel-max draw per row. PyMC's ``CategoricalGibbsMetropolis`` evaluates the
model's joint log density for every element and value, :math:`K N` passes
over the :math:`N` rows per sweep.

The factorisation is checked when the step is built: structurally (the
terms, traced with :math:`z`'s axis as the rows,
:func:`~pymc_subsample.model.row_locality.find_row_mixing`) and numerically
(at the initial point and draws from the prior, changing a few elements of
:math:`z` changes those rows' terms only).
"""

from __future__ import annotations

import numpy as np
from pymc.step_methods.compound import BlockedStep

from ..model.blocks import ModelSplitError, as_value_vars, depends_on, per_observation, prior_points
from ..model.row_locality import find_row_mixing
from ..model.support import discrete_support
from .base import check_step_context, step_rng

__all__ = ["RowLatentGibbs"]

#: Prior draws (with the initial point) at which the factorisation is checked.
_CHECK_POINTS = 3
#: Elements of the block changed at each check.
_CHECK_ELEMENTS = 8


class RowLatentGibbs(BlockedStep):
    r"""Exact Gibbs step for a discrete latent vector with one element per observation.

    Draws every element :math:`z_n` from :math:`p(z_n = k \mid \text{rest})
    \propto e^{g_n(k)}`, :math:`g_n` the sum of the row-:math:`n` entries of
    every log density that involves :math:`z` (its prior, the likelihood
    terms), for :math:`k` over :math:`z`'s support: exact, since those
    conditionals are independent given the rest (module docstring).

    Parameters
    ----------
    vars : list
        One discrete vector variable (``Categorical``, ``Bernoulli``, or another
        bounded discrete distribution, :func:`~pymc_subsample.model.support.discrete_support`).
    model, rng, initial_point, compile_kwargs, blocked
        As for PyMC's step methods.

    Raises
    ------
    ModelSplitError
        When a log density that involves the block is not a sum of per-row
        terms of its elements (a potential or a total over the elements, a
        term that reads several elements), naming it.
    ValueError
        When the block is not one discrete vector.
    """

    name = "row_latent_gibbs"
    stats_dtypes_shapes = {"row_latent_changed": (np.int64, [])}

    def __init__(
        self,
        vars,
        *,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
    ):
        import pymc as pm
        from pymc.pytensorf import compile as compile_pymc

        check_step_context(model, initial_point, compile_kwargs)
        model = pm.modelcontext(model)
        value_vars = as_value_vars(model, vars)
        if len(value_vars) != 1:
            raise ValueError(
                "RowLatentGibbs draws one latent vector; got "
                f"{[v.name for v in value_vars]}: build one step per variable"
            )
        (z,) = value_vars
        point = model.initial_point() if initial_point is None else initial_point
        name = model.values_to_rvs[z].name
        if np.ndim(point[z.name]) != 1:
            raise ValueError(
                f"RowLatentGibbs draws a vector with one element per observation; {name!r} "
                f"has shape {np.shape(point[z.name])}"
            )
        self.values = discrete_support(model, z, point)
        self.vars = [z]
        self.model = model
        self.rng = step_rng(rng)
        self.n_rows = int(np.shape(point[z.name])[0])
        parts, names = [], []
        for rv in model.basic_RVs:
            [lp] = model.logp(vars=[rv], sum=False)
            if not depends_on(lp, [z]):
                continue
            if lp.ndim == 0:
                raise self._refusal(name, f"the log density of {rv.name!r} is a single total")
            parts.append(per_observation(lp))
            names.append(rv.name)
        for pot, pot_value in zip(
            model.potentials, model.replace_rvs_by_values(model.potentials), strict=True
        ):
            if depends_on(pot_value, [z]):
                raise self._refusal(name, f"the potential {pot.name!r} involves it")
        terms = parts[0] if len(parts) == 1 else sum(parts[1:], parts[0])
        mixing = [m for m in find_row_mixing(terms, [z]) if m.definite]
        if mixing:
            found = "; ".join(m.operation for m in mixing)
            raise self._refusal(name, f"the terms of {', '.join(names)} read other rows: {found}")
        #: the log densities whose rows make each element's conditional
        self.terms_of = tuple(names)
        others = [v for v in model.value_vars if v is not z and depends_on(terms, [v])]
        self._other_names = [v.name for v in others]
        kwargs = dict(compile_kwargs or {})
        kwargs.setdefault("on_unused_input", "ignore")
        self._fn = compile_pymc([z, *others], terms, **kwargs)
        self._check_rows(name, point)

    @staticmethod
    def _refusal(name: str, why: str) -> ModelSplitError:
        return ModelSplitError(
            f"RowLatentGibbs: the conditional of {name!r} does not split into one term per "
            f"element ({why}); draw {name} with pm.CategoricalGibbsMetropolis, or marginalise it"
        )

    def _scores(self, z: np.ndarray, point: dict) -> np.ndarray:
        others = [np.asarray(point[n]) for n in self._other_names]
        out = np.asarray(self._fn(z, *others), dtype=float)
        return np.broadcast_to(out, (self.n_rows,))

    def _check_rows(self, name: str, point: dict) -> None:
        """Check numerically that changing elements of the block changes their rows only."""
        rng = np.random.default_rng(0)
        dtype = self.vars[0].dtype
        points = [point, *prior_points(self.model, _CHECK_POINTS, seed=0)]
        for at in points:
            z = np.asarray(at[self.vars[0].name], dtype=dtype)
            base = self._scores(z, at)
            if base.shape != (self.n_rows,):
                raise self._refusal(name, f"its terms have shape {base.shape}")
            changed = rng.choice(self.n_rows, size=min(_CHECK_ELEMENTS, self.n_rows - 1))
            z_new = z.copy()
            z_new[changed] = rng.choice(self.values, size=len(changed))
            moved = self._scores(z_new, at) != base
            moved[changed] = False
            both_nan = np.isnan(base) & np.isnan(self._scores(z_new, at))
            if np.any(moved & ~both_nan):
                raise self._refusal(
                    name, "changing a few of its elements changed the terms of other rows"
                )

    def step(self, point: dict) -> tuple[dict, list[dict]]:
        """Draw every element from its exact conditional (Gumbel-max over the support)."""
        z_name = self.vars[0].name
        dtype = self.vars[0].dtype
        scores = np.stack(
            [self._scores(np.full(self.n_rows, v, dtype=dtype), point) for v in self.values]
        )
        scores = np.where(np.isnan(scores), -np.inf, scores)
        noisy = scores + self.rng.gumbel(size=scores.shape)
        new = self.values[np.argmax(noisy, axis=0)].astype(dtype)
        changed = int(np.count_nonzero(new != point[z_name]))
        point = dict(point)
        point[z_name] = new
        return point, [{"row_latent_changed": changed}]

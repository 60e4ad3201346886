r"""The block a step updates, read from the model: its value variables and its terms.

A step updates a block :math:`\theta` of value variables. The model's log
density splits into the terms that involve :math:`\theta` and the rest; this
module finds the block's value variables (refusing discrete ones for the
continuous steps), the log densities that involve it (:func:`block_terms`),
the Deterministics a step may expand in (:func:`model_deterministics`) and
draws from the prior at which the terms are checked (:func:`prior_points`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.graph.traversal import ancestors

from ..validation import ArgumentTypeError
from .tiered import no_c_compilation

__all__ = [
    "ModelSplitError",
    "as_value_vars",
    "block_terms",
    "check_expand_in",
    "continuous_value_vars",
    "depends_on",
    "model_deterministics",
    "per_observation",
    "prior_points",
]


class ModelSplitError(ValueError):
    """The model's likelihood cannot be split into per-observation terms."""


def per_observation(lp):
    """Sum a log density over every axis but the first (the observations')."""
    return lp.sum(axis=tuple(range(1, lp.ndim))) if lp.ndim > 1 else lp


def depends_on(graph, variables) -> bool:
    """Return True when ``graph`` has one of ``variables`` among its ancestors."""
    targets = set(variables)
    return any(a in targets for a in ancestors([graph]))


def check_expand_in(expand_in) -> None:
    """Refuse an ``expand_in`` that is not None, a name or a list of them (before any build).

    Raises
    ------
    ArgumentTypeError
        Naming ``expand_in``, the value and a valid one.
    """
    if expand_in is not None and not isinstance(expand_in, str | list | tuple):
        raise ArgumentTypeError(
            "expand_in must be a list of Deterministics of the model or their names, got "
            f"{expand_in!r}; e.g. expand_in=['sigma2']"
        )


def model_deterministics(model, variables: str | Sequence) -> list:
    """Return the Deterministics named in ``variables`` (a name, names or variables) of ``model``.

    Raises
    ------
    ValueError
        For anything that is not a Deterministic of the model, naming the fix.
    """
    check_expand_in(variables)
    names = [d.name for d in model.deterministics]
    found = []
    for v in [variables] if isinstance(variables, str) else variables:
        if isinstance(v, str) and v not in model.named_vars:
            raise ValueError(
                f"expand_in: {v!r} is not a variable of the model; its Deterministics are {names}"
            )
        var = model[v] if isinstance(v, str) else v
        if var not in model.deterministics:
            name = v if isinstance(v, str) else getattr(v, "name", v)
            kind = "a value or free variable" if var in model.free_RVs else "not one"
            raise ValueError(
                f"expand_in: {name!r} is {kind}; give Deterministics of the model "
                "(pm.Deterministic) through which the terms depend on the parameters, "
                "or leave expand_in out to expand in the value variables"
            )
        found.append(var)
    return found


def prior_points(model, n: int, seed: int) -> list[dict]:
    """Return ``n`` joint draws of the model's free variables from the prior, as value points.

    Transformed variables are mapped to their value variables' space; an empty
    list when the prior cannot be sampled (e.g. a ``CustomDist`` without a
    random function).
    """
    from pymc.pytensorf import compile as compile_pymc

    outputs = []
    for rv in model.free_RVs:
        transform = model.rvs_to_transforms.get(rv)
        outputs.append(rv if transform is None else transform.forward(rv, *rv.owner.inputs))
    names = [model.rvs_to_values[rv].name for rv in model.free_RVs]
    try:
        # Python's linker: a few draws, where compiling (Numba's object mode for some
        # random variables) would cost more than they do
        with no_c_compilation():
            draw = compile_pymc([], outputs, random_seed=seed, mode="FAST_COMPILE")
        return [dict(zip(names, draw(), strict=True)) for _ in range(n)]
    except Exception:  # noqa: BLE001 (any failure to sample the prior: check at fewer points)
        return []


def as_value_vars(model, vars) -> list:
    """Return the value variables of the block ``vars``; refuse an empty block and repeats."""
    from pymc.util import get_value_vars_from_user_vars

    value_vars = list(get_value_vars_from_user_vars(vars, model))
    if not value_vars:
        raise ValueError(
            f"vars must list at least one variable of the model, got {vars!r}; e.g. vars=[theta]"
        )
    seen = set()
    for v in value_vars:
        if v in seen:
            name = model.values_to_rvs[v].name
            raise ValueError(
                f"vars lists {name!r} more than once (got {vars!r}): give each variable of "
                f"the block once, e.g. vars=[{name}]"
            )
        seen.add(v)
    return value_vars


def continuous_value_vars(model, vars, step: str) -> list:
    """Return the value variables of ``vars``; raise if one of them is discrete.

    ``step`` names the step in the message (continuous steps only).
    """
    value_vars = as_value_vars(model, vars)
    for v in value_vars:
        if not v.dtype.startswith("float"):
            rv = model.values_to_rvs[v]
            raise ValueError(
                f"{step} updates continuous variables; {rv.name!r} is discrete "
                f"(dtype {v.dtype}): use SubsampledCategoricalGibbs (or a PyMC Gibbs step) for it"
            )
    return value_vars


def block_terms(model, value_vars, rvs, *, potentials: bool = True) -> list:
    """Return the summed log densities of those ``rvs`` whose log density involves the block.

    Parameters
    ----------
    model : pymc.Model
        The model.
    value_vars : sequence
        The block's value variables.
    rvs : sequence
        Random variables to consider (free, observed, or both).
    potentials : bool
        Also return the model's ``pm.Potential`` terms (summed) that involve the block.

    Returns
    -------
    list
        One scalar graph per variable of ``rvs`` (and per potential) that depends on the block.
    """
    terms = [model.logp(vars=[rv], sum=True) for rv in rvs]
    if potentials and model.potentials:
        terms += [pt.sum(p) for p in model.replace_rvs_by_values(model.potentials)]
    return [t for t in terms if depends_on(t, value_vars)]

r"""Observed variables of different lengths, raced over the union of their rows.

When the observed variables that depend on a block have different numbers of
observations, :math:`N_1, \dots, N_G` (variables of one length form a group,
their terms summed row by row), the log-likelihood is still a sum of
per-observation terms, over the union of the rows,

.. math:: \sum_{g=1}^G \sum_{n=1}^{N_g} \log f^{(g)}_n(\theta)
          = \sum_{m=1}^{N} \log f_m(\theta), \qquad N = N_1 + \dots + N_G,

with union row :math:`m` belonging to one group :math:`g(m)`. :class:`UnionIndex`
rewrites the likelihood graph so that everything downstream (the row-permuted
copy, the races, the expansions, the audits) sees one index of :math:`N` rows:

* each per-observation ``pm.Data`` input :math:`D^{(g)}` (:math:`N_g` rows) of
  group :math:`g` is padded to :math:`N` rows, its own rows at the group's union
  positions and its first row everywhere else (a real row: the branch that is
  not taken stays finite, so gradients through the switch stay finite);
* a per-row label :math:`g(m)` is one more per-observation input;
* the union term is the term of the row's own group on its padded row,
  :math:`\log f_m = \mathrm{switch}(g(m) = 1, \log f^{(1)}_m, \mathrm{switch}(g(m) = 2, \dots))`.

A union row therefore costs :math:`G` evaluations of a term (both branches of
a switch are computed), and the padded copies hold :math:`G` times :math:`N`
rows of the data's columns. The padding is rebuilt from the user's inputs
whenever they change (``pm.set_data``); it is never written by the user.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs

from .blocks import ModelSplitError
from .row_locality import RowMixing, find_row_mixing

__all__ = ["UnionIndex"]


def _first_dim(var) -> int | None:
    value = var.get_value(borrow=True)
    return int(np.shape(value)[0]) if np.ndim(value) >= 1 else None


def _pad(value: np.ndarray, n_total: int, start: int) -> np.ndarray:
    """Return ``n_total`` rows: ``value``'s from ``start`` on, its first row elsewhere."""
    value = np.asarray(value)
    out = np.empty((n_total, *value.shape[1:]), dtype=value.dtype)
    out[...] = value[:1]
    out[start : start + len(value)] = value
    return out


class UnionIndex:
    r"""One index over the rows of observed variables of different lengths.

    Built by :class:`~pymc_subsample.model.terms.ObservationTerms` when the observed
    variables that depend on its block have different numbers of
    observations. Groups are the distinct lengths, in the order the observed
    variables first reach them; the rows of group :math:`g` are union positions
    ``offsets[g]:offsets[g] + lengths[g]``. A union row costs one term
    evaluation per group.

    Parameters
    ----------
    per_obs : sequence of TensorVariable
        The observed variables' per-observation log densities (vectors).
    observed : sequence of str
        Their names, in the same order.
    lengths : sequence of int
        Their numbers of observations.
    data : sequence of pm.Data variables, optional
        The per-observation inputs, as ``ObservationTerms(data=...)``; each is
        assigned to the group of its length whose likelihood reads it.
        Default: every ``pm.Data`` input of a group's likelihood whose first
        dimension is the group's length.

    Attributes
    ----------
    lengths : list of int
        :math:`N_g` per group.
    offsets : list of int
        First union position of each group.
    n_obs : int
        :math:`N = \sum_g N_g`.
    loglik : TensorVariable
        The union terms, a vector of :math:`N` terms.
    data : list
        The union's per-observation inputs: the group label, then the padded inputs.
    user_data : list of list
        Per group, the user's per-observation inputs that the padding copies.

    Raises
    ------
    ModelSplitError
        When a group has no per-observation ``pm.Data`` input, or a ``data``
        entry belongs to no group.
    """

    def __init__(
        self,
        model,
        per_obs: Sequence,
        observed: Sequence[str],
        lengths: Sequence[int],
        data: Sequence | None = None,
    ):
        self._model = model
        order: list[int] = []
        for n in lengths:
            if int(n) not in order:
                order.append(int(n))
        #: group of each observed variable
        self.group_of = [order.index(int(n)) for n in lengths]
        self.names = [
            [o for o, g in zip(observed, self.group_of, strict=True) if g == k]
            for k in range(len(order))
        ]
        group_lps = self._sums(per_obs)
        self.user_data = [
            self._group_data(model, lp, n, names, data)
            for lp, n, names in zip(group_lps, order, self.names, strict=True)
        ]
        if data is not None:
            assigned = {v for group in self.user_data for v in group}
            for d in data:
                var = model[d] if isinstance(d, str) else d
                if var not in assigned:
                    raise ModelSplitError(
                        f"data entry {getattr(var, 'name', d)!r} is not a per-observation input "
                        f"of any observed variable: its first dimension must be the number of "
                        f"observations of one of {self._describe(order)}, and that variable's "
                        "likelihood must read it"
                    )
        if 0 in order:
            raise ModelSplitError(
                f"observed variables depending on the block have different numbers of "
                f"observations ({self._describe(order)}) and one has none: drop it from the "
                "model, or give it its rows, before building the step"
            )
        self.group_lps = group_lps
        self._set_layout(order)
        self.label = pytensor.shared(self._labels(), name="union_group", shape=(None,))
        self.padded = [
            [
                pytensor.shared(
                    _pad(d.get_value(borrow=True), self.n_obs, off),
                    name=f"{d.name}_union",
                    shape=(None, *d.type.shape[1:]),
                )
                for d in group
            ]
            for group, off in zip(self.user_data, self.offsets, strict=True)
        ]
        self.data = [self.label, *[p for group in self.padded for p in group]]
        self.loglik = self._union(group_lps)

    # -- construction -----------------------------------------------------------------

    def _describe(self, lengths: Sequence[int]) -> str:
        return ", ".join(
            f"{'/'.join(names)} ({n} rows)" for names, n in zip(self.names, lengths, strict=True)
        )

    def _sums(self, per_obs: Sequence) -> list:
        """Sum the per-observation log densities of each group, row by row."""
        sums: list = [None] * len(self.names)
        for lp, g in zip(per_obs, self.group_of, strict=True):
            sums[g] = lp if sums[g] is None else sums[g] + lp
        return sums

    @staticmethod
    def _group_data(model, lp, n_rows: int, names: Sequence[str], data) -> list:
        shared = [v for v in graph_inputs([lp]) if isinstance(v, SharedVariable)]
        if data is not None:
            chosen = [model[d] if isinstance(d, str) else d for d in data]
            found = [v for v in chosen if v in shared and _first_dim(v) == n_rows]
        else:
            found = [v for v in shared if _first_dim(v) == n_rows]
        if not found:
            raise ModelSplitError(
                f"no pm.Data input with {n_rows} rows was found in the likelihood of "
                f"{', '.join(names)}: wrap the observed values (and per-observation "
                "covariates) in pm.Data, or pass data=[...]"
            )
        return found

    def _set_layout(self, lengths: Sequence[int]) -> None:
        self.lengths = [int(n) for n in lengths]
        self.offsets = [int(o) for o in np.cumsum([0, *self.lengths[:-1]])]
        self.n_obs = int(sum(self.lengths))

    def _labels(self) -> np.ndarray:
        dtype = np.int8 if len(self.lengths) < 128 else np.int32
        return np.repeat(np.arange(len(self.lengths), dtype=dtype), self.lengths)

    def _union(self, group_lps: Sequence):
        """Return the union terms: each group's terms on its padded inputs, chosen by the label."""
        terms = None
        for g in reversed(range(len(group_lps))):
            replace = dict(zip(self.user_data[g], self.padded[g], strict=True))
            lp = graph_replace(group_lps[g], replace, strict=False)
            terms = lp if terms is None else pt.switch(pt.eq(self.label, g), lp, terms)
        return terms

    def combine(self, per_obs: Sequence):
        """Return the union terms of per-observation log densities, one per observed variable.

        For graphs of the same observed variables rewritten otherwise (e.g. in
        Deterministics of the block): grouped, padded and switched as
        :attr:`loglik`.
        """
        return self._union(self._sums(per_obs))

    def row_mixing(self) -> list[RowMixing]:
        """Apply the graph rule to each group's own likelihood and per-observation inputs."""
        found = []
        for lp, data in zip(self.group_lps, self.user_data, strict=True):
            found += find_row_mixing(lp, data)
        return found

    def group_rows(self, rows: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """Split union rows (:attr:`data` order) into each group's own rows."""
        return [
            [r[off : off + n] for r in rows]
            for off, n in zip(self.offsets, self.lengths, strict=True)
        ]

    def watched(self) -> list:
        """Return the user's per-observation inputs, whose new values :meth:`take_up` pads."""
        return [d for group in self.user_data for d in group]

    # -- checks ----------------------------------------------------------------------------

    def check_padding(self, points: Sequence[dict], value_vars: Sequence, compile_kwargs) -> None:
        """Check that the union terms are each group's own terms at its union positions.

        At each point, on the data as they are: a group whose likelihood fixes
        its number of observations elsewhere than in its ``pm.Data`` inputs
        (``shape=``, a reduction of the rows) would give other terms, or none,
        on padded inputs. Such a model is refused rather than raced.
        """
        fn = self._model.compile_fn(
            [self.loglik, *self.group_lps], inputs=value_vars, point_fn=False, **compile_kwargs
        )
        for point in points:
            try:
                union, *own = fn(*[point[v.name] for v in value_vars])
            except Exception as err:  # noqa: BLE001 (any failure on the padded rows)
                self._refuse_padding(
                    "the terms cannot be evaluated on the padded rows "
                    f"({type(err).__name__}: {err})"
                )
            union = np.asarray(union)
            if union.shape != (self.n_obs,):
                self._refuse_padding(f"the terms have shape {union.shape} on {self.n_obs} rows")
            for g, (lp, off, n) in enumerate(zip(own, self.offsets, self.lengths, strict=True)):
                mine = union[off : off + n]
                if np.shape(lp) != (n,) or not np.allclose(
                    mine, lp, rtol=1e-9, atol=1e-12, equal_nan=True
                ):
                    self._refuse_padding(
                        f"the terms of {'/'.join(self.names[g])} on its union rows differ from "
                        "its own terms"
                    )

    def _refuse_padding(self, what: str) -> None:
        raise ModelSplitError(
            "observed variables of different lengths are raced over the union of their rows "
            f"({self._describe(self.lengths)}), each padded to {self.n_obs} rows; here {what}. "
            "The number of observations of a likelihood must come from its pm.Data inputs "
            "alone: drop a shape= fixed to the number of rows (and any reduction over them), "
            "or update this block with an exact PyMC step"
        )

    # -- new data --------------------------------------------------------------------------

    def take_up(self, counts: Callable[[], Sequence[int]]) -> int:
        r"""Pad the user's current inputs again; return the new :math:`N`.

        ``counts()`` returns the observed variables' numbers of observations
        on the new data (from their own graphs); it is called once each
        group's inputs agree on their rows. Nothing is changed when a check
        fails.

        Raises
        ------
        ValueError
            When a group's inputs no longer have one number of rows, that
            number is not its likelihood's, or a group has no rows.
        """
        new = []
        for g, group in enumerate(self.user_data):
            rows = {d.name: int(np.shape(d.get_value(borrow=True))[0]) for d in group}
            if len(set(rows.values())) > 1:
                detail = ", ".join(f"{name} has {n}" for name, n in rows.items())
                raise ValueError(
                    f"the per-observation data inputs of {', '.join(self.names[g])} no longer "
                    f"have one number of rows ({detail}; they had {self.lengths[g]}). Set every "
                    "one of them to the new number of observations, in one pm.set_data({...}) "
                    "call, before sampling"
                )
            new.append(next(iter(rows.values())))
        lengths = counts()
        for g, n_rows in enumerate(new):
            own = {int(n) for n, k in zip(lengths, self.group_of, strict=True) if k == g}
            if own != {n_rows}:
                raise ValueError(
                    f"the likelihood of {', '.join(self.names[g])} has {sorted(own)} "
                    f"observations, but its per-observation data inputs "
                    f"{[d.name for d in self.user_data[g]]} have {n_rows} rows: the number of "
                    "observations is fixed somewhere else in the model (a shape= or dims "
                    "length); the step cannot take up the new data"
                )
            if n_rows == 0:
                raise ValueError(
                    f"the new data of {', '.join(self.names[g])} have no rows; the step "
                    "cannot race over them"
                )
        self._set_layout(new)
        self.label.set_value(self._labels(), borrow=True)
        for group, padded, off in zip(self.user_data, self.padded, self.offsets, strict=True):
            for d, p in zip(group, padded, strict=True):
                p.set_value(_pad(d.get_value(borrow=True), self.n_obs, off), borrow=True)
        return self.n_obs

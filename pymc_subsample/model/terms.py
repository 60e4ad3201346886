r"""Per-observation log-likelihood terms of a PyMC model, evaluated on index subsets.

For value variables :math:`\theta` (the block a step updates), the model's
log density splits into the terms that involve :math:`\theta`:

.. math:: \log \tilde p(\theta) = \log f_0(\theta) + \sum_{n=1}^N \log f_n(\theta),

with :math:`\log f_n` the log-likelihood of observation :math:`n` (summed over
every observed variable that depends on :math:`\theta` and over trailing event
dimensions) and :math:`\log f_0` everything else that involves :math:`\theta`
(its prior, Jacobian, and the log densities of other free variables whose
parameters depend on it). :class:`ObservationTerms` compiles, for
candidates :math:`\theta_1..\theta_K` (a leading batch dimension):

* :meth:`~ObservationTerms.loglik_subset`: :math:`\log f_n(\theta_k)` on
  observations ``idx``, shape ``(K, len(idx))``: every per-observation data
  input :math:`D` (a ``pm.Data`` with :math:`N` rows) is gathered as
  ``D[idx]`` and passed to a function compiled with those rows as inputs, so
  the cost grows with ``len(idx)``, not with :math:`N`;
* :meth:`~ObservationTerms.loglik_batch`: the same on positions of a
  row-permuted copy of the data: whole random blocks of rows (the layout
  races read by default) or a contiguous window (a slice, no gather);
* :meth:`~ObservationTerms.loglik_full`: all :math:`N` observations, ``(K, N)``;
* :meth:`~ObservationTerms.loglik_sum`: :math:`\sum_n \log f_n(\theta_k)`,
  shape ``(K,)``, summed inside the compiled graph (one fused pass, in chunks of
  rows that stay in cache: :class:`~pymc_subsample.model.chunked_sum.ChunkedSum`);
* :meth:`~ObservationTerms.log_f0`: :math:`\log f_0(\theta_k)`, shape ``(K,)``.

All of them take the other value variables from a point dictionary.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors, graph_inputs

from ..racing.compiled import CompiledRewards
from ..validation import ArgumentTypeError, check_choice
from .batched import vectorize_per_point
from .chunked_sum import ChunkedSum
from .row_locality import LAG_FIX, equivariance_failure, find_row_mixing
from .union import UnionIndex

__all__ = [
    "BATCH_LAYOUTS",
    "LOCALITY_ROWS",
    "MAX_SECOND_ORDER_INPUTS",
    "ModelSplitError",
    "TAYLOR_CHUNK_ROWS",
    "ObservationTerms",
    "block_terms",
    "check_expand_in",
    "continuous_value_vars",
    "model_deterministics",
]

#: Names accepted by ``ObservationTerms(batches=...)``.
BATCH_LAYOUTS = ("blocks", "random", "windows")

#: Draws from the prior at which :meth:`ObservationTerms._check_row_locality` checks the terms.
LOCALITY_DRAWS = 3

#: Rows of the data on which :meth:`ObservationTerms._check_row_locality` checks the terms
#: (all of them when there are fewer).
LOCALITY_ROWS = 2**16

#: Rows per call of the exact Taylor sums (:meth:`ObservationTerms.taylor_sums`): their
#: gradient and Hessian graphs hold arrays of the rows they read, a few per coordinate.
TAYLOR_CHUNK_ROWS = 2**16

#: Largest number of coordinates of the other inputs for which the expansion of
#: :meth:`ObservationTerms.expansion_residual_batch` is of second order.
MAX_SECOND_ORDER_INPUTS = 400


def _per_observation(lp):
    """Sum a log density over every axis but the first (the observations')."""
    return lp.sum(axis=tuple(range(1, lp.ndim))) if lp.ndim > 1 else lp


def _flat_graph(values: Sequence):
    """Return the graphs ``values`` raveled and concatenated as one float64 vector."""
    return pt.concatenate([pt.cast(v, "float64").ravel() for v in values])


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
        draw = compile_pymc([], outputs, random_seed=seed)
        return [dict(zip(names, draw(), strict=True)) for _ in range(n)]
    except Exception:  # noqa: BLE001 (any failure to sample the prior: check at fewer points)
        return []


def _slice_rows(positions: slice, n_obs: int) -> np.ndarray:
    """Return the int64 indices of a slice of ``n_obs`` positions."""
    return np.arange(*positions.indices(n_obs), dtype=np.int64)


def _rows_view(buf: np.ndarray) -> np.ndarray:
    """Return ``buf`` (C-contiguous) as a 1-D array with one element per row, for shuffles."""
    if buf.ndim == 1 or len(buf) == 0 or buf[0].nbytes == 0:
        return buf
    return buf.reshape(len(buf), -1).view(np.dtype((np.void, buf[0].nbytes))).reshape(len(buf))


def _release_copies(shared: Sequence) -> None:
    """Give the permuted copies' shared variables empty arrays (their buffers are freed)."""
    for p in shared:
        value = p.get_value(borrow=True)
        p.set_value(np.empty((0, *np.shape(value)[1:]), dtype=value.dtype), borrow=True)


def _own_buffer(buf: np.ndarray, src: np.ndarray) -> bool:
    """Return True when ``buf`` can receive a copy of ``src`` in place (a buffer of its own)."""
    return (
        isinstance(buf, np.ndarray)
        and buf.shape == src.shape
        and buf.dtype == src.dtype
        and buf.flags.c_contiguous
        and buf.flags.writeable
        and not np.may_share_memory(buf, src)
    )


class ModelSplitError(ValueError):
    """The model's likelihood cannot be split into per-observation terms."""


def _as_value_vars(model, vars) -> list:
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


def _missing_data_fix(name: str) -> str:
    """Return what to do with missing values of a subsampled likelihood (``name``: where)."""
    return (
        f"{name} holds missing values (NaN or masked entries), which a subsampled likelihood "
        "cannot evaluate and pm.Data does not accept: drop those rows (from every "
        "per-observation input, observed values and covariates alike) before wrapping the "
        "data in pm.Data, or model the missing values outside the subsampled likelihood (a "
        "separate observed variable for the incomplete rows, updated by an exact step)"
    )


def _has_missing(value) -> bool:
    """Return True for a masked array or a float array with a NaN (no N booleans made)."""
    if np.ma.isMaskedArray(value):
        return True
    value = np.asarray(value)
    if value.dtype.kind not in "fc" or value.size == 0:
        return False
    if not np.isnan(np.add.reduce(value, axis=None)):
        return False
    return bool(np.isnan(value).any())  # NaN sum: a NaN entry, or +inf and -inf


def continuous_value_vars(model, vars, step: str) -> list:
    """Return the value variables of ``vars``; raise if one of them is discrete.

    ``step`` names the step in the message (continuous steps only).
    """
    value_vars = _as_value_vars(model, vars)
    for v in value_vars:
        if not v.dtype.startswith("float"):
            rv = model.values_to_rvs[v]
            raise ValueError(
                f"{step} updates continuous variables; {rv.name!r} is discrete "
                f"(dtype {v.dtype}): use SubsampledCategoricalGibbs (or a PyMC Gibbs step) for it"
            )
    return value_vars


def _depends_on(graph, variables) -> bool:
    targets = set(variables)
    return any(a in targets for a in ancestors([graph]))


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
    return [t for t in terms if _depends_on(t, value_vars)]


class ObservationTerms:
    r"""Per-observation log-likelihood terms of a block of variables, on index subsets.

    Parameters
    ----------
    model : pymc.Model
        The model.
    vars : sequence of variables
        The block (random variables or their value variables).
    data : sequence of pm.Data variables or names, optional
        The per-observation data inputs (observed values and covariates whose
        first dimension indexes observations). Default: every ``pm.Data``
        (shared variable) in the likelihood whose first dimension equals
        :math:`N`.
    initial_point : dict, optional
        Point used to find :math:`N` and to check the subset graph.
    compile_kwargs : dict, optional
        Passed to ``model.compile_fn``.
    batches : {"blocks", "random", "windows"}
        ``"blocks"`` (default) and ``"windows"`` keep a row-permuted copy of
        every per-observation data input (memory: one more copy of them, and
        no index array of :math:`N` entries: the permutation is kept as the
        state of the generator that drew it); :meth:`shuffle` redraws the
        permutation in place, one pass that moves every row.
        :meth:`loglik_batch` then reads positions of the copy: whole blocks
        of rows (gathered in runs: dearer per term than a window, cheaper
        than scattered rows; see the results pages) or contiguous slices
        (``"windows"``, no gather).
        ``"random"`` keeps no copy and no index array (positions are rows):
        batches are gathers of scattered rows (dearer per term: a cache miss
        per row), for data that do not fit twice in memory.

    Attributes
    ----------
    vars : list
        The block's value variables.
    n_obs : int
        :math:`N`.
    observed : list of str
        Names of the observed variables whose terms are raced.
    data : list
        The per-observation data inputs that are indexed.
    inputs : list
        The other value variables the terms depend on (read from the point).

    Notes
    -----
    Observed variables of different lengths :math:`N_1, \dots, N_G` that
    depend on the block are raced over the union of their rows,
    :math:`N = \sum_g N_g` (:class:`~pymc_subsample.model.union.UnionIndex`): their
    per-observation inputs are padded to :math:`N` rows and a per-row group
    label chooses each row's term. A union row then costs :math:`G` term
    evaluations, and the padded copies hold :math:`G N` rows. The row rules
    are checked on each group's own graph and rows.

    Raises
    ------
    ModelSplitError
        When no observed variable depends on the block, it has no
        observations (:math:`N = 0`), the data hold missing values (NaN or
        masked entries), observed data or covariates are NumPy arrays baked
        into the graph, the subset graph disagrees with the full one
        (per-observation latent variables, observations coupled through a
        time-series likelihood, a per-observation input that is not indexed),
        or observed variables of different lengths cannot be padded to the
        union of their rows (a ``shape=`` fixed to a number of observations).
    """

    def __init__(
        self,
        model,
        vars: Sequence,
        *,
        data: Sequence | None = None,
        initial_point: dict | None = None,
        compile_kwargs: dict | None = None,
        batches: str = "blocks",
    ):
        check_choice("batches", batches, BATCH_LAYOUTS)
        self.batches = batches
        self.vars = _as_value_vars(model, vars)
        point = model.initial_point() if initial_point is None else initial_point
        compile_kwargs = dict(compile_kwargs or {})
        compile_kwargs.setdefault("on_unused_input", "ignore")
        names = ", ".join(v.name for v in self.vars)

        per_obs, scalar_obs, observed, per_obs_rvs = [], [], [], []
        for rv in model.observed_RVs:
            [lp] = model.logp(vars=[rv], sum=False)
            if not _depends_on(lp, self.vars):
                continue
            if lp.ndim == 0:
                scalar_obs.append(lp)
                continue
            self._reject_numpy_observed(model, rv)
            per_obs.append(_per_observation(lp))
            observed.append(rv.name)
            per_obs_rvs.append(rv)
        if not per_obs:
            raise ModelSplitError(
                f"no observed variable with per-observation terms depends on {names}: "
                "there is nothing to subsample; use an exact PyMC step for it"
            )
        self.observed = observed
        self._observed_rvs = per_obs_rvs

        value_vars = model.value_vars
        self._value_vars = value_vars
        lengths = self._lengths(model, per_obs, point, compile_kwargs)
        #: observed variables of different lengths: one index over the union of their rows
        self._union: UnionIndex | None = None
        if len(set(lengths)) > 1:
            self._union = UnionIndex(model, per_obs, observed, lengths, data)
            self.n_obs = self._union.n_obs
            loglik = self._union.loglik
        else:
            self.n_obs = int(lengths[0])
            loglik = per_obs[0]
            for lp in per_obs[1:]:
                loglik = loglik + lp

        exact_terms = block_terms(model, self.vars, model.free_RVs) + scalar_obs
        log_f0 = pt.add(*exact_terms) if len(exact_terms) > 1 else exact_terms[0]

        shared = [v for v in graph_inputs([loglik]) if isinstance(v, SharedVariable)]
        if self._union is None:
            self.data = self._find_data(model, loglik, data, observed)
            self._reject_numpy_inputs(loglik, observed)
            self._mixing = find_row_mixing(loglik, self.data)
            own = self.data
        else:  # the union's label and padded inputs; checks on each group's own graph
            self.data = self._union.data
            for lp, names_g, n in zip(
                self._union.group_lps, self._union.names, self._union.lengths, strict=True
            ):
                self._reject_numpy_inputs(lp, names_g, n)
            self._mixing = self._union.row_mixing()
            own = self._union.watched()
            shared = [v for v in shared if v not in self.data]
        self._check_rows(self.n_obs)
        self._reject_row_mixing(names)
        #: every pm.Data input of the terms, the per-observation ones first (:meth:`data_unchanged`)
        self.watched = own + [v for v in shared if v not in own]
        self._watch_data()

        idx = pt.lvector("idx")
        subset = graph_replace(loglik, {d: d[idx] for d in self.data}, strict=False)
        self._graphs = (idx, subset, log_f0)
        self._loglik = loglik
        start, stop = pt.lscalar("start"), pt.lscalar("stop")
        # the row permutation is kept as the RNG state that drew it (materialised, as int32
        # below 2**31 rows, only when positions_to_rows asks): the copies hold its effect
        self._perm_state = None
        self._perm = None
        self._permuted = []
        if batches in ("blocks", "windows"):
            # the data themselves until the first shuffle, which gives the copies buffers of
            # their own: the checks of the construction do not hold a copy meanwhile
            self._permuted = [
                pytensor.shared(d.get_value(borrow=True), name=f"{d.name}_permuted", borrow=True)
                for d in self.data
            ]
        self._permuted_values = [p.get_value(borrow=True) for p in self._permuted]
        if self._permuted:
            # compiled functions read the copies through these shared variables, and Numba keeps
            # what it compiled (and so them) after the terms are gone: free the buffers then
            weakref.finalize(self, _release_copies, list(self._permuted))
            window = graph_replace(
                loglik,
                {d: p[start:stop] for d, p in zip(self.data, self._permuted, strict=True)},
                strict=False,
            )
        windows = batches == "windows"
        # the first positions of the permuted copy (a uniformly random subset), for sums over
        # a window; races read windows of it only with batches="windows"
        self._first_positions = (start, stop, window) if self._permuted else None
        self._window_graph = self._first_positions if windows else None
        self._model = model
        self._compile_kwargs = compile_kwargs
        self._grad_fn = None
        self._expansion_fns = None
        self._expansion_vars: list = []
        self._psi_fn = None
        self._psi_memo: tuple = (None, None)
        self._taylor_fns: dict = {}  # by whether in coordinates (Deterministics) of the block
        self._build_taylor_gather: dict = {}
        self._f0_grad_fn = None
        self._cands = [
            pt.tensor(name=f"{v.name}_candidates", dtype=v.dtype, shape=(None, *v.type.shape))
            for v in self.vars
        ]
        batch = dict(zip(self.vars, self._cands, strict=True))
        # a race's gathered rows enter as inputs: numpy gathers them, and the compiled
        # function only evaluates
        self._row_inputs = [
            pt.tensor(name=f"{d.name}_rows", dtype=d.dtype, shape=(None, *d.type.shape[1:]))
            for d in self.data
        ]
        rows = graph_replace(loglik, dict(zip(self.data, self._row_inputs, strict=True)))
        # the fused sum of the rows it is given: with a permuted copy, loglik_sum passes it
        # (the same sum), so that a race that ends in an exact pass touches one copy of the
        # data, not two
        graphs = [rows, loglik, log_f0, rows.sum(axis=-1)] + ([window] if windows else [])
        outs = [vectorize_per_point(g, batch) for g in graphs]
        used = set()
        for g in outs:
            used |= set(graph_inputs([g]))
        self.inputs = [v for v in value_vars if v in used and v not in self.vars]
        self._input_names = [v.name for v in self.inputs]
        f0_inputs = set(graph_inputs([outs[2]]))
        #: True when log f0 depends on the candidates alone (no other value variable and no
        #: shared variable such as a pm.Data prior): the same at every point.
        self.log_f0_is_constant = not any(
            isinstance(v, SharedVariable) or v in value_vars for v in f0_inputs - set(self._cands)
        )
        self._rows_fn = self._compile(outs[0], [*self._cands, *self._row_inputs, *self.inputs])
        self._exact_fn = self._compile(outs[2], [*self._cands, *self.inputs])
        self._totals_fn = self._compile(outs[3], [*self._cands, *self._row_inputs, *self.inputs])
        self._sum_rows = ChunkedSum(
            self._totals_fn, len(self._cands), len(self.data), len(self.inputs)
        )
        self._window_fn = None
        if windows:
            self._window_fn = self._compile(outs[4], [*self._cands, start, stop, *self.inputs])
        self._cand_dtypes = [v.dtype for v in self.vars]
        self._input_dtypes = [v.dtype for v in self.inputs]
        if self._union is not None:
            self._union.check_padding(
                [point, *prior_points(model, LOCALITY_DRAWS, seed=0)], value_vars, compile_kwargs
            )
        self._check_row_locality(point, names)

    # -- construction helpers -------------------------------------------------

    @staticmethod
    def _reject_numpy_observed(model, rv) -> None:
        value = model.rvs_to_values[rv]
        base = rv.name.removesuffix("_observed")
        imputed = base != rv.name and f"{base}_unobserved" in model.named_vars
        if isinstance(value, Constant) and (imputed or _has_missing(value.data)):
            raise ModelSplitError(
                _missing_data_fix(f"the observed data of {base!r}")
                + (
                    f" (PyMC split {base!r} into {rv.name!r} and the imputed '{base}_unobserved')"
                    if imputed
                    else ""
                )
            )
        if isinstance(value, Constant) and np.ndim(value.data) >= 1:
            raise ModelSplitError(
                f"the observed data of {rv.name!r} is a NumPy array baked into the graph, so its "
                f"terms cannot be evaluated on a subset: wrap it in pm.Data "
                f"(e.g. y = pm.Data('{rv.name}_data', values); "
                f"pm.Normal('{rv.name}', ..., observed=y))"
            )

    def _lengths(self, model, per_obs, point, compile_kwargs) -> list[int]:
        """Return the observed variables' numbers of observations (kept: data may change)."""
        self._lengths_fn = model.compile_fn(
            [lp.shape[0] for lp in per_obs],
            inputs=self._value_vars,
            point_fn=False,
            **compile_kwargs,
        )
        return [int(n) for n in self._lengths_fn(*[point[v.name] for v in self._value_vars])]

    def _find_data(self, model, loglik, data, observed) -> list:
        shared = [v for v in graph_inputs([loglik]) if isinstance(v, SharedVariable)]
        if data is not None:
            known = [n for n, v in model.named_vars.items() if isinstance(v, SharedVariable)]
            if isinstance(data, str) or not isinstance(data, Sequence):
                raise ArgumentTypeError(
                    f"data must be a list of pm.Data variables or their names, got {data!r}; "
                    f"e.g. data={known[:2]!r}"
                )
            found = []
            for d in data:
                if isinstance(d, str) and d not in model.named_vars:
                    raise ModelSplitError(
                        f"data entry {d!r} is not a variable of the model; its pm.Data "
                        f"variables are {known}"
                    )
                var = model[d] if isinstance(d, str) else d
                if not isinstance(var, SharedVariable):
                    raise ModelSplitError(
                        f"data entry {d!r} is not a pm.Data variable; pass pm.Data variables "
                        f"or their names: {known}"
                    )
                if var not in shared:
                    raise ModelSplitError(
                        f"data entry {var.name!r} is not an input of the likelihood of "
                        f"{', '.join(observed)}"
                    )
                if np.shape(var.get_value(borrow=True))[:1] != (self.n_obs,):
                    raise ModelSplitError(
                        f"data entry {var.name!r} has shape {np.shape(var.get_value())}; "
                        f"its first dimension must index the {self.n_obs} observations"
                    )
                found.append(var)
            return found
        found = [
            v
            for v in shared
            if np.ndim(v.get_value(borrow=True)) >= 1
            and np.shape(v.get_value(borrow=True))[0] == self.n_obs
        ]
        if not found:
            raise ModelSplitError(
                f"no pm.Data input with {self.n_obs} rows was found in the likelihood of "
                f"{', '.join(observed)}: wrap the observed values (and per-observation "
                "covariates) in pm.Data, or pass data=[...]"
            )
        return found

    def _reject_numpy_inputs(self, loglik, observed, n_obs: int | None = None) -> None:
        n_obs = self.n_obs if n_obs is None else n_obs
        for v in graph_inputs([loglik]):
            if (
                isinstance(v, Constant)
                and np.ndim(v.data) >= 1
                and np.shape(v.data)[0] == n_obs
                and n_obs > 1
            ):
                raise ModelSplitError(
                    f"a NumPy array with {n_obs} rows (shape {np.shape(v.data)}) is baked "
                    f"into the likelihood of {', '.join(observed)}, e.g. covariates passed as "
                    "a NumPy array: wrap it in pm.Data so that it can be indexed by observation"
                )

    def _reject_row_mixing(self, names: str) -> None:
        """Refuse terms whose graph certainly reads other observations' rows."""
        definite = [m for m in self._mixing if m.definite]
        if definite:
            found = "; ".join(m.describe() for m in definite)
            raise ModelSplitError(
                f"the likelihood terms of {', '.join(self.observed)} (for {names}) read other "
                f"observations' rows: {found}. {LAG_FIX}"
            )

    def _check_row_locality(self, point: dict, names: str) -> None:
        r"""Check numerically that the terms are row-local, at several parameter values.

        At the initial point and at :data:`LOCALITY_DRAWS` draws from the
        prior (a lag coefficient at its initial value 0 hides the lag), the
        terms must be permutation-equivariant in the rows and a subset's
        terms the full terms on those rows
        (:func:`~pymc_subsample.model.row_locality.equivariance_failure`). This
        also catches what the graph rule leaves unverified, and inputs with
        :math:`N` rows that are not indexed. Above :data:`LOCALITY_ROWS` rows
        the "full" data are those rows drawn at random (in their order): terms
        that read other rows (a lag, a statistic of the column) differ there
        too, and the check holds no array of :math:`N` terms.
        """
        rng = np.random.default_rng(0)
        rows = self._data_rows()
        # over the union of rows of different lengths: each group's own rows, checked apart
        parts = [rows] if self._union is None else self._union.group_rows(rows)
        for i, part in enumerate(parts):
            n_part = len(part[0]) if part else 0
            if n_part > LOCALITY_ROWS:  # the data restricted to random rows, kept in order
                keep = np.sort(rng.choice(n_part, size=LOCALITY_ROWS, replace=False))
                parts[i] = [r.take(keep, axis=0) for r in part]
        for at in [point, *prior_points(self._model, LOCALITY_DRAWS, seed=0)]:
            cands = [np.asarray(at[v.name], dtype=v.dtype)[None] for v in self.vars]
            others = [
                np.asarray(at[n], dtype=d)
                for n, d in zip(self._input_names, self._input_dtypes, strict=True)
            ]
            for part in parts:
                try:
                    failure = equivariance_failure(
                        lambda r, c=cands, o=others: self._rows_fn(*c, *r, *o), part, rng
                    )
                except Exception as err:  # the terms could not even be evaluated on a subset
                    failure = f"evaluating them on a subset failed ({type(err).__name__}: {err})"
                if failure is not None:
                    self._refuse_not_local(at, names, failure)

    def _refuse_not_local(self, point: dict, names: str, failure: str) -> None:
        counts = [self.n_obs] if self._union is None else self._union.lengths
        latent = [
            n
            for n in self._input_names
            if np.ndim(point[n]) >= 1 and np.shape(point[n])[0] in counts
        ]
        if latent:
            raise ModelSplitError(
                f"the likelihood of {', '.join(self.observed)} depends on per-observation "
                f"latent variable(s) {latent}: their terms are not functions of {names} and the "
                f"data alone ({failure}). Subsampling does not apply; marginalize them or use "
                "exact steps"
            )
        unverified = [m.describe() for m in self._mixing]
        detail = f" The graph has {'; '.join(unverified)}." if unverified else ""
        foreign = [
            f"{v.name!r} ({np.shape(v.get_value(borrow=True))[0]} rows)"
            for v in graph_inputs([self._loglik])
            if isinstance(v, SharedVariable)
            and np.ndim(v.get_value(borrow=True)) >= 1
            and v not in self.data
        ]
        indexed = [d.name for d in (self.data if self._union is None else self._union.watched())]
        if foreign:
            detail += (
                f" Inputs read whole, not by observation: {', '.join(foreign)}; a slice of "
                "one of them aligned with the observations is a lag."
            )
        raise ModelSplitError(
            f"the likelihood terms of {', '.join(self.observed)} are not row-local: {failure} "
            "at a draw from the prior, so term n reads more than row n of the data "
            f"(indexed inputs: {indexed}).{detail} If a per-observation "
            "pm.Data input is missing from the indexed ones, pass data=[...] listing every one. "
            + LAG_FIX
        )

    # -- evaluation -------------------------------------------------------------

    def _exact_arrays(self, candidates, point) -> list:
        """Return the inputs as ndarrays of the compiled dtypes."""
        cands = [np.asarray(c, dtype=d) for c, d in zip(candidates, self._cand_dtypes, strict=True)]
        return cands, self._other_arrays(point)

    def _compile(self, outputs, inputs: Sequence, trust: bool = True):
        """Compile ``outputs`` as a function of ``inputs`` (positional, no point function).

        With ``trust``, without PyTensor's checks of the inputs (about 5 µs an
        input a call): every caller passes ndarrays of the compiled dtypes
        (:meth:`_exact_arrays`, :meth:`_other_arrays`).
        """
        fn = self._model.compile_fn(outputs, inputs=inputs, point_fn=False, **self._compile_kwargs)
        fn.trust_input = trust
        return fn

    def _other_arrays(self, point) -> list:
        """Return the other inputs' values as ndarrays of the compiled dtypes."""
        return [
            np.asarray(point[n], dtype=d)
            for n, d in zip(self._input_names, self._input_dtypes, strict=True)
        ]

    # -- data set with pm.set_data ------------------------------------------------

    def _check_rows(self, n_obs: int) -> None:
        """Refuse data without observations, or with missing values (NaN or masked entries).

        At construction and whenever new data are taken up (:meth:`take_up_data`):
        the one place where both are checked.
        """
        observed = ", ".join(repr(o) for o in self.observed)
        if n_obs < 1:
            raise ModelSplitError(
                f"the likelihood of {observed} has no observations (N = 0): there is nothing "
                "to subsample; give it at least one row (pm.set_data) or use an exact step"
            )
        for d in self.data:
            if _has_missing(d.get_value(borrow=True)):
                raise ModelSplitError(_missing_data_fix(f"the data input {d.name!r}"))

    def _watch_data(self) -> None:
        """Remember the array behind every watched input (held: an id could be reused)."""
        self._watch = tuple((v.container.storage, v.get_value(borrow=True)) for v in self.watched)

    def data_unchanged(self) -> bool:
        """Return True when every pm.Data input still holds the array the terms last took up.

        ``pm.set_data`` (``set_value``) puts a new array behind the input, so
        an identity test per input sees it (a fraction of a microsecond);
        writing into the array in place is not seen (call the step's
        ``data_changed`` then).
        """
        for storage, seen in self._watch:
            if storage[0] is not seen:
                return False
        return True

    def take_up_data(self, point: dict) -> tuple[list[str], int, int]:
        r"""Take up the current values of the pm.Data inputs: :math:`N` and the permuted copies.

        The compiled functions read the rows as inputs (or the shared
        copies), so nothing is compiled again; :math:`N` is read from the
        likelihood's shape at ``point`` (a full point of the model). The
        permuted copies hold the new rows in data order until the next
        :meth:`shuffle`.

        Returns
        -------
        tuple
            ``(changed, old_n, new_n)``: names of the inputs whose array
            changed, :math:`N` before and after.

        Raises
        ------
        ValueError
            When the per-observation inputs no longer have one common number
            of rows, have none, hold missing values (NaN or masked entries,
            :class:`ModelSplitError`), or the likelihood cannot be evaluated
            on the new data; the terms are left as they were.
        """
        changed = [
            v.name
            for v, (storage, seen) in zip(self.watched, self._watch, strict=True)
            if storage[0] is not seen
        ]
        old_n = self.n_obs
        if self._union is not None:  # pad the user's inputs again: the union's own inputs
            self._union.take_up(lambda: self._counts_on_new_data(point))
        rows = {d.name: int(np.shape(d.get_value(borrow=True))[0]) for d in self.data}
        if len(set(rows.values())) > 1:
            detail = ", ".join(f"{name} has {n}" for name, n in rows.items())
            moved = [name for name, n in rows.items() if n != old_n]
            raise ValueError(
                f"the per-observation data inputs of {', '.join(self.observed)} no longer have "
                f"one number of rows ({detail}; they had {old_n}): {moved} changed length "
                "alone. Set every one of them to the new number of observations, in one "
                "pm.set_data({...}) call, before sampling"
            )
        lengths = self._counts_on_new_data(point) if self._union is None else []
        new_n = next(iter(rows.values()))
        if any(int(n) != new_n for n in lengths):
            raise ValueError(
                f"the likelihood of {', '.join(self.observed)} has {[int(n) for n in lengths]} "
                f"observations, but its per-observation data inputs "
                f"{[d.name for d in self.data]} have {new_n} rows: the number of observations "
                "is fixed somewhere else in the model (a shape= or dims length); the step "
                "cannot take up the new data"
            )
        self._check_rows(new_n)
        self.n_obs = new_n
        self._perm_state = None  # the identity until the next shuffle
        self._perm = None
        # the copies share the new arrays until the next shuffle, which gives them their own
        for d, p in zip(self.data, self._permuted, strict=False):  # none with "random"
            p.set_value(d.get_value(borrow=True), borrow=True)
        self._permuted_values = [p.get_value(borrow=True) for p in self._permuted]
        self._sum_rows.reset()
        self._watch_data()
        return changed, old_n, new_n

    def _counts_on_new_data(self, point: dict) -> list[int]:
        """Return the observed variables' numbers of observations on the data as they are now."""
        try:
            return [int(n) for n in self._lengths_fn(*[point[v.name] for v in self._value_vars])]
        except Exception as err:
            raise ValueError(
                f"the likelihood of {', '.join(self.observed)} cannot be evaluated on the new "
                f"data ({type(err).__name__}: {err}); the step cannot take them up"
            ) from err

    def shuffle(self, rng: np.random.Generator) -> None:
        """Redraw the row permutation behind :meth:`loglik_batch` (one pass over the data).

        Every window of positions read from a uniformly random start is then a
        uniformly random subset of observations drawn without replacement.
        Without a permuted copy (``batches="random"``) there is nothing to
        redraw: every race draws its own uniformly random rows.

        The copies are rewritten in place (the data copied in, then their rows
        shuffled, every input by the same draws): no index array of length
        :math:`N` and no second copy is allocated. The permutation is the one
        ``rng.permutation(N)`` would return, and ``rng`` ends in the same state.
        """
        if not self._permuted:
            return
        state = rng.bit_generator.state
        for d, p in zip(self.data, self._permuted, strict=True):
            src = d.get_value(borrow=True)
            buf = p.get_value(borrow=True)
            if not _own_buffer(buf, src):
                buf = np.empty_like(src, order="C")
                p.set_value(buf, borrow=True)
            np.copyto(buf, src)
            rng.bit_generator.state = state
            rng.shuffle(_rows_view(buf))
        self._perm_state = (type(rng.bit_generator), state)
        self._perm = None
        # the arrays behind the copies, read by every gather (set only here)
        self._permuted_values = [p.get_value(borrow=True) for p in self._permuted]

    def permutation(self) -> np.ndarray:
        """Return the current row permutation: position ``i`` of the copies holds its row.

        Materialised on first call after a :meth:`shuffle` (int32 below
        :math:`2^{31}` rows) from the RNG state that drew it; the identity
        without a permuted copy.
        """
        if self._perm is None:
            dtype = np.int32 if self.n_obs < 2**31 else np.int64
            perm = np.arange(self.n_obs, dtype=dtype)
            if self._perm_state is not None and self._permuted:
                kind, state = self._perm_state
                gen = np.random.Generator(kind())
                gen.bit_generator.state = state
                gen.shuffle(perm)
            self._perm = perm
        return self._perm

    def loglik_subset(
        self, candidates: Sequence[np.ndarray], idx: np.ndarray, point: dict
    ) -> np.ndarray:
        r"""Terms :math:`\log f_n(\theta_k)` on observations ``idx`` (rows of the data).

        Through the full function when ``idx`` covers a third of :math:`N`
        (gathering most rows costs more than evaluating all of them).

        Parameters
        ----------
        candidates : sequence of numpy.ndarray
            One array per block variable, shape ``(K, *var.shape)``.
        idx : numpy.ndarray
            int64 observation indices.
        point : dict
            Values of the other value variables.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, len(idx))``.
        """
        if 3 * len(idx) >= self.n_obs:
            return self.loglik_full(candidates, point)[:, idx]
        cands, others = self._exact_arrays(candidates, point)
        idx = np.asarray(idx, dtype=np.int64)
        # ndarray.take gathers rows of a matrix about five times faster than fancy indexing
        rows = [d.get_value(borrow=True).take(idx, axis=0) for d in self.data]
        return self._rows_fn(*cands, *rows, *others)

    def loglik_batch(
        self, candidates: Sequence[np.ndarray], positions: slice | np.ndarray, point: dict
    ) -> np.ndarray:
        r"""Terms on the observations at ``positions`` of the current row permutation.

        Parameters
        ----------
        candidates : sequence of numpy.ndarray
            One array per block variable, shape ``(K, *var.shape)``.
        positions : slice or numpy.ndarray
            A contiguous window (read from the permuted copy, no gather) or
            int64 positions (gathered, e.g. a window that wraps around).
        point : dict
            Values of the other value variables.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, n)`` for ``n`` positions.
        """
        if isinstance(positions, slice):
            if not self._permuted:  # positions are rows
                return self.loglik_subset(candidates, _slice_rows(positions, self.n_obs), point)
            if self._window_fn is None:  # a slice of the copies: views, no gather
                cands, others = self._exact_arrays(candidates, point)
                rows = [p[positions] for p in self._permuted_values]
                return self._rows_fn(*cands, *rows, *others)
            cands, others = self._exact_arrays(candidates, point)
            start = np.asarray(positions.start, dtype=np.int64)
            stop = np.asarray(positions.stop, dtype=np.int64)
            return self._window_fn(*cands, start, stop, *others)
        if self._permuted:  # whole blocks (or a window across the end) of the permuted copy
            positions = np.asarray(positions, dtype=np.int64)
            rows = [p.take(positions, axis=0) for p in self._permuted_values]
            cands, others = self._exact_arrays(candidates, point)
            return self._rows_fn(*cands, *rows, *others)
        return self.loglik_subset(candidates, positions, point)

    def _at_positions(self, positions, window, get_gather, head, tail) -> np.ndarray:
        """Call ``window(*head, start, stop, *tail)`` on a slice of the permuted copy.

        Otherwise (no copy, or int positions) ``get_gather()(*head, idx, *tail)``
        with ``idx`` the positions: the gather reads the permuted copies
        (:meth:`_on_batches`), or the data rows without a copy.
        """
        if isinstance(positions, slice):
            if window is not None:
                start = np.asarray(positions.start, dtype=np.int64)
                stop = np.asarray(positions.stop, dtype=np.int64)
                return window(*head, start, stop, *tail)
            positions = _slice_rows(positions, self.n_obs)
        return get_gather()(*head, np.asarray(positions, dtype=np.int64), *tail)

    def positions_to_rows(self, positions: slice | np.ndarray) -> np.ndarray:
        """Return the data rows at ``positions`` of the current row permutation.

        Without a permuted copy (``batches="random"``) the permutation is the
        identity and index arrays are returned as they are (slices as index
        arrays). With one, the permutation is materialised on first use
        (:meth:`permutation`).
        """
        if not self._permuted:
            if isinstance(positions, slice):
                return _slice_rows(positions, self.n_obs)
            return positions
        return self.permutation()[positions]

    def compiled_rows(self) -> CompiledRewards | None:
        """Return the rows function's Numba kernel on the permuted copies (random blocks).

        For :func:`~pymc_subsample.racing.compiled.race_compiled`: None without
        a row-permuted copy read as blocks, or when the rows function was not
        compiled by Numba, or when the kernel reads more than the candidates,
        the gathered rows of every per-observation input and :meth:`other_arrays`
        (e.g. a ``dims`` length or another ``pm.Data`` that PyTensor passes as an
        input of its own): the Python race serves those.
        """
        jit_fn = getattr(getattr(self._rows_fn, "vm", None), "jit_fn", None)
        if jit_fn is None or self.batches != "blocks" or not self._permuted:
            return None
        expected = len(self._cands) + len(self.data) + len(self.inputs)
        fgraph = getattr(getattr(self._rows_fn, "maker", None), "fgraph", None)
        if fgraph is None or len(fgraph.inputs) != expected:  # shared inputs of its own
            return None
        return CompiledRewards(jit_fn, self._permuted_values)

    def permuted_rows(self) -> tuple:
        """Return the row-permuted copies of the per-observation inputs (read, not written)."""
        return tuple(self._permuted_values)

    def other_arrays(self, point: dict) -> list:
        """Return the other value variables' values as arrays of the compiled dtypes."""
        return self._other_arrays(point)

    def loglik_full(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Terms :math:`\log f_n(\theta_k)` on all observations, shape ``(K, N)``."""
        cands, others = self._exact_arrays(candidates, point)
        return self._rows_fn(*cands, *self._data_rows(), *others)

    def _data_rows(self) -> list[np.ndarray]:
        """Every row of the per-observation inputs, in data order (C order: trusted inputs)."""
        return [np.ascontiguousarray(d.get_value(borrow=True)) for d in self.data]

    def loglik_sum(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Return :math:`\sum_{n=1}^N \log f_n(\theta_k)`, shape ``(K,)``.

        A fused pass (terms summed in the compiled graph), over chunks of rows
        that stay in cache (:class:`~pymc_subsample.model.chunked_sum.ChunkedSum`).
        """
        cands, others = self._exact_arrays(candidates, point)
        rows = self._permuted_values or self._data_rows()  # the same sum in any order
        return np.asarray(self._sum_rows(cands, rows, others), dtype=np.float64)

    def log_f0(self, candidates: Sequence[np.ndarray], point: dict) -> np.ndarray:
        r"""Non-per-observation terms :math:`\log f_0(\theta_k)`, shape ``(K,)``."""
        cands, others = self._exact_arrays(candidates, point)
        return np.asarray(self._exact_fn(*cands, *others), dtype=np.float64)

    def gradient(
        self, values: Sequence[np.ndarray], idx: np.ndarray, point: dict
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        r"""Gradients of :math:`\sum_{n \in \mathrm{idx}} \log f_n` and of :math:`\log f_0`.

        Compiled on first use (only gradient-based proposals need it).

        Parameters
        ----------
        values : sequence of numpy.ndarray
            One value per block variable (not batched).
        idx : numpy.ndarray
            Observation indices of the mini-batch.
        point : dict
            Values of the other value variables.

        Returns
        -------
        tuple of list of numpy.ndarray
            ``(grad_loglik, grad_f0)``, one array per block variable.
        """
        if self._grad_fn is None:
            import pytensor

            idx_var, subset, log_f0 = self._graphs
            grads = pytensor.grad(subset.sum(), self.vars) + pytensor.grad(log_f0, self.vars)
            self._grad_fn = self._compile(grads, [*self.vars, idx_var, *self.inputs])
        values, others = self._exact_arrays(values, point)
        out = self._grad_fn(*values, np.asarray(idx, dtype=np.int64), *others)
        k = len(self.vars)
        return [np.asarray(g) for g in out[:k]], [np.asarray(g) for g in out[k:]]

    # -- expansion in the other inputs (control variates of discrete races) -------------

    def expansion_inputs(self) -> list[str]:
        """Names of the continuous value variables the expansion's coordinates are read from.

        A reference point for :meth:`expansion_residual_batch` gives values
        for these. Without :meth:`expand_in` they are the coordinates
        themselves.
        """
        return [n for n, d in zip(self._input_names, self._input_dtypes, strict=True)
                if d.startswith("float")]  # fmt: skip

    def expand_in(self, variables: Sequence) -> None:
        r"""Expand the terms in model Deterministics rather than in the value variables.

        With Deterministics :math:`\phi = \phi(\psi)` through which the terms
        depend on the other continuous value variables :math:`\psi`, the
        expansion of :meth:`expansion_residual_batch` is in :math:`\phi`
        (with any value variable the terms still read directly):
        :math:`\log f_n(\phi) - \log f_n(\hat\phi) - D\log f_n(\hat\phi)[\Delta]
        - \tfrac12 D^2 \log f_n(\hat\phi)[\Delta, \Delta]` with
        :math:`\Delta = \phi(\psi) - \phi(\hat\psi)`. Pays when the terms are
        nearly quadratic in :math:`\phi` but not in :math:`\psi`: a coefficient
        :math:`\alpha = \mathrm{softplus}(z)` at its boundary is far from
        linear in :math:`z`, while a variance linear in :math:`\alpha` keeps
        the terms smooth in it.

        Parameters
        ----------
        variables : sequence of str or TensorVariable
            Deterministics of the model (or their names); an empty sequence
            restores the expansion in the value variables.
        """
        found = model_deterministics(self._model, variables)
        self._expansion_vars = found
        self._expansion_fns = None
        self._psi_fn = None
        self._psi_memo = (None, None)
        if found:
            self._expansion_graph()  # raises if the terms do not depend on them

    def _loglik_with(self, replace: dict):
        """Per-observation log-likelihood with model variables replaced (before ``logp``).

        The replacement is made in the observed variables' graphs, where the
        Deterministics still stand as they were written; ``model.logp``
        rewrites them on its way to the log density.
        """
        from pymc import logp
        from pymc.logprob.utils import replace_rvs_by_values

        model = self._model
        lps = []
        for rv in self._observed_rvs:
            mapping = {k: v for k, v in model.rvs_to_values.items() if k is not rv} | replace
            [new_rv] = replace_rvs_by_values(
                [rv], rvs_to_values=mapping, rvs_to_transforms=model.rvs_to_transforms
            )
            lps.append(_per_observation(logp(new_rv, model.rvs_to_values[rv])))
        if self._union is not None:
            return self._union.combine(lps)
        total = lps[0]
        for lp in lps[1:]:
            total = total + lp
        return total

    def _expansion_graph(self) -> tuple:
        r"""Return the terms as a graph of the coordinates :math:`\phi`, and those as value graphs.

        Returns ``(loglik, coords, values)``: the per-observation
        log-likelihood with every coordinate an input of its own, the
        coordinate variables, and their graphs in the value variables.
        """
        floats = [v for v in self.inputs if v.dtype.startswith("float")]
        if not self._expansion_vars:
            return self._loglik, floats, floats
        dets = self._expansion_vars
        phis = [d.type(name=f"{d.name}_coordinate") for d in dets]
        loglik = self._loglik_with(dict(zip(dets, phis, strict=True)))
        used = set(graph_inputs([loglik]))
        unused = [d.name for d, f in zip(dets, phis, strict=True) if f not in used]
        if unused:
            raise ValueError(
                f"expand_in: the likelihood terms of {', '.join(self.observed)} do not "
                f"depend on {unused}; give the Deterministics the terms are computed from"
            )
        rest = [v for v in floats if v in used]
        values = self._model.replace_rvs_by_values(dets)
        return loglik, [*phis, *rest], [*values, *rest]

    def _compile_expansion(self, reference: dict) -> None:
        r"""Compile the residual and reference-sum functions of the expansion in :math:`\phi`.

        Second order when :math:`\phi` has at most :data:`MAX_SECOND_ORDER_INPUTS`
        coordinates (the sums keep a Hessian per candidate), first order above.
        """
        if not any(v.dtype.startswith("float") for v in self.inputs):
            raise ValueError(
                "control variates expand the terms in the continuous variables they depend "
                f"on besides {', '.join(v.name for v in self.vars)}, and there are none: the "
                "terms depend on the block and the data only, so there is nothing to expand"
            )
        loglik, coords, values = self._expansion_graph()
        to_values = {c: v for c, v in zip(coords, values, strict=True) if c is not v}
        if to_values:  # Deterministics among the coordinates: phi(psi) is compiled
            floats = [v for v in self.inputs if v.dtype.startswith("float")]
            self._psi_fn, shapes = self._flat_values(values, floats, reference)
            self._psi_inputs = floats
        else:
            self._psi_fn, shapes = None, [np.shape(reference[v.name]) for v in values]
        sizes = [int(np.prod(sh, dtype=int)) for sh in shapes]
        bounds = np.cumsum([0, *sizes])
        second_order = bounds[-1] <= MAX_SECOND_ORDER_INPUTS
        flat_ref = pt.dvector("psi_reference")
        direction = pt.dvector("psi_direction")
        to_ref = {
            v: flat_ref[a:b].reshape(sh).astype(v.dtype)
            for v, a, b, sh in zip(coords, bounds[:-1], bounds[1:], shapes, strict=True)
        }
        flat_psi = _flat_graph(values)
        batch = dict(zip(self.vars, self._cands, strict=True))

        def residual(graph):
            at_ref = graph_replace(graph, to_ref, strict=False)
            first = pytensor.gradient.pushforward(
                at_ref, flat_ref, direction, disconnected_outputs="ignore"
            )
            expansion = at_ref + first
            if second_order:
                second = pytensor.gradient.pushforward(
                    first, flat_ref, direction, disconnected_outputs="ignore"
                )
                expansion = expansion + 0.5 * second
            res = graph_replace(graph - expansion, {direction: flat_psi - flat_ref}, strict=False)
            res = graph_replace(res, to_values, strict=False) if to_values else res
            return vectorize_per_point(res, batch)

        others = [*self.inputs, flat_ref]
        idx_var = self._graphs[0]
        subset, windows, _ = self._on_batches(loglik)
        gather = self._compile(residual(subset), [*self._cands, idx_var, *others])
        window = None
        if windows is not None:
            start, stop, win = windows
            window = self._compile(residual(win), [*self._cands, start, stop, *others])
        total = graph_replace(loglik.sum(), to_ref, strict=False)
        grad = pytensor.grad(total, flat_ref, disconnected_inputs="ignore")
        outputs = [total, grad]
        if second_order:
            outputs.append(pytensor.gradient.jacobian(grad, flat_ref, vectorize=True))
        sums = self._compile(outputs, [*self.vars, *others], trust=False)
        self._expansion_fns = (gather, window, sums)

    def _flat_values(self, values: Sequence, inputs: Sequence, point: dict) -> tuple:
        """Compile ``values`` (graphs of ``inputs``) as one flat float64 vector.

        Returns ``(fn, shapes)``: ``fn(*inputs)`` returns ``[flat, *shapes]``;
        ``shapes`` are the values' shapes at ``point``.
        """
        flat = _flat_graph(values)
        fn = self._compile([flat, *[v.shape for v in values]], inputs)
        out = fn(*[np.asarray(point[v.name], dtype=v.dtype) for v in inputs])
        return fn, [tuple(int(n) for n in sh) for sh in out[1:]]

    def _flat_coordinates(self, point: dict, memo: bool = False) -> np.ndarray:
        r"""Return the flat coordinates :math:`\phi` of the expansion at ``point``.

        ``memo``: the point is a reference, never changed in place, read again
        on every look (its coordinates are computed once).
        """
        if self._psi_fn is None:
            names = self.expansion_inputs()
            return np.concatenate([np.ravel(np.asarray(point[n], dtype=np.float64)) for n in names])
        if memo and self._psi_memo[0] is point:
            return self._psi_memo[1]
        floats = [np.asarray(point[v.name], dtype=v.dtype) for v in self._psi_inputs]
        flat = np.asarray(self._psi_fn(*floats)[0], dtype=np.float64)
        if memo:
            self._psi_memo = (point, flat)
        return flat

    def expansion_residual_batch(
        self,
        candidates: Sequence[np.ndarray],
        positions: slice | np.ndarray,
        point: dict,
        reference: dict,
    ) -> np.ndarray:
        r"""Residuals of the expansion of the terms in the other inputs.

        With :math:`\psi` the continuous value variables the terms depend on
        besides the block (read from ``point``, flattened in the order of
        :meth:`expansion_inputs`) and :math:`\hat\psi` their values in
        ``reference``, :math:`\Delta = \psi - \hat\psi`, returns

        .. math:: r_n(\theta_k) = \log f_n(\theta_k; \psi) - \log f_n(\theta_k; \hat\psi)
                  - D_\psi \log f_n(\theta_k; \hat\psi)[\Delta]
                  - \tfrac12 D^2_\psi \log f_n(\theta_k; \hat\psi)[\Delta, \Delta],

        the directional derivatives computed exactly (forward mode); the
        second-order term only when :math:`\psi` has at most
        :data:`MAX_SECOND_ORDER_INPUTS` coordinates. Observations at
        ``positions`` of the current row permutation (as :meth:`loglik_batch`).
        Their sum over all :math:`N` is :math:`\sum_n \log f_n(\theta_k; \psi) -
        S_k - G_k^\top \Delta - \tfrac12 \Delta^\top H_k \Delta` with
        :math:`(S_k, G_k, H_k)` from :meth:`expansion_sums`.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, n)``.
        """
        if self._expansion_fns is None:
            self._compile_expansion(reference)
        gather, window, _ = self._expansion_fns
        cands, others = self._exact_arrays(candidates, point)
        ref = self._flat_coordinates(reference, memo=True)
        return self._at_positions(positions, window, lambda: gather, cands, [*others, ref])

    def expansion_sums(
        self, candidates: Sequence[np.ndarray], point: dict, reference: dict
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        r"""Exact sums of the expansion at the reference, one full pass per candidate.

        Returns :math:`S_k = \sum_n \log f_n(\theta_k; \hat\psi)`, its
        gradient :math:`G_k` and (second order) Hessian :math:`H_k` in the
        flat :math:`\hat\psi`, the block's value and the non-continuous
        inputs taken from ``candidates`` and ``point``.

        Returns
        -------
        tuple
            ``(S, G, H)``: shapes ``(K,)``, ``(K, D)`` and ``(K, D, D)`` for
            :math:`D` coordinates of :math:`\psi`; ``H`` is None for a
            first-order expansion.
        """
        if self._expansion_fns is None:
            self._compile_expansion(reference)
        _, _, sums = self._expansion_fns
        cands, others = self._exact_arrays(candidates, point)
        ref = self._flat_coordinates(reference, memo=True)
        n_cands = len(cands[0])
        outs = [sums(*[c[k] for c in cands], *others, ref) for k in range(n_cands)]
        values = np.array([float(o[0]) for o in outs])
        grads = np.stack([np.asarray(o[1], dtype=np.float64) for o in outs])
        hess = (
            np.stack([np.asarray(o[2], dtype=np.float64) for o in outs])
            if len(outs[0]) > 2
            else None
        )
        return values, grads, hess

    def expansion_step(self, point: dict, reference: dict) -> np.ndarray:
        r"""Return the flat :math:`\Delta = \psi - \hat\psi` of :meth:`expansion_sums`."""
        if self._expansion_fns is None:
            self._compile_expansion(reference)
        return self._flat_coordinates(point) - self._flat_coordinates(reference, memo=True)

    # -- second-order Taylor expansion in the block (control variates of MH races) ----

    def _compile_taylor(self, shapes: Sequence[tuple], coordinates: Sequence = ()) -> None:
        r"""Compile the Taylor residuals and the exact sums, in the flat block coordinates.

        With ``coordinates`` (Deterministics of the block, e.g. its transformed
        parameters), in their flat values instead, ``shapes`` theirs: the
        functions of :meth:`taylor_residual_batch` and :meth:`taylor_sums` with
        ``coordinates=True``.
        """
        theta = pt.dvector("theta")
        ref = pt.dvector("theta_reference")
        direction = pt.dvector("direction")
        sizes = [int(np.prod(s, dtype=int)) for s in shapes]
        bounds = np.cumsum([0, *sizes])
        variables, loglik = self.vars, self._loglik
        idx_var = self._graphs[0]
        subset, windows, first = self._on_batches(loglik)
        if coordinates:
            variables = [d.type(name=f"{d.name}_coordinate") for d in coordinates]
            loglik = self._loglik_with(dict(zip(coordinates, variables, strict=True)))
            direct = [v.name for v in self.vars if v in set(graph_inputs([loglik]))]
            if direct:
                raise ValueError(
                    f"expand_in: the likelihood terms depend on {direct} directly, not only "
                    f"through {[d.name for d in coordinates]}; give Deterministics that carry "
                    "all of the block's influence on the terms"
                )
            subset, windows, first = self._on_batches(loglik)

        def unflatten(flat):
            return {
                v: flat[a:b].reshape(shape).astype(v.dtype)
                for v, a, b, shape in zip(variables, bounds[:-1], bounds[1:], shapes, strict=True)
            }

        def residual(graph):
            at_ref = graph_replace(graph, unflatten(ref), strict=False)
            first = pytensor.gradient.pushforward(at_ref, ref, direction)
            second = pytensor.gradient.pushforward(first, ref, direction)
            taylor = at_ref + first + 0.5 * second
            res = graph_replace(graph, unflatten(theta), strict=False) - taylor
            res = graph_replace(res, {direction: theta - ref}, strict=False)
            return vectorize_per_point(res, {theta: self._flat_cands})

        self._flat_cands = pt.dmatrix("theta_candidates")

        def build_gather():  # compiled on first use: windows that wrap around are rare
            return self._compile(residual(subset), [self._flat_cands, ref, idx_var, *self.inputs])

        window = None
        if windows is not None:
            start, stop, win = windows
            window = self._compile(
                residual(win), [self._flat_cands, ref, start, stop, *self.inputs]
            )
        if first is None:  # no copy: slices of the data themselves, summed in chunks
            start, stop = self._first_positions_vars()
            win = graph_replace(loglik, {d: d[start:stop] for d in self.data}, strict=False)
        else:
            start, stop, win = first
        total = graph_replace(win, unflatten(ref), strict=False).sum()
        sum_inputs = [ref, start, stop, *self.inputs]
        grad = pytensor.grad(total, ref)
        hess = pytensor.gradient.jacobian(grad, ref, vectorize=True)
        sums = self._compile([total, grad, hess], sum_inputs, trust=False)
        self._build_taylor_gather[bool(coordinates)] = build_gather
        self._taylor_fns[bool(coordinates)] = (None, window, sums)

    def block_coordinates(self, coordinates: Sequence, point: dict) -> tuple:
        r"""Compile the flat values of Deterministics of the block, :math:`\phi(\theta)`.

        Returns ``(evaluate, pullback, shapes)``: ``evaluate(values, point)``
        takes one value per block variable and a point for the other inputs;
        ``pullback(values, v, point)`` returns :math:`J_\phi(\theta)^\top v`,
        one array per block variable; neither reads data. ``shapes`` are the
        Deterministics' shapes at ``point``.
        """
        values = self._model.replace_rvs_by_values(list(coordinates))
        inputs = [*self.vars, *self.inputs]
        fn, shapes = self._flat_values(values, inputs, point)
        flat = _flat_graph(values)
        v_in = pt.dvector("cotangent")
        pull = pytensor.grad((flat * v_in).sum(), self.vars)
        pull_fn = self._compile(pull, [*inputs, v_in])

        def evaluate(block_values, point):
            block_values, others = self._exact_arrays(block_values, point)
            return np.asarray(fn(*block_values, *others)[0], dtype=np.float64)

        def pullback(block_values, v, point):
            block_values, others = self._exact_arrays(block_values, point)
            cotangent = np.asarray(v, dtype=np.float64)
            return [np.asarray(g) for g in pull_fn(*block_values, *others, cotangent)]

        return evaluate, pullback, shapes

    def _first_positions_vars(self) -> tuple:
        """Return the ``(start, stop)`` scalars of the window graphs (those of ``__init__``)."""
        if self._first_positions is not None:
            return self._first_positions[:2]
        return pt.lscalar("start"), pt.lscalar("stop")

    def _on_batches(self, loglik) -> tuple:
        """Return the graphs of ``loglik`` on gathered rows, on windows, on the first positions.

        As the terms' own (``__init__``): ``(subset, windows, first)``, where
        ``windows`` and ``first`` are ``(start, stop, graph)`` or None, and
        ``subset`` gathers positions: of the permuted copies when there are
        some, else rows of the data.
        """
        idx_var = self._graphs[0]
        source = self._permuted or self.data
        subset = graph_replace(
            loglik, {d: s[idx_var] for d, s in zip(self.data, source, strict=True)}, strict=False
        )
        first = None
        if self._first_positions is not None:
            start, stop, _ = self._first_positions
            views = {d: p[start:stop] for d, p in zip(self.data, self._permuted, strict=True)}
            first = (start, stop, graph_replace(loglik, views, strict=False))
        return subset, first if self._window_graph is not None else None, first

    def taylor_residual_batch(
        self,
        thetas: np.ndarray,
        reference: np.ndarray,
        positions: slice | np.ndarray,
        point: dict,
        shapes: Sequence[tuple],
        coordinates: Sequence = (),
    ) -> np.ndarray:
        r"""Residuals of the second-order Taylor expansion of the terms in the block.

        For flat block values :math:`\theta_k` and reference :math:`\hat\theta`,
        :math:`\Delta_k = \theta_k - \hat\theta`:

        .. math:: r_n(\theta_k) = \log f_n(\theta_k) - \log f_n(\hat\theta)
                  - D\log f_n(\hat\theta)[\Delta_k]
                  - \tfrac12 D^2 \log f_n(\hat\theta)[\Delta_k, \Delta_k],

        the directional derivatives computed exactly on the batch (forward
        mode, twice), so nothing per observation is stored and the cost does
        not grow with the block's dimension :math:`d` (Bardenet, Doucet &
        Holmes 2017; Cornish et al. 2019). Observations as in
        :meth:`loglik_batch`; the sum over all :math:`N` of the expansion is
        :meth:`taylor_sums`'s :math:`L + g^\top\Delta + \Delta^\top H \Delta/2`.

        Parameters
        ----------
        thetas : numpy.ndarray
            Flat block values, shape ``(K, d)`` (variables in block order, raveled).
        reference : numpy.ndarray
            :math:`\hat\theta`, shape ``(d,)``.
        positions : slice or numpy.ndarray
            Positions in the current row permutation (see :meth:`loglik_batch`).
        point : dict
            Values of the other value variables.
        shapes : sequence of tuple
            Shapes of the block's variables (of ``coordinates`` when given).
        coordinates : sequence of TensorVariable, optional
            Deterministics of the block in which to expand instead (see
            :meth:`_compile_taylor`): ``thetas`` and ``reference`` are then
            their flat values.

        Returns
        -------
        numpy.ndarray
            Shape ``(K, n)``.
        """
        key = bool(coordinates)
        if key not in self._taylor_fns:
            self._compile_taylor(shapes, coordinates)
        window = self._taylor_fns[key][1]
        others = self._other_arrays(point)
        thetas = np.asarray(thetas, dtype=np.float64)
        reference = np.asarray(reference, dtype=np.float64)
        return self._at_positions(
            positions, window, lambda: self._taylor_gather(key), [thetas, reference], others
        )

    def _taylor_gather(self, coordinates: bool = False):
        """Return the gathered Taylor residuals function, compiled on first use."""
        gather, window, sums = self._taylor_fns[coordinates]
        if gather is None:
            gather = self._build_taylor_gather[coordinates]()
            self._taylor_fns[coordinates] = (gather, window, sums)
        return gather

    def taylor_sums(
        self,
        reference: np.ndarray,
        point: dict,
        shapes: Sequence[tuple],
        window: int | None = None,
        coordinates: Sequence = (),
    ) -> tuple[float, np.ndarray, np.ndarray]:
        r"""Value, gradient and Hessian of :math:`\sum_n \log f_n` at the flat ``reference``.

        Exact (reverse mode), over all :math:`N` observations, or over the
        first ``window`` positions of the row permutation (a uniformly random
        subset) scaled by :math:`N/\mathrm{window}`. With ``coordinates``, in
        those Deterministics (as :meth:`taylor_residual_batch`).

        Returns
        -------
        tuple
            ``(L, g, H)``: a float, shape ``(d,)``, shape ``(d, d)``.
        """
        key = bool(coordinates)
        if key not in self._taylor_fns:
            self._compile_taylor(shapes, coordinates)
        _, _, sums = self._taylor_fns[key]
        others = self._other_arrays(point)
        reference = np.asarray(reference, dtype=np.float64)
        stop = self.n_obs
        if self._first_positions is not None and window is not None:  # a random subset
            stop = min(window, self.n_obs)
        scale = self.n_obs / stop
        # in chunks of rows: the gradient and Hessian graphs hold a few arrays of their rows
        value, grad, hess = 0.0, 0.0, 0.0
        for a in range(0, stop, TAYLOR_CHUNK_ROWS):
            b = min(a + TAYLOR_CHUNK_ROWS, stop)
            bounds = (np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
            v, g, h = sums(reference, *bounds, *others)
            value, grad, hess = value + float(v), grad + np.asarray(g), hess + np.asarray(h)
        return value * scale, np.asarray(grad) * scale, np.asarray(hess) * scale

    def log_f0_grad(self, values: Sequence[np.ndarray], point: dict) -> list[np.ndarray]:
        r"""Gradient of :math:`\log f_0` (prior, Jacobian, other blanket terms); no data read.

        Compiled on first use.

        Parameters
        ----------
        values : sequence of numpy.ndarray
            One value per block variable (not batched).
        point : dict
            Values of the other value variables.

        Returns
        -------
        list of numpy.ndarray
            One array per block variable.
        """
        if self._f0_grad_fn is None:
            import pytensor

            log_f0 = self._graphs[2]
            self._f0_grad_fn = self._compile(
                pytensor.grad(log_f0, self.vars), [*self.vars, *self.inputs]
            )
        values, others = self._exact_arrays(values, point)
        out = self._f0_grad_fn(*values, *others)
        return [np.asarray(g) for g in out]

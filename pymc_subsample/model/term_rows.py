r"""The rows behind the per-observation terms: the data as taken up, and their permutation.

:class:`~pymc_subsample.model.terms.ObservationTerms` reads the rows of its
``pm.Data`` inputs in data order (exact sums, scattered rows) or from a
row-permuted copy (blocks and windows; :class:`~pymc_subsample.model.data.PermutedCopy`):
a window of positions read from a uniformly random start is then a uniformly
random subset of observations drawn without replacement. :class:`TermRows`
takes up new data (``pm.set_data``: a new :math:`N`, the copies in data order
until the next shuffle), redraws the permutation and maps positions of the
copy back to rows of the data.
"""

from __future__ import annotations

import numpy as np

from .data import DataWatch, PermutedCopy, check_rows, new_row_count, slice_rows

__all__ = ["TermRows"]


class TermRows:
    """Mixin of :class:`~pymc_subsample.model.terms.ObservationTerms`: its rows and permutation.

    Reads the terms' ``data``, ``watched``, ``observed``, ``batches``,
    ``n_obs``, ``model`` and the private ``_union``, ``_lengths_fn`` and
    ``_sum_rows`` (set in its constructor); holds the permuted copy
    (``_copy``), the watch on the inputs (``_data_watch``) and the identity
    permutation without a copy (``_identity``), set by :meth:`_init_rows`.
    """

    def _init_rows(self) -> None:
        """Watch the ``pm.Data`` inputs; make the permuted copy for blocks and windows."""
        self._data_watch = DataWatch(self.watched)
        copies = self.batches in ("blocks", "windows") and self._ooc is None
        self._copy = PermutedCopy(self.data) if copies else None
        self._identity = None  # the permutation without a copy, made when asked

    @property
    def has_permuted_copy(self) -> bool:
        """Whether batches read a row-permuted copy of the data (``"blocks"``, ``"windows"``)."""
        if self._ooc is not None:
            return self._ooc.copy is not None
        return self._copy is not None

    def _data_rows(self) -> list[np.ndarray]:
        """Every row of the per-observation inputs, in data order (C order: trusted inputs)."""
        return [np.ascontiguousarray(d.get_value(borrow=True)) for d in self.data]

    def batch_sources(self) -> list[np.ndarray]:
        """Return the arrays that :meth:`batch_graphs` index: the permuted copies, else the data."""
        if self._ooc is not None:
            raise NotImplementedError(
                "out-of-core terms have no arrays of every row to index: read batches with "
                "batch_rows(positions)"
            )
        return list(self._copy.values) if self._copy is not None else self._data_rows()

    def batch_rows(self, positions) -> list[np.ndarray]:
        """Return the rows at ``positions`` of :meth:`loglik_batch` (gathered, in memory or not)."""
        if self._ooc is not None:
            return self._ooc.batch_rows(positions)
        if isinstance(positions, slice):
            positions = slice_rows(positions, self.n_obs)
        return [s.take(np.asarray(positions, dtype=np.int64), axis=0) for s in self.batch_sources()]

    def permuted_rows(self) -> tuple:
        """Return the row-permuted copies of the per-observation inputs (read, not written)."""
        return () if self._copy is None else tuple(self._copy.values)

    # -- data set with pm.set_data ----------------------------------------------------------

    def _check_rows(self, n_obs: int) -> None:
        if self._ooc is not None:  # checked for missing values by a Dask pass, at construction
            return
        check_rows(self.data, self.observed, n_obs)

    def data_unchanged(self) -> bool:
        """Return True when every pm.Data input still holds the array the terms last took up.

        ``pm.set_data`` (``set_value``) puts a new array behind the input, so
        an identity test per input sees it (a fraction of a microsecond);
        writing into the array in place is not seen (call the step's
        ``data_changed`` then).
        """
        return self._data_watch.unchanged()

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
            :class:`~pymc_subsample.ModelSplitError`), or the likelihood cannot be evaluated
            on the new data; the terms are left as they were.
        """
        changed = self._data_watch.changed()
        old_n = self.n_obs
        if self._union is not None:  # pad the user's inputs again: the union's own inputs
            self._union.take_up(lambda: self._counts_on_new_data(point))
        counts = (lambda: self._counts_on_new_data(point)) if self._union is None else (lambda: [])
        new_n = new_row_count(self.data, self.observed, old_n, counts)
        self._check_rows(new_n)
        self.n_obs = new_n
        self._identity = None  # of the new number of rows, made when asked
        if self._copy is not None:  # the copies share the new arrays until the next shuffle
            self._copy.take_up(self.data)
        self._sum_rows.reset()
        self._data_watch.remember()
        return changed, old_n, new_n

    def _counts_on_new_data(self, point: dict) -> list[int]:
        """Return the observed variables' numbers of observations on the data as they are now."""
        try:
            return [
                int(n) for n in self._lengths_fn(*[point[v.name] for v in self.model.value_vars])
            ]
        except Exception as err:
            raise ValueError(
                f"the likelihood of {', '.join(self.observed)} cannot be evaluated on the new "
                f"data ({type(err).__name__}: {err}); the step cannot take them up"
            ) from err

    # -- the row permutation ----------------------------------------------------------------

    def shuffle(self, rng: np.random.Generator) -> None:
        """Redraw the row permutation behind :meth:`loglik_batch` (one pass over the data).

        Every window of positions read from a uniformly random start is then a
        uniformly random subset of observations drawn without replacement.
        Without a permuted copy (``batches="random"``) there is nothing to
        redraw: every race draws its own uniformly random rows.

        The copies are rewritten in place (the data copied in, then their rows
        shuffled, every input by the same draws): no index array of length
        :math:`N` and no second copy is allocated. The permutation is the one
        ``rng.permutation(N)`` would return, and ``rng`` ends in the same state
        (:class:`~pymc_subsample.model.data.PermutedCopy`).
        """
        if self._copy is not None:
            self._copy.shuffle(self.data, rng)
        # out of core the stored permutation is kept: written once, reused (no rng draw)

    def permutation(self) -> np.ndarray:
        """Return the current row permutation: position ``i`` of the copies holds its row.

        Materialised on first call after a :meth:`shuffle` (int32 below
        :math:`2^{31}` rows) from the RNG state that drew it; the identity
        without a permuted copy.
        """
        if self._ooc is not None and self._ooc.copy is not None:
            raise NotImplementedError(
                "the stored permutation of out-of-core rows is not materialised (N entries)"
            )
        if self._copy is not None:
            return self._copy.permutation(self.n_obs)
        if self._identity is None:
            dtype = np.int32 if self.n_obs < 2**31 else np.int64
            self._identity = np.arange(self.n_obs, dtype=dtype)
        return self._identity

    def positions_to_rows(self, positions: slice | np.ndarray) -> np.ndarray:
        """Return the data rows at ``positions`` of the current row permutation.

        Without a permuted copy (``batches="random"``) the permutation is the
        identity and index arrays are returned as they are (slices as index
        arrays). With one, the permutation is materialised on first use
        (:meth:`permutation`).
        """
        if self._copy is None:
            if isinstance(positions, slice):
                return slice_rows(positions, self.n_obs)
            return positions
        return self.permutation()[positions]

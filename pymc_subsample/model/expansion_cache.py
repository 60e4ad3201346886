r"""Exact sums of an expansion, kept for the values of the inputs they were computed at.

A control variate :math:`h_n(\theta; \psi)` of a race expands the terms
:math:`l_n(\theta; \psi)` in the step's own coordinates :math:`\theta` and
holds their exact sums over all :math:`N` observations (value, gradient,
Hessian, or stencil sums). The terms also read the other value variables
:math:`\psi` of the model, which other steps move. A race is consistent only
when the residuals it reads on a batch and the sums it adds back are taken at
the same :math:`\psi`:

.. math:: \sum_n l_n(\theta; \psi) = \sum_n r_n(\theta; \psi) + \sum_n h_n(\theta; \psi),

so the sums are a function of :math:`\psi` (and of anything else the residuals
read), computed with a full pass over the data. :class:`ExpansionCache` keeps
the last few of them keyed on the bytes of those inputs, recomputes on a miss
and counts the recomputations. Pure Python and NumPy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from ..validation import check_int

__all__ = ["ExpansionCache", "inputs_key"]

#: Entries kept by default (least recently used dropped first).
CAPACITY = 64


def inputs_key(arrays: Sequence[np.ndarray], *extra: Hashable) -> tuple:
    """Return a hashable key of the values of ``arrays`` (their bytes), after ``extra``.

    Arrays of fixed dtypes and shapes (as the compiled inputs are) give equal
    keys exactly when their values are equal bit for bit.
    """
    return (*extra, *(np.ascontiguousarray(a).tobytes() for a in arrays))


class ExpansionCache:
    r"""A bounded least-recently-used map from input values to exact sums of an expansion.

    Parameters
    ----------
    capacity : int
        Entries kept; the least recently used is dropped beyond it.

    Attributes
    ----------
    n_refits : int
        Entries computed (misses of :meth:`get`), :meth:`put` not included.
    """

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = check_int("capacity", capacity, low=1, example=CAPACITY)
        self._entries: OrderedDict = OrderedDict()
        self.n_refits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """Return the entry of ``key``; on a miss, store ``compute()`` and count a refit."""
        entries = self._entries
        value = entries.get(key)
        if value is not None:
            entries.move_to_end(key)
            return value
        value = compute()
        self.n_refits += 1
        self.put(key, value)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` (not None) under ``key`` without counting a refit."""
        if value is None:
            raise ValueError("an entry cannot be None")
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (the sums' other dependencies changed: data, reference)."""
        self._entries.clear()

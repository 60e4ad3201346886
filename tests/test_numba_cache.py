"""Numba's disk cache degrades quietly when no writable place for it is found.

``cache=True`` raises at decoration (so at import) when Numba finds no
writable cache location: a read-only site-packages with no writable user
cache folder and no ``NUMBA_CACHE_DIR``. The package's decorators then compile
without the cache.
"""

import numba.core.caching as caching
import numpy as np
import pytest

from pymc_subsample._numba_cache import cfunc_cached, njit_cached


@pytest.fixture
def no_cache_location(monkeypatch):
    def refuse(self, py_func):
        raise RuntimeError(f"cannot cache function {py_func.__name__!r}: no locator available")

    monkeypatch.setattr(caching.CacheImpl, "__init__", refuse)


def test_njit_without_a_cache_location_compiles_uncached(no_cache_location):
    with pytest.raises(RuntimeError, match="cannot cache"):  # what numba itself does
        from numba import njit

        njit(cache=True)(lambda x: x)

    @njit_cached(fastmath=False)
    def twice(x):
        return 2 * x

    assert twice(np.float64(1.5)) == 3.0


def test_cfunc_without_a_cache_location_compiles_uncached(no_cache_location):
    from numba import types

    @cfunc_cached(types.float64(types.float64))
    def half(x):
        return x / 2

    assert half.ctypes(3.0) == 1.5

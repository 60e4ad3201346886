"""Numba decorators that cache compiled code on disk when they can, and quietly do without.

Numba's ``cache=True`` writes next to the source file (``__pycache__``), or in a
per-user cache folder when the package's folder is read-only, or in
``NUMBA_CACHE_DIR`` when set. When no writable place is found, Numba raises at
decoration (at import): these decorators then compile without a disk cache
(each new process compiles again).
"""

from __future__ import annotations

from numba import cfunc, njit

__all__ = ["cfunc_cached", "njit_cached"]


def _cached(decorator, *args, **options):
    def decorate(fn):
        try:
            return decorator(*args, cache=True, **options)(fn)
        except RuntimeError as err:  # "cannot cache function ...: no locator available"
            if "cannot cache" not in str(err):
                raise
            return decorator(*args, **options)(fn)

    return decorate


def njit_cached(**options):
    """``numba.njit(cache=True, **options)``, without the disk cache where none can be written."""
    return _cached(njit, **options)


def cfunc_cached(signature, **options):
    """``numba.cfunc(signature, cache=True, **options)``, likewise."""
    return _cached(cfunc, signature, **options)

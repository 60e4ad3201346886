"""The low priority of the library's helper processes (compilations, the kernels' warm-up)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["AUTOGROUP", "HELPERS", "NICE", "leave_a_core", "run_behind"]

#: Whether the library may start helper processes (background compilations, the kernels'
#: warm-up): ``PYMC_SUBSAMPLE_BACKGROUND=0`` in the environment turns both off at import
#: (in pm.sample's worker processes too), as the test suite does.
HELPERS = os.environ.get("PYMC_SUBSAMPLE_BACKGROUND", "1") != "0"

#: Niceness of a helper process: the sampling process comes first.
NICE = 10
#: Linux's scheduler shares the processor between sessions (autogroups) before it
#: looks at niceness: a helper started in a session of its own (to outlive the run)
#: would get an equal share whatever its niceness, and a BLAS call of the sampling
#: process, whose threads wait for each other, stalls while a thread waits for the
#: core the helper holds. The helper therefore sets its session's niceness too.
AUTOGROUP = Path("/proc/self/autogroup")


def run_behind(session: bool = True) -> None:
    """Lower this process's priority below the sampling process's, where the system allows.

    Its niceness (:data:`NICE`) and, with ``session``, on Linux with autogroups,
    its session's (:data:`AUTOGROUP`, to 19): this process leads a session of its
    own. Without ``session`` it keeps a session's share: a helper the sampling
    process waits for must not starve while that process keeps every core busy.
    """
    if hasattr(os, "nice"):
        os.nice(NICE)
    if not session:
        return
    try:
        AUTOGROUP.write_text("19")
    except OSError:  # not Linux, autogroups off, or not allowed: niceness alone
        pass


def leave_a_core() -> Callable[[], None]:
    """Limit this process's BLAS threads to the cores but one, while a helper runs there.

    A BLAS call whose threads wait for each other stalls while one of them waits
    for the core a helper holds.
    Returns the function that restores the limits found (one that does nothing
    where the limits cannot be set: the sampling is not held up for it).
    """
    try:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(limits=max(1, (os.cpu_count() or 1) - 1), user_api="blas")
    except Exception:  # noqa: BLE001 - a BLAS threadpoolctl cannot handle: leave it be
        return lambda: None
    return limiter.restore_original_limits

"""The low priority of the library's helper processes (compilations, the kernels' warm-up)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["AUTOGROUP", "NICE", "run_behind"]

#: Niceness of a helper process: the sampling process comes first.
NICE = 10
#: Linux's scheduler shares the processor between sessions (autogroups) before it
#: looks at niceness: a helper started in a session of its own (to outlive the run)
#: would get an equal share whatever its niceness, and a BLAS call of the sampling
#: process, whose threads wait for each other, stalls while a thread waits for the
#: core the helper holds. The helper therefore sets its session's niceness too.
AUTOGROUP = Path("/proc/self/autogroup")


def run_behind() -> None:
    """Lower this process's priority below the sampling process's, where the system allows.

    Its niceness (:data:`NICE`) and, on Linux with autogroups, its session's
    (:data:`AUTOGROUP`, to 19): this process leads a session of its own.
    """
    if hasattr(os, "nice"):
        os.nice(NICE)
    try:
        AUTOGROUP.write_text("19")
    except OSError:  # not Linux, autogroups off, or not allowed: niceness alone
        pass

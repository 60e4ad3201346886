"""A lock file that one process on the machine holds, taken over once stale."""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["take_lock"]


def take_lock(lock: Path, stale_seconds: float) -> int | None:
    """Create ``lock`` exclusively; return its open descriptor, or None if another holds it.

    A lock older than ``stale_seconds`` is removed first (its process was
    stopped). None too where the folder cannot be written: the caller then
    does the work itself.
    """
    try:
        if time.time() - lock.stat().st_mtime > stale_seconds:
            lock.unlink(missing_ok=True)
    except OSError:
        pass
    try:
        return os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:  # held by another process, or a read-only folder
        return None

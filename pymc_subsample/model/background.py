"""Compile a function's final tier in another process, into this machine's Numba cache.

A :class:`~pymc_subsample.model.tiered.TieredFunction` that has paid for its
compilation need not wait for it: the graph is handed to a new Python process
(:class:`BackgroundCompile`), which compiles it with the default mode (Numba)
and calls it once, so that its machine code lands in PyTensor's Numba cache
(``base_compiledir``), then records it as compiled on this machine and its price
(:func:`~pymc_subsample.model.tiered.seconds_per_node`). The function keeps
evaluating its first tier meanwhile, and moves once the process has finished:
its own compilation then loads the machine code from the cache. Both tiers
evaluate the same graph, so the chain's law is unchanged by when it moves.
The process runs behind the sampling process: a lower niceness, and on Linux a
lower priority for its session too (it leads a session of its own, to outlive the
run, and the scheduler shares the processor between sessions first).

Run as ``python -m pymc_subsample.model.background <job file>`` by
:class:`BackgroundCompile`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .._locks import take_lock
from .._priority import run_behind

__all__ = ["MAX_RUNNING", "BackgroundCompile"]

#: A lock older than this (seconds) is taken over: its process was stopped.
STALE_LOCK_SECONDS = 1800.0

#: At most this many compilations started by one process run at once, one core left to
#: the sampling process (each is a Python process with PyMC loaded and the call's
#: arguments): the others wait their turn.
MAX_RUNNING = max(1, (os.cpu_count() or 2) - 1)

_STARTED: list = []


def _folder() -> Path:
    from pytensor import config

    folder = Path(config.base_compiledir) / "pymc_subsample_background"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _take_lock(digest: str) -> bool:
    """Return True if this process now holds the lock of ``digest`` (no other compiles it)."""
    fd = take_lock(_folder() / f"{digest}.lock", STALE_LOCK_SECONDS)
    if fd is None:
        return False
    os.close(fd)
    return True


class BackgroundCompile:
    """A compilation of ``compile(None)`` and its first call on ``args`` in a new process.

    Parameters
    ----------
    compile : callable
        ``compile(mode)`` returns the PyTensor function (picklable with cloudpickle).
    args : tuple
        Arguments of a call (Numba compiles for their types at the first call).
    digest : str
        The graph's digest (:func:`~pymc_subsample.model.tiered.graph_digest`),
        recorded as compiled once the machine code is in the cache.
    n_nodes : int
        Operations of the first tier's graph, recorded with the seconds it took.

    Raises
    ------
    Exception
        Whatever pickling the job raises (the caller then compiles in process).
    """

    def __init__(self, compile: Callable, args: tuple, digest: str, n_nodes: int):
        import cloudpickle
        from pytensor import config

        self.digest, self.lock = digest, _folder() / f"{digest}.lock"
        self.process = None
        if not _take_lock(digest):  # another process compiles it: wait for its lock to go
            return
        fd, name = tempfile.mkstemp(suffix=".pkl", dir=_folder())
        self.path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                cloudpickle.dump((compile, tuple(args), digest, int(n_nodes)), f)
        except Exception:
            self.path.unlink(missing_ok=True)
            self.lock.unlink(missing_ok=True)
            raise
        env = dict(os.environ)
        flags = env.get("PYTENSOR_FLAGS", "")
        env["PYTENSOR_FLAGS"] = ",".join(
            f for f in (flags, f"base_compiledir={config.base_compiledir}") if f
        )
        # it outlives this process if need be: its machine code serves the next run
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(self.path), str(self.lock)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _STARTED.append(self)

    @classmethod
    def running(cls) -> int:
        """Return how many compilations this process has started that still run."""
        _STARTED[:] = [job for job in _STARTED if job.process.poll() is None]
        return len(_STARTED)

    def poll(self) -> bool | None:
        """Return None while it runs, then True when the machine code is cached, else False."""
        if self.process is None:  # another process's compilation: done when its lock goes
            if self.lock.exists():
                return None
            from .tiered import recorded_on_disk

            return recorded_on_disk(self.digest)
        code = self.process.poll()
        if code is None:
            return None
        return code == 0


def _main(path: str, lock: str) -> int:
    """Compile the job in ``path``, call it once, record it as compiled; return the exit code.

    Removes the job and the ``lock`` whatever happens.
    """
    try:
        import cloudpickle

        run_behind()  # the sampling process comes first
        with open(path, "rb") as f:
            compile, args, digest, n_nodes = cloudpickle.load(f)
        from . import tiered

        t0 = time.process_time()  # the compilation's work: this process runs at a low priority
        final = compile(None)
        final(*args)  # Numba compiles here and writes the machine code to the cache
        tiered.record_compiled(digest, n_nodes, time.process_time() - t0)
        return 0
    finally:
        Path(path).unlink(missing_ok=True)
        Path(lock).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))

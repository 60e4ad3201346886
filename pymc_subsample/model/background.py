"""Compile a function's final tier in another process, into this machine's Numba cache.

A :class:`~pymc_subsample.model.tiered.TieredFunction` that has paid for its
compilation need not wait for it: the graph is handed to a helper process
(:class:`BackgroundCompile`), which compiles it with the default mode (Numba)
and calls it once, so that its machine code lands in PyTensor's Numba cache
(``base_compiledir``), then records it as compiled on this machine and its price
(:func:`~pymc_subsample.model.tiered.seconds_per_node`). The function keeps
evaluating its first tier meanwhile, and moves once the job is done: its own
compilation then loads the machine code from the cache. Both tiers evaluate the
same graph, so the chain's law is unchanged by when it moves.

The helper is one Python process per sampling process (:class:`_Helper`), started
at the first job and fed the jobs' files through a pipe, one after the other: it
loads Python, PyMC and Numba once, not once per job. It runs behind the sampling
process: a lower niceness, and on Linux a lower priority for its session too (it
leads a session of its own, to finish its jobs if the run ends first, and the
scheduler shares the processor between sessions first). It ends once the pipe
closes (the sampling process ended) and its jobs are done, or after
:data:`JOBS_PER_HELPER` jobs (a new one takes the next: Numba keeps the machine
code of every function it compiles).

Run as ``python -m pymc_subsample.model.background`` by :class:`_Helper`.
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

__all__ = ["JOBS_PER_HELPER", "MAX_RUNNING", "BackgroundCompile"]

#: A lock older than this (seconds) is taken over: its process was stopped.
STALE_LOCK_SECONDS = 1800.0

#: At most this many jobs handed over by one process wait or run at once, one core left
#: to the sampling process (each holds its call's arguments): the others wait their turn.
MAX_RUNNING = max(1, (os.cpu_count() or 2) - 1)

#: A helper process takes this many jobs, then ends once they are done (a new one takes
#: the next): the machine code of every function it compiled stays in its memory.
JOBS_PER_HELPER = 64

_STARTED: list = []


class _Helper:
    """The helper process that compiles this process's jobs, in the order they come."""

    _current: _Helper | None = None

    def __init__(self):
        from pytensor import config

        env = dict(os.environ)
        flags = env.get("PYTENSOR_FLAGS", "")
        env["PYTENSOR_FLAGS"] = ",".join(
            f for f in (flags, f"base_compiledir={config.base_compiledir}") if f
        )
        # it finishes its jobs if this process ends first: their machine code serves the next run
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        self.jobs = 0

    def alive(self) -> bool:
        """Return True while the process runs."""
        return self.process.poll() is None

    def submit(self, path: Path, lock: Path) -> bool:
        """Send it the job in ``path`` (it removes ``lock`` when done); False if it cannot."""
        if not self.alive():
            return False
        try:
            self.process.stdin.write(f"{path}\t{lock}\n")
            self.process.stdin.flush()
        except OSError:  # the pipe broke: the process ended
            return False
        self.jobs += 1
        return True

    def retire(self) -> None:
        """Close its pipe: it ends once its jobs are done."""
        try:
            self.process.stdin.close()
        except OSError:
            pass

    @classmethod
    def take(cls) -> _Helper:
        """Return the running helper, or a new one (the old one retired after its jobs)."""
        helper = cls._current
        if helper is None or not helper.alive() or helper.jobs >= JOBS_PER_HELPER:
            if helper is not None:
                helper.retire()
            helper = cls._current = cls()
        return helper


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
    """A compilation of ``compile(None)`` and its first call on ``args`` in the helper process.

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
        Whatever pickling the job raises, or RuntimeError when no helper process
        takes it (the caller then compiles in process).
    """

    def __init__(self, compile: Callable, args: tuple, digest: str, n_nodes: int):
        import cloudpickle

        self.digest, self.lock = digest, _folder() / f"{digest}.lock"
        self.helper = None
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
        self.helper = _Helper.take()
        if not self.helper.submit(self.path, self.lock):
            self.path.unlink(missing_ok=True)
            self.lock.unlink(missing_ok=True)
            raise RuntimeError("no helper process to compile in")
        _STARTED.append(self)

    @classmethod
    def running(cls) -> int:
        """Return how many jobs this process has handed over that wait or run."""
        _STARTED[:] = [job for job in _STARTED if job._pending()]
        return len(_STARTED)

    def _pending(self) -> bool:
        return self.lock.exists() and (self.helper is None or self.helper.alive())

    def poll(self) -> bool | None:
        """Return None while it waits or runs, then True when the machine code is cached.

        False when it failed (or its helper process ended before it).
        Another process's compilation of the graph is done when its lock goes.
        """
        if self._pending():
            return None
        self.lock.unlink(missing_ok=True)  # a helper that ended left it
        from .tiered import recorded_on_disk

        return recorded_on_disk(self.digest)


def _compile_job(path: str, lock: str) -> None:
    """Compile the job in ``path``, call it once, record it as compiled on this machine.

    Removes the job and the ``lock`` whatever happens.
    """
    try:
        import cloudpickle

        with open(path, "rb") as f:
            compile, args, digest, n_nodes = cloudpickle.load(f)
        from . import tiered

        t0 = time.process_time()  # the compilation's work: this process runs at a low priority
        final = compile(None)
        final(*args)  # Numba compiles here and writes the machine code to the cache
        tiered.record_compiled(digest, n_nodes, time.process_time() - t0)
    finally:
        Path(path).unlink(missing_ok=True)
        Path(lock).unlink(missing_ok=True)


def _main(jobs=None) -> int:
    """Compile the jobs read from ``jobs`` (default: standard input), one per line, in turn.

    A line is a job's file and its lock, separated by a tab. A job that fails
    is not recorded (its function then compiles in its own process).
    """
    run_behind()  # the sampling process comes first
    for line in sys.stdin if jobs is None else jobs:
        path, _, lock = line.rstrip("\n").partition("\t")
        try:
            _compile_job(path, lock)
        except Exception:  # noqa: BLE001, S112 - the job is not recorded: compiled there
            continue
    return 0


if __name__ == "__main__":
    sys.exit(_main())

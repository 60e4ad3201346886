r"""The racing kernels, compiled once per machine in a process of their own.

Numba compiles the kernels of a race (:mod:`~pymc_subsample.racing.kernels`,
:mod:`~pymc_subsample.racing.draws`) at their first call and caches the machine
code on disk, so only the first run on a machine pays for them, but it pays
seconds of LLVM before its first race. :func:`ready` tells a step whether the
kernels can be called without that wait: yes when this process or the disk
cache holds them; otherwise it starts :func:`exercise` in a new process (one
per machine, by a lock next to the cache), and says yes once that process has
ended. A step decides exactly meanwhile (a race with :math:`\delta = 0`: every
term summed), then plans its races and races: each decision is exact or right
up to :math:`\delta`, so the chain's law stays within the race's guarantee
whenever the switch comes. The process runs behind the sampling process, as a
background compilation does (:mod:`~pymc_subsample.model.background`).

Run as ``python -m pymc_subsample.racing.warmup <lock file>``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .._locks import take_lock
from .._priority import HELPERS, leave_a_core, run_behind
from .common import BOUNDS, VARIANCES
from .config import BATCH_LAYOUTS, RaceConfig
from .mh import mh_test
from .race import race

__all__ = [
    "IN_BACKGROUND",
    "POLL_SECONDS",
    "STALE_LOCK_SECONDS",
    "exercise",
    "kernels",
    "ready",
    "wait",
]

#: Compile the kernels in another process while steps decide exactly (False: a step's
#: first race compiles them in its own process, as the test suite does;
#: ``PYMC_SUBSAMPLE_BACKGROUND=0`` in the environment sets it False at import).
IN_BACKGROUND = HELPERS

#: Seconds between two looks at another process's warm-up (its lock file).
POLL_SECONDS = 0.25

#: A lock older than this (seconds) is taken over: its process was stopped.
STALE_LOCK_SECONDS = 900.0

_STATE: dict = {"ready": False, "process": None, "lock": None, "polled": 0.0, "restore": None}


def kernels() -> list:
    """Return the Numba dispatchers a race calls, whose disk cache :func:`ready` reads."""
    from . import draws, kernels

    return [
        kernels.look_rows,
        kernels.look_pairwise,
        kernels.look_marginal,
        draws.draw_sorted,
        draws.expand_blocks,
        draws.fresh_blocks,
    ]


def _held(dispatcher) -> bool:
    """Return True when this process or this machine's disk cache holds ``dispatcher``'s code.

    Reads Numba's cache index (the entries valid for the current source), keyed
    by the machine's code generator. When Numba's cache cannot be read this
    way, returns True: the first race then compiles in process, as without a
    warm-up.
    """
    if dispatcher.signatures:
        return True
    try:
        index = dispatcher._cache._cache_file._load_index()
        magic = dispatcher.targetctx.codegen().magic_tuple()
    except Exception:  # no disk cache, or another Numba: nothing to wait for
        return True
    return any(key[1] == magic for key in index)


def _lock_path() -> Path | None:
    """Return the warm-up's lock, beside Numba's cache of the kernels (None: no disk cache)."""
    from .kernels import look_rows

    folder = getattr(getattr(look_rows, "_cache", None), "_cache_path", None)
    return None if folder is None else Path(folder) / "pymc_subsample_warmup.lock"


def _start() -> None:
    """Start the warm-up process, unless another one runs (then watch its lock)."""
    lock = _lock_path()
    if lock is None:
        _STATE["ready"] = True
        return
    _STATE["lock"] = lock
    fd = take_lock(lock, STALE_LOCK_SECONDS)
    if fd is None:
        if not _other_runs(lock):  # not writable, or a warm-up that was stopped
            _STATE["ready"] = True
        return
    try:
        _STATE["process"] = subprocess.Popen(
            [sys.executable, "-m", __name__, str(lock)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # it outlives this process: the next run loads its code
        )
        # its id, for the processes that watch the lock (through the descriptor: a
        # warm-up that ended already has removed the file, which stays removed)
        os.write(fd, str(_STATE["process"].pid).encode())
    except OSError:
        lock.unlink(missing_ok=True)
        _STATE["ready"] = True
    finally:
        os.close(fd)


def _other_runs(lock: Path) -> bool:
    """Return True while another process's warm-up holds ``lock`` and is alive.

    The lock holds the warm-up's process id (written just after it starts: a
    lock without one counts for a few seconds). Only on POSIX systems, where
    a signal 0 tests a process; elsewhere nothing is awaited.
    """
    try:
        text = lock.read_text().strip()
        age = time.time() - lock.stat().st_mtime
    except OSError:  # gone: the warm-up ended
        return False
    if os.name != "posix":
        return False
    if not text:
        return age < 10.0
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return age < STALE_LOCK_SECONDS
    return True


def ready() -> bool:
    """Return True when a race can run without compiling the kernels in this process first.

    True when :data:`IN_BACKGROUND` is off, when this process or the disk
    cache holds every kernel (:func:`kernels`), and once a warm-up process
    (started by the first call that finds them missing, or by another
    process on this machine) has ended, whether it succeeded or not: a
    kernel still missing then compiles in process, as it would without a
    warm-up. Cheap after the first call: a look at the process, or at the
    other process's lock every :data:`POLL_SECONDS` (:func:`_other_runs`).
    Until then this process's BLAS threads leave the warm-up a core
    (``pymc_subsample._priority.leave_a_core``).
    """
    if _STATE["ready"] or not IN_BACKGROUND:
        return True
    if _STATE["lock"] is None:  # first call
        if all(_held(d) for d in kernels()):
            _STATE["ready"] = True
            return True
        _start()
        if not _STATE["ready"]:  # a warm-up runs: this process's BLAS leaves it a core
            _STATE["restore"] = leave_a_core()
        return _STATE["ready"]
    process = _STATE["process"]
    if process is not None:
        if process.poll() is None:
            return False
    else:
        now = time.monotonic()
        if now - _STATE["polled"] < POLL_SECONDS:
            return False
        _STATE["polled"] = now
        if _other_runs(_STATE["lock"]):
            return False
    _STATE["ready"] = True
    restore, _STATE["restore"] = _STATE["restore"], None
    if restore is not None:
        restore()
    return True


def wait() -> None:
    """Return once :func:`ready` is True (at once when nothing compiles in another process)."""
    while not ready():
        time.sleep(0.05)


def exercise(seed: int = 0) -> None:
    """Run small races that call every kernel with the types a step's races pass.

    Every bound, variance and batch layout of :func:`~.race.race` on a shared
    population, with and without the exact pass, and the two-arm accept test
    (:func:`~.mh.mh_test`): float64 rewards in C order, as the model's terms
    return them. Arms of separated and of equal means, so that looks drop
    arms, keep them, and reach the exact pass.
    """
    rng = np.random.default_rng(seed)
    n_obs, n_arms = 4096, 5
    table = rng.normal(size=(n_arms, n_obs)) + np.array([0.0, 0.0, -0.02, -0.5, -3.0])[:, None]
    table = np.ascontiguousarray(table)

    def rewards(arms, idx):
        return np.ascontiguousarray(table[np.asarray(arms)][:, idx])

    def totals(arms):
        return table[np.asarray(arms)].sum(axis=1)

    pair = np.array([0, 2])

    for bound in BOUNDS:
        variances = VARIANCES if bound in ("normal", "ebs") else (VARIANCES[0],)
        layouts = BATCH_LAYOUTS if bound in ("normal", "ebs") else (None,)
        for variance in variances:
            for batches in layouts:
                for total in (None, totals):
                    kw = {"rng": rng, "totals": total} if bound != "lilucb" else {"rng": rng}
                    if batches is None:
                        race(rewards, n_arms, n_obs, bound=bound, **kw)
                        continue
                    config = RaceConfig(bound=bound, variance=variance, batches=batches)
                    race(rewards, n_arms, n_obs, config=config, **kw)
                    if variance == VARIANCES[0]:  # the accept test: arms 0 and 2
                        mh_test(
                            lambda arms, idx: rewards(pair[np.asarray(arms)], idx),
                            n_obs,
                            0.0,
                            float(np.log(rng.uniform())),
                            config,
                            rng=rng,
                            totals=None if total is None else (lambda arms: totals(pair[arms])),
                        )


def _main(lock: str) -> int:
    """Run :func:`exercise` at a low priority, then remove ``lock``; return the exit code."""
    try:
        run_behind(session=False)  # behind the sampling process, which waits for it
        exercise()
        return 0
    finally:
        Path(lock).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))

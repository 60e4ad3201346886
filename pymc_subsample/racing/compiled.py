r"""A whole Racing-Normal race in one compiled call, for rewards that are compiled too.

:func:`~pymc_subsample.racing.race.race_shared`, the Python driver of a race's
state machine (:class:`~pymc_subsample.racing.state.SharedRace`), calls Python at
every look: the reward callback, the position stream, the state update. On cheap terms at large
:math:`N` that Python costs more than the terms themselves. When the rewards
come from a Numba-compiled function of the rows of some data arrays (as a
PyTensor function compiled with the Numba backend is), the whole subsampled
part of a race can run in one compiled call instead: :func:`race_blocks` draws
whole random blocks of positions (the same :class:`~pymc_subsample.racing.
schedule.RandomBlocks` draw, from the same SplitMix64 stream), gathers the
rows, calls the reward function on the survivors, and applies the look
(:func:`~pymc_subsample.racing.packed.look_state`: the kernel the Python update calls,
:func:`~pymc_subsample.racing.kernels.look_rows`, then the eliminations and the
give-up test of :meth:`~pymc_subsample.racing.state.SharedRace.hopeless`), look
after look; it returns the race's state, which ends as every race does, through
:meth:`~pymc_subsample.racing.state.SharedRace.finish` (exact pass, rescue).
Same settings and the same random stream give the same decisions as the
Python driver.

The driver is generated for each reward function (bound in as a global),
number of data arrays and of extra inputs, and compiled once. It holds only
the block draws, the gathers and the reward call; everything a look does
after the rewards (statistics, bound, skew guard, eliminations, give-up
test) is :func:`~pymc_subsample.racing.packed.look_packed`, compiled once
per machine and cached on disk, which the driver calls through a C function
pointer (:func:`~pymc_subsample.racing.packed.look_c`): called directly, its
code would be compiled into every driver again, seconds of LLVM each time.
A look of more than :data:`CHUNK_REWARDS` rewards is evaluated in chunks of
whole blocks, merged as they come, with the bound at the look's last chunk.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np
from numba import njit

from .._numba_cache import njit_cached
from .common import RaceResult, TotalsFn, check_reward_values
from .config import RaceConfig
from .draws import claim_bitmap, draw_sorted, gather_blocks, new_seed, unmark
from .packed import (
    N_OUT_INTS,
    N_SETTINGS,
    NAN_REWARD,
    POSINF_REWARD,
    layout,
    look_c,
    pack,
    unpack,
)
from .schedule import REJECTION_SHARE, block_rows
from .state import RaceState, SharedRace

__all__ = [
    "CompiledRace",
    "CompiledRewards",
    "driver_compiled",
    "race_blocks",
    "race_compiled",
    "supports",
]

#: Most rewards (surviving arms x rows) one reward call of a compiled race returns: a
#: larger look is evaluated in chunks of whole blocks, each merged into the running
#: statistics as it comes (:func:`~.packed.look_packed`, ``merge_only``), so that the
#: matrix of rewards (512 kB) stays in a core's cache: a matrix that goes out to memory
#: and back costs several times more per term to compute and to look at (the results
#: pages).
CHUNK_REWARDS = 2**16

_TEMPLATE = """
def driver(cand, {args}, bits, seed, ints, reals, offsets):
    drawn = _begin(ints, reals, len(offsets))
    block, n_obs, chunk = ints[1], ints[2], ints[{ns} - 2]
    nd = 0
    status = 1
    for li in range(ints[{ns} - 1]):
        ids = _next_blocks(bits, seed, ints, li, drawn, nd)
        if len(ids) == 0:
            continue
        nd += len(ids)
        start = 0
        outcome = -1
        while outcome < 0 and start < len(ids):
            alive = _alive_candidates(cand, ints, len(offsets))
            stop = min(len(ids), start + max(chunk // (len(alive) * block), 1))
            sub = ids[start:stop]
{gathers}
            batch = np.ascontiguousarray(fn(alive, {call})[0])
            outcome = look_c(batch.ctypes, batch.shape[0], batch.shape[1], ints.ctypes,
                              len(ints), reals.ctypes, len(reals), offsets.ctypes, len(offsets),
                              stop < len(ids))
            start = stop
        if outcome >= 0:
            status = outcome
            break
    unmark(bits, drawn[:nd])
    return status
"""


@njit_cached()
def _begin(ints, reals, d):  # pragma: no cover - compiled
    """Start a race in the buffers (every arm alive, nothing drawn); return the draw log."""
    out, alive, rows = layout(ints, d)
    for i in range(d):
        ints[alive + i] = i
        reals[rows + i] = 0.0
        reals[rows + d + i] = 0.0
        reals[rows + 2 * d + i] = 0.0
        reals[rows + 3 * d + i] = np.nan
    for k in range(N_OUT_INTS):
        ints[out + k] = 0
    ints[out] = d
    ints[out + 2] = -1  # no reference arm
    ints[out + 6] = -1  # no winner
    n_looks, block = ints[N_SETTINGS - 1], ints[1]
    return np.empty(ints[out - 1] // block + n_looks + 1, dtype=np.int64)


@njit_cached()
def _next_blocks(bits, seed, ints, li, drawn, nd):  # pragma: no cover - compiled
    """Draw the blocks of look ``li`` (none when it adds no rows); log them in ``drawn``."""
    n_blocks, block = ints[0], ints[1]
    n_drawn = ints[layout(ints, 0)[0] + 1]
    k = ints[N_SETTINGS + li] - n_drawn
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    want = (k + block - 1) // block
    ids = draw_sorted(bits, n_blocks, want, seed)
    drawn[nd : nd + want] = ids
    return ids


@njit_cached()
def _alive_candidates(cand, ints, d):  # pragma: no cover - compiled
    """Return the candidates of the arms still alive."""
    out, alive, _ = layout(ints, d)
    return cand[ints[alive : alive + ints[out]]]


#: Drivers compiled last, held strongly (least recently used dropped first): races set
#: up one after another on the same function (a step's timing, then its own) share one.
RECENT_DRIVERS = 1
_RECENT: OrderedDict = OrderedDict()
#: Every driver still in use (held by a :class:`CompiledRace`), by ``id`` of its function.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def driver_compiled(fn, n_rows: int, n_others: int) -> bool:
    """Return True when this process holds a compiled driver of ``fn`` (no compilation due)."""
    driver = _LIVE.get((id(fn), n_rows, n_others))
    return bool(
        driver is not None and driver.py_func.__globals__.get("fn") is fn and driver.signatures
    )


def _driver(fn, n_rows: int, n_others: int):
    """Return the compiled driver of ``fn`` for ``n_rows`` data arrays and ``n_others`` inputs.

    ``fn`` is bound into the driver as a global, not passed: a dispatcher
    passed as an argument is typed anew at every call. The
    look itself is :func:`~.packed.look_c`, compiled once and cached. Drivers are
    cached weakly (while a race holds them) and the last
    :data:`RECENT_DRIVERS` strongly: a driver keeps its function alive, and
    Numba's compiled code cannot be collected in a cycle, so a cache that
    grew with every step (or hung the driver on the function) would keep
    every step's functions for the session.
    """
    key = (id(fn), n_rows, n_others)
    driver = _LIVE.get(key)
    if driver is not None and driver.py_func.__globals__.get("fn") is fn:
        _RECENT[key] = driver
        _RECENT.move_to_end(key)
        return driver
    rows = [f"d{i}" for i in range(n_rows)]
    others = [f"o{i}" for i in range(n_others)]
    gathers = "\n".join(
        f"            r{i} = gather_blocks(d{i}, sub, block, n_obs)" for i in range(n_rows)
    )
    source = _TEMPLATE.format(
        args=", ".join(rows + others),
        gathers=gathers,
        call=", ".join([f"r{i}" for i in range(n_rows)] + others),
        ns=N_SETTINGS,
    )
    namespace = {
        "fn": fn,
        "_begin": _begin,
        "_next_blocks": _next_blocks,
        "_alive_candidates": _alive_candidates,
        "look_c": look_c(),
        "np": np,
        "gather_blocks": gather_blocks,
        "unmark": unmark,
    }
    exec(compile(source, f"<race_blocks driver {key[1:]}>", "exec"), namespace)  # noqa: S102
    driver = njit(namespace["driver"])
    _LIVE[key] = driver
    _RECENT[key] = driver
    while len(_RECENT) > RECENT_DRIVERS:
        _RECENT.popitem(last=False)
    return driver


def _no_row_rewards(arms, idx):
    """Rewards callback of a compiled race's exact pass, which reads only ``totals``."""
    raise RuntimeError("a compiled race reads its rows itself")


class CompiledRewards:
    r"""Rewards computed by a Numba-compiled function of gathered data rows.

    ``fn(candidates, *rows, *others)`` returns a tuple whose first element is
    the ``(len(candidates), len(rows))`` matrix of rewards, as a PyTensor
    function compiled with the Numba backend does (its ``vm.jit_fn``).

    Parameters
    ----------
    fn : numba dispatcher
        The compiled reward function.
    data : sequence of numpy.ndarray
        C-contiguous arrays whose first axis is the population (in a
        uniformly random order, e.g. row-permuted copies of the data).
    """

    def __init__(self, fn, data):
        self.fn = fn
        self.data = tuple(data)


def _blocks(n_obs: int) -> tuple[int, int]:
    """Rows per block (:func:`~.schedule.block_rows`) and number of blocks of ``n_obs``."""
    block = block_rows(n_obs)
    return block, -(-n_obs // block)


def supports(config: RaceConfig, n_arms: int, n_obs: int, totals) -> bool:
    """Return True when :func:`race_blocks` can run this race.

    Racing-Normal on whole random blocks with a fused exact pass (``totals``)
    after a last subsampled look that stays within the bitmap draw and below
    half of the population, with more than one arm.
    """
    if config.bound != "normal" or config.batches != "blocks" or totals is None or n_arms < 2:
        return False
    looks = config.looks(n_obs)
    if len(looks) < 2:
        return False
    block, n_blocks = _blocks(n_obs)
    last = int(looks[-2]) + block
    return 2 * last < n_obs and last <= REJECTION_SHARE * n_blocks * block - block


class CompiledRace:
    r"""A Racing-Normal race on compiled rewards, set up once and run many times.

    Everything that does not change between races of the same settings (the
    look sizes, the bound's constants, the compiled driver) is prepared here,
    so that a race costs one compiled call plus a few microseconds of Python.

    Parameters
    ----------
    rewards : CompiledRewards
        The compiled reward function (its data arrays are passed at each run:
        a row permutation may be redrawn between races).
    config : RaceConfig
        Settings (``bound="normal"``, ``batches="blocks"``; :func:`supports`).
    n_arms : int
        Number of arms :math:`D`.
    n_obs : int
        Population size :math:`N`.
    n_others : int
        Number of further inputs of the reward function.
    chunk_rewards : int, optional
        Most rewards (surviving arms × rows) per reward call; a larger look
        is evaluated and merged in chunks of whole blocks (default
        :data:`CHUNK_REWARDS`).
    """

    def __init__(
        self,
        rewards: CompiledRewards,
        config: RaceConfig,
        n_arms: int,
        n_obs: int,
        n_others: int,
        chunk_rewards: int | None = None,
    ):
        if chunk_rewards is not None and not (
            isinstance(chunk_rewards, int | np.integer) and chunk_rewards >= 1
        ):
            raise ValueError(
                f"chunk_rewards must be a positive integer (rewards per reward call), got "
                f"{chunk_rewards!r}; leave it None for CHUNK_REWARDS = {CHUNK_REWARDS}"
            )
        self.kernel = kernel = SharedRace(config, n_arms, n_obs)
        self.n_obs = int(n_obs)
        self.block, self.n_blocks = _blocks(self.n_obs)
        self._driver = _driver(rewards.fn, len(rewards.data), int(n_others))
        self.chunk_rewards = CHUNK_REWARDS if chunk_rewards is None else int(chunk_rewards)
        self._ints, self._reals = pack(kernel, self.n_blocks, self.block, self.chunk_rewards)
        # views of what the driver writes: the race's state after its last look
        out = N_SETTINGS + len(kernel.look_sizes) - 1
        self._out_ints = self._ints[out : out + N_OUT_INTS]
        self._out_alive = self._ints[out + N_OUT_INTS :]

    def launch(
        self,
        candidates: np.ndarray,
        data: tuple,
        others: tuple,
        seed: np.ndarray,
        offsets: np.ndarray,
    ) -> int:
        """Run the subsampled looks from the SplitMix64 state ``seed``; return the status.

        The lean entry point of :meth:`run`: when the status is
        :data:`~.packed.DECIDED`, :meth:`outcome` tells the winner, evaluations and
        looks, and :meth:`state` builds the full state otherwise.
        """
        bits = claim_bitmap(self.n_blocks)[0]  # the driver unmarks its own draws when done
        status = self._driver(
            candidates, *data, *others, bits, seed, self._ints, self._reals, offsets
        )
        if status in (NAN_REWARD, POSINF_REWARD):  # the shared check raises the usual error
            check_reward_values(np.array([np.nan if status == NAN_REWARD else np.inf]))
        return status

    def outcome(self) -> tuple[int, int, int]:
        """Return ``(winner, n_evaluations, n_rounds)`` of the last launch (winner −1 if none)."""
        _, _, _, _, n_evals, n_rounds, winner = self._out_ints.tolist()
        return winner, n_evals, n_rounds

    def rows_drawn(self) -> int:
        """Return the observations the last launch drew per surviving arm (its sample size)."""
        return int(self._out_ints[1])

    def survivors(self) -> np.ndarray:
        """Return the arms alive after the last launch (the driver's buffer: read, not kept)."""
        return self._out_alive[: self._out_ints[0]]

    def exact_outcome(self, offsets: np.ndarray, sums: np.ndarray) -> tuple[int, int, int] | None:
        r"""End the last launch's race in its exact pass: ``(winner, n_evaluations, n_rounds)``.

        The lean form of :meth:`finish` after :data:`~.packed.EXACT_PASS`, for finite
        ``sums``, the survivors' sums :math:`\sum_{n=1}^N r_n(i)`: the winner
        is the survivor of largest ``sums / N + offsets``, as
        :meth:`~pymc_subsample.racing.race.SharedRace.exact_look` decides.
        Returns None when some sum is not finite (:meth:`finish` then decides,
        or raises the usual error).
        """
        na = int(self._out_ints[0])
        if len(sums) != na or not np.isfinite(sums).all():
            return None
        alive = self._out_alive[:na]
        winner = int(alive[np.argmax(sums / self.n_obs + offsets[alive])])
        return winner, int(self._out_ints[4]) + self.n_obs * na, int(self._out_ints[5]) + 1

    def state(self, offsets: np.ndarray) -> RaceState:
        """Return the :class:`~pymc_subsample.racing.state.RaceState` after the last launch.

        ``offsets`` are the arms' offsets that launch ran with.
        """
        return unpack(self._ints, self._reals, offsets)

    def run(
        self,
        candidates: np.ndarray,
        data: tuple,
        others: tuple,
        rng: np.random.Generator,
        offsets: np.ndarray,
    ) -> tuple[SharedRace, RaceState, int]:
        """Run the subsampled looks (see :func:`race_blocks`); return ``(kernel, state, status)``.

        ``data`` are the reward function's data arrays (a uniformly random
        order of the rows); ``kernel`` is the race's kernel with ``offsets``,
        to end the race with.
        """
        status = self.launch(candidates, data, others, new_seed(rng), offsets)
        return self.kernel.with_offsets(offsets), self.state(offsets), status

    def finish(self, status: int, offsets: np.ndarray, totals: TotalsFn) -> RaceResult:
        """End the race of the last launch: its result, exact pass or rescue through ``totals``.

        :meth:`SharedRace.finish <pymc_subsample.racing.state.SharedRace.finish>`
        on the launch's state, which tells what ``status`` tells.
        """
        kernel, state = self.kernel.with_offsets(offsets), self.state(offsets)
        return kernel.finish(state, totals, _no_row_rewards)

    def __call__(
        self,
        candidates: np.ndarray,
        data: tuple,
        others: tuple,
        rng: np.random.Generator,
        offsets: np.ndarray,
        totals: TotalsFn,
    ) -> RaceResult:
        """Run a whole race: :meth:`launch`, then :meth:`finish` (:func:`race_compiled`)."""
        status = self.launch(candidates, data, others, new_seed(rng), offsets)
        return self.finish(status, offsets, totals)


def race_blocks(
    rewards: CompiledRewards,
    candidates: np.ndarray,
    others: tuple,
    n_obs: int,
    config: RaceConfig,
    *,
    rng: np.random.Generator,
    offsets: np.ndarray,
) -> tuple[SharedRace, RaceState, int]:
    r"""Run the subsampled looks of a Racing-Normal race in one compiled call.

    The looks, bound, eliminations, skew guard and give-up test are those of
    :func:`~pymc_subsample.racing.race.race_shared` with ``batches="blocks"``
    (:func:`supports` tells when it applies); the rewards of arm :math:`i` on
    rows ``r`` are ``rewards.fn(candidates[i], *rows, *others)``.

    Parameters
    ----------
    rewards : CompiledRewards
        The compiled reward function and its data arrays.
    candidates : numpy.ndarray
        One candidate per arm (first axis), passed to the reward function.
    others : tuple of numpy.ndarray
        Further inputs of the reward function, unchanged between looks.
    n_obs : int
        Population size :math:`N`.
    config : RaceConfig
        Settings (``bound="normal"``, ``batches="blocks"``).
    rng : numpy.random.Generator
        Source of the block draws (one seed, as a :class:`RandomBlocks` stream
        draws it).
    offsets : numpy.ndarray
        Offset of each arm.

    Returns
    -------
    kernel : SharedRace
        The race's kernel, to end it with.
    state : RaceState
        The state after the last look: decided (``winner >= 0``), or waiting
        for the exact pass (or, with no survivor left, for the rescue).
    status : int
        :data:`~.packed.DECIDED`, :data:`~.packed.EXACT_PASS` or :data:`~.packed.ALL_MINUS_INF`.

    Raises
    ------
    ValueError
        When a reward is NaN or +inf.
    """
    race = CompiledRace(rewards, config, len(offsets), n_obs, len(others))
    return race.run(candidates, rewards.data, others, rng, offsets)


def race_compiled(
    rewards: CompiledRewards,
    candidates: np.ndarray,
    others: tuple,
    n_obs: int,
    config: RaceConfig,
    *,
    rng: np.random.Generator,
    offsets: np.ndarray,
    totals: TotalsFn,
) -> RaceResult:
    """Run a whole race: :func:`race_blocks`, then its exact pass or rescue through ``totals``.

    Parameters
    ----------
    rewards, candidates, others, n_obs, config, rng, offsets
        As for :func:`race_blocks`.
    totals : callable
        ``totals(arms)``: each arm's sum over all :math:`N` observations (one
        fused pass), for the exact pass.

    Returns
    -------
    RaceResult
        As :func:`~pymc_subsample.racing.race.race_shared` returns it.
    """
    race = CompiledRace(rewards, config, len(offsets), n_obs, len(others))
    return race(candidates, rewards.data, others, rng, offsets, totals)

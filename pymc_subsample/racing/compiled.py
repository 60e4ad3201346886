r"""A whole Racing-Normal race in one compiled call, for rewards that are compiled too.

:func:`~pymc_subsample.racing.race.race_shared` calls Python at every look: the
reward callback, the position stream, the state update. On cheap terms at large
:math:`N` that Python costs more than the terms themselves. When the rewards
come from a Numba-compiled function of the rows of some data arrays (as a
PyTensor function compiled with the Numba backend is), the whole subsampled
part of a race can run in one compiled call instead: :func:`race_blocks` draws
whole random blocks of positions (the same :class:`~pymc_subsample.racing.
schedule.RandomBlocks` draw, from the same SplitMix64 stream), gathers the
rows, calls the reward function on the survivors, and applies
:func:`~pymc_subsample.racing.kernels.look_normal`, the eliminations and the
give-up test of :meth:`~pymc_subsample.racing.race.SharedRace.hopeless`, look
after look; it returns the race's state, and the caller ends the race (exact
pass, rescue) as :func:`~pymc_subsample.racing.race.race_shared` does. Same
settings and the same random stream give the same decisions as the Python
driver.

The driver is generated for each reward function (bound in as a global),
number of data arrays and of extra inputs, and compiled once. It holds only
the block draws, the gathers and the reward call; everything a look does
after the rewards (statistics, bound, skew guard, eliminations, give-up
test) is :func:`_look`, compiled once per machine and cached on disk, which
the driver calls through a C function pointer (:func:`_look_c`): called
directly, its code would be compiled into every driver again (about 4 s of
LLVM, 19 s in all with the NumPy code it used). A driver builds in about 2 s.
A look of more than :data:`CHUNK_REWARDS` rewards is evaluated in chunks of
whole blocks, merged as they come, with the bound at the look's last chunk.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np
from numba import carray, njit, types

from .._numba_cache import cfunc_cached, njit_cached
from .common import RaceResult, TotalsFn, check_reward_values
from .kernels import look_normal, stuck_arms
from .race import RaceConfig, RaceState, SharedRace, _exact_pass, _rescue
from .schedule import (
    REJECTION_SHARE,
    _draw_sorted,
    _gather_blocks,
    _unmark,
    block_rows,
    claim_bitmap,
    new_seed,
)

__all__ = ["CompiledRace", "CompiledRewards", "race_blocks", "race_compiled", "supports"]

#: Status codes returned by a compiled race.
DECIDED, EXACT_PASS, ALL_MINUS_INF, NAN_REWARD, POSINF_REWARD = range(5)

#: Layout of a compiled race's integer array: :data:`_N_SETTINGS` settings (the last one
#: the number of looks L), the L look sizes, :data:`_N_OUT_INTS` outputs, then the D
#: surviving arms; its float array holds 5 settings, then the (4, D) state rows.
_N_SETTINGS, _N_OUT_INTS = 9, 7

#: Most rewards (surviving arms x rows) one reward call of a compiled race returns: a
#: larger look is evaluated in chunks of whole blocks, each merged into the running
#: statistics as it comes (:func:`_look`, ``merge_only``), so that the matrix of rewards
#: (512 kB) stays in a core's cache. Measured at D = 100: a 100 x 25,600 matrix (20 MB)
#: cost 0.87 ns a term to compute and 1.29 to look at, against 0.24 and 0.42 at
#: 100 x 4,096; a Normal draw at N = 10^6, D = 100 took 3.2 ms whole, 2.1-2.5 ms in
#: chunks of 2^14 to 2^17 rewards.
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
            outcome = _look_c(batch.ctypes, batch.shape[0], batch.shape[1], ints.ctypes,
                              len(ints), reals.ctypes, len(reals), offsets.ctypes, len(offsets),
                              stop < len(ids))
            start = stop
        if outcome >= 0:
            status = outcome
            break
    _unmark(bits, drawn[:nd])
    return status
"""


@njit_cached()
def _layout(ints, d):  # pragma: no cover - compiled
    """Where the race's state lies in the packed buffers: ``(out, alive, rows)``.

    ``ints[out:out + _N_OUT_INTS]`` are the outputs, ``ints[alive:alive + d]``
    the arms (the first ``ints[out]`` alive), ``reals[rows + k * d + i]``
    row ``k`` of the state (mean, mean difference, sum of squares of the
    alive arms; the dropped arms' means). Helpers index the buffers at these
    offsets rather than return views of them: views returned by a helper
    were seen to lose their last writes once compiled (Numba 0.68).
    """
    out = _N_SETTINGS + ints[_N_SETTINGS - 1]
    return out, out + _N_OUT_INTS, 5


@njit_cached()
def _begin(ints, reals, d):  # pragma: no cover - compiled
    """Start a race in the buffers (every arm alive, nothing drawn); return the draw log."""
    out, alive, rows = _layout(ints, d)
    for i in range(d):
        ints[alive + i] = i
        reals[rows + i] = 0.0
        reals[rows + d + i] = 0.0
        reals[rows + 2 * d + i] = 0.0
        reals[rows + 3 * d + i] = np.nan
    for k in range(_N_OUT_INTS):
        ints[out + k] = 0
    ints[out] = d
    ints[out + 2] = -1  # no reference arm
    ints[out + 6] = -1  # no winner
    n_looks, block = ints[_N_SETTINGS - 1], ints[1]
    return np.empty(ints[out - 1] // block + n_looks + 1, dtype=np.int64)


@njit_cached()
def _next_blocks(bits, seed, ints, li, drawn, nd):  # pragma: no cover - compiled
    """Draw the blocks of look ``li`` (none when it adds no rows); log them in ``drawn``."""
    n_blocks, block = ints[0], ints[1]
    n_drawn = ints[_layout(ints, 0)[0] + 1]
    k = ints[_N_SETTINGS + li] - n_drawn
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    want = (k + block - 1) // block
    ids = _draw_sorted(bits, n_blocks, want, seed)
    drawn[nd : nd + want] = ids
    return ids


@njit_cached()
def _alive_candidates(cand, ints, d):  # pragma: no cover - compiled
    """Return the candidates of the arms still alive."""
    out, alive, _ = _layout(ints, d)
    return cand[ints[alive : alive + ints[out]]]


@njit_cached()
def _look(batch, ints, reals, offsets, merge_only=False):  # pragma: no cover - compiled
    r"""Apply one look's rewards ``batch`` (alive arms × new rows) to the state in the buffers.

    :func:`~pymc_subsample.racing.kernels.look_normal` at the look's width,
    arms with a :math:`-\infty` reward dropped (their mean :math:`-\infty`),
    the eliminations, then the give-up test. Returns −1 when the race goes
    on, else its status (:data:`DECIDED`, :data:`EXACT_PASS` on giving up,
    :data:`ALL_MINUS_INF`, :data:`NAN_REWARD`, :data:`POSINF_REWARD`).

    ``merge_only``: ``batch`` is a chunk of a look, not its last: its rewards
    are merged into the running statistics (means, and differences with the
    leader in pairwise mode, by the same updates that merge a look into the
    previous ones), arms with a :math:`-\infty` reward dropped, and nothing
    else: no bound, no give-up test, no look counted. The look's last chunk
    then applies the bound at the look's sample size. With a leader that
    holds through the look (the usual case) the statistics are those of one
    whole look, up to rounding; when the leader changes within it, the
    differences restart from that chunk, as they restart at a look where
    the leader changes (fewer observations behind the variance: still an
    estimate of it), and the skew guard reads the last chunk.
    """
    d = len(offsets)
    out, at, rows = _layout(ints, d)
    n_obs, t_last = ints[2], ints[3]
    pairwise, guard, give_up = ints[4] != 0, ints[5] != 0, ints[6] != 0
    threshold, floor_range, cantelli = reals[0], reals[1], reals[2]
    factor_last, floor_last = reals[3], reals[4]
    na, n_drawn, ref, n_ref = ints[out], ints[out + 1], ints[out + 2], ints[out + 3]
    alive = ints[at : at + na].copy()
    mean = reals[rows : rows + na].copy()
    dmean = reals[rows + d : rows + d + na].copy()
    m2 = reals[rows + 2 * d : rows + 2 * d + na].copy()
    means = rows + 3 * d  # where the dropped arms' means go
    size = n_drawn + batch.shape[1]
    ints[out + 4] += batch.size
    if not merge_only:
        ints[out + 5] += 1
    factor = 0.0 if merge_only else threshold * np.sqrt((n_obs - size) / (n_obs - 1.0) / size)
    floor = 0.0
    if floor_range >= 0.0:
        p0 = 1.0 / (size + 1.0)
        floor = floor_range * np.sqrt(p0 * (1.0 - p0))
    status = -1
    while True:
        look = look_normal(batch, n_drawn, mean, ref, n_ref, dmean, m2, offsets[alive],
                           factor, floor, pairwise, guard, n_obs, cantelli)  # fmt: skip
        if look[1] >= 0:  # every reward finite
            break
        if np.isnan(batch).any():
            status = NAN_REWARD
            break
        if np.isposinf(batch).any():
            status = POSINF_REWARD
            break
        finite = np.array([np.isfinite(batch[i]).all() for i in range(len(alive))])
        for i in range(len(alive)):
            if not finite[i]:
                reals[means + alive[i]] = -np.inf
        kept = np.flatnonzero(finite)
        new_ref = -1
        for j in range(len(kept)):
            if kept[j] == ref:
                new_ref = j
        ref = new_ref
        alive = alive[kept]
        batch = np.ascontiguousarray(batch[kept])
        mean = mean[kept]
        dmean = dmean[kept]
        m2 = m2[kept]
        if len(alive) == 0:
            status = ALL_MINUS_INF
            break
    if status < 0:
        stats, lead, n_ref, n_keep, keep = look
        mean = stats[0]
        dmean = stats[1]
        m2 = stats[2]
        ref = lead if pairwise else -1
        if len(alive) > 1 and n_keep < len(alive):
            off = offsets[alive]
            for i in range(len(alive)):
                if not keep[i]:
                    reals[means + alive[i]] = mean[i] + off[i]
            if ref >= 0:
                ref = np.count_nonzero(keep[:ref])
            alive = alive[keep]
            mean = mean[keep]
            dmean = dmean[keep]
            m2 = m2[keep]
        if len(alive) == 1:
            ints[out + 6] = alive[0]
            status = DECIDED
        elif give_up and size < t_last and not merge_only:
            stuck = stuck_arms(
                mean, offsets[alive], m2, ref, n_ref, size, pairwise, factor_last, floor_last, n_obs
            )
            if stuck > 0 and 2 * (stuck + 1) >= len(alive):
                status = EXACT_PASS
    na = len(alive)
    for i in range(na):
        ints[at + i] = alive[i]
        reals[rows + i] = mean[i]
        reals[rows + d + i] = dmean[i]
        reals[rows + 2 * d + i] = m2[i]
    ints[out] = na
    ints[out + 1] = size
    ints[out + 2] = ref
    ints[out + 3] = n_ref
    return status


_F8P, _I8P, _I8 = types.CPointer(types.float64), types.CPointer(types.int64), types.int64


@cfunc_cached(types.int64(_F8P, _I8, _I8, _I8P, _I8, _F8P, _I8, _F8P, _I8, types.boolean))
def _look_c(
    batch, n_alive, m, ints, n_ints, reals, n_reals, offsets, d, merge_only
):  # pragma: no cover
    """:func:`_look` behind a C pointer, called from the generated drivers.

    A driver that called :func:`_look` directly would compile its code anew
    (about 4 s of LLVM per driver); through this pointer, it is compiled
    once and cached on disk. Numba keys that cache on this file alone: after
    editing the kernels it calls (``kernels.py``), delete
    ``racing/__pycache__/*.nbi`` and ``*.nbc``, or the cached look keeps the
    old kernels (a fresh install or clone has no cache).
    """
    return _look(
        carray(batch, (n_alive, m)), carray(ints, (n_ints,)), carray(reals, (n_reals,)),
        carray(offsets, (d,)), merge_only,
    )  # fmt: skip


#: Drivers compiled last, held strongly (least recently used dropped first): races set
#: up one after another on the same function (a step's timing, then its own) share one.
RECENT_DRIVERS = 1
_RECENT: OrderedDict = OrderedDict()
#: Every driver still in use (held by a :class:`CompiledRace`), by ``id`` of its function.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _driver(fn, n_rows: int, n_others: int):
    """Return the compiled driver of ``fn`` for ``n_rows`` data arrays and ``n_others`` inputs.

    ``fn`` is bound into the driver as a global, not passed: a dispatcher
    passed as an argument is typed anew at every call (about 10 µs). The
    look itself is :func:`_look_c`, compiled once and cached. Drivers are
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
        f"            r{i} = _gather_blocks(d{i}, sub, block, n_obs)" for i in range(n_rows)
    )
    source = _TEMPLATE.format(
        args=", ".join(rows + others),
        gathers=gathers,
        call=", ".join([f"r{i}" for i in range(n_rows)] + others),
        ns=_N_SETTINGS,
    )
    namespace = {
        "fn": fn,
        "_begin": _begin,
        "_next_blocks": _next_blocks,
        "_alive_candidates": _alive_candidates,
        "_look_c": _look_c,
        "np": np,
        "_gather_blocks": _gather_blocks,
        "_unmark": _unmark,
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
        bound = kernel.bound
        t_last = kernel._t_last
        factor_last, floor_last = kernel._widths.get(t_last, (0.0, 0.0))
        # settings, look sizes and the race's outputs packed in two arrays: Numba types and
        # unboxes each argument at each call (about 0.1 µs), and returned arrays are boxed
        looks = np.asarray(kernel.look_sizes[:-1], dtype=np.int64)
        d, n_looks = int(n_arms), len(looks)
        self.chunk_rewards = CHUNK_REWARDS if chunk_rewards is None else int(chunk_rewards)
        settings = [self.n_blocks, self.block, self.n_obs, t_last, kernel.pairwise,
                    kernel._guard, kernel.can_give_up, self.chunk_rewards, n_looks]  # fmt: skip
        assert len(settings) == _N_SETTINGS  # the layout the driver reads (_N_SETTINGS)
        out = _N_SETTINGS + n_looks
        self._ints = np.zeros(out + _N_OUT_INTS + d, dtype=np.int64)
        self._ints[:_N_SETTINGS] = settings
        self._ints[_N_SETTINGS:out] = looks
        floor_range = -1.0 if bound.floor_range is None else float(bound.floor_range)
        self._reals = np.zeros(5 + 4 * d)
        self._reals[:5] = [bound.threshold, floor_range, kernel._cantelli, factor_last, floor_last]
        # views of what the driver writes: the race's state after its last look
        self._looks = self._ints[_N_SETTINGS:out]
        self._out_ints = self._ints[out : out + _N_OUT_INTS]
        self._out_alive = self._ints[out + _N_OUT_INTS :]
        self._out_reals = self._reals[5:].reshape(4, d)

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
        :data:`DECIDED`, :meth:`outcome` tells the winner, evaluations and
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

        The lean form of :meth:`finish` after :data:`EXACT_PASS`, for finite
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
        """Return the :class:`~pymc_subsample.racing.race.RaceState` after the last launch.

        ``offsets`` are the arms' offsets that launch ran with.
        """
        na, n_drawn, ref, n_ref, n_evals, n_rounds, winner = self._out_ints.tolist()
        reals = self._out_reals
        alive = self._out_alive[:na].copy()
        rows = np.empty((4, na))
        rows[:3] = reals[:3, :na]
        rows[3] = offsets[alive]
        return RaceState(
            alive, n_drawn, rows, ref, n_ref, reals[3].copy(), n_evals, n_rounds, winner
        )  # fmt: skip

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
        """End the race of the last launch: its result, exact pass or rescue through ``totals``."""
        kernel, state = self.kernel.with_offsets(offsets), self.state(offsets)
        if status == DECIDED:
            return kernel.result(state)
        if status == EXACT_PASS:
            return _exact_pass(kernel, state, _no_row_rewards, totals)
        return _rescue(kernel, state, _no_row_rewards, totals)

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
        :data:`DECIDED`, :data:`EXACT_PASS` or :data:`ALL_MINUS_INF`.

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

r"""A race's state packed in two arrays, and the compiled look on it.

The compiled race (:mod:`~pymc_subsample.racing.compiled`) keeps a Racing-Normal
race's settings, look sizes and state in one int64 and one float64 array
(:func:`pack`, :func:`layout`, :func:`unpack`): Numba types and unboxes each
argument at each call, and boxes each array it returns, so a driver that takes
two buffers and returns a status costs least. :func:`look_packed` applies a
look to that state: the kernel of :meth:`SharedRace.update
<pymc_subsample.racing.state.SharedRace.update>`
(:func:`~pymc_subsample.racing.kernels.look_rows`), then the eliminations, the
−inf drops and the give-up test (Chen & Ghahramani 2016, Alg. 1); the drivers
call it through a C function pointer (:func:`look_c`, made at the first race), and Python through
:func:`look_state`, which lets the two drivers be compared on any state.
"""

from __future__ import annotations

import numpy as np
from numba import carray, types

from .._numba_cache import cfunc_cached, njit_cached
from .kernels import look_rows
from .state import RaceState, SharedRace

__all__ = [
    "ALL_MINUS_INF",
    "DECIDED",
    "EXACT_PASS",
    "NAN_REWARD",
    "N_OUT_INTS",
    "N_SETTINGS",
    "POSINF_REWARD",
    "layout",
    "look_c",
    "look_packed",
    "look_state",
    "pack",
    "unpack",
]

#: Status codes returned by a compiled race.
DECIDED, EXACT_PASS, ALL_MINUS_INF, NAN_REWARD, POSINF_REWARD = range(5)

#: Layout of a compiled race's integer array: :data:`N_SETTINGS` settings (the last one
#: the number of looks L), the L look sizes, :data:`N_OUT_INTS` outputs, then the D
#: surviving arms; its float array holds 5 settings, then the (4, D) state rows.
N_SETTINGS, N_OUT_INTS = 9, 7


@njit_cached()
def layout(ints, d):  # pragma: no cover - compiled
    """Where the race's state lies in the packed buffers: ``(out, alive, rows)``.

    ``ints[out:out + N_OUT_INTS]`` are the outputs, ``ints[alive:alive + d]``
    the arms (the first ``ints[out]`` alive), ``reals[rows + k * d + i]``
    row ``k`` of the state (mean, mean difference, sum of squares of the
    alive arms; the dropped arms' means). Helpers index the buffers at these
    offsets rather than return views of them: views returned by a helper
    were seen to lose their last writes once compiled (Numba 0.68).
    """
    out = N_SETTINGS + ints[N_SETTINGS - 1]
    return out, out + N_OUT_INTS, 5


@njit_cached()
def look_packed(batch, ints, reals, offsets, merge_only=False):  # pragma: no cover - compiled
    r"""Apply one look's rewards ``batch`` (alive arms × new rows) to the state in the buffers.

    The look of :meth:`~pymc_subsample.racing.state.SharedRace.update`, on the
    state held in the packed buffers: the same compiled kernel
    (:func:`~pymc_subsample.racing.kernels.look_rows`: statistics, bound,
    skew guard and the stuck count of the give-up test) at the look's width,
    arms with a :math:`-\infty` reward dropped first (their mean
    :math:`-\infty`), then the eliminations. Returns −1 when the race goes
    on, else its status (:data:`DECIDED`, :data:`EXACT_PASS` on giving up,
    :data:`ALL_MINUS_INF`, :data:`NAN_REWARD`, :data:`POSINF_REWARD`). Unlike
    the Python update, it keeps no arm for sparse differences
    (:func:`~pymc_subsample.racing.state.sparse_arms`).

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
    out, at, rows = layout(ints, d)
    n_obs, t_last = ints[2], ints[3]
    pairwise, guard, give_up = ints[4] != 0, ints[5] != 0, ints[6] != 0
    threshold, floor_range, cantelli = reals[0], reals[1], reals[2]
    na, n_drawn, ref, n_ref = ints[out], ints[out + 1], ints[out + 2], ints[out + 3]
    alive = ints[at : at + na].copy()
    state = np.empty((4, na))  # the survivors' rows, as a RaceState holds them
    for k in range(3):
        state[k] = reals[rows + k * d : rows + k * d + na]
    state[3] = offsets[alive]
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
    last = (-1.0, 0.0)  # no stuck count
    if give_up and size < t_last and not merge_only:
        last = (reals[3], reals[4])
    status = -1
    new = np.empty((5, na))
    lead, n_ref_new, n_keep, n_stuck = -1, n_ref, 0, -1
    while True:
        new = np.empty((5, len(alive)))
        lead, n_ref_new, n_keep, n_stuck = look_rows(
            batch, n_drawn, state, ref, n_ref, factor, floor, pairwise, guard, n_obs, cantelli,
            new, last,
        )  # fmt: skip
        if lead >= 0:  # every reward finite
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
        state = np.ascontiguousarray(state[:, kept])
        if len(alive) == 0:
            status = ALL_MINUS_INF
            break
    if status < 0:
        state = new
        n_ref = n_ref_new
        ref = lead if pairwise else -1
        if len(alive) > 1 and n_keep < len(alive):
            keep = np.flatnonzero(new[4] != 0.0)
            for i in range(len(alive)):
                if new[4, i] == 0.0:
                    reals[means + alive[i]] = new[0, i] + new[3, i]
            if ref >= 0:
                ref = np.count_nonzero(new[4, :ref] != 0.0)
            alive = alive[keep]
            state = np.ascontiguousarray(new[:, keep])
        if len(alive) == 1:
            ints[out + 6] = alive[0]
            status = DECIDED
        elif n_stuck > 0 and 2 * (n_stuck + 1) >= len(alive):
            status = EXACT_PASS
    na = len(alive)
    for i in range(na):
        ints[at + i] = alive[i]
        for k in range(3):
            reals[rows + k * d + i] = state[k, i]
    ints[out] = na
    ints[out + 1] = size
    ints[out + 2] = ref
    ints[out + 3] = n_ref
    return status


_F8P, _I8P, _I8 = types.CPointer(types.float64), types.CPointer(types.int64), types.int64


_LOOK_C_SIGNATURE = types.int64(_F8P, _I8, _I8, _I8P, _I8, _F8P, _I8, _F8P, _I8, types.boolean)
_LOOK_C: list = []  # the compiled C function, made at the first call of look_c


def _look_c(
    batch, n_alive, m, ints, n_ints, reals, n_reals, offsets, d, merge_only
):  # pragma: no cover - compiled
    return look_packed(
        carray(batch, (n_alive, m)), carray(ints, (n_ints,)), carray(reals, (n_reals,)),
        carray(offsets, (d,)), merge_only,
    )  # fmt: skip


def look_c():
    """Return :func:`look_packed` behind a C pointer, which the generated drivers call.

    A driver that called :func:`look_packed` directly would compile its code anew
    (seconds of LLVM per driver); through this pointer, it is compiled
    once and cached on disk. A C function with a signature is compiled when it
    is made, so it is made at the first call (the first compiled race), not at
    import: a process that never runs a compiled race does not pay for it on a
    machine without its disk cache. Numba keys that cache on this file alone: after
    editing the kernels it calls (``kernels.py``), delete
    ``racing/__pycache__/*.nbi`` and ``*.nbc``, or the cached look keeps the
    old kernels (a fresh install or clone has no cache).
    """
    if not _LOOK_C:
        _LOOK_C.append(cfunc_cached(_LOOK_C_SIGNATURE)(_look_c))
    return _LOOK_C[0]


def pack(
    kernel: SharedRace, n_blocks: int, block: int, chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pack a race's settings and look sizes into the two buffers a compiled race reads.

    Numba types and unboxes each argument at each call, and
    returned arrays are boxed: the settings, the look sizes and the race's
    outputs travel in one int64 and one float64 array (:func:`layout`).
    """
    bound = kernel.bound
    factor_last, floor_last = kernel.last_width if kernel.can_give_up else (0.0, 0.0)
    looks = np.asarray(kernel.look_sizes[:-1], dtype=np.int64)
    d, n_looks = kernel.n_arms, len(looks)
    settings = [n_blocks, block, kernel.n_obs, kernel.t_last, kernel.pairwise, kernel.guard,
                kernel.can_give_up, chunk, n_looks]  # fmt: skip
    assert len(settings) == N_SETTINGS  # the layout the driver reads (N_SETTINGS)
    out = N_SETTINGS + n_looks
    ints = np.zeros(out + N_OUT_INTS + d, dtype=np.int64)
    ints[:N_SETTINGS] = settings
    ints[N_SETTINGS:out] = looks
    floor_range = -1.0 if bound.floor_range is None else float(bound.floor_range)
    reals = np.zeros(5 + 4 * d)
    reals[:5] = [bound.threshold, floor_range, kernel.cantelli, factor_last, floor_last]
    return ints, reals


def unpack(ints: np.ndarray, reals: np.ndarray, offsets: np.ndarray) -> RaceState:
    """Read the :class:`~pymc_subsample.racing.state.RaceState` held in a race's buffers."""
    d = len(offsets)
    out = N_SETTINGS + int(ints[N_SETTINGS - 1])
    na, n_drawn, ref, n_ref, n_evals, n_rounds, winner = ints[out : out + N_OUT_INTS].tolist()
    state = reals[5:].reshape(4, d)
    alive = ints[out + N_OUT_INTS : out + N_OUT_INTS + na].copy()
    rows = np.empty((4, na))
    rows[:3] = state[:3, :na]
    rows[3] = offsets[alive]
    return RaceState(alive, n_drawn, rows, ref, n_ref, state[3].copy(), n_evals, n_rounds, winner)


def look_state(
    kernel: SharedRace, state: RaceState, batch: np.ndarray, merge_only: bool = False
) -> tuple[RaceState, int]:
    """Apply one look of the compiled race to a state, from Python.

    The compiled twin of :meth:`SharedRace.update
    <pymc_subsample.racing.state.SharedRace.update>` for Racing-Normal looks
    before the exact switch: the same kernel
    (:func:`~pymc_subsample.racing.kernels.look_rows`) on the state packed
    into the buffers a compiled race reads, and the same eliminations, −inf
    drops and give-up test, written in Numba (:func:`look_packed`, which
    every compiled look runs). From Python it lets the two drivers be
    compared on any state (without sparse differences, which only the Python update
    guards against).

    Parameters
    ----------
    kernel : SharedRace
        The race (Racing-Normal), with its offsets.
    state : RaceState
        The state before the look (``n_drawn`` plus the batch below the
        population size).
    batch : numpy.ndarray
        ``(len(state.alive), m)`` rewards of the survivors on the new rows.
    merge_only : bool
        The batch is a chunk of a look, not its last (no bound, no look
        counted).

    Returns
    -------
    state : RaceState
        The state after the look (``n_stuck`` −1, ``sparse`` False).
    status : int
        −1 when the race goes on, else :data:`DECIDED`, :data:`EXACT_PASS`
        (gives up), :data:`ALL_MINUS_INF`, :data:`NAN_REWARD` or
        :data:`POSINF_REWARD`.
    """
    ints, reals = pack(kernel, 1, 1, 0)
    d = kernel.n_arms
    out, at, rows = layout(ints, d)
    na = len(state.alive)
    ints[out : out + N_OUT_INTS] = [na, state.n_drawn, state.ref, state.n_ref,
                                     state.n_evaluations, state.n_rounds, state.winner]  # fmt: skip
    ints[at : at + na] = state.alive
    stats = reals[rows:].reshape(4, d)
    stats[:3, :na] = state.rows[:3]
    stats[3] = state.means
    offsets = np.asarray(kernel.offsets, dtype=np.float64)
    batch = np.ascontiguousarray(batch, dtype=np.float64)
    status = look_packed(batch, ints, reals, offsets, merge_only)
    return unpack(ints, reals, offsets), int(status)

r"""Compiled functions that start on PyTensor's Python VM and move to Numba once they have paid.

PyTensor's Numba backend turns a graph into machine code at its first call:
seconds for each graph new to the machine, tens of seconds for the largest
(an expansion's Hessian), and a step compiles about ten of them. Many are
called a few times only (a Newton step's sums, the lengths, an audit), and
even the hot ones need not be fast at the first draw. A :class:`TieredFunction`
therefore evaluates its graph first with PyTensor's Python VM
(:data:`START_MODE`: no compilation, NumPy per operation, tens of microseconds
an operation), and compiles it with the default mode (Numba) once the calls
have cost a budget in all (:data:`PROMOTE_SECONDS`, or the machine's
:func:`seconds_per_node` per operation of the graph, the larger: a compilation
costs more the larger the graph), or at once after a call of
:data:`SLOW_CALL_SECONDS` and half the budget (timing calls included). A function
that has paid a share of its budget (:data:`BACKGROUND_SHARE`) compiles in another
process while its first tier keeps serving (:data:`BACKGROUND_COMPILE`,
:mod:`~pymc_subsample.model.background`): there the compilation does not hold the
calls up. The first tier's rewrites, paid again in each process, count as rent.
It is the rule of ski rental: rent until the rent paid equals the price of
buying, which spends at most about twice the better of the two choices made in
hindsight. A function called a few times is never compiled,
a hot one once its calls have cost about what compiling it would; how many
calls that takes depends on what a call costs, not on a count. A graph whose
first tier would loop in Python over each element (an operation with no NumPy
function, :func:`loops_in_python`) moves before a call on
:data:`PYTHON_LOOP_ELEMENTS` elements or more; the first tier's rewrites give
the common such operations (softplus, log1mexp, ...) a NumPy function
(:mod:`~pymc_subsample.model.numpy_elemwise`), so that few graphs loop.
Calls that time a function (a
step planning its races) are not counted (:func:`uncounted`). Both tiers
evaluate the same graph; their values differ by rounding only.

A machine that has compiled a graph before keeps its machine code in
PyTensor's Numba cache, where loading it costs a fraction of a second: each
function that moves is recorded (:func:`graph_digest`, in a file of
PyTensor's ``base_compiledir``), and a function recorded there starts in its
final tier, as before tiers existed; the graph before rewrites is recorded too
(:func:`~pymc_subsample.model.function_cache.compile_cached`'s digest of it), so that
such a function is not first rewritten for the first tier. The budget runs across processes: the
seconds a function spent on the first tier without moving are recorded at exit,
and a later process starts it with those seconds spent, so a function called a
few times per run (a check at construction, a Newton step's sums) is compiled
once the runs of the model together have paid for it, not at its second run.
The price is the machine's own: each compilation's seconds are recorded with the
size of its graph, and a new graph's budget is priced at the seconds per operation
those compilations took (:func:`seconds_per_node`; :data:`SECONDS_PER_NODE` before
any), so that a slow machine, or one whose graphs compile slowly, rents longer.

Steps that planned their races on the timings of the first tier read
:func:`promotions` to plan them again once a function has moved (their
settings, not their law, change).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from pytensor import config
from pytensor.compile.mode import Mode
from pytensor.link.vm import VMLinker

from .._priority import HELPERS
from .numpy_elemwise import REWRITE_TAG

__all__ = [
    "BACKGROUND_SHARE",
    "PROMOTE_SECONDS",
    "PYTHON_LOOP_ELEMENTS",
    "SECONDS_PER_NODE",
    "SLOW_CALL_SECONDS",
    "START_MODE",
    "TieredFunction",
    "graph_digest",
    "no_c_compilation",
    "promotions",
    "record_compiled",
    "seconds_per_node",
    "uncounted",
]

#: Seconds of calls after which a function is compiled with the default mode (Numba), at least.
PROMOTE_SECONDS = 0.5
#: Seconds of calls per operation of the first tier's graph after which it is compiled, if
#: more, on a machine that has recorded no compilation yet (:func:`seconds_per_node`).
SECONDS_PER_NODE = 0.05
#: Graphs of fewer operations are not used to price others: their compilation is mostly
#: Numba's fixed cost (its start-up, the first of a process), not their operations'.
PRICE_MIN_NODES = 20
#: A first-tier call that takes this long, and half the function's budget, moves the
#: function at once (timing calls included): a call that slow, where a second one would
#: reach the budget, says the first tier does not suit the graph (a Python loop over rows).
#: A heavy graph's budget is larger (:data:`SECONDS_PER_NODE`): a first call of a second
#: or two on a Hessian in 104 coordinates does not move it (its compilation took 38 s).
SLOW_CALL_SECONDS = 1.0

#: A function that has paid its budget is compiled in another process
#: (:class:`~pymc_subsample.model.background.BackgroundCompile`) while its first tier
#: keeps serving the calls, and moves once the machine code is in the cache; False:
#: compiled in this process at once, before the call returns. The environment variable
#: ``PYMC_SUBSAMPLE_BACKGROUND=0`` sets it False at import (in pm.sample's worker
#: processes too), as the test suite does.
BACKGROUND_COMPILE = HELPERS

#: Share of its budget after which a function is handed to another process
#: (:data:`BACKGROUND_COMPILE`), at least :data:`PROMOTE_SECONDS`: a compilation there
#: does not hold the calls up, so it is bought early; the full budget applies where it
#: would hold them up (a job that cannot be handed over compiles in process).
BACKGROUND_SHARE = 0.1

#: Input elements from which a first-tier call of a graph that loops in Python over each
#: element (an elementwise operation with no NumPy function, run by ``np.frompyfunc``:
#: a fused scalar graph, say) moves the function before the call: there the first tier
#: costs about a microsecond an element, seconds on a population of rows.
PYTHON_LOOP_ELEMENTS = 20_000

#: The first tier: PyTensor's Python VM, each operation's NumPy ``perform`` (no C thunks,
#: no fused loops, which only a compiled backend runs fast), after the usual rewrites and
#: :data:`~pymc_subsample.model.numpy_elemwise.REWRITE_TAG`.
START_MODE = (
    Mode(linker=VMLinker(use_cloop=False, c_thunks=False), optimizer="fast_run")
    .excluding("fusion")
    .including(REWRITE_TAG)
)

_PROMOTED = [0]
_COUNTING = [True]


#: Digests of the graphs this machine has compiled in their final tier (loaded once).
_SEEN: set | None = None
#: Seconds earlier processes spent calling each graph on the first tier, by digest.
_SPENT: dict[str, float] = {}
#: Prefix of a line that records such seconds: ``spent:<digest>:<seconds>``.
_SPENT_PREFIX = "spent:"
#: Seconds and operations of the compilations recorded on this machine (graphs of
#: :data:`PRICE_MIN_NODES` operations or more), summed.
_PRICES = [0.0, 0]
#: Prefix of a line that records a compilation: ``price:<operations>:<seconds>``.
_PRICE_PREFIX = "price:"
#: The functions of this process still on the first tier (their seconds recorded at exit).
_LIVE: weakref.WeakSet = weakref.WeakSet()


def _seen_path() -> Path:
    return Path(config.base_compiledir) / "pymc_subsample_compiled_graphs.txt"


def _seen() -> set:
    global _SEEN
    if _SEEN is None:
        try:
            lines = _seen_path().read_text().split()
        except OSError:
            lines = []
        _SEEN = set()
        for line in lines:
            if line.startswith(_SPENT_PREFIX):
                digest, _, seconds = line[len(_SPENT_PREFIX) :].partition(":")
                try:
                    _SPENT[digest] = _SPENT.get(digest, 0.0) + float(seconds)
                except ValueError:  # a line cut short by a process stopped mid-write
                    pass
            elif line.startswith(_PRICE_PREFIX):
                nodes, _, seconds = line[len(_PRICE_PREFIX) :].partition(":")
                try:
                    _add_price(int(nodes), float(seconds))
                except ValueError:
                    pass
            else:
                _SEEN.add(line)
        atexit.register(_record_spent)
    return _SEEN


def _record_spent() -> None:
    """At exit, record the first-tier seconds of this process's functions that did not move."""
    lines = []
    for fn in list(_LIVE):
        new = fn.spent - fn.carried
        if fn.final is None and fn.digest is not None and new > 0:
            lines.append(f"{_SPENT_PREFIX}{fn.digest}:{new:.4f}\n")
    if lines:
        _append("".join(lines))


def _add_price(nodes: int, seconds: float) -> None:
    if nodes >= PRICE_MIN_NODES and seconds >= 0.0:
        _PRICES[0] += seconds
        _PRICES[1] += nodes


def seconds_per_node() -> float:
    r"""Return the price of compiling one operation on this machine, in seconds.

    :math:`\sum_g s_g / \sum_g n_g` over the compilations recorded here (graph
    :math:`g` of :math:`n_g \ge` :data:`PRICE_MIN_NODES` operations compiled
    in :math:`s_g` seconds at its first call), or :data:`SECONDS_PER_NODE`
    before any. A function's budget is its graph's price at this rate: the
    rule of ski rental needs the price of buying.
    """
    _seen()
    seconds, nodes = _PRICES
    return seconds / nodes if nodes else SECONDS_PER_NODE


def record_compiled(digest: str, n_nodes: int | None, seconds: float) -> None:
    """Record graph ``digest`` as compiled on this machine, in ``seconds`` for ``n_nodes``."""
    if digest not in _seen():
        _record(digest)
    if n_nodes is not None:  # the price of its graph, for the budgets of others
        _add_price(n_nodes, seconds)
        _append(f"{_PRICE_PREFIX}{n_nodes}:{seconds:.4f}\n")


def recorded_on_disk(digest: str) -> bool:
    """Return True if the record on disk (another process's writes included) holds ``digest``."""
    try:
        return digest in _seen_path().read_text().split()
    except OSError:
        return False


def _record(digest: str) -> None:
    _seen().add(digest)
    _append(digest + "\n")


def _append(text: str) -> None:
    """Append ``text`` to the record in ``base_compiledir`` (read-only: nothing kept)."""
    try:
        with _seen_path().open("a") as f:
            f.write(text)
    except OSError:  # a read-only cache: the next process starts on the first tier again
        pass


def loops_in_python(fgraph) -> bool:
    """Return True when a node of ``fgraph`` runs per element (or per step) in Python.

    PyTensor's Python VM evaluates an ``Elemwise`` with its NumPy function
    where the scalar op has one for that many inputs, and otherwise with
    ``np.frompyfunc`` on the op's Python ``impl``; a ``Scan`` runs its inner
    function once per step. A ``Blockwise`` without a NumPy gufunc calls its
    core op per batch element too, but its batch is mostly the candidates (a
    Categorical's values indexing a constant), a few calls: it is not counted.
    """
    from pytensor.scan.op import Scan
    from pytensor.tensor.blockwise import Blockwise
    from pytensor.tensor.elemwise import Elemwise

    for node in fgraph.apply_nodes:
        op = node.op
        if isinstance(op, Scan):
            return True
        if isinstance(op, Blockwise):  # batched over the candidates, mostly: a few calls
            continue
        if not isinstance(op, Elemwise):
            continue
        spec = getattr(op, "nfunc_spec", None)
        if getattr(op, "nfunc", None) is not None and spec and len(node.inputs) == spec[1]:
            continue
        ufunc = getattr(node.tag, "ufunc", None) or getattr(op, "ufunc", None)
        if isinstance(ufunc, np.ufunc) and "(vectorized)" in getattr(ufunc, "__name__", ""):
            return True
    return False


def _elements(args) -> int:
    return max((int(np.size(a)) for a in args), default=0)


def graph_digest(fn) -> str:
    """Return a digest of a compiled function's graph (its printout and input types)."""
    from pytensor.printing import debugprint

    out = io.StringIO()
    debugprint(fn.maker.fgraph, file=out, print_type=True)
    types = ",".join(str(v.type) for v in fn.maker.fgraph.inputs)
    return hashlib.sha256((out.getvalue() + types).encode()).hexdigest()


def no_c_compilation():
    """Return a context in which PyTensor compiles no C: each operation runs its Python code.

    :data:`START_MODE` makes no C thunks for the graph's own operations, but an
    operation with an inner function (a ``Blockwise`` of an ``OpFromGraph``, say)
    links that function on PyTensor's default VM, which compiles each operation
    with the C compiler (a compiler run each on a machine that has not compiled
    them, a second or so). With ``config.cxx`` empty no operation is compiled.
    """
    return config.change_flags(cxx="")


@contextmanager
def uncounted():
    """Within this block, calls do not count towards any function's budget (timing calls)."""
    before = _COUNTING[0]
    _COUNTING[0] = False
    try:
        yield
    finally:
        _COUNTING[0] = before


def promotions() -> int:
    """Return how many tiered functions have moved to their final tier in this process.

    Those built in it (graphs this machine compiled before) are not counted.
    """
    return _PROMOTED[0]


class TieredFunction:
    """A compiled function that starts in :data:`START_MODE` and moves to the default mode.

    Parameters
    ----------
    compile : callable
        ``compile(mode)`` returns the PyTensor function of the graph in
        ``mode`` (None: the default mode).
    budget : float, optional
        Seconds of calls in the first tier after which the function moves
        (default: :data:`PROMOTE_SECONDS`, or :func:`seconds_per_node` per
        operation of its first tier's graph, the larger).

    Notes
    -----
    Called as the PyTensor function it stands for. Nothing is built before
    the first call (a function never called costs no rewrites), nor the
    first tier when :meth:`promote` comes first. Once moved, :attr:`vm` and
    :attr:`maker` are the final function's (a compiled kernel, ``vm.jit_fn``,
    is found there); before, they are None.
    """

    def __init__(self, compile: Callable, budget: float | None = None):
        self._compile = compile
        self.spent = 0.0
        self.calls = 0
        self.final = None
        self.start = None
        self._budget = budget
        self.budget = budget
        self.digest: str | None = None
        self.source: str | None = None  # digest of the graph before rewrites (recorded too)
        self.n_nodes: int | None = None  # operations of the first tier's graph
        self.carried = 0.0  # seconds earlier processes spent on this graph's first tier
        self.loops_in_python = False  # its first tier loops in Python per element
        self._background = None  # the compilation of its final tier in another process
        self._handed_over: bool | None = None  # False: its job could not be handed over
        self._hand_over_now = False  # hand the job over at the next call, queued if need be
        self._call = self._first_call

    def __call__(self, *args):
        """Evaluate the function (in its current tier)."""
        return self._call(*args)

    def _begin(self, args: tuple | None = None) -> None:
        """Build the first tier (the graph's rewrites), or the final one if cached or used.

        Deferred to the first call (on ``args``): a function never called costs
        nothing. One that earlier processes paid for is compiled in the background.
        """
        source = getattr(self._compile, "source_digest", None)
        self.source = source() if source is not None else None
        if self.source is not None and self.source in _seen():  # its final tier compiled here
            self._finalize()
            return
        t0 = time.process_time()
        with no_c_compilation():  # inner functions' C thunks too: a gcc run each, new machine
            self.start = self._compile(START_MODE)
        build = time.process_time() - t0  # the first tier's rewrites: rent, paid each process
        budget = self._budget
        self.n_nodes = len(self.start.maker.fgraph.apply_nodes)
        if budget is None:
            budget = max(PROMOTE_SECONDS, seconds_per_node() * self.n_nodes)
        self.budget = float(budget)
        self._slow_call = max(SLOW_CALL_SECONDS, 0.5 * self.budget)
        self.loops_in_python = loops_in_python(self.start.maker.fgraph)
        self._call = self._start_call
        self.digest = graph_digest(self.start)
        seen = _seen()
        # the budget runs across processes: what earlier runs of the model spent counts
        self.carried = _SPENT.get(self.digest, 0.0)
        self.spent = self.carried + (build if _COUNTING[0] else 0.0)
        if self.digest in seen:  # compiled on this machine before: its machine code cached
            self._finalize()
            self._record_source()
            return
        _LIVE.add(self)
        if self.carried > 0 and self._paid():  # paid for by earlier runs
            self._move(args)

    def _first_call(self, *args):
        self._begin(args)
        return self._call(*args)

    def _move(self, args: tuple | None) -> None:
        """Compile the final tier: in another process when possible (:data:`BACKGROUND_COMPILE`).

        The first tier serves the calls until that process has put the machine
        code in the cache (:meth:`_start_call` polls it). Without ``args``, or
        when the job cannot be handed over (a graph that does not pickle, a
        compilation there that failed), the function moves here once its calls
        have paid the whole budget (:meth:`promote`).
        """
        if self._background is not None:
            return
        if self._can_hand_over() and args is not None:
            from .background import MAX_RUNNING, BackgroundCompile

            waits = BackgroundCompile.running() >= MAX_RUNNING and not self._hand_over_now
            if self.spent < self.budget and waits:
                return  # its turn comes at a later call
            try:
                self._background = BackgroundCompile(self._compile, args, self.digest, self.n_nodes)
                return
            except Exception:  # noqa: BLE001 - any failure to hand it over: compile here
                self._handed_over = False
        if self.spent >= self.budget:
            self.promote()

    def _can_hand_over(self) -> bool:
        return BACKGROUND_COMPILE and self.digest is not None and self._handed_over is not False

    def _paid(self) -> bool:
        """Return True once the calls have paid for a move: the budget, or a share of it.

        A share (:data:`BACKGROUND_SHARE`, at least :data:`PROMOTE_SECONDS`) where
        the compilation can run in another process, which does not hold the calls up.
        """
        if self.spent >= self.budget:
            return True
        if self._hand_over_now and self._can_hand_over():
            return True
        share = max(PROMOTE_SECONDS, BACKGROUND_SHARE * self.budget)
        return self._can_hand_over() and self.spent >= share

    def _poll_background(self) -> None:
        """Move once the background compilation has cached the machine code (else compile here)."""
        done = self._background.poll()
        if done is None:
            return
        self._background = None
        if done:
            _seen().add(self.digest)  # recorded by that process: loads from the cache
            self._record_source()
            self.promote()
            return
        self._handed_over = False  # it failed: compiled here once the whole budget is paid
        if self.spent >= self.budget or self._hand_over_now:
            self.promote()

    def hand_over(self) -> None:
        """Compile the final tier in the helper process from the next call, paid or not.

        Queued behind the helper's other jobs (not :data:`MAX_RUNNING`'s turn); where
        no job can be handed over, the function moves in this process at that call.
        The first tier serves until the job is done (:meth:`settle` waits for it).
        """
        if self.final is None:
            self._hand_over_now = True
            if not self._can_hand_over() and self.start is not None:
                self.promote()

    def settle(self, timeout: float = 600.0) -> bool:
        """Wait for the helper's compilation of the final tier, then move; return whether final.

        A function with no job in the helper stays where it is. After ``timeout``
        seconds of waiting, it stays on the first tier (its job goes on).
        """
        deadline = time.monotonic() + timeout
        while self._background is not None and time.monotonic() < deadline:
            self._poll_background()
            if self._background is not None:
                time.sleep(0.05)
        return self.final is not None

    @property
    def compiling(self) -> bool:
        """True while another process compiles the final tier (the first tier serves)."""
        return self._background is not None

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k != "_call"}
        state["_background"] = None  # a copy moves by its own rule
        state["_hand_over_now"] = False
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.final is not None:
            self._call = self._final_first_call if self.digest is not None else self.final
        else:
            self._call = self._first_call if self.start is None else self._start_call
            if self.start is not None:  # a process of pm.sample's: its seconds recorded too
                _seen()
                _LIVE.add(self)

    def _start_call(self, *args):
        if self._background is not None:
            self._poll_background()
            if self.final is not None:
                return self._call(*args)
        if self.loops_in_python and _elements(args) >= PYTHON_LOOP_ELEMENTS:
            self.promote()  # a Python loop over a population of rows: compiled before the call
            return self._call(*args)
        t0 = time.perf_counter()
        out = self.start(*args)
        seconds = time.perf_counter() - t0
        if _COUNTING[0]:
            self.spent += seconds
            self.calls += 1
        # a slow call moves it even when uncounted: timing a slow tier times nothing useful
        if seconds >= self._slow_call:
            self.promote()
        elif self._paid():
            self._move(args)
        return out

    def promote(self):
        """Compile the final tier now (its machine code at its first call); return it."""
        if self.final is None and self.start is None:
            self._begin()  # recorded as compiled before: final at once, not a promotion
        # wanted now: compiled here (a background compilation goes on, for the next process)
        self._background = None
        if self.final is None:
            self._finalize()
            _PROMOTED[0] += 1
        return self.final

    def promote_if_compiled(self) -> bool:
        """Move to the final tier if this machine holds its machine code; return whether final.

        A graph recorded as compiled loads from PyTensor's Numba cache in a fraction
        of a second; any other stays where it is, to move once it has paid.
        """
        if self.final is None and self.start is None:
            self._begin()  # a recorded graph starts final
        if self.final is None and self.digest in _seen():
            self.promote()
        return self.final is not None

    def _finalize(self) -> None:
        self.final = self._compile(None)
        self.start = None
        if self.digest is not None and self.digest not in _seen():
            self._call = self._final_first_call  # recorded once its machine code exists
        else:
            self._call = self.final

    def _final_first_call(self, *args):
        """Call the final tier the first time (Numba compiles it), then record the graph.

        A graph is recorded as compiled on this machine only once its machine code
        is in the cache: a function moved at its last call is not.
        """
        t0 = time.process_time()
        out = self.final(*args)
        seconds = time.process_time() - t0
        self._call = self.final
        if self.digest not in _seen():
            record_compiled(self.digest, self.n_nodes, seconds)
        self._record_source()
        return out

    def _record_source(self) -> None:
        """Record the graph before rewrites as compiled: the next process skips the first tier."""
        if self.source is not None and self.source not in _seen():
            _record(self.source)

    @property
    def promoted(self) -> bool:
        """True once the function runs in its final tier."""
        return self.final is not None

    @property
    def vm(self):
        """The final function's VM (None before the move)."""
        return None if self.final is None else self.final.vm

    @property
    def maker(self):
        """The final function's maker (None before the move)."""
        return None if self.final is None else self.final.maker

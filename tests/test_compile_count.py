"""The number of functions a step compiles before its first draw, guarded.

Each PyTensor function compiled with the Numba backend costs seconds on a model
new to the machine (tens for the largest), so the steps start on PyTensor's
Python VM (:mod:`pymc_subsample.model.tiered`) and compile with Numba only
what has paid for it. These counts, taken over building a step and its first
draw, must not grow back silently: raise them only with a measured reason
(``benchmarks/first_draw.py``).
"""

import functools
import time
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from pytensor.compile import maker
from pytensor.link.numba.linker import NumbaLinker

from pymc_subsample import RacingMetropolis, SubsampledCategoricalGibbs
from pymc_subsample.model.function_cache import clear_function_cache
from pymc_subsample.model.tiered import TieredFunction, promotions

#: Most PyTensor functions compiled with Numba while building the step and drawing once:
#: the audits' joint log density (the first draw is audited); for RacingMetropolis at this
#: small N also PyMC's NUTS log density and gradient (its regime when subsampling cannot pay).
MAX_NUMBA = {"gibbs": 1, "racing": 2}
#: Most PyTensor functions compiled in all (Numba or the Python VM) over the same span
#: (measured: 9 and 13; before the tiers, every one of them with Numba).
MAX_ALL = {"gibbs": 9, "racing": 13}


@pytest.fixture(autouse=True)
def new_machine(monkeypatch, tmp_path):
    """No graph compiled on this machine before (else its functions start in Numba)."""
    from pymc_subsample.model import tiered

    monkeypatch.setattr(tiered, "_SEEN", set())
    monkeypatch.setattr(tiered, "_PRICES", [0.0, 0])
    monkeypatch.setattr(tiered, "_seen_path", lambda: tmp_path / "seen.txt")


@pytest.fixture
def count_compiles(monkeypatch):
    """Record the linker of every PyTensor function compiled while the fixture is active."""
    linkers = []
    original = maker.FunctionMaker.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        linkers.append(type(self.linker))

    monkeypatch.setattr(maker.FunctionMaker, "__init__", init)
    return linkers


def _model(n_obs: int = 3000):
    rng = np.random.default_rng(0)
    x = rng.normal(size=n_obs)
    scales = np.array([0.5, 1.0, 2.0])
    y = 1.0 + 0.5 * x + rng.normal(size=n_obs)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y", y)
        q = pm.Categorical("q", p=np.full(3, 1 / 3))
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0)
        pm.Normal("obs", a + b * x_data, pm.math.constant(scales)[q], observed=y_data)
    return model


def _grid_model(seed: int = 3):
    grid = np.array([1.46, 1.48, 1.5, 1.52, 1.54])
    y = np.random.default_rng(seed).normal(1.5, 1.0, size=20_000)
    with pm.Model() as model:
        y_data = pm.Data("y_data", y)
        q = pm.Categorical("q", p=np.full(len(grid), 1 / len(grid)))
        pm.Normal("y", pm.math.constant(grid)[q], 1.0, observed=y_data)
    return model, grid, y


def _grid_posterior(y, grid) -> np.ndarray:
    """The exact conditional of q on the grid (Normal terms, unit scale, flat prior)."""
    from scipy import stats

    log_p = stats.norm.logpdf(y[None, :], grid[:, None], 1.0).sum(axis=1)
    p = np.exp(log_p - log_p.max())
    return p / p.sum()


def _draw_until_compiled(step, model, n: int) -> tuple[list, int | None]:
    """Draw ``n`` times from the initial point; return the draws and the first compiled one."""
    point, draws, compiled_at = model.initial_point(), [], None
    for t in range(n):
        point, _ = step.step(point)
        draws.append(int(point["q"]))
        if compiled_at is None and step.compiled:
            compiled_at = t
    return draws, compiled_at


@pytest.mark.parametrize("kind", ["gibbs", "racing"])
def test_functions_compiled_before_the_first_draw(kind, count_compiles):
    clear_function_cache()  # steps of other tests would lend theirs
    model = _model()
    with model:
        count_compiles.clear()
        if kind == "gibbs":
            step = SubsampledCategoricalGibbs([model["q"]], rng=0)
        else:
            step = RacingMetropolis([model["a"], model["b"]], rng=0)
        step.step(model.initial_point())
    numba = sum(issubclass(c, NumbaLinker) for c in count_compiles)
    assert numba <= MAX_NUMBA[kind], count_compiles
    assert len(count_compiles) <= MAX_ALL[kind], count_compiles


def test_tiered_function_moves_once_it_has_paid():
    """A function moves to Numba after its budget of calls, with the same values."""
    import pytensor.tensor as pt

    x = pt.dvector("x")
    with pm.Model() as model:
        pass

    def compile_in(mode):
        return model.compile_fn((x**2).sum(), inputs=[x], point_fn=False, mode=mode)

    fn = TieredFunction(compile_in, budget=0.0)
    before = promotions()
    value = np.arange(5.0)
    first = fn(value)  # the Python VM's call, which spends the budget
    assert fn.promoted and promotions() == before + 1
    assert isinstance(fn.maker.linker, NumbaLinker)
    np.testing.assert_allclose(fn(value), first, rtol=1e-12)
    # recorded: the same graph compiled again on this machine starts in Numba (at its
    # first call: nothing is built before)
    again = TieredFunction(compile_in, budget=0.0)
    assert not again.promoted and again.start is None
    np.testing.assert_allclose(again(value), first, rtol=1e-12)
    assert again.promoted and promotions() == before + 1


def test_gibbs_draws_are_right_through_the_move_to_numba(monkeypatch):
    """A chain whose functions move mid-way (and whose races then run compiled) keeps its law.

    Tiny budgets move the terms' functions after a few draws; the step then plans
    its races again and races in one compiled call. The frequencies of all draws,
    before and after the move, match the exact conditional.
    """

    from pymc_subsample.model import tiered
    from pymc_subsample.options import RaceOptions
    from pymc_subsample.steps import gibbs_plan

    monkeypatch.setattr(tiered, "PROMOTE_SECONDS", 0.02)
    monkeypatch.setattr(tiered, "seconds_per_node", lambda: 0.0)
    monkeypatch.setattr(gibbs_plan, "DRIVER_SECONDS", 0.02)  # and the race driver with them
    clear_function_cache()
    model, grid, y = _grid_model()
    with model:
        step = SubsampledCategoricalGibbs(
            [model["q"]], rng=1, race=RaceOptions(backoff=False, batch_size=400, exact_fraction=0.1)
        )
    assert not step.compiled  # the Python VM first: no compiled race yet
    draws, compiled_at = _draw_until_compiled(step, model, 3000)
    assert compiled_at is not None and compiled_at < 1500  # moved, early in the chain
    p = _grid_posterior(y, grid)
    freq = np.bincount(draws, minlength=len(grid)) / len(draws)
    # draws of a Gibbs step on q alone are independent: binomial errors, plus delta
    tol = 4 * np.sqrt(p * (1 - p) / len(draws)) + step.delta
    assert (np.abs(freq - p) < tol).all(), (freq.round(3), p.round(3))


def _new_process(monkeypatch):
    """A fresh registry of what this machine has seen, spent and paid (as in a new process)."""
    from pymc_subsample.model import tiered

    monkeypatch.setattr(tiered, "_SEEN", None)
    monkeypatch.setattr(tiered, "_SPENT", {})
    monkeypatch.setattr(tiered, "_PRICES", [0.0, 0])
    monkeypatch.setattr(tiered, "_LIVE", tiered.weakref.WeakSet())


def test_first_tier_seconds_carry_over_to_the_next_process(monkeypatch, tmp_path):
    """The budget runs across processes: seconds spent without moving are recorded at exit
    and counted by the next process, which compiles a function once the runs have paid."""
    import pytensor.tensor as pt

    from pymc_subsample.model import tiered

    x = pt.dvector("x")
    with pm.Model() as model:
        pass

    def compile_in(mode):
        return model.compile_fn((x**3).sum(), inputs=[x], point_fn=False, mode=mode)

    def new_process():
        _new_process(monkeypatch)

    monkeypatch.setattr(tiered, "_seen_path", lambda: tmp_path / "graphs.txt")
    monkeypatch.setattr(tiered.atexit, "register", lambda f: None)
    new_process()
    fn = TieredFunction(compile_in, budget=10.0)
    fn(np.arange(3.0))
    assert not fn.promoted and fn.carried == 0.0
    fn.spent = 6.0  # as if its calls had cost 6 s
    tiered._record_spent()  # what the process does at exit
    new_process()
    again = TieredFunction(compile_in, budget=10.0)
    again(np.arange(3.0))
    assert not again.promoted and again.carried == pytest.approx(6.0, abs=1e-3)
    again.spent += 5.0
    tiered._record_spent()
    new_process()
    third = TieredFunction(compile_in, budget=10.0)  # 11 s spent by the runs before
    np.testing.assert_allclose(third(np.arange(3.0)), 9.0)  # 0 + 1 + 8
    assert third.promoted


def test_budgets_are_priced_at_this_machines_compilations(monkeypatch, tmp_path):
    """A compilation is recorded with its graph's size; a new graph's budget uses that rate.

    A graph of 230 operations whose compilation took 38 s was budgeted at the
    default rate (11.5 s): the second run of its model paid the 38 s before its
    first draw. Priced at the rate this machine recorded, it rents longer.
    """
    import pytensor.tensor as pt

    from pymc_subsample.model import tiered

    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    graph = sum(pt.cos(x * float(i)) for i in range(1, 15)).sum()

    def compile_in(mode):
        return model.compile_fn(graph, inputs=[x], point_fn=False, mode=mode)

    def new_process():
        _new_process(monkeypatch)

    path = tmp_path / "graphs.txt"
    monkeypatch.setattr(tiered, "_seen_path", lambda: path)
    monkeypatch.setattr(tiered.atexit, "register", lambda f: None)
    new_process()
    assert tiered.seconds_per_node() == tiered.SECONDS_PER_NODE  # nothing recorded yet
    fn = TieredFunction(compile_in)
    fn(np.arange(3.0))
    n_nodes = fn.n_nodes
    assert n_nodes >= tiered.PRICE_MIN_NODES
    assert fn.budget == pytest.approx(max(tiered.PROMOTE_SECONDS, 0.05 * n_nodes))
    fn.promote()
    fn(np.arange(3.0))  # Numba compiles it here: its seconds are recorded with its size
    (line,) = [ln for ln in path.read_text().split() if ln.startswith("price:")]
    nodes, seconds = line[len("price:") :].split(":")
    assert int(nodes) == n_nodes and float(seconds) > 0
    path.write_text(f"price:{10 * n_nodes}:{2.0 * n_nodes}\nprice:5:100.0\n")  # 0.2 s each
    new_process()
    assert tiered.seconds_per_node() == pytest.approx(0.2)  # the small graph is not used
    again = TieredFunction(compile_in)
    again(np.arange(3.0))
    assert not again.promoted and again.budget == pytest.approx(0.2 * n_nodes)


def test_a_function_moved_at_its_last_call_is_not_recorded_as_compiled():
    """A graph is recorded as compiled on this machine once its machine code exists.

    A function that moves at its last call in a process has no machine code yet:
    recorded, the next process would compile it before its first draw.
    """
    import pytensor.tensor as pt

    x = pt.dvector("x")
    with pm.Model() as model:
        pass

    def compile_in(mode):
        return model.compile_fn((x**4).sum(), inputs=[x], point_fn=False, mode=mode)

    value = np.arange(4.0)
    fn = TieredFunction(compile_in, budget=0.0)
    fn(value)  # spends the budget and moves: no call of the final tier yet
    assert fn.promoted
    later = TieredFunction(compile_in, budget=10.0)
    later(value)
    assert not later.promoted  # not recorded: the first tier, as on a new machine
    np.testing.assert_allclose(fn(value), later(value), rtol=1e-12)  # now compiled
    third = TieredFunction(compile_in, budget=10.0)
    third(value)
    assert third.promoted  # recorded: its machine code is in the cache


def test_race_driver_waits_until_python_races_have_paid(monkeypatch):
    """A step whose rows function starts compiled (a model this machine ran before) does
    not compile its race driver (seconds of LLVM in every process) before its first draw:
    it races in Python until those races have cost DRIVER_SECONDS, then compiled; the
    draws before and after the switch match the exact conditional."""

    from pymc_subsample.options import RaceOptions
    from pymc_subsample.steps import gibbs_plan

    clear_function_cache()
    model, grid, y = _grid_model()
    race = RaceOptions(backoff=False, batch_size=400, exact_fraction=0.1)
    with model:
        earlier = SubsampledCategoricalGibbs([model["q"]], rng=1, race=race)
    earlier.terms.promote(loop=False)  # the rows function in Numba, no driver compiled
    with model:
        step = SubsampledCategoricalGibbs([model["q"]], rng=2, race=race)
    assert step.terms._rows_fn is earlier.terms._rows_fn and step.terms._rows_fn.promoted
    assert not step.compiled and step.compiled_race is None  # no driver yet
    # the first race pays its functions' first calls (a tenth of a second on a busy
    # machine): the driver is due 0.1 s of races after it
    monkeypatch.setattr(gibbs_plan, "DRIVER_SECONDS", float("inf"))
    step.step(model.initial_point())
    due = step._python_race_seconds + 0.1
    assert not step.compiled
    monkeypatch.setattr(gibbs_plan, "DRIVER_SECONDS", due)
    draws, compiled_at = _draw_until_compiled(step, model, 3000)
    assert compiled_at is not None and 0 < compiled_at < 2500, compiled_at
    assert step._python_race_seconds >= due
    p = _grid_posterior(y, grid)
    for part in (draws[:compiled_at], draws[compiled_at:], draws):
        freq = np.bincount(part, minlength=len(grid)) / len(part)
        # independent draws (a Gibbs step on q alone): binomial errors, plus delta
        tol = 4 * np.sqrt(p * (1 - p) / len(part)) + step.delta
        assert (np.abs(freq - p) < tol).all(), (len(part), freq.round(3), p.round(3))


def test_chunk_loop_waits_until_one_call_sums_have_paid(monkeypatch):
    """The sums' chunk loop (compiled anew in every process) comes once one-call sums on a
    large population have cost LOOP_SECONDS, or at once when asked; the sums agree."""
    from pymc_subsample.model import chunked_sum

    monkeypatch.setattr(chunked_sum, "CHUNK_BYTES", 2048)  # chunks of 1,024 rows
    monkeypatch.setattr(chunked_sum, "LOOP_SECONDS", 1e9)
    clear_function_cache()
    model, _, _ = _grid_model(4)
    with model:
        step = SubsampledCategoricalGibbs([model["q"]], rng=0)
    terms, point, cands = step.terms, model.initial_point(), [np.arange(5)]
    terms.promote(loop=False)
    first = terms.loglik_sum(cands, point)
    assert terms._sum_rows._driver is None and terms._sum_rows._unchunked_seconds > 0
    monkeypatch.setattr(chunked_sum, "LOOP_SECONDS", 0.0)  # paid
    np.testing.assert_allclose(terms.loglik_sum(cands, point), first, rtol=1e-12)
    assert terms._sum_rows._driver is not None


def test_a_graph_that_loops_in_python_moves_before_a_large_call():
    """An operation with no NumPy function (a ScalarLoop here: the gradient of the
    regularised incomplete gamma function in its shape) runs per element in Python on the
    first tier: such a graph moves to Numba before a call on a population of rows, and stays
    on the first tier for small inputs; a slow timing call moves a function too."""
    import pytensor
    import pytensor.tensor as pt

    from pymc_subsample.model import tiered

    x = pt.dvector("x")
    looped = pytensor.grad(pt.gammainc(pt.exp(x) + 1.0, 2.0).sum(), x)  # a ScalarLoop
    with pm.Model() as model:
        pass

    def looped_sum(mode):
        return model.compile_fn(looped.sum(), inputs=[x], point_fn=False, mode=mode)

    def exp_sum(mode):
        return model.compile_fn(pt.exp(x).sum(), inputs=[x], point_fn=False, mode=mode)

    small, large = np.linspace(-1, 1, 10), np.linspace(-1, 1, tiered.PYTHON_LOOP_ELEMENTS)
    fn = TieredFunction(looped_sum, budget=100.0)
    first = fn(small)
    assert fn.loops_in_python and not fn.promoted
    np.testing.assert_allclose(first, looped_sum("NUMBA")(small), rtol=1e-10)
    np.testing.assert_allclose(fn(large), looped_sum(None)(large), rtol=1e-10)
    assert fn.promoted
    plain = TieredFunction(exp_sum, budget=100.0)
    plain(large)
    assert not plain.loops_in_python and not plain.promoted
    monkey = tiered.SLOW_CALL_SECONDS
    try:
        tiered.SLOW_CALL_SECONDS = 0.0  # every call counts as slow
        with tiered.uncounted():  # a timing call slower than half the budget: moved all the same
            slow = TieredFunction(exp_sum, budget=1e-9)
            slow(small)
        heavy = TieredFunction(exp_sum, budget=100.0)  # a heavy graph's large budget: it stays
        heavy(small)
    finally:
        tiered.SLOW_CALL_SECONDS = monkey
    assert slow.promoted and slow.spent == 0.0
    assert not heavy.promoted


def test_promote_if_compiled_moves_only_what_the_machine_holds():
    """After the rows function moves, its siblings move only if their machine code is
    cached: one compiled since (a graph recorded) moves, a new graph stays."""
    import pytensor.tensor as pt

    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    salt = float(np.random.default_rng().integers(1, 10**9))  # graphs new to this machine

    def graph(k):
        return lambda mode: model.compile_fn(
            (pt.exp(x) * (salt + k)).sum(), inputs=[x], point_fn=False, mode=mode
        )

    waiting, other = TieredFunction(graph(0), budget=100.0), TieredFunction(graph(1), budget=100.0)
    waiting(np.ones(3))
    other(np.ones(3))
    assert not waiting.promote_if_compiled() and not other.promote_if_compiled()
    compiled = TieredFunction(graph(0), budget=100.0)
    compiled.promote()
    compiled(np.ones(3))  # the machine code exists: the graph is recorded
    assert waiting.promote_if_compiled() and not other.promote_if_compiled()
    np.testing.assert_allclose(waiting(np.zeros(2)), 2 * salt)


def test_the_first_tier_compiles_no_c_not_even_in_inner_functions(monkeypatch):
    """A Blockwise of an OpFromGraph (what vectorising some likelihoods over candidates
    gives) links its inner function on PyTensor's default VM, which made a C thunk of
    each operation: a compiler run each on a new machine (a zero-inflated Poisson model
    waited 38 s for them before its first draw). The first tier builds none."""
    import pytensor.tensor as pt
    from pytensor.compile.builders import OpFromGraph
    from pytensor.link.c.op import COp
    from pytensor.tensor.blockwise import Blockwise

    def no_c(*args, **kwargs):
        raise AssertionError("a C thunk was made on the first tier")

    a = pt.dvector("a")
    inner = OpFromGraph([a], [pt.log(pt.exp(a) + 1.0).sum() + pt.max(a)])
    x = pt.dmatrix("x")
    out = Blockwise(inner, signature="(n)->()")(x)
    with pm.Model() as model:
        pass

    def build(mode):
        return model.compile_fn(out, inputs=[x], point_fn=False, mode=mode)

    value = np.arange(12.0).reshape(3, 4) / 10
    expected = np.log(np.exp(value) + 1.0).sum(axis=1) + value.max(axis=1)
    monkeypatch.setattr(COp, "make_c_thunk", no_c)
    fn = TieredFunction(build, budget=100.0)
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
    assert not fn.promoted


def test_a_python_race_compiles_each_library_kernel_once():
    """Every state a Python race passes to a kernel has one layout: one compilation each.

    Arms dropped by a look, or by a ``-inf`` reward, left the state's rows in
    Fortran order (a boolean index on the second axis), so the next look
    compiled ``look_rows`` a second time: seconds on a machine new to it.
    Run in a new process, where no earlier test typed the kernels.
    """
    import subprocess
    import sys

    code = """
import numpy as np
from numba.core.registry import CPUDispatcher
from pymc_subsample.racing import kernels, sample_categorical
rng = np.random.default_rng(0)
table = rng.normal(np.linspace(0.0, 0.05, 12)[:, None], 1.0, size=(12, 20_000))
table[3, 7_000] = -np.inf  # an arm dropped by a -inf reward
for seed in range(5):
    sample_categorical(np.zeros(12), lambda arms, idx: table[np.ix_(arms, idx)], 20_000, rng=seed)
print(max(len(f.signatures) for f in vars(kernels).values() if isinstance(f, CPUDispatcher)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "1", out.stdout + out.stderr[-2000:]


def test_a_paid_function_compiles_in_another_process_while_its_first_tier_serves(monkeypatch):
    """Once paid, the final tier compiles in a background process; the first tier serves.

    The calls before the move return the first tier's values, those after the
    final tier's (equal up to rounding); the other process records the graph as
    compiled on this machine, with its price, and the function then loads it.
    """
    import pytensor.tensor as pt
    from pytensor import config

    from pymc_subsample.model import tiered

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", True)
    # the other process records in the machine's own file
    record = Path(config.base_compiledir) / "pymc_subsample_compiled_graphs.txt"
    monkeypatch.setattr(tiered, "_seen_path", lambda: record)
    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    scale = float(np.random.default_rng().uniform(1.0, 2.0))  # a graph new to the machine
    graph = (pt.sin(x * scale) ** 3 + pt.exp(x)).sum()

    def compile_in(mode):
        return model.compile_fn(graph, inputs=[x], point_fn=False, mode=mode)

    value = np.arange(5.0)
    expected = float(np.sum(np.sin(value * scale) ** 3 + np.exp(value)))
    fn = TieredFunction(compile_in, budget=0.0)
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
    assert fn.compiling and not fn.promoted  # paid: handed over, not compiled here
    job = fn._background
    assert job.helper is not None  # this process's job, in its helper process
    deadline = time.time() + 300
    while job.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert job.poll() is True
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
    assert fn.promoted and not fn.compiling
    assert tiered.recorded_on_disk(fn.digest)
    again = TieredFunction(compile_in)
    np.testing.assert_allclose(again(value), expected, rtol=1e-12)
    assert again.promoted  # compiled on this machine: starts final


def test_one_helper_process_compiles_the_jobs_in_turn(monkeypatch):
    """Jobs go to one helper process, which loads Python and PyMC once, not once per job;
    after JOBS_PER_HELPER jobs a new helper takes the next, and the old one ends."""
    import pytensor.tensor as pt
    from pytensor import config

    from pymc_subsample.model import background, tiered

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", True)
    record = Path(config.base_compiledir) / "pymc_subsample_compiled_graphs.txt"
    monkeypatch.setattr(tiered, "_seen_path", lambda: record)
    monkeypatch.setattr(background, "JOBS_PER_HELPER", 2)
    monkeypatch.setattr(background._Helper, "_current", None)
    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    value = np.arange(4.0)
    helpers = []
    for _ in range(3):
        scale = float(np.random.default_rng().uniform(1.0, 2.0))  # a graph new to the machine
        graph = (pt.cos(x * scale) ** 2).sum()
        fn = TieredFunction(
            lambda mode, graph=graph: model.compile_fn(
                graph, inputs=[x], point_fn=False, mode=mode
            ),
            budget=0.0,
        )
        expected = float(np.sum(np.cos(value * scale) ** 2))
        np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
        job = fn._background
        assert job is not None
        helpers.append(job.helper)
        deadline = time.time() + 300
        while job.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
        assert fn.promoted
    assert helpers[0] is helpers[1] and helpers[2] is not helpers[0]
    helpers[0].process.wait(timeout=60)  # retired: it ends once its jobs are done
    assert helpers[2].alive()


def test_a_function_handed_over_is_queued_and_settles(monkeypatch):
    """hand_over: the next call queues the job even when it is not the function's turn
    (unpaid, others pending); the first tier serves; settle waits and moves it. Without
    helper processes it moves at once."""
    import pytensor.tensor as pt
    from pytensor import config

    from pymc_subsample.model import background, tiered

    record = Path(config.base_compiledir) / "pymc_subsample_compiled_graphs.txt"
    monkeypatch.setattr(tiered, "_seen_path", lambda: record)
    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    value = np.arange(4.0)

    def new_function():
        scale = float(np.random.default_rng().uniform(1.0, 2.0))  # a graph new to the machine
        graph = (pt.sin(x * scale) ** 2).sum()
        fn = TieredFunction(
            lambda mode: model.compile_fn(graph, inputs=[x], point_fn=False, mode=mode),
            budget=100.0,
        )
        return fn, float(np.sum(np.sin(value * scale) ** 2))

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", True)
    monkeypatch.setattr(background.BackgroundCompile, "running", classmethod(lambda cls: 99))
    fn, expected = new_function()
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
    assert not fn.compiling  # unpaid and not its turn
    fn.hand_over()
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)  # the first tier serves
    assert fn.compiling and not fn.promoted
    assert fn.settle(timeout=300)
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)
    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", False)
    fn, expected = new_function()
    fn(value)
    fn.hand_over()
    assert fn.promoted and not fn.compiling
    np.testing.assert_allclose(fn(value), expected, rtol=1e-12)


def test_a_graph_that_does_not_pickle_compiles_here(monkeypatch):
    """A job that cannot be handed to another process is compiled in this one, at once."""
    from pymc_subsample.model import background, tiered

    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", True)

    def refuse(*args, **kwargs):
        raise TypeError("cannot pickle")

    monkeypatch.setattr(background.BackgroundCompile, "__init__", refuse)
    import pytensor.tensor as pt

    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    graph = (pt.cos(x * float(np.random.default_rng().uniform(1.0, 2.0)))).sum()
    fn = TieredFunction(
        lambda mode: model.compile_fn(graph, inputs=[x], point_fn=False, mode=mode), budget=0.0
    )
    fn(np.arange(3.0))
    assert fn.promoted and not fn.compiling


def test_a_graph_compiled_before_skips_the_first_tier(monkeypatch, count_compiles):
    """A function whose graph this machine compiled before builds its final tier only.

    The graph before rewrites is recorded with the compiled one, so that the next
    process does not rewrite it for the first tier first (seconds on a model's
    larger graphs, in every run) only to find it compiled.
    """
    import pytensor.tensor as pt

    from pymc_subsample.model import tiered
    from pymc_subsample.model.function_cache import compile_cached

    monkeypatch.setattr(tiered.atexit, "register", lambda f: None)
    x = pt.dvector("x")
    scale = float(np.random.default_rng().uniform(1.0, 2.0))  # a graph new to the machine
    with pm.Model() as model:
        pass
    graph = (pt.sin(x * scale) ** 2).sum()
    value = np.arange(4.0)
    fn = compile_cached(model, graph, [x])
    fn(value)
    assert not fn.promoted and fn.spent > 0  # the first tier's rewrites count as its rent
    fn.promote()
    expected = fn(value)  # compiled: recorded, with the graph before rewrites
    assert fn.source is not None
    _new_process(monkeypatch)
    clear_function_cache()
    count_compiles.clear()
    again = compile_cached(model, graph, [x])
    np.testing.assert_allclose(again(value), expected, rtol=1e-12)
    assert again.promoted and again.start is None
    assert count_compiles == [NumbaLinker]  # one compilation: the final tier's
    other = compile_cached(model, (pt.sin(x * scale) ** 3).sum(), [x])
    other(value)
    assert not other.promoted  # another graph: the first tier


def test_a_function_is_handed_to_another_process_at_a_share_of_its_budget(monkeypatch):
    """Compiling in another process does not hold the calls up: it starts at a share of the
    budget (the whole budget when it must compile here), at most MAX_RUNNING at once."""
    import pytensor.tensor as pt

    from pymc_subsample.model import background, tiered

    started = []

    class Fake:
        running_now = 0

        def __init__(self, compile, args, digest, n_nodes):
            started.append(digest)

        @classmethod
        def running(cls):
            return cls.running_now

        def poll(self):
            return None

    monkeypatch.setattr(background, "BackgroundCompile", Fake)
    x = pt.dvector("x")
    with pm.Model() as model:
        pass
    graph = (pt.cos(x * float(np.random.default_rng().uniform(1.0, 2.0)))).sum()

    def new_function():
        return TieredFunction(
            lambda mode: model.compile_fn(graph, inputs=[x], point_fn=False, mode=mode),
            budget=100.0,
        )

    value = np.arange(3.0)
    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", False)
    fn = new_function()
    fn(value)
    fn.spent = 0.5 * fn.budget
    fn(value)
    assert not fn.compiling and not fn.promoted  # in process: the whole budget first
    monkeypatch.setattr(tiered, "BACKGROUND_COMPILE", True)
    share = max(tiered.PROMOTE_SECONDS, tiered.BACKGROUND_SHARE * 100.0)
    fn = new_function()
    fn(value)
    fn.spent = 0.9 * share
    fn(value)
    assert not fn.compiling
    fn.spent = share
    Fake.running_now = background.MAX_RUNNING  # others' turn first
    fn(value)
    assert not fn.compiling and not started
    Fake.running_now = 0
    fn(value)
    assert fn.compiling and not fn.promoted and started == [fn.digest]


def test_the_digest_before_rewrites_is_the_same_in_every_process():
    """A graph with object constants (a shape of None) digests alike in two processes."""
    import subprocess
    import sys

    code = (
        "import pymc as pm, pytensor.tensor as pt\n"
        "from pymc_subsample.model.function_cache import _Compiler\n"
        "x = pt.dvector('x')\n"
        "with pm.Model() as model:\n"
        "    pass\n"
        "graph = (pt.specify_shape(x, (None,)) ** 2).sum()\n"
        "print(_Compiler(model, graph, [x], False, {}).source_digest())\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
        for _ in range(2)
    }
    (digest,) = digests
    assert digest.startswith("src-")

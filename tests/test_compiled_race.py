"""The compiled race (racing.compiled) against the Python driver, and in the Gibbs step."""

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from numba import njit

from pymc_subsample import SubsampledCategoricalGibbs
from pymc_subsample.options import AuditOptions, RaceOptions
from pymc_subsample.racing import RaceConfig, race_shared
from pymc_subsample.racing.compiled import CompiledRewards, race_compiled, supports
from pymc_subsample.racing.schedule import ExactSwitch


@njit
def gaussian_terms(cand, rows, scale):
    """Log-density terms of rows under N(cand, scale), -inf for arm values above 8."""
    out = np.empty((len(cand), len(rows)))
    for i in range(len(cand)):
        for n in range(len(rows)):
            z = (rows[n] - cand[i]) / scale[()]
            out[i, n] = -np.inf if cand[i] > 8.0 and rows[n] > 2.5 else -0.5 * z * z
    return (out,)


def python_race(data, cand, scale, config, n_obs, rng, offsets):
    def rewards(arms, idx):
        return gaussian_terms(cand[arms], data[idx], scale)[0]

    def totals(arms):
        return gaussian_terms(cand[arms], data, scale)[0].sum(axis=1)

    return race_shared(rewards, len(cand), n_obs, config, rng=rng, offsets=offsets, totals=totals)


@pytest.mark.parametrize(
    ("spread", "variance", "n_obs"),
    [
        (0.05, "pairwise", 200_000),
        (0.002, "pairwise", 200_000),
        (0.05, "marginal", 200_000),
        (0.05, "pairwise", 600_000),  # blocks of 64 rows (block_rows)
    ],
)
def test_compiled_race_makes_the_python_race_decisions(spread, variance, n_obs):
    data = np.random.default_rng(0).normal(size=n_obs)
    cand = np.arange(10) * spread - 4 * spread
    cand[9] = 9.0  # -inf terms on some rows: dropped at the look that meets one
    scale = np.asarray(1.0)
    config = RaceConfig(
        batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks", variance=variance
    )
    assert supports(config, 10, n_obs, totals=True)
    compiled = CompiledRewards(gaussian_terms, [data])
    noise_rng = np.random.default_rng(1)
    for seed in range(40):
        offsets = noise_rng.gumbel(size=10) / n_obs
        expected = python_race(
            data, cand, scale, config, n_obs, np.random.default_rng(seed), offsets
        )
        got = race_compiled(
            compiled, cand, (scale,), n_obs, config, rng=np.random.default_rng(seed),
            offsets=offsets, totals=lambda arms: gaussian_terms(cand[arms], data, scale)[0].sum(1),
        )  # fmt: skip
        assert got.winner == expected.winner
        assert got.n_evaluations == expected.n_evaluations
        assert got.n_rounds == expected.n_rounds
        np.testing.assert_allclose(got.means, expected.means, rtol=1e-12)  # float sums, to rounding


@pytest.mark.parametrize("variance", ["pairwise", "marginal"])
def test_compiled_look_makes_the_python_update_on_random_states(variance):
    """A compiled look (``look_state``) equals ``SharedRace.update``, on random inputs.

    Random arms, offsets, reward range and heavy-tailed batches, some with a
    -inf reward, looked at from ``init`` until the race decides or gives up:
    after every look the two states agree (survivors, statistics, means of
    the dropped arms, counts), and the compiled status says what the Python
    driver would do next (decided, give up, rescue, go on).
    """
    from pymc_subsample.racing import SharedRace
    from pymc_subsample.racing.packed import ALL_MINUS_INF, DECIDED, EXACT_PASS, look_state

    rng = np.random.default_rng(3)
    seen = {DECIDED: 0, EXACT_PASS: 0, ALL_MINUS_INF: 0, "dropped": 0, "-inf": 0}
    for _ in range(80):
        d = int(rng.integers(2, 9))
        config = RaceConfig(
            batch_size=int(rng.choice([50, 200])), variance=variance, batches="blocks",
            exact=ExactSwitch.after_size(6400), reward_range=None if rng.random() < 0.7 else 8.0,
        )  # fmt: skip
        kernel = SharedRace(config, d, 100_000, rng.normal(size=d) * 1e-3)
        centres = rng.normal(size=d) * rng.choice([1e-3, 3e-2, 0.3])
        python = compiled = kernel.init()
        for size in kernel.look_sizes[:-1]:
            m = size - python.n_drawn
            rewards = rng.standard_t(4, size=(d, m)) + centres[:, None]
            if rng.random() < 0.08:
                rewards[rng.integers(d), rng.integers(m)] = -np.inf
                seen["-inf"] += 1
            batch = np.ascontiguousarray(rewards[python.alive])
            python = kernel.update(python, batch)
            compiled, status = look_state(kernel, compiled, batch)
            assert not python.sparse
            for name in ("alive", "n_drawn", "ref", "n_ref", "n_evaluations", "n_rounds", "winner"):
                np.testing.assert_array_equal(getattr(compiled, name), getattr(python, name))
            # The statistics are float sums; a compiled loop may add in another
            # order (1 ulp seen on a fresh machine), so they agree to rounding.
            np.testing.assert_allclose(compiled.rows[:3], python.rows[:3], rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(compiled.means, python.means, rtol=1e-12, atol=1e-300)
            seen["dropped"] += int(np.isfinite(python.means).any())
            if len(python.alive) == 0:
                expected = ALL_MINUS_INF
            elif python.winner >= 0:
                expected = DECIDED
            elif kernel.can_give_up and kernel.hopeless(python):
                expected = EXACT_PASS
            else:
                expected = -1
            assert status == expected
            if status >= 0:
                seen[status] += 1
                break
    assert seen[DECIDED] > 5 and seen[EXACT_PASS] > 5 and seen["dropped"] > 5, seen
    assert seen["-inf"] > 3, seen


def test_block_rows_grow_with_n_keeping_many_blocks():
    from pymc_subsample.racing.schedule import MIN_BLOCKS, block_rows

    sizes = [10**4, 262_143, 262_144, 524_288, 10**6, 1_048_576, 10**7, 10**9]
    assert [block_rows(n) for n in sizes] == [16, 16, 32, 64, 64, 128, 128, 128]
    assert all(n // block_rows(n) >= MIN_BLOCKS for n in sizes if block_rows(n) > 16)


@pytest.mark.parametrize("chunk", [0, -5, 2.5])
def test_compiled_race_rejects_a_bad_chunk_size(chunk):
    from pymc_subsample.racing.compiled import CompiledRace

    config = RaceConfig(batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks")
    rewards = CompiledRewards(gaussian_terms, [np.zeros(200_000)])
    with pytest.raises(ValueError, match="chunk_rewards must be a positive integer"):
        CompiledRace(rewards, config, 3, 200_000, 1, chunk_rewards=chunk)


def test_compiled_race_rejects_nan_rewards():
    @njit
    def nan_terms(cand, rows):
        out = np.zeros((len(cand), len(rows)))
        out[-1, 0] = np.nan
        return (out,)

    n_obs = 200_000
    config = RaceConfig(batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks")
    with pytest.raises(ValueError, match="returned NaN"):
        race_compiled(
            CompiledRewards(nan_terms, [np.zeros(n_obs)]), np.arange(3.0), (), n_obs, config,
            rng=np.random.default_rng(0), offsets=np.zeros(3), totals=lambda arms: np.zeros(3),
        )  # fmt: skip


def test_supports_only_blocks_with_an_early_exact_pass():
    early = RaceConfig(batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks")
    assert supports(early, 10, 200_000, totals=True)
    assert not supports(early, 10, 200_000, totals=None)  # no fused pass to end with
    assert not supports(early, 1, 200_000, totals=True)
    assert not supports(RaceConfig(batch_size=400, batches="blocks"), 10, 200_000, totals=True)
    windows = RaceConfig(batch_size=400, exact=ExactSwitch.after_size(12_800), batches="windows")
    assert not supports(windows, 10, 200_000, totals=True)
    ebs = RaceConfig(
        bound="ebs", batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks"
    )
    assert not supports(ebs, 10, 200_000, totals=True)


@pytest.fixture(scope="module")
def large_selector():
    rng = np.random.default_rng(3)
    n_obs = 150_000
    mus = np.array([0.0, 0.004, 0.008, 0.012, 0.3])
    x = rng.normal(size=n_obs)
    y = rng.normal(0.008 + 0.5 * x, 1.0)
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        y_data = pm.Data("y_data", y)
        slope = pm.Normal("slope", 0.0, 1.0)
        q = pm.Categorical("q", p=np.full(5, 0.2))
        pm.Normal("y", pt.as_tensor(mus)[q] + slope * x_data, 1.0, observed=y_data)
    return model, q


class _SameDraws(np.random.Generator):
    """A stand-in for ``rng`` that serves the compiled races' bulk seeds one at a time.

    A lone scalar takes its Gumbel noise from ``rng`` in blocks of
    :data:`~pymc_subsample.steps.gibbs.DRAW_BUFFER`, and so do its compiled
    races' seeds; a Python race takes one seed per race. Fed this object, the
    Python driver sees the same noise and seeds as the compiled driver fed
    ``np.random.default_rng(seed)``.
    """

    def __init__(self, seed, n_cat):
        from pymc_subsample.steps.gibbs import DRAW_BUFFER

        super().__init__(np.random.PCG64(0))
        self._rng, self._n_cat, self._size = np.random.default_rng(seed), n_cat, DRAW_BUFFER
        self._seeds, self.n_noise, self.n_seeds = [], 0, 0

    @property
    def bit_generator(self):
        return self

    def gumbel(self, size):
        assert size == (self._size, self._n_cat)  # the noise buffer, which both drivers read
        self.n_noise += self._size
        return self._rng.gumbel(size=size)

    def random_raw(self):
        if self.n_seeds >= len(self._seeds):
            self._seeds += list(self._rng.bit_generator.random_raw(self._size))
        self.n_seeds += 1
        return int(self._seeds[self.n_seeds - 1])


def test_gibbs_step_races_compiled_with_the_same_draws(large_selector):
    """The compiled driver and the Python driver of the step make the same draws.

    Same noise, same race seeds (:class:`_SameDraws`): the same values, terms
    and looks at each of 150 draws that drop, give up and decide.
    """
    model, q = large_selector
    settings = {
        "race": RaceOptions(batch_size=400, exact_fraction=0.1),
        "audit": AuditOptions(every=0),
    }
    with model:
        compiled = SubsampledCategoricalGibbs([q], rng=5, **settings)  # the same row permutation
        python = SubsampledCategoricalGibbs([q], rng=5, **settings)
    for step in (compiled, python):  # the compiled tier a long chain reaches
        step.finish_compiling()
    assert compiled.compiled
    python._compiled = False
    compiled.rng = np.random.default_rng(5)
    python.rng = _SameDraws(5, compiled.n_categories[0])
    point = model.initial_point()
    point["slope"] = np.asarray(0.5)
    draws = {}
    for name, step in (("compiled", compiled), ("python", python)):
        p, record = dict(point), []
        for _ in range(150):
            p, stats = step.step(p)
            record.append((int(p["q"]), stats[0]["n_evals"], stats[0]["n_rounds"]))
        draws[name] = record
    assert python.rng.n_noise >= 150 and python.rng.n_seeds > 0  # drawn through the feed
    assert draws["compiled"] == draws["python"]
    values = np.array([r[0] for r in draws["compiled"]])
    assert len(np.unique(values)) > 1  # a real spread: races that drop, give up and decide


@pytest.mark.parametrize("shape", [(1003,), (1003, 3)])
def test_block_gather_matches_the_expanded_positions(shape):
    """Copying whole blocks gives the rows of the expanded positions (the last block cut)."""
    from pymc_subsample.racing.draws import expand_blocks, gather_blocks
    from pymc_subsample.racing.schedule import BLOCK_ROWS

    data = np.arange(np.prod(shape), dtype=float).reshape(shape)
    n_blocks = -(-shape[0] // BLOCK_ROWS)
    ids = np.array([n_blocks - 1, 0, 7, 3], dtype=np.int64)
    expected = data[expand_blocks(ids, BLOCK_ROWS, shape[0])]
    got = gather_blocks(data, ids, BLOCK_ROWS, shape[0])
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_auto_plan_is_timed_on_compiled_looks(large_selector):
    """At its defaults the step times compiled looks and keeps a plan they can run."""
    from pymc_subsample.mcmc.cost import compiled_look_cost

    model, q = large_selector
    with model:
        step = SubsampledCategoricalGibbs([q], rng=5)
    step.finish_compiling()  # the compiled tier a long chain reaches
    assert step.compiled
    assert supports(step.race_config, 5, step.terms.n_obs, totals=True)
    a, b = compiled_look_cost(
        step.terms.compiled_rows(), step.candidate_values[0],
        tuple(step.terms.other_arrays(step.initial_point)), step.terms.n_obs,
        np.random.default_rng(0),
    )  # fmt: skip
    assert a >= 0.0 and b > 0.0
    # a compiled look's fixed cost is far below a Python look's (tens of microseconds)
    assert a < 50e-6


@pytest.fixture(scope="module")
def tied_selector():
    """Three values with nearly identical terms (weighted by the prior), two far off.

    Their differences are tiny but nonzero on every row: values with identical terms on most
    rows have sparse differences, which go to an exact pass (``racing.state.sparse_arms``).
    """
    rng = np.random.default_rng(4)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(0.0, 1.0, size=150_000))
        q = pm.Categorical("q", p=np.array([0.1, 0.3, 0.2, 0.2, 0.2]))
        mus = pt.as_tensor(np.array([0.0, 1e-6, 2e-6, 0.02, 0.3]))
        pm.Normal("y", mus[q], 1.0, observed=y_data)
    return model, q


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("case", ["diffuse", "tied"])
def test_compiled_step_draws_the_exact_conditional(
    large_selector, tied_selector, case, chunked, monkeypatch
):
    """Compiled races' draws (no audits, no back-off) follow the conditional by enumeration.

    "diffuse": three values share the mass with log-likelihoods about a nat
    apart, so most races end in the exact pass. "tied": three values have the
    same terms up to 1e-6 (almost no variance in their differences) and only the Gumbel noise
    and the prior separate them, so races decide after a look or two. delta =
    0.01, so that a chi-square on 1,500 draws would see an error of the default
    0.05 in total variation. "chunked": every look after the first is
    evaluated and merged in chunks of 2,000 rewards (``CHUNK_REWARDS``).
    """
    from test_gibbs import assert_matches, draw_many, exact_conditional

    from pymc_subsample.racing import compiled

    if chunked:
        monkeypatch.setattr(compiled, "CHUNK_REWARDS", 2000)
    model, q = large_selector if case == "diffuse" else tied_selector
    point = model.initial_point()
    if case == "diffuse":
        point["slope"] = np.asarray(0.5)
    probs = exact_conditional(model, "q", 5, point)
    assert probs.max() < 0.6 and np.sort(probs)[-3] > 0.05
    with model:
        step = SubsampledCategoricalGibbs(
            [q],
            rng=11,
            delta=0.01,
            race=RaceOptions(backoff=False, batch_size=400, exact_fraction=0.4),
            audit=AuditOptions(every=0),
        )
    step.finish_compiling()  # the compiled tier a long chain reaches
    assert step.compiled
    assert step.compiled_race.chunk_rewards == (2000 if chunked else compiled.CHUNK_REWARDS)
    draws, st = draw_many(step, point, 1500, "q")
    assert_matches(draws, probs, 5)
    assert hasattr(step, "_noise_buffer")  # drawn in bulk
    assert all(s["n_raced"] == 1 for s in st)
    # draws that cost less than half an exact draw: races decided on a subsample, or given
    # up with two values left (tied: 451 of 1,500 with GIVE_UP_MARGIN = 1.5, 873 with 1.0,
    # whose earlier give-ups read 5% fewer terms here and 3.7x more on a point mass)
    early = sum(s["n_evals"] < 0.5 * 5 * step.terms.n_obs for s in st)
    assert early > (300 if case == "tied" else 0), early


@njit
def rare_inf_terms(cand, rows):
    """N(mu, 1) terms; candidates above 0.5 have mean cand - 1 and -inf terms on rows > 4."""
    out = np.empty((len(cand), len(rows)))
    for i in range(len(cand)):
        mu = cand[i] - 1.0 if cand[i] > 0.5 else cand[i]
        for n in range(len(rows)):
            z = rows[n] - mu
            out[i, n] = -np.inf if cand[i] > 0.5 and rows[n] > 4.0 else -0.5 * z * z
    return (out,)


def test_exact_outcome_decides_as_finish():
    """The lean end of an exact pass makes :meth:`finish`'s decision, or defers to it.

    Near-tied arms reach the exact pass; one arm has -inf terms on a few rows
    (rows above 4 sd), which its looks rarely meet, so that some exact passes
    see a -inf sum: then ``exact_outcome`` returns None and ``finish`` decides.
    """
    from pymc_subsample.racing.compiled import CompiledRace
    from pymc_subsample.racing.packed import EXACT_PASS

    n_obs = 200_000
    data = np.random.default_rng(2).normal(size=n_obs)
    assert 0 < np.sum(data > 4.0) < 20
    cand = np.array([0.0, 0.002, 0.004, 1.003])  # the last: mean 0.003, rare -inf rows
    config = RaceConfig(batch_size=400, exact=ExactSwitch.after_size(12_800), batches="blocks")
    race = CompiledRace(CompiledRewards(rare_inf_terms, [data]), config, 4, n_obs, 0)

    def totals(arms):
        return rare_inf_terms(cand[arms], data)[0].sum(axis=1)

    noise_rng, cases = np.random.default_rng(1), {"finite": 0, "-inf": 0}
    for seed in range(60):
        offsets = noise_rng.gumbel(size=4) / n_obs
        status = race.launch(cand, (data,), (), np.array([seed], dtype=np.uint64), offsets)
        if status != EXACT_PASS:
            continue
        sums = totals(race.survivors())
        got = race.exact_outcome(offsets, sums)
        expected = race.finish(status, offsets, totals)
        if np.isfinite(sums).all():
            cases["finite"] += 1
            assert got == (expected.winner, expected.n_evaluations, expected.n_rounds)
        else:
            cases["-inf"] += 1
            assert got is None and expected.winner != 3
    assert cases["finite"] > 5 and cases["-inf"] > 0, cases


def test_compiled_step_audits_its_races(large_selector):
    """Compiled races are audited, and the audits see a wrong decision.

    Every draw is audited (``audit_every=1``), every race is compiled, and
    the audited error rate is within delta; with the race's value replaced by
    another one, every audit of a raced draw disagrees.
    """
    from scipy import stats
    from test_gibbs import draw_many

    model, q = large_selector
    point = dict(model.initial_point(), slope=np.asarray(0.5))
    with model:
        step = SubsampledCategoricalGibbs(
            [q],
            rng=3,
            race=RaceOptions(backoff=False, batch_size=400, exact_fraction=0.1),
            audit=AuditOptions(every=1),
        )
    step.finish_compiling()  # the compiled tier a long chain reaches
    assert step.compiled
    race, compiled_races = step._race_compiled, []
    step._race_compiled = lambda o, p, seed=None: compiled_races.append(1) or race(o, p, seed)
    _, st = draw_many(step, point, 300, "q")
    assert all(s["n_raced"] == 1 and s["audit_agree"] >= 0 for s in st)
    assert step.n_audits == 300 and len(compiled_races) == 300
    assert stats.binom.sf(step.n_disagreements - 1, 300, step.delta) > 1e-3

    def wrong_race(offsets, p, seed=None):
        value, *rest = race(offsets, p, seed)
        return ((value + 1) % 5, *rest)

    step._race_compiled = wrong_race
    with pytest.warns(UserWarning, match="audited decisions differed"):
        _, st = draw_many(step, point, 50, "q")
    # the race's own value is exact but for about delta of the draws: then the shifted
    # one may happen to be right; a few wrong audits (after 300 right ones) switch to
    # exact draws, one when the value chosen has exact probability below 1e-12
    switched = next(i for i, s in enumerate(st) if s["audit_exact"])
    assert 1 <= switched <= 40 and sum(s["audit_agree"] == 0 for s in st[:switched]) >= 1
    assert all(s["n_raced"] == 0 for s in st[switched:])


def test_a_replan_that_changes_nothing_keeps_the_driver(large_selector):
    """A function moving to Numba mid-chain plans the races again; the same plan keeps its driver.

    Any promotion in the process (the audits' joint density, another step's
    function) triggers a replan; one that chooses the same settings on the
    same rows kernel neither rebuilds the driver nor runs its warm-up race.
    """
    model, q = large_selector
    point = dict(model.initial_point(), slope=np.asarray(0.5))
    with model:
        step = SubsampledCategoricalGibbs(
            [q], rng=3, race=RaceOptions(backoff=False, batch_size=400, exact_fraction=0.1)
        )
    step.finish_compiling()
    assert step.compiled
    driver, calls = step.compiled_race, []
    race = step._race_compiled
    step._race_compiled = lambda o, p, seed=None: calls.append(seed) or race(o, p, seed)
    step._functions_promoted(point)
    assert step.compiled_race is driver and calls == []


def test_every_audit_is_timed():
    """Every audit is timed, also when the race computed every value's sums itself.

    Two near-tied values at N = 100,000: most races reach the exact pass with
    both alive; their sums are the race's own, and the audit does not reuse
    them (it evaluates the model's joint log density, independently), so it
    is charged to the ``"auto"`` budget like any other.
    """
    from test_gibbs import draw_many

    rng = np.random.default_rng(6)
    with pm.Model() as model:
        y_data = pm.Data("y_data", rng.normal(0.001, 1.0, size=100_000))
        q = pm.Categorical("q", p=np.full(2, 0.5))
        pm.Normal("y", pt.as_tensor(np.array([0.0, 0.002]))[q], 1.0, observed=y_data)
    with model:
        step = SubsampledCategoricalGibbs(
            [q],
            rng=2,
            race=RaceOptions(backoff=False, batch_size=400, exact_fraction=0.1),
            audit=AuditOptions(every=1),
        )
    step.finish_compiling()  # the compiled tier a long chain reaches
    assert step.compiled
    race, clock, clocked, free = step._race_compiled, step._audit_clock, [], []

    def counted_clock():
        clocked.append(1)
        return clock()

    def recorded_race(offsets, p, seed=None):
        out = race(offsets, p, seed)
        free.append(out[4] is not None)  # the sums, when the race computed them all
        return out

    step._audit_clock, step._race_compiled = counted_clock, recorded_race
    _, st = draw_many(step, model.initial_point(), 200, "q")
    n_free = sum(free)
    assert 20 < n_free < 200 and len(clocked) == 200, (n_free, len(clocked))
    assert all(s["audit_agree"] >= 0 for s in st) and step.n_audits == 200

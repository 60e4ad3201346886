"""Racing core: error rates against delta, exactness, budgets, pitfalls, bad input."""

import numpy as np
import pytest
from scipy import stats

from pymc_subsample.racing import (
    IndexStream,
    doubling_schedule,
    normal_threshold,
    race,
    race_independent,
    sample_categorical,
    union_threshold,
)
from support.synthetic import (
    bandit_population,
    gumbel_race_errors,
    rare_event_population,
)

SHARED_BOUNDS = ["normal", "ebs", "lilucb"]


def table_rewards(table, calls=None):
    def rewards(arms, idx):
        if calls is not None:
            calls.append((np.array(arms), np.array(idx)))
        return table[np.ix_(arms, idx)]

    return rewards


def too_many_errors(errors, trials, delta, alpha=1e-3):
    """One-sided binomial test of 'error rate <= delta' at level alpha."""
    return stats.binom.sf(errors - 1, trials, delta) < alpha


def error_rate(
    dist, bound, variance, *, n_obs=2000, sigma=2e-3, delta=0.05, trials=300, seed=0, n_arms=10
):
    table, log_p = bandit_population(dist, n_arms, n_obs, sigma, rng=seed)
    crange = float((table.max(axis=1) - table.min(axis=1)).max())
    errors, evals = gumbel_race_errors(
        table,
        log_p,
        trials,
        np.random.default_rng(seed + 1),
        delta=delta,
        bound=bound,
        variance=variance,
        reward_range=None if bound == "normal" else crange,
    )
    assert evals.max() <= n_obs * n_arms
    return errors, np.mean(evals) / (n_obs * n_arms)


# uniform rewards (bounded, the easiest population for both bounds) only in make
# test-all: normal and lognormal check every bound and variance in the default run
@pytest.mark.parametrize(
    "dist", ["normal", pytest.param("uniform", marks=pytest.mark.slow), "lognormal"]
)
@pytest.mark.parametrize("variance", ["pairwise", "marginal"])
@pytest.mark.parametrize("bound", ["normal", "ebs"])
def test_error_rate_below_delta(dist, bound, variance):
    trials = 300
    errors, frac = error_rate(dist, bound, variance, trials=trials)
    assert not too_many_errors(errors, trials, 0.05), (errors, trials)
    assert frac < 1.0  # the race saved something on this population


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_many_arms_batch_variance_error_rate_below_delta(dist):
    # more than 16 arms: pairwise Racing-Normal estimates variances on the latest batch
    trials = 200
    errors, frac = error_rate(dist, "normal", "pairwise", n_arms=30, sigma=3e-3, trials=trials)
    assert not too_many_errors(errors, trials, 0.05), errors
    assert frac < 0.9


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_lilucb_error_rate_below_delta(dist):
    trials = 80
    errors, _ = error_rate(dist, "lilucb", "pairwise", sigma=3e-4, trials=trials)
    assert not too_many_errors(errors, trials, 0.05)


def test_normal_race_error_close_to_delta_on_hard_problem():
    # Racing-Normal's bound is sharp (Chen & Ghahramani 2016, Fig. 1b): on a hard population the
    # error is of the order of delta, not orders of magnitude below it. Checking
    # both directions shows the error-rate test has power.
    trials = 400
    errors, frac = error_rate(
        "normal", "normal", "pairwise", sigma=2e-2, delta=0.2, trials=trials, seed=3
    )
    assert not too_many_errors(errors, trials, 0.2)
    assert errors > 0
    assert frac > 0.3


@pytest.mark.parametrize("bound", ["normal", "ebs", "lilucb"])
def test_exact_and_easy_races_return_argmax(bound):
    table, log_p = bandit_population("uniform", 6, 500, 1e-5, rng=4)
    rewards = table_rewards(table)
    for seed in range(20):
        res = race(rewards, 6, 500, bound=bound, rng=seed, reward_range=1e-4)
        assert res.winner == int(np.argmax(log_p))
    res = race(rewards, 6, 500, bound="exact")
    assert res.winner == int(np.argmax(log_p)) and res.exhausted
    assert res.n_evaluations == 6 * 500


def test_exact_bound_is_always_right():
    table, _ = bandit_population("lognormal", 10, 300, 1.0, rng=5)
    rewards = table_rewards(table)
    for seed in range(30):
        noise = np.random.default_rng(seed).gumbel(size=10)
        x, res = sample_categorical(np.zeros(10), rewards, 300, bound="exact", noise=noise)
        assert x == int(np.argmax(table.sum(axis=1) + noise))
        assert res.exhausted


@pytest.mark.parametrize("bound", ["normal", "ebs", "exact"])
def test_sample_categorical_matches_target_distribution(bound):
    n_arms, n_obs = 4, 400
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    table, log_p = bandit_population("normal", n_arms, n_obs, 1e-3, rng=6, probs=probs)
    rewards = table_rewards(table)
    rng = np.random.default_rng(7)
    draws = 2000
    counts = np.bincount(
        [
            sample_categorical(
                np.zeros(n_arms), rewards, n_obs, bound=bound, rng=rng, reward_range=0.1
            )[0]
            for _ in range(draws)
        ],
        minlength=n_arms,
    )
    pval = stats.chisquare(counts, draws * np.exp(log_p)).pvalue
    assert pval > 1e-3, counts


def test_budget_never_exceeds_n_times_d():
    table, _ = bandit_population("lognormal", 5, 777, 10.0, rng=8)
    rewards = table_rewards(table)
    for bound in ["normal", "ebs", "lilucb", "exact"]:
        for variance in ["pairwise", "marginal"]:
            for seed in range(5):
                res = race(rewards, 5, 777, bound=bound, variance=variance, rng=seed, batch_size=2)
                assert res.n_evaluations <= 5 * 777
                assert res.n_drawn <= 777


def test_log_f0_minus_inf_arms_never_win_and_cost_nothing():
    table, _ = bandit_population("normal", 5, 300, 1e-3, rng=9)
    calls = []
    log_f0 = np.array([0.0, -np.inf, 50.0, -np.inf, 0.0])
    for seed in range(20):
        x, _ = sample_categorical(log_f0, table_rewards(table, calls), 300, rng=seed)
        assert x == 2
    assert not any(np.isin([1, 3], arms).any() for arms, _ in calls)


def test_minus_inf_rewards_eliminate_at_once():
    table = np.zeros((3, 1000))
    table[2] = 1.0  # best by far, but impossible at every fifth observation
    table[2, ::5] = -np.inf
    table[1] = 0.5
    for variance in ["pairwise", "marginal"]:
        for bound in ["normal", "ebs", "lilucb"]:
            for seed in range(10):
                res = race(table_rewards(table), 3, 1000, bound=bound, variance=variance, rng=seed)
                assert res.winner == 1
    assert race(table_rewards(table), 3, 1000, bound="exact").winner == 1


def test_all_minus_inf_raises():
    table = np.zeros((3, 100))
    table[:, ::3] = -np.inf
    for bound in ["normal", "ebs", "lilucb", "exact"]:
        with pytest.raises(ValueError, match="-inf"):
            race(table_rewards(table), 3, 100, bound=bound, rng=0)
    with pytest.raises(ValueError, match="-inf"):
        sample_categorical(np.full(3, -np.inf), table_rewards(table), 100)


def test_exact_pass_on_impossible_survivors_decides_the_dropped_arms():
    # arms 0 and 2 lead the first look, then both turn out impossible in the exact
    # pass through ``totals``: arm 1, dropped earlier, is the only possible arm
    table = np.zeros((3, 5))
    table[[0, 2], 3] = -np.inf
    table[1] = -1.0

    def totals(arms):
        return table[arms].sum(axis=1)

    for tot in [None, totals]:
        through_exact = 0
        for seed in range(10):  # some first looks miss observation 3, some see it
            res = race(
                table_rewards(table), 3, 5, schedule=(2,), rng=seed, reward_range=0.1, totals=tot
            )
            assert res.winner == 1
            np.testing.assert_array_equal(res.means, [-np.inf, -1.0, -np.inf])
            through_exact += res.exhausted
        assert through_exact > 0


def test_identical_arms_tie_at_n_and_lowest_index_wins():
    table = np.tile(np.random.default_rng(10).normal(size=500), (3, 1))
    for variance in ["pairwise", "marginal"]:
        res = race(table_rewards(table), 3, 500, variance=variance, rng=1)
        assert res.exhausted and res.winner == 0 and res.n_drawn == 500


def test_constant_differences_decided_at_first_look_pairwise():
    base = np.random.default_rng(11).normal(size=10_000) * 5.0
    table = np.stack([base, base + 1e-3, base - 1e-3])
    res = race(table_rewards(table), 3, 10_000, variance="pairwise", rng=0)
    assert res.winner == 1 and res.n_rounds == 1 and res.n_evaluations == 3 * 50
    res = race(table_rewards(table), 3, 10_000, variance="marginal", rng=0)
    assert res.winner == 1 and res.n_rounds > 1  # marginal cannot see the constant gap early


@pytest.mark.parametrize("leader_holds", [True, False])
def test_pairwise_look_merges_to_the_statistics_of_all_rewards(leader_holds):
    """Two looks merged by ``look_pairwise`` (the leader holds, or changes) vs NumPy.

    Arm means 10^3 apart with spreads of 10^-3, so that sums of squares taken
    around zero rather than the running mean would cancel to nothing.
    """
    from pymc_subsample.racing.kernels import look_pairwise

    rng = np.random.default_rng(12)
    n, m, s = 300, 200, 5
    table = rng.normal(size=(s, n + m)) * 1e-3 - 1e3 * np.arange(s)[:, None]
    if not leader_holds:  # arm 1 overtakes arm 0 in the second batch
        table[1, n:] += 4e3
    offsets = np.zeros(s)
    zeros = np.zeros(s)
    mean, lead, n_ref, dmean, dm2, *_ = look_pairwise(
        table[:, :n], 0, zeros, -1, 0, zeros, zeros, offsets, 0.0, 0.0
    )
    assert lead == 0 and n_ref == n
    mean, lead, n_ref, dmean, dm2, keep, _ = look_pairwise(
        table[:, n:], n, mean, lead, n_ref, dmean, dm2, offsets, 0.0, 0.0
    )
    np.testing.assert_allclose(mean, table.mean(axis=1), rtol=1e-12)
    # the differences with the leader over the observations since it leads
    since = 0 if leader_holds else n
    diffs = table[lead, since:] - table[:, since:]
    assert lead == (0 if leader_holds else 1) and n_ref == n + m - since and keep.all()
    np.testing.assert_allclose(dmean, diffs.mean(axis=1), rtol=1e-12)
    expected = ((diffs - diffs.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    np.testing.assert_allclose(dm2, expected, rtol=1e-6, atol=1e-12)
    assert np.all(expected[np.arange(s) != lead] > 1e-4)  # the spreads, not rounding noise


def test_rare_event_rewards_need_the_range():
    trials, delta = 200, 0.01
    wrong_default = wrong_floored = 0
    evals = []
    for seed in range(trials):
        table = rare_event_population(20_000, 20, 1.0, rng=seed)
        default = race(table_rewards(table), 2, 20_000, delta=delta, rng=seed + 10**6)
        floored = race(
            table_rewards(table), 2, 20_000, delta=delta, rng=seed + 10**6, reward_range=1.0
        )
        wrong_default += default.winner != 0
        wrong_floored += floored.winner != 0
        evals.append(floored.n_evaluations)
    # the known failure of the plain normal approximation ...
    assert wrong_default > 10 * delta * trials
    # ... which the floor from a true reward range removes, still saving rewards
    assert not too_many_errors(wrong_floored, trials, delta)
    assert np.mean(evals) < 2 * 20_000


def test_independent_populations_of_different_sizes():
    rng = np.random.default_rng(12)
    sizes = np.array([50, 400, 3000, 800])
    pops = [rng.normal(0.0, 0.01, size=n) for n in sizes]
    pops = [p - p.mean() for p in pops]
    totals = np.array([2.0, 1.0, 0.0, 2.3])
    pops = [p + t / len(p) for p, t in zip(pops, totals, strict=True)]

    def rewards(arms, idx):
        assert len(arms) == 1
        return pops[int(arms[0])][idx][None, :]

    trials, wrong, evals = 100, 0, []
    for seed in range(trials):
        res = race(rewards, 4, sizes, variance="marginal", rng=seed, batch_size=10)
        wrong += res.winner != 3
        evals.append(res.n_evaluations)
    assert not too_many_errors(wrong, trials, 0.05)
    assert np.mean(evals) < sizes.sum()
    assert race(rewards, 4, sizes, variance="marginal", bound="exact").winner == 3
    with pytest.raises(ValueError, match="marginal"):
        race(rewards, 4, sizes)
    with pytest.raises(ValueError, match="entries"):
        race(rewards, 3, sizes, variance="marginal")


def test_normal_threshold_controls_the_crossing_probability():
    # Simulate the standardized means of without-replacement sampling from a
    # Gaussian population along the doubling schedule and check P(max Z > B).
    n_obs, batch, delta = 3200, 50, 0.1
    looks = doubling_schedule(n_obs, batch)[:-1]
    b = normal_threshold(looks, n_obs, delta)
    assert stats.norm.isf(delta) < b < union_threshold(len(looks), delta)
    rng = np.random.default_rng(13)
    pop = rng.normal(size=n_obs)
    pop = (pop - pop.mean()) / pop.std()
    reps = 4000
    perm = rng.permuted(np.tile(pop, (reps, 1)), axis=1)
    csum = np.cumsum(perm, axis=1)[:, looks - 1]
    sd = np.sqrt((n_obs - looks) / (n_obs - 1) / looks)
    crossed = ((csum / looks) / sd > b).any(axis=1).mean()
    assert abs(crossed - delta) < 4 * np.sqrt(delta * (1 - delta) / reps), crossed


def test_random_blocks_read_whole_blocks_uniformly_without_replacement():
    from pymc_subsample.racing import RandomBlocks

    rng = np.random.default_rng(15)
    n, b, reps = 100, 16, 3000  # 7 blocks, the last of 4 positions
    counts = np.zeros(7)
    for _ in range(reps):
        s = RandomBlocks(n, rng, block=b)
        counts[s.take(1)[0] // b] += 1  # the first block drawn
        second = s.take(20)
        assert len(second) >= 20  # whole blocks: at least k
        assert len(np.unique(second)) == len(second)
        for start in second[second % b == 0]:  # every block is read whole
            assert np.isin(np.arange(start, min(start + b, n)), second).all()
    # the blocks are drawn uniformly (rows are then uniform over the permutation)
    assert stats.chisquare(counts).pvalue > 1e-3
    s = RandomBlocks(n, rng, block=b)
    parts = [s.take(m) for m in (5, 30, 40)]
    parts.append(s.take(n - s.n_drawn))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert s.n_drawn == n


@pytest.mark.parametrize("reuse", [False, True])
def test_index_stream_is_uniform_without_replacement(reuse):
    rng = np.random.default_rng(14)
    n, k, reps = 100, 30, 3000
    counts = np.zeros(n)
    for _ in range(reps):
        s = IndexStream(n, rng, reuse_stamps=reuse)
        first = s.take(10)
        second = s.take(k - 10)
        both = np.concatenate([first, second])
        assert len(np.unique(both)) == k
        counts[both] += 1
    assert stats.chisquare(counts).pvalue > 1e-3
    s = IndexStream(1000, rng, reuse_stamps=reuse)
    parts = [s.take(m) for m in (7, 100, 300, 593)]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    assert s.n_drawn == 1000
    with pytest.raises(ValueError, match="remain"):
        s.take(1)


def test_large_population_small_batch_does_not_permute_everything():
    s = IndexStream(10**9, np.random.default_rng(0))
    idx = s.take(100)
    assert len(np.unique(idx)) == 100 and idx.max() < 10**9
    assert s._rest is None  # no list of all indices was built


def test_doubling_schedule():
    assert doubling_schedule(1000, 50).tolist() == [50, 100, 200, 400, 800, 1000]
    assert doubling_schedule(30, 50).tolist() == [30]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"batch_size": 1}, "batch_size"),
        ({"bound": "hoeffding"}, "bound"),
        ({"variance": "joint"}, "variance"),
        ({"reward_range": -1.0}, "reward_range"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    table = np.zeros((2, 10))
    with pytest.raises(ValueError, match=match):
        race(table_rewards(table), 2, 10, **kwargs)


def test_bad_sizes_and_callbacks_raise():
    table = np.zeros((2, 10))
    with pytest.raises(ValueError, match="n_arms"):
        race(table_rewards(table), 0, 10)
    with pytest.raises(ValueError, match="n_obs"):
        race(table_rewards(table), 2, 0)
    with pytest.raises(ValueError, match="shape"):
        race(lambda a, i: np.zeros(len(i)), 2, 10)
    with pytest.raises(ValueError, match="NaN"):
        race(lambda a, i: np.full((len(a), len(i)), np.nan), 2, 10)
    with pytest.raises(ValueError, match=r"\+inf"):
        race(lambda a, i: np.full((len(a), len(i)), np.inf), 2, 10)
    with pytest.raises(ValueError, match="log_f0"):
        sample_categorical(np.array([0.0, np.nan]), table_rewards(table), 10)
    with pytest.raises(ValueError, match="delta"):
        sample_categorical(np.zeros(2), table_rewards(table), 10, delta=2)


def test_random_positions_and_skip_taken():
    from pymc_subsample.racing.schedule import random_positions, skip_taken

    rng = np.random.default_rng(15)
    for n, k in [(10, 3), (10, 9), (1000, 999), (50, 25), (7, 7)]:
        counts = np.zeros(n)
        for _ in range(400):
            pos = random_positions(n, k, rng)
            assert len(pos) == k and len(np.unique(pos)) == k and pos.min() >= 0 and pos.max() < n
            counts[pos] += 1
        if k < n:
            assert stats.chisquare(counts).pvalue > 1e-4
    taken = np.array([0, 3, 4, 9])
    free = np.setdiff1d(np.arange(12), taken)
    assert np.array_equal(skip_taken(np.arange(len(free)), taken), free)


def test_independent_populations_minus_inf_and_rescue():
    pops = [np.zeros(100), np.full(300, 0.01), np.full(200, 0.02)]
    pops[2][::2] = -np.inf  # highest mean, but impossible

    def rewards(arms, idx):
        return pops[int(arms[0])][idx][None, :]

    for seed in range(10):
        res = race(rewards, 3, np.array([100, 300, 200]), variance="marginal", rng=seed)
        assert res.winner == 1
    pops_all = [np.full(50, -np.inf), np.full(60, -np.inf)]
    with pytest.raises(ValueError, match="-inf"):
        race(
            lambda a, i: pops_all[int(a[0])][i][None, :], 2, np.array([50, 60]), variance="marginal"
        )


# -- the core as explicit state ------------------------------------------------------


def test_independent_populations_count_the_draws_of_impossible_arms():
    # arm 1 is read in full (two rewards, one -inf); n_drawn and exhausted count it
    pops = [np.zeros(10), np.array([-np.inf, 0.0])]
    res = race_independent(lambda arm, idx: pops[arm][idx], [10, 2], batch_size=5, rng=0)
    assert res.winner == 0 and res.means[1] == -np.inf
    assert res.n_drawn == 5 and res.exhausted


def test_shared_race_update_is_pure_and_matches_the_driver():
    from pymc_subsample.racing import RaceConfig, SharedRace, race_shared

    table, _ = bandit_population("normal", 5, 4000, 2e-3, rng=21)
    config = RaceConfig(batches="windows")
    kernel = SharedRace(config, 5, 4000)
    state = kernel.init()
    before = [a.copy() for a in (state.mean, state.m2, state.means)]
    looks = kernel.looks
    start = int(np.random.default_rng(5).integers(4000))
    new = kernel.update(state, np.ascontiguousarray(np.roll(table, -start, axis=1)[:, : looks[0]]))
    for a, b in zip(before, (state.mean, state.m2, state.means), strict=True):
        assert np.array_equal(a, b, equal_nan=True)  # the input state is untouched
    assert new.n_drawn == looks[0] and new.n_rounds == 1 and new.n_evaluations == 5 * looks[0]
    np.testing.assert_allclose(new.mean, np.roll(table, -start, axis=1)[:, : looks[0]].mean(1))
    res = race_shared(
        lambda arms, idx: table[arms][:, idx], 5, 4000, config, rng=np.random.default_rng(5)
    )
    assert np.isfinite(res.means[res.winner]) and res.winner in range(5)


@pytest.mark.parametrize("bound", ["normal", "ebs", "lilucb", "exact"])
def test_every_race_returns_means(bound):
    table, log_p = bandit_population("uniform", 4, 800, 1e-4, rng=22)
    res = race(table_rewards(table), 4, 800, bound=bound, rng=0, reward_range=1e-3)
    assert res.means.shape == (4,)
    assert res.means[res.winner] == np.nanmax(res.means)
    if bound == "exact":
        np.testing.assert_allclose(res.means * 800, log_p)


def test_hooks_an_algorithm_cannot_honour_raise():
    table, _ = bandit_population("normal", 3, 500, 1e-3, rng=23)
    with pytest.raises(ValueError, match="cannot honour"):
        race(table_rewards(table), 3, 500, bound="lilucb", schedule=[50, 100])
    with pytest.raises(ValueError, match="cannot honour"):
        race(table_rewards(table), 3, 500, bound="lilucb", exact_after=100)


def test_cyclic_windows_are_uniform_and_nested():
    from pymc_subsample.racing import CyclicWindows

    n, reps = 40, 4000
    rng = np.random.default_rng(24)
    counts = np.zeros(n)
    for _ in range(reps):
        perm = rng.permutation(n)  # the population stored in a random order
        w = CyclicWindows(n, int(rng.integers(n)))
        pos = [np.arange(n)[w.take(k)] for k in (5, 5, 10)]
        rows = perm[np.concatenate(pos)]
        assert len(np.unique(rows)) == 20 and w.n_drawn == 20
        counts[rows[:10]] += 1
    assert stats.chisquare(counts).pvalue > 1e-3
    w = CyclicWindows(10, 8)
    assert w.take(2) == slice(8, 10)
    assert w.take(3) == slice(0, 3)
    w = CyclicWindows(10, 7)
    assert w.take(5).tolist() == [7, 8, 9, 0, 1]
    with pytest.raises(ValueError, match="remain"):
        w.take(6)


def test_exact_switch_truncates_and_decides_exactly():
    from pymc_subsample.racing import ExactSwitch

    looks = doubling_schedule(1000, 50)
    assert ExactSwitch.after_size(200).truncate(looks, 1000).tolist() == [50, 100, 200, 1000]
    assert ExactSwitch.at_once().truncate(looks, 1000).tolist() == [1000]
    assert ExactSwitch.never().truncate(looks, 1000).tolist() == looks.tolist()
    with pytest.raises(ValueError, match="size"):
        ExactSwitch.after_size(-1)
    # a diffuse population: the race gives up early and the exact pass decides right
    table, log_p = bandit_population("normal", 6, 20_000, 1.0, rng=25)
    rewards = table_rewards(table)
    totals = lambda arms: table[arms].sum(axis=1)  # noqa: E731
    rounds = []
    for seed in range(10):
        noise = np.random.default_rng(seed).gumbel(size=6)
        x, res = sample_categorical(
            np.zeros(6), rewards, 20_000, noise=noise, exact_after=5000, totals=totals, rng=seed
        )
        assert x == int(np.argmax(log_p + noise))
        assert res.exhausted
        rounds.append(res.n_rounds)
    # some give up before the switch (a race that does not: 7 looks, then the pass); with
    # GIVE_UP_MARGIN = 1.5 standard errors 3 of these 10 do (5 or more with one), and a
    # race that could not give up would have 8 rounds every time
    assert sum(r < 8 for r in rounds) >= 2, rounds


def test_mh_test_agrees_with_exact_mh_and_rejects_impossible_proposals():
    from pymc_subsample.racing import RaceConfig, mh_test

    rng = np.random.default_rng(26)
    n_obs = 5000
    diffs = rng.normal(2e-4, 0.01, size=n_obs)
    table = np.stack([np.zeros(n_obs), diffs])
    config = RaceConfig(delta=0.01)
    wrong = 0
    for _ in range(200):
        log_u = float(np.log(rng.random()))
        d = mh_test(lambda a, i: table[a][:, i], n_obs, 0.0, log_u, config, rng=rng)
        exact = log_u < diffs.sum()
        wrong += d.accepted != exact
        assert d.race.means.shape == (2,)
    assert not too_many_errors(wrong, 200, 0.01)
    d = mh_test(lambda a, i: table[a][:, i], n_obs, -np.inf, -0.1, config, rng=rng)
    assert not d.accepted and d.race.n_evaluations == 0 and d.accept_probability == 0.0
    d = mh_test(lambda a, i: table[a][:, i], n_obs, 0.0, -0.1, None, rng=rng)
    np.testing.assert_allclose(d.log_alpha, diffs.sum())


def test_mh_test_accepts_surely_when_the_current_point_is_impossible():
    # a -inf term at the current point: log alpha is +inf, not NaN
    from pymc_subsample.racing import RaceConfig, mh_test

    table = np.zeros((2, 60))
    table[0, ::2] = -np.inf
    for config in [None, RaceConfig(batch_size=10)]:
        dec = mh_test(table_rewards(table), 60, 0.0, -0.1, config, rng=np.random.default_rng(0))
        assert dec.accepted
        assert dec.log_alpha == np.inf and dec.accept_probability == 1.0


def test_residual_callbacks_keep_the_argmax_and_shrink_the_variance():
    from pymc_subsample.racing import residual_callbacks

    rng = np.random.default_rng(27)
    x = rng.normal(size=3000)
    table = np.stack([-0.5 * (x - m) ** 2 for m in (0.0, 0.01, 0.02)])
    proxy = np.stack([-0.5 * x**2 + m * x for m in (0.0, 0.01, 0.02)])  # drops -m^2/2
    res = residual_callbacks(
        table_rewards(table),
        lambda arms: table[arms].sum(axis=1),
        lambda arms, idx: proxy[arms][:, idx],
        proxy.sum(axis=1),
    )
    idx = np.arange(3000)
    resid = res.rewards(np.arange(3), idx)
    np.testing.assert_allclose(resid + proxy, table)
    np.testing.assert_allclose(res.totals(np.arange(3)) + res.shift, table.sum(axis=1))
    assert resid.var(axis=1).max() < 1e-12 < table.var(axis=1).min()


@pytest.mark.parametrize("shuffle_every", [1, 200])
def test_reused_permutations_keep_the_error_rate_within_delta(shuffle_every):
    trials = 400
    table, log_p = bandit_population("normal", 10, 2000, 2e-3, rng=28)
    errors, _ = gumbel_race_errors(
        table, log_p, trials, np.random.default_rng(29), shuffle_every=shuffle_every
    )
    assert not too_many_errors(errors, trials, 0.05), errors


@pytest.mark.parametrize("batch_size", [None, "50", 1, 2.5, float("nan"), True])
def test_bad_batch_size_is_a_clear_error(batch_size):
    from pymc_subsample.racing.common import validate_race_args

    with pytest.raises(ValueError, match="batch_size must be an integer >= 2"):
        validate_race_args(0.05, "normal", batch_size, "pairwise", 2)

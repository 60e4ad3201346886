"""Property-based tests of the racing core: accounting, exactness, determinism, -inf handling.

Hypothesis generates reward populations (ties, copies of other arms, constant
arms, heavy tails, scattered -inf entries, arms of unequal sizes), schedules,
error probabilities in (0, 1) and the races' settings. A recording callback
keeps every reward the race asked for, so the invariants are checked against
what was actually drawn, not against a second implementation of the race:

* the race evaluates exactly the rewards it reports, without replacement,
  within the documented budget;
* the statistics of :class:`~pymc_subsample.racing.RaceResult` (``means``,
  ``n_drawn``, ``exhausted``, ``n_rounds``) match the rewards drawn;
* the winner survived the race and has a finite mean; no NaN escapes;
* ``bound="exact"`` returns the Gumbel-max argmax;
* the same seed gives the same result.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymc_subsample.racing import (
    ExactSwitch,
    RaceConfig,
    mh_test,
    race,
    race_exact,
    race_independent,
    sample_categorical,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: The same properties on many more examples, for ``make test-all``.
DEEP = settings(SETTINGS, max_examples=1000)


def prop(*strategies):
    """Turn ``check`` into a test on SETTINGS; its ``deep`` twin runs DEEP, marked slow."""

    def wrap(check):
        test = SETTINGS(given(*strategies)(check))
        test.deep = pytest.mark.slow(DEEP(given(*strategies)(check)))
        return test

    return wrap


ROW_KINDS = ("normal", "coarse", "lognormal", "constant", "copy")


# ---------------------------------------------------------------- strategies


@st.composite
def rows(draw, sizes, neg_inf=True):
    """One reward population per arm, of the given sizes (a list of 1-D arrays)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = []
    for i, n in enumerate(sizes):
        kind = draw(st.sampled_from(ROW_KINDS))
        loc = draw(st.sampled_from([0.0, 0.0, 1e-3, -0.5, 1.0]))
        scale = draw(st.sampled_from([1e-3, 0.1, 1.0, 10.0]))
        same = [j for j in range(i) if len(out[j]) == n]
        if kind == "copy" and same:  # a tie with an earlier arm, observation by observation
            row = out[draw(st.sampled_from(same))].copy()
        elif kind == "coarse":  # many tied values
            row = loc + scale * rng.integers(-2, 3, size=n).astype(float)
        elif kind == "lognormal":  # skewed, heavy right tail
            row = loc + scale * rng.lognormal(0.0, 2.0, size=n)
        elif kind == "constant":
            row = np.full(n, loc)
        else:
            row = loc + scale * rng.normal(size=n)
        n_inf = draw(st.sampled_from([0, 0, 0, 0, 1, 3])) if neg_inf else 0
        if n_inf:
            row = row.copy()
            row[rng.choice(n, size=min(n_inf, n), replace=False)] = -np.inf
        out.append(row)
    return out


def deltas():
    return st.floats(min_value=1e-6, max_value=0.99, allow_nan=False, exclude_min=True)


@st.composite
def schedules(draw, n_obs):
    """None (doubling), or increasing cumulative sizes starting at >= 2 (may pass ``n_obs``)."""
    if n_obs < 3 or draw(st.booleans()):
        return None
    looks = draw(st.lists(st.integers(2, n_obs + 5), min_size=1, max_size=6, unique=True))
    return tuple(sorted(looks))


def offsets_for(draw, n_arms):
    kind = draw(st.sampled_from(["none", "zeros", "random"]))
    if kind == "none":
        return None
    if kind == "zeros":
        return np.zeros(n_arms)
    vals = st.sampled_from([0.0, -1e-3, 1e-3, 0.5, -2.0])
    return np.array(draw(st.lists(vals, min_size=n_arms, max_size=n_arms)))


# ---------------------------------------------------------------- recording callbacks


class Recorder:
    """Reward callbacks that serve a table and remember every reward handed out."""

    def __init__(self, pops):
        self.pops = [np.asarray(p, dtype=float) for p in pops]
        self.calls = []  # (arms, idx) per call; ``totals`` calls have idx None
        self.seen = [[] for _ in self.pops]  # indices handed out, per arm
        self.count = 0

    @property
    def table(self):
        return np.stack(self.pops)

    def shared(self, arms, idx):
        arms = np.asarray(arms)
        n_obs = len(self.pops[int(arms[0])])
        assert all(len(self.pops[a]) == n_obs for a in arms.tolist())
        idx = np.arange(n_obs)[idx]  # an index array, or a slice in "windows" mode
        assert idx.dtype.kind == "i" and ((idx >= 0) & (idx < n_obs)).all()
        self.calls.append((arms.copy(), idx.copy()))
        for a in arms.tolist():
            self.seen[a].append(idx)
        self.count += len(arms) * len(idx)
        return np.stack([self.pops[a][idx] for a in arms.tolist()]).reshape(len(arms), len(idx))

    def totals(self, arms):
        arms = np.asarray(arms)
        n_obs = len(self.pops[0])
        self.calls.append((arms.copy(), None))
        for a in arms.tolist():
            self.seen[a].append(np.arange(n_obs))
        self.count += len(arms) * n_obs
        return np.array([self.pops[a].sum() for a in arms.tolist()])

    def arm(self, arm, idx):
        idx = np.asarray(idx)
        n_i = len(self.pops[arm])
        assert idx.dtype.kind == "i" and ((idx >= 0) & (idx < n_i)).all()
        self.calls.append((np.array([arm]), idx.copy()))
        self.seen[arm].append(idx)
        self.count += len(idx)
        return self.pops[arm][idx]

    def indices(self, i):
        return np.concatenate(self.seen[i]) if self.seen[i] else np.zeros(0, dtype=np.int64)

    def drawn(self, i):
        """Distinct observations of arm ``i`` handed out."""
        return np.unique(self.indices(i))


def check_means_match_draws(res, rec, offsets):
    """``means`` is the mean of the rewards drawn plus the offset, or -inf after a -inf."""
    offsets = np.zeros(len(rec.pops)) if offsets is None else offsets
    assert not np.isnan(res.means).any()  # every arm is evaluated at the first look
    assert not np.isposinf(res.means).any()
    for i, pop in enumerate(rec.pops):
        vals = pop[rec.drawn(i)]
        if len(vals) == 0:  # never evaluated: a lone arm wins without a look
            assert res.means[i] == offsets[i]
        elif np.isneginf(vals).any():
            assert res.means[i] == -np.inf, (i, res.means)
        else:
            expected = vals.mean() + offsets[i]
            tol = 1e-9 * (1.0 + np.abs(vals).max() + abs(offsets[i]))
            assert abs(res.means[i] - expected) <= tol, (i, res.means[i], expected)


def check_common(res, rec, n_arms):
    """Invariants shared by every race."""
    assert 0 <= res.winner < n_arms
    assert np.isfinite(res.means[res.winner])  # the winner never has a -inf reward drawn
    assert res.n_evaluations == rec.count  # exactly the rewards asked for
    drawn = [len(rec.drawn(i)) for i in range(n_arms)]
    sizes = [len(p) for p in rec.pops]
    assert res.n_drawn == max(drawn)
    assert res.exhausted == any(d == n for d, n in zip(drawn, sizes, strict=True))
    assert res.n_rounds >= min(len(rec.calls), 1)


def all_arms_impossible(pops):
    return all(np.isneginf(p).any() for p in pops)


# ---------------------------------------------------------------- shared-index races


@st.composite
def shared_cases(draw):
    n_arms = draw(st.integers(1, 5))
    n_obs = draw(st.integers(1, 150))
    pops = draw(rows([n_obs] * n_arms))
    bound = draw(st.sampled_from(["normal", "ebs", "lilucb"]))
    kw = {
        "delta": draw(deltas()),
        "bound": bound,
        "batch_size": draw(st.integers(2, 40)),
        "variance": draw(st.sampled_from(["pairwise", "marginal"])),
        "reward_range": draw(st.sampled_from([None, None, 0.0, 1.0, 50.0])),
        "offsets": offsets_for(draw, n_arms),
        "rng": draw(st.integers(0, 2**32 - 1)),
    }
    if bound != "lilucb":
        kw["schedule"] = draw(schedules(n_obs))
        kw["exact_after"] = draw(st.sampled_from([None, None, 0, 2, 10, 60]))
        kw["skew_guard"] = draw(st.booleans())
    use_totals = bound != "lilucb" and draw(st.booleans())
    layout = draw(st.sampled_from([None, "windows", "blocks"])) if bound != "lilucb" else None
    return pops, kw, use_totals, layout


def run_shared(pops, kw, use_totals, layout):
    rec = Recorder(pops)
    kw = dict(kw)
    totals = rec.totals if use_totals else None
    if layout:  # the same settings as a config, reading cyclic windows or random blocks
        exact_after = kw.pop("exact_after")
        config = RaceConfig(
            delta=kw.pop("delta"), bound=kw.pop("bound"), variance=kw.pop("variance"),
            batch_size=kw.pop("batch_size"), reward_range=kw.pop("reward_range"),
            schedule=kw.pop("schedule"), skew_guard=kw.pop("skew_guard"), batches=layout,
            exact=ExactSwitch(exact_after),
        )  # fmt: skip
        kw["config"] = config
    res = race(rec.shared, len(pops), len(pops[0]), totals=totals, **kw)
    return res, rec


@prop(shared_cases())
def test_shared_races_account_for_every_reward(case):
    pops, kw, use_totals, windows = case
    n_arms, n_obs = len(pops), len(pops[0])
    try:
        res, rec = run_shared(pops, kw, use_totals, windows)
    except ValueError as err:  # documented: every arm has a -inf reward
        assert "-inf" in str(err) and all_arms_impossible(pops)
        return
    check_common(res, rec, n_arms)
    check_means_match_draws(res, rec, kw["offsets"])
    # budget: sum(N_i) unless an exact pass re-reads drawn observations, never twice that
    assert res.n_evaluations <= 2 * n_arms * n_obs
    reread = any(len(np.unique(rec.indices(i))) < len(rec.indices(i)) for i in range(n_arms))
    if not reread:
        assert res.n_evaluations <= n_arms * n_obs
    if n_arms == 1 and kw["bound"] != "lilucb":
        assert res.winner == 0 and not rec.calls
        return
    if kw["bound"] == "lilucb":
        assert not reread  # each arm draws its own indices without replacement
        assert res.n_rounds == len(rec.calls) - n_arms + 1
        return
    # shared races: one call per look, on the survivors, who shrink
    assert res.n_rounds == len(rec.calls)
    arms_sets = [set(a.tolist()) for a, _ in rec.calls]
    last = arms_sets[-1]
    assert res.winner in last  # the winner is among the arms of the last look
    rescued = len(arms_sets) > 1 and not last <= arms_sets[-2]
    if not rescued:  # the survivors only shrink; the winner survived every look
        assert all(b <= a for a, b in zip(arms_sets, arms_sets[1:], strict=False))
        assert all(res.winner in s for s in arms_sets)
    if res.exhausted:  # decided on exact means: the largest wins, lowest index on ties
        best = max(res.means[a] for a in last)
        assert res.means[res.winner] == best
        assert res.winner == min(a for a in last if res.means[a] == best)
    offsets = np.zeros(n_arms) if kw["offsets"] is None else kw["offsets"]
    for j in range(n_arms):  # an exact copy of an earlier arm never wins
        for i in range(j):
            if np.array_equal(pops[i], pops[j]) and offsets[i] == offsets[j]:
                assert res.winner != j


test_shared_races_account_for_every_reward_deep = test_shared_races_account_for_every_reward.deep


@prop(shared_cases())
def test_shared_races_are_deterministic_given_the_seed(case):
    pops, kw, use_totals, windows = case
    outcomes = []
    for _ in range(2):
        try:
            res, rec = run_shared(pops, kw, use_totals, windows)
        except ValueError as err:
            outcomes.append(str(err))
            continue
        calls = [(a.tolist(), None if i is None else i.tolist()) for a, i in rec.calls]
        outcomes.append((res.winner, res.n_evaluations, res.n_rounds, res.n_drawn,
                         res.exhausted, res.means.tobytes(), calls))  # fmt: skip
    assert outcomes[0] == outcomes[1]


test_shared_races_are_deterministic_given_the_seed_deep = (
    test_shared_races_are_deterministic_given_the_seed.deep
)


# ---------------------------------------------------------------- independent populations


@st.composite
def independent_cases(draw):
    sizes = draw(st.lists(st.integers(1, 120), min_size=1, max_size=5))
    pops = draw(rows(sizes))
    sched = None
    if draw(st.booleans()):
        sched = []
        for n in sizes:
            looks = draw(st.lists(st.integers(1, n), max_size=4, unique=True))
            sched.append(sorted(looks))
    kw = {
        "delta": draw(deltas()),
        "bound": draw(st.sampled_from(["normal", "ebs", "exact"])),
        "schedules": sched,
        "batch_size": draw(st.integers(2, 40)),
        "reward_range": draw(st.sampled_from([None, None, 0.0, 1.0, 50.0])),
        "offsets": offsets_for(draw, len(sizes)),
        "quantile": draw(st.sampled_from(["t", "normal"])),
        "rng": draw(st.integers(0, 2**32 - 1)),
    }
    return pops, kw


@prop(independent_cases())
def test_independent_races_account_for_every_reward(case):
    pops, kw = case
    n_arms = len(pops)
    sizes = np.array([len(p) for p in pops])
    rec = Recorder(pops)
    try:
        res = race_independent(rec.arm, sizes, **kw)
    except ValueError as err:
        assert "-inf" in str(err) and all_arms_impossible(pops)
        return
    check_common(res, rec, n_arms)
    check_means_match_draws(res, rec, kw["offsets"])
    for i in range(n_arms):  # each arm draws its own indices without replacement
        assert len(np.unique(rec.indices(i))) == len(rec.indices(i))
    assert res.n_evaluations <= sizes.sum()
    if kw["bound"] == "exact":  # the largest total wins
        assert res.exhausted and res.n_evaluations == sizes.sum()
        offsets = np.zeros(n_arms) if kw["offsets"] is None else kw["offsets"]
        totals = np.array([p.sum() for p in pops]) + sizes * offsets
        best = totals.max()
        assert totals[res.winner] >= best - 1e-9 * (1 + np.abs(totals[np.isfinite(totals)]).max())
    # same seed, same result
    rec2 = Recorder(pops)
    res2 = race_independent(rec2.arm, sizes, **kw)
    assert (res2.winner, res2.n_evaluations, res2.n_rounds) == (
        res.winner, res.n_evaluations, res.n_rounds,
    )  # fmt: skip
    np.testing.assert_array_equal(res2.means, res.means)


test_independent_races_account_for_every_reward_deep = (
    test_independent_races_account_for_every_reward.deep
)


# ---------------------------------------------------------------- Gumbel-max sampling


@st.composite
def categorical_cases(draw):
    n_arms = draw(st.integers(1, 5))
    if draw(st.booleans()):
        n_obs = draw(st.integers(1, 80))
        sizes = [n_obs] * n_arms
    else:
        sizes = draw(st.lists(st.integers(1, 80), min_size=n_arms, max_size=n_arms))
        n_obs = sizes
    pops = draw(rows(sizes))
    log_f0 = np.array(
        draw(
            st.lists(
                st.sampled_from([0.0, 0.0, -1.0, 2.0, -np.inf]), min_size=n_arms, max_size=n_arms
            )
        )
    )
    seed = draw(st.integers(0, 2**32 - 1))
    given_noise = draw(st.booleans())
    return pops, n_obs, log_f0, seed, given_noise


def gumbel_scores(pops, log_f0, noise):
    """log f0 + noise + sum of the rewards: the Gumbel-max objective, -inf where impossible."""
    sums = np.array([p.sum() for p in pops])
    with np.errstate(invalid="ignore"):
        score = log_f0 + noise + sums
    return np.where(np.isneginf(log_f0) | np.isneginf(sums), -np.inf, score)


@prop(categorical_cases(), deltas())
def test_exact_sampling_returns_the_gumbel_argmax(case, delta):
    pops, n_obs, log_f0, seed, given_noise = case
    n_arms = len(pops)
    rec = Recorder(pops)
    rewards = rec.shared
    # the noise: passed in, or the first draw of the generator built from the seed
    noise = np.random.default_rng(seed).gumbel(size=n_arms)
    score = gumbel_scores(pops, log_f0, noise)
    try:
        x, res = sample_categorical(
            log_f0, rewards, n_obs, delta=delta, bound="exact", rng=seed,
            noise=noise if given_noise else None,
            variance="marginal" if np.ndim(n_obs) else "pairwise",  # required for N_i
        )  # fmt: skip
    except ValueError as err:
        assert "-inf" in str(err) and not np.isfinite(score).any()
        return
    assert np.isfinite(score).any()
    tol = 1e-9 * (1.0 + np.abs(score[np.isfinite(score)]).max())
    assert score[x] >= score.max() - tol
    if (score >= score.max() - tol).sum() == 1:
        assert x == int(np.argmax(score))
    assert res.winner == x and res.exhausted
    assert np.isneginf(res.means[np.isneginf(log_f0)]).all()
    assert not np.isnan(res.means).any()
    # arms with log f0 = -inf cost nothing; the others are read in full
    feasible = np.isfinite(log_f0)
    sizes = np.broadcast_to(np.asarray(n_obs), (n_arms,))
    assert res.n_evaluations == rec.count == sizes[feasible].sum()
    assert all(not rec.seen[i] for i in np.flatnonzero(~feasible))


test_exact_sampling_returns_the_gumbel_argmax_deep = (
    test_exact_sampling_returns_the_gumbel_argmax.deep
)


@prop(categorical_cases(), deltas(), st.sampled_from(["normal", "ebs"]))
def test_sampling_is_deterministic_and_skips_impossible_arms(case, delta, bound):
    pops, n_obs, log_f0, seed, _ = case
    kw = {"variance": "marginal"} if np.ndim(n_obs) == 1 else {}
    outcomes = []
    for _ in range(2):
        rec = Recorder(pops)
        try:
            x, res = sample_categorical(
                log_f0, rec.shared, n_obs, delta=delta, bound=bound, rng=seed, **kw
            )
        except ValueError as err:
            assert "-inf" in str(err)
            outcomes.append(str(err))
            continue
        assert res.winner == x and np.isfinite(log_f0[x]) and np.isfinite(res.means[x])
        assert not np.isnan(res.means).any()
        assert all(not rec.seen[i] for i in np.flatnonzero(np.isneginf(log_f0)))
        assert res.n_evaluations == rec.count
        outcomes.append((x, res.n_evaluations, res.n_rounds, res.means.tobytes()))
    assert outcomes[0] == outcomes[1]


test_sampling_is_deterministic_and_skips_impossible_arms_deep = (
    test_sampling_is_deterministic_and_skips_impossible_arms.deep
)


# ---------------------------------------------------------------- the MH test


@prop(
    rows([60, 60]),
    st.floats(-5.0, 5.0),
    st.floats(1e-9, 1.0),
    st.sampled_from([None, "normal", "ebs"]),
    deltas(),
    st.integers(0, 2**32 - 1),
)
def test_mh_test_is_exact_mh_when_exhausted(pops, exact_part, u, bound, delta, seed):
    rec = Recorder(pops)
    config = None if bound is None else RaceConfig(delta=delta, bound=bound, batch_size=10)
    log_u = float(np.log(u))
    try:
        dec = mh_test(rec.shared, 60, exact_part, log_u, config, rng=np.random.default_rng(seed))
    except ValueError as err:
        assert "-inf" in str(err) and all_arms_impossible(pops)
        return
    assert dec.accepted == (dec.race.winner == 1)
    assert not np.isnan(dec.log_alpha)
    assert 0.0 <= dec.accept_probability <= 1.0
    assert dec.race.n_evaluations == rec.count <= 2 * 2 * 60
    if all_arms_impossible(pops):  # a lone survivor may win before its -inf is drawn
        return
    exact = race_exact(Recorder(pops).shared, 2, 60, np.array([log_u, exact_part]) / 60)
    if config is None or dec.race.exhausted:  # then the decision is exact MH's
        gap = exact.means[1] - exact.means[0]
        if not np.isfinite(gap) or abs(gap) > 1e-9 * (1 + np.abs(exact.means).max()):
            assert dec.accepted == (exact.winner == 1)
        if np.isfinite(exact.means).all():
            log_alpha = 60 * gap + log_u
            assert dec.log_alpha == pytest.approx(log_alpha, rel=1e-9, abs=1e-9)


test_mh_test_is_exact_mh_when_exhausted_deep = test_mh_test_is_exact_mh_when_exhausted.deep

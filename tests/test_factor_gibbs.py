"""PairwiseFactorGibbs: conditionals and chains against exact enumeration, audits, annealing."""

import itertools

import numpy as np
import pytest
from scipy import stats

from coreference.factor_gibbs import PairwiseFactorGibbs, geometric_temperatures


def matrix_factor(w):
    def log_factor(i, js):
        return w[i, js]

    return log_factor


def canonical(labels):
    seen = {}
    return tuple(seen.setdefault(int(c), len(seen)) for c in labels)


def set_partitions(n):
    """All set partitions of range(n) as canonical label tuples."""
    out = []
    for labels in itertools.product(range(n), repeat=n):
        if canonical(labels) == labels:
            out.append(labels)
    return out


def log_joint(labels, w, log_new):
    labels = np.asarray(labels)
    same = labels[:, None] == labels[None, :]
    iu = np.triu_indices(len(labels), 1)
    return w[iu][same[iu]].sum() + log_new * len(set(labels.tolist()))


def cluster_instance(seed=0, sizes=(1, 2, 5, 40, 300), totals=(0.4, -0.2, 0.3, 0.8, 0.5)):
    """Item 0 and clusters of the given sizes; factors with item 0 are noisy with
    cluster totals near `totals` (a non-degenerate conditional), others are 0."""
    rng = np.random.default_rng(seed)
    n = 1 + sum(sizes)
    w = np.zeros((n, n))
    labels = np.zeros(n, dtype=np.int64)
    start = 1
    for c, (size, total) in enumerate(zip(sizes, totals, strict=True)):
        mem = np.arange(start, start + size)
        x = rng.normal(0.0, 0.3, size)
        w[0, mem] = w[mem, 0] = x - x.mean() + total / size
        labels[mem] = c + 1
        start += size
    expected = np.exp(np.append(totals, 0.0))  # candidates in label order, then new
    return w, labels, expected / expected.sum()


def test_conditional_matches_formula():
    w, labels, expected = cluster_instance()
    g = PairwiseFactorGibbs(matrix_factor(w), len(labels), labels=labels, method="exact")
    cands, probs = g.conditional(0)
    assert cands.tolist() == [1, 2, 3, 4, 5, -1]
    np.testing.assert_allclose(probs, expected)
    # at temperature 2 the logits halve
    _, p2 = g.conditional(0, temperature=2.0)
    q = np.sqrt(expected)
    np.testing.assert_allclose(p2, q / q.sum())
    assert g.counters.factor_evaluations == 0  # conditional() is not counted


def test_exact_draws_follow_conditional():
    w, labels, expected = cluster_instance(1)
    g = PairwiseFactorGibbs(matrix_factor(w), len(labels), labels=labels, method="exact", rng=2)
    trials = 4000
    counts = np.zeros(6)
    for _ in range(trials):
        k = g.draw(0)
        counts[k - 1 if k > 0 else 5] += 1
    assert stats.chisquare(counts, trials * expected).pvalue > 1e-3
    assert g.counters.factor_evaluations == trials * 348


def test_racing_draws_within_delta_and_audited_error():
    """Racing draws: TV to the exact conditional <= delta + Monte Carlo error;
    audited error rate <= delta (binomial test). The totals are within 1 of
    each other, so the race saves almost nothing here; with normal quantiles at
    the first look of 3 draws its audited error was 0.09 on this instance."""
    delta, trials = 0.05, 3000
    w, labels, expected = cluster_instance(2)
    g = PairwiseFactorGibbs(
        matrix_factor(w), len(labels), labels=labels, delta=delta, audit=1.0, rng=3
    )
    counts = np.zeros(6)
    for _ in range(trials):
        k = g.draw(0)
        counts[k - 1 if k > 0 else 5] += 1
    tv = 0.5 * np.abs(counts / trials - expected).sum()
    mc = 0.5 * 4 * np.sqrt(expected * (1 - expected) / trials).sum()
    assert tv <= delta + mc, (tv, counts / trials, expected)
    c = g.counters
    assert c.audits == c.races == trials
    assert stats.binom.sf(c.audit_errors - 1, trials, delta) > 1e-3, c
    assert c.factor_evaluations <= c.exact_evaluations


def test_racing_rejects_wrong_cluster_fast():
    """A clearly wrong big cluster is dropped after a few factors."""
    n = 1 + 500 + 500
    w = np.zeros((n, n))
    w[0, 1:501] = w[1:501, 0] = 1.0 + np.random.default_rng(0).normal(0, 0.1, 500)
    w[0, 501:] = w[501:, 0] = -1.0
    labels = np.r_[0, np.ones(500, int), np.full(500, 2)]
    g = PairwiseFactorGibbs(matrix_factor(w), n, labels=labels, rng=0)
    for _ in range(50):
        assert g.draw(0) == 1
    assert g.counters.factor_evaluations < 0.05 * g.counters.exact_evaluations


@pytest.mark.parametrize("method", ["exact", "racing"])
def test_chain_matches_enumerated_posterior(method):
    """Gibbs chain over all 52 partitions of 5 items vs the enumerated posterior."""
    n, log_new = 5, -0.5
    rng = np.random.default_rng(5)
    w = rng.normal(0.3, 1.0, (n, n))
    w = (w + w.T) / 2
    parts = set_partitions(n)
    logp = np.array([log_joint(p, w, log_new) for p in parts])
    p = np.exp(logp - logp.max())
    p /= p.sum()
    g = PairwiseFactorGibbs(matrix_factor(w), n, log_new=log_new, method=method, rng=6)
    index = {q: k for k, q in enumerate(parts)}
    counts = np.zeros(len(parts))
    sweeps = 12000 if method == "exact" else 4000
    for _ in range(sweeps):
        g.sweep()
        counts[index[canonical(g.labels)]] += 1
    tv = 0.5 * np.abs(counts / sweeps - p).sum()
    # measured Monte Carlo TV of exact chains: about 0.02 (12000 sweeps), 0.035 (4000)
    assert tv < (0.05 if method == "exact" else 0.08), tv


def test_annealing_reaches_map():
    """Annealed Gibbs then tau = 0 sweeps end at the enumerated MAP clustering."""
    n = 7
    rng = np.random.default_rng(7)
    truth = np.array([0, 0, 0, 1, 1, 2, 2])
    same = truth[:, None] == truth[None, :]
    w = np.where(same, 1.0, -1.0) + rng.normal(0, 0.6, (n, n))
    w = (w + w.T) / 2
    parts = set_partitions(n)
    best = parts[int(np.argmax([log_joint(p, w, 0.0) for p in parts]))]
    hits = 0
    for seed in range(5):
        g = PairwiseFactorGibbs(matrix_factor(w), n, rng=seed)
        g.run(np.r_[geometric_temperatures(30, 3.0, 0.05), np.zeros(3)])
        hits += canonical(g.labels) == best
    assert hits == 5


@pytest.mark.parametrize("method", ["exact", "racing"])
def test_blocks_are_respected(method):
    n = 12
    w = np.full((n, n), 2.0)  # everything wants to merge
    blocks = np.r_[np.zeros(6, int), np.ones(6, int)]
    g = PairwiseFactorGibbs(matrix_factor(w), n, blocks=blocks, method=method, rng=1)
    for _ in range(10):
        g.sweep()
        lab = g.labels
        assert not set(lab[:6]) & set(lab[6:])
    assert len(set(g.labels[:6])) == len(set(g.labels[6:])) == 1


def test_exact_respects_cannot_links():
    n = 12
    w = np.full((n, n), 2.0)
    w[0, 1] = w[1, 0] = -np.inf  # everything merges except 0 and 1
    g = PairwiseFactorGibbs(matrix_factor(w), n, method="exact", rng=1)
    for _ in range(20):
        g.sweep()
        assert g.labels[0] != g.labels[1]


def test_counters_and_sizes_are_consistent():
    w, labels, _ = cluster_instance(3)
    g = PairwiseFactorGibbs(matrix_factor(w), len(labels), labels=labels, rng=0)
    g.sweep()
    assert g.cluster_sizes().sum() == len(labels)
    assert g.counters.updates == len(labels)
    assert g.counters.factor_evaluations <= g.counters.exact_evaluations


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "mh"}, "unknown method"),
        ({"bound": "lilucb"}, "unknown bound"),
        ({"delta": 0.0}, "delta must lie"),
        ({"audit": 2.0}, "audit"),
        ({"blocks": [0, 1]}, "blocks must be"),
        ({"labels": [0, 0, 1, 1], "blocks": [0, 1, 1, 1]}, "different blocks"),
        ({"first": 1}, "first must be"),
        ({"log_new": np.inf}, "log_new"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PairwiseFactorGibbs(matrix_factor(np.zeros((4, 4))), 4, **kwargs)


def test_bad_factor_and_temperature():
    g = PairwiseFactorGibbs(lambda i, js: np.zeros(len(js) + 1), 4, labels=[0, 0, 1, 1])
    with pytest.raises(ValueError, match="one value per j"):
        g.update(0)
    g = PairwiseFactorGibbs(matrix_factor(np.zeros((4, 4))), 4)
    with pytest.raises(ValueError, match="temperature"):
        g.update(0, temperature=-1.0)

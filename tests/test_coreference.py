"""Coreference helpers (B3, data, theta) and the example's quick mode on a small slice."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from coreference.factor_gibbs import PairwiseFactorGibbs
from coreference.model import (
    FEATURE_NAMES,
    b_cubed,
    fit_pair_logistic,
    pair_log_odds,
    power_law_mentions,
    sample_block_pairs,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "author_coreference.py"


def b_cubed_bruteforce(pred, truth):
    pred, truth = np.asarray(pred), np.asarray(truth)
    p = r = 0.0
    for i in range(len(pred)):
        same_p = pred == pred[i]
        same_t = truth == truth[i]
        both = (same_p & same_t).sum()
        p += both / same_p.sum()
        r += both / same_t.sum()
    p, r = p / len(pred), r / len(pred)
    return p, r, 2 * p * r / (p + r)


def test_b_cubed_matches_definition():
    rng = np.random.default_rng(0)
    for _ in range(5):
        pred = rng.integers(0, 6, 40)
        truth = rng.integers(0, 4, 40)
        np.testing.assert_allclose(b_cubed(pred, truth), b_cubed_bruteforce(pred, truth))
    truth = np.array([0, 0, 1, 1, 1, 2])
    assert b_cubed(truth + 7, truth) == (1.0, 1.0, 1.0)
    p, r, _ = b_cubed(np.zeros(6, int), truth)
    assert r == 1.0 and p == pytest.approx((2 * 2 / 6 + 3 * 3 / 6 + 1 / 6) / 6)
    with pytest.raises(ValueError, match="same length"):
        b_cubed([0, 1], [0])


def test_power_law_mentions_sizes_and_blocks():
    m = power_law_mentions(3, 30, exponent=1.7, max_size=500, largest=400, rng=0)
    sizes = np.bincount(m.entity)
    first = [np.flatnonzero(m.block == b)[0] for b in range(3)]
    assert (sizes[m.entity[first]] == 400).all()
    assert sizes.max() <= 500 and sizes.min() >= 1
    assert np.median(sizes) <= 3  # heavy tail: most authors have few mentions
    # every author lives in one block; every block shares a last-name/initial key
    for e in range(len(sizes)):
        assert len(set(m.block[m.entity == e].tolist())) == 1
    assert len(m) == len(m.first) == len(m.topics) == len(m.year)
    again = power_law_mentions(3, 30, exponent=1.7, max_size=500, largest=400, rng=0)
    assert again.first == m.first
    with pytest.raises(ValueError, match="exponent"):
        power_law_mentions(exponent=1.0)


def test_block_pairs_are_within_blocks():
    block = np.array([0, 0, 0, 1, 2, 2, 2, 2])
    pairs = sample_block_pairs(block, 500, rng=1)
    assert (block[pairs[:, 0]] == block[pairs[:, 1]]).all()
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert 3 not in pairs  # alone in its block
    with pytest.raises(ValueError, match="no block"):
        sample_block_pairs([0, 1, 2], 5)


def test_logistic_fit_recovers_theta():
    rng = np.random.default_rng(2)
    n, theta = 20_000, np.array([-1.0, 2.0, -0.5])
    x = rng.normal(size=(n, 2))
    y = rng.random(n) < 1 / (1 + np.exp(-pair_log_odds(theta, x)))
    est = fit_pair_logistic(x, y, l2=0.0)
    # standard errors are about 0.03 at n = 20,000
    np.testing.assert_allclose(est, theta, atol=0.12)
    with pytest.raises(ValueError, match="both"):
        fit_pair_logistic(x, np.zeros(n, bool))


def test_pair_features_need_jellyfish_and_are_sane():
    pytest.importorskip("jellyfish")
    from coreference.model import mention_pair_features

    m = power_law_mentions(1, 5, max_size=20, largest=10, rng=3)
    f = mention_pair_features(m, 0, np.arange(len(m)))
    assert f.shape == (len(m), len(FEATURE_NAMES))
    assert f[0, 3] == 1.0 and f[0, 5] == 1.0 and f[0, 6] == 0.0  # with itself
    assert np.isfinite(f).all()


def synthetic_factor(seed=0, noise=0.3):
    """Numeric stand-in for string similarities (no optional dependency)."""
    m = power_law_mentions(2, 8, max_size=150, largest=120, rng=seed)
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=(m.entity.max() + 1, 8))
    x = centre[m.entity] + noise * rng.normal(size=(len(m), 8))

    def log_factor(i, js):
        return 3.0 - 0.5 * ((x[js] - x[i]) ** 2).sum(axis=1)

    return m, log_factor


def test_racing_f1_matches_exact_on_synthetic_slice():
    """Same final B3 F1 (within run-to-run spread) with fewer factors."""
    m, log_factor = synthetic_factor()
    f1 = {}
    evals = {}
    for method in ("exact", "racing"):
        scores = []
        for seed in range(3):
            g = PairwiseFactorGibbs(log_factor, len(m), blocks=m.block, method=method, rng=seed)
            g.run(np.ones(3))
            scores.append(b_cubed(g.labels, m.entity)[2])
        f1[method] = np.array(scores)
        evals[method] = g.counters.factor_evaluations
    assert f1["exact"].mean() > 0.9
    spread = max(f1["exact"].std(), f1["racing"].std(), 0.01)
    assert abs(f1["racing"].mean() - f1["exact"].mean()) < 3 * spread, f1
    assert evals["racing"] < 0.6 * evals["exact"]


def test_example_quick_mode_runs(tmp_path, monkeypatch):
    pytest.importorskip("jellyfish")
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("author_coreference", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "author_coreference", mod)
    spec.loader.exec_module(mod)
    prob = mod.synthetic_problem(quick=True)
    runs = {
        m: [mod.run_chain(prob, m, s, np.ones(2), 0.05, 0.3) for s in (1, 2)] for m in mod.METHODS
    }
    final = {m: np.mean([r["f1"][-1] for r in runs[m]]) for m in mod.METHODS}
    assert final["exact"] > 0.9
    assert abs(final["racing"] - final["exact"]) < 0.03, final
    audits = sum(r["audits"] for r in runs["racing"])
    assert audits > 100
    assert sum(r["audit_errors"] for r in runs["racing"]) <= 0.1 * audits
    evals = {m: np.mean([r["evals"][-1] for r in runs[m]]) for m in mod.METHODS}
    assert evals["racing"] < 0.6 * evals["exact"]
    # the table and figures are written from the recorded runs (--replot)
    raw = {"synthetic": {"note": prob.note, "runs": runs, "annealed": final}}
    (tmp_path / "coref_runs_quick.json").write_text(json.dumps(raw, default=float))
    monkeypatch.setattr(sys, "argv", ["x", "--quick", "--replot", "--out", str(tmp_path)])
    mod.main()
    assert (tmp_path / "coref_table_quick.md").exists()
    assert (tmp_path / "coref_synthetic_quick.png").exists()


def test_audited_error_rate_below_delta_on_coreference_sweeps():
    """Every racing draw of two sweeps audited against the exact draw with the same
    Gumbel noise: error rate <= delta (one-sided binomial test at level 1e-3).
    Noisy factors make the races close; measured: 0 errors in 587 audits, while
    Student-t thresholds shrunk 5-fold give 17 (the test then fails)."""
    from scipy import stats

    m, log_factor = synthetic_factor(1, noise=0.6)
    delta = 0.01
    g = PairwiseFactorGibbs(log_factor, len(m), blocks=m.block, delta=delta, audit=1.0, rng=4)
    g.run(np.ones(2))
    c = g.counters
    assert c.audits == c.races > 200
    assert stats.binom.sf(c.audit_errors - 1, c.audits, delta) > 1e-3, c

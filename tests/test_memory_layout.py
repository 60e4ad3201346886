"""The row permutation and its copies cost what the docs say: one copy of the data, no more.

``batches="blocks"`` and ``"windows"`` keep one row-permuted copy of each
per-observation input and no index array of length N (the permutation is kept
as the RNG state that drew it, and materialised as int32 only on request);
``"random"`` keeps neither. A shuffle rewrites the copies in place: it
allocates no N-sized array. The permuted rows are those of
``rng.permutation(N)``, the same for every input.
"""

import tracemalloc

import numpy as np
import pymc as pm
import pytest

from pymc_subsample.model.expansion import Expansion
from pymc_subsample.model.terms import ObservationTerms

N_OBS = 20_000


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N_OBS, 3))
    with pm.Model() as model:
        x_data = pm.Data("x_data", x)
        y_data = pm.Data("y_data", x @ np.array([0.5, -0.2, 0.1]) + rng.normal(size=N_OBS))
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal("y", x_data @ beta, 1.0, observed=y_data)
    return model


def _index_arrays(terms):
    """Integer arrays of length N held by the terms' attributes (directly or in a list/tuple)."""
    found = []
    for name, value in vars(terms).items():
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.size >= N_OBS:
                found.append((name, v.dtype))
    return found


def _large_arrays(terms):
    """Float arrays of N rows held by the terms' attributes, by identity."""
    out = {}
    for value in vars(terms).values():
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and len(v) >= N_OBS:
                out[id(v)] = v
    return out


@pytest.mark.parametrize("batches", ["blocks", "windows", "random"])
def test_no_index_array_of_length_n_is_kept(model, batches):
    beta = model["beta"]
    terms = ObservationTerms(model, [beta], batches=batches)
    terms.shuffle(np.random.default_rng(1))
    assert _index_arrays(terms) == []
    copies = terms.permuted_rows()
    assert len(copies) == (0 if batches == "random" else 2)
    data = [d.get_value(borrow=True) for d in terms.data]
    for c in copies:  # buffers of their own, not views of the data
        assert not any(np.may_share_memory(c, d) for d in data)


def test_permutation_is_int32_and_common_to_every_input(model):
    terms = ObservationTerms(model, [model["beta"]], batches="blocks")
    terms.shuffle(np.random.default_rng(3))
    perm = terms.permutation()
    assert perm.dtype == np.int32
    np.testing.assert_array_equal(perm, np.random.default_rng(3).permutation(N_OBS))
    assert terms.positions_to_rows(slice(10, 20)).dtype == np.int32
    for d, c in zip(terms.data, terms.permuted_rows(), strict=True):
        np.testing.assert_array_equal(c, d.get_value(borrow=True)[perm])


def test_shuffle_consumes_the_rng_as_a_permutation_does(model):
    terms = ObservationTerms(model, [model["beta"]], batches="windows")
    rng, ref = np.random.default_rng(4), np.random.default_rng(4)
    terms.shuffle(rng)
    ref.permutation(N_OBS)
    assert rng.random() == ref.random()


def test_random_positions_are_rows(model):
    terms = ObservationTerms(model, [model["beta"]], batches="random")
    np.testing.assert_array_equal(terms.positions_to_rows(slice(5, 9)), np.arange(5, 9))
    point = model.initial_point()
    cands = [np.zeros((2, 3))]
    np.testing.assert_allclose(
        terms.loglik_batch(cands, slice(5, 9), point),
        terms.loglik_full(cands, point)[:, 5:9],
    )
    assert _index_arrays(terms) == []


@pytest.mark.parametrize("batches", ["blocks", "windows"])
def test_shuffle_allocates_no_array_of_n_rows(model, batches):
    terms = ObservationTerms(model, [model["beta"]], batches=batches)
    terms.shuffle(np.random.default_rng(0))  # the copies get buffers of their own
    before = set(_large_arrays(terms))
    tracemalloc.start()
    try:
        terms.shuffle(np.random.default_rng(1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < N_OBS * 8 / 4, peak  # far below one int64 index of N or one data column
    assert set(_large_arrays(terms)) == before  # the same buffers, rewritten in place


def test_windows_and_gathers_read_the_permuted_rows_after_set_data(model):
    """After new data are taken up, the copies are rebuilt and read the new rows."""
    beta = model["beta"]
    terms = ObservationTerms(model, [beta], batches="blocks")
    terms.shuffle(np.random.default_rng(2))
    point = model.initial_point()
    cands = [np.array([[0.1, 0.2, 0.3], [0.0, -1.0, 1.0]])]
    full = terms.loglik_full(cands, point)
    pos = np.array([3, 7, 11, 19_999])
    np.testing.assert_allclose(
        terms.loglik_batch(cands, pos, point), full[:, terms.positions_to_rows(pos)]
    )
    np.testing.assert_allclose(
        terms.loglik_batch(cands, slice(100, 140), point),
        full[:, terms.positions_to_rows(slice(100, 140))],
    )


@pytest.mark.parametrize("batches", ["blocks", "random"])
def test_taylor_sums_in_chunks_are_the_whole_sums(model, batches, monkeypatch):
    """The exact Taylor sums, read in chunks of rows, are those of one pass over all rows."""
    import pymc_subsample.model.expansion as expansion_module

    terms = ObservationTerms(model, [model["beta"]], batches=batches)
    terms.shuffle(np.random.default_rng(0))
    expansion = Expansion(terms, "block", shapes=[(3,)])
    point = model.initial_point()
    ref = np.array([0.4, -0.1, 0.2])
    whole = expansion.sums(ref, point)
    monkeypatch.setattr(expansion_module, "TAYLOR_CHUNK_ROWS", 3001)
    chunked = expansion.sums(ref, point)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    beta = ref[None, :]
    x, y = (model[name].get_value() for name in ("x_data", "y_data"))
    resid = y - x @ beta[0]
    expected = -0.5 * (resid**2).sum() - 0.5 * len(y) * np.log(2 * np.pi)
    np.testing.assert_allclose(chunked[0], expected, rtol=1e-10)
    np.testing.assert_allclose(chunked[2], -x.T @ x, rtol=1e-10)


def test_row_locality_check_reads_a_random_subset_of_rows_above_the_cap(monkeypatch):
    """Above LOCALITY_ROWS rows the check runs on that many rows: it still finds a lag."""
    import pymc_subsample.model.row_locality as graph
    from pymc_subsample import ModelSplitError

    monkeypatch.setattr(graph, "LOCALITY_ROWS", 500)
    y = np.random.default_rng(0).normal(size=3000)
    with pm.Model() as model:
        data = pm.Data("y_data", y)
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, 1.0, observed=data)
    terms = ObservationTerms(model, [mu], batches="random")
    seen = []
    local = terms._rows_fn

    def recording(*args):
        seen.append(len(args[1]))
        return local(*args)

    terms._rows_fn = recording
    point = model.initial_point()
    terms._check_row_locality(point, "mu")
    assert seen and max(seen) == 500

    def lagged(cands, rows, *others):
        prev = np.concatenate([[0.0], rows[:-1]])
        return -0.5 * (rows[None, :] - cands[:, None] - 0.5 * prev[None, :]) ** 2

    terms._rows_fn = lagged
    with pytest.raises(ModelSplitError, match="not row-local"):
        terms._check_row_locality(point, "mu")

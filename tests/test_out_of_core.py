"""Out-of-core data (pymc_subsample.Data on zarr/Dask): same draws as in memory, refusals.

Every pass over all rows runs on a two-worker dask.distributed LocalCluster
(module-scoped). The draws of a zarr-backed model are compared with those of
the same model on pm.Data, with the same seeds and the same batch layout
("random": rows of the data, no permutation); the sums over all rows are
added in another order (by chunk), so the draws agree up to rounding.
"""

import os
import pickle
import threading
import warnings
import zlib
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

zarr = pytest.importorskip("zarr")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import pymc_subsample as pms  # noqa: E402
from pymc_subsample import ModelSplitError, OutOfCoreReadError  # noqa: E402
from pymc_subsample.model import out_of_core_passes  # noqa: E402
from pymc_subsample.model.out_of_core_copy import ChunkReader, deal_table  # noqa: E402
from pymc_subsample.model.out_of_core_passes import DataChangedError  # noqa: E402
from pymc_subsample.options import RaceOptions  # noqa: E402

SAMPLE = {"chains": 1, "cores": 1, "compute_convergence_checks": False, "progressbar": False}
GRID = np.round(np.arange(1.40, 1.8001, 0.04), 2)


@pytest.fixture(scope="module")
def cluster():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as lc,
        distributed.Client(lc) as client,
    ):
        out_of_core_passes.use_client(client)
        yield client
        out_of_core_passes.use_client(None)


def logistic_data(n, d=3, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("f4")
    beta = np.array([0.5, -1.0, 0.25])[:d]
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ beta))).astype("i1")
    return x, y


def write_group(path, chunk=2500, **arrays):
    group = zarr.open_group(str(path), mode="w")
    for name, value in arrays.items():
        out = group.create_array(
            name, shape=value.shape, chunks=(chunk, *value.shape[1:]), dtype=value.dtype
        )
        out[:] = value
    return group


def logistic_model(x, y):
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("obs", logit_p=x @ b, observed=y)
    return model


def sample_logistic(x_in, y_in, batches, seed=5):
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("obs", logit_p=x_in() @ b, observed=y_in())
        step = pms.RacingMetropolis(
            [b], race=RaceOptions(batches=batches, batch_size=500, exact_fraction=0.5), rng=3
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(step=[step], tune=200, draws=200, random_seed=seed, **SAMPLE)
    return idata.posterior["b"].values[0], step


def test_logistic_draws_equal_in_memory(cluster, tmp_path):
    x, y = logistic_data(20_000)
    group = write_group(tmp_path / "d.zarr", X=x, y=y)
    ours, step = sample_logistic(
        lambda: pms.Data("X", group["X"]), lambda: pms.Data("y", group["y"]), "random"
    )
    assert step.terms.out_of_core
    mem, _ = sample_logistic(lambda: pm.Data("X", x), lambda: pm.Data("y", y), "random")
    # the same draws up to the rounding of sums added by chunk: a wrong row, a
    # stale chunk or another rng stream would move them far more
    np.testing.assert_allclose(ours, mem, rtol=1e-4, atol=1e-5)
    assert np.ptp(ours[:, 0]) > 0.01  # the chain moved


def test_blocks_layout_matches_in_memory_posterior(cluster, tmp_path):
    x, y = logistic_data(20_000)
    group = write_group(tmp_path / "d.zarr", X=x, y=y)
    ours, step = sample_logistic(
        lambda: pms.Data("X", group["X"]), lambda: pms.Data("y", group["y"]), "blocks"
    )
    assert step.terms.has_permuted_copy
    mem, _ = sample_logistic(lambda: pm.Data("X", x), lambda: pm.Data("y", y), "blocks")
    # different row permutations: the same posterior within Monte Carlo error
    sd = mem.std(axis=0)
    se = sd * np.sqrt(2 * 20 / len(mem))  # an autocorrelation time of 20 draws at most
    assert np.all(np.abs(ours.mean(axis=0) - mem.mean(axis=0)) < 4 * se)
    assert np.all(np.abs(ours.std(axis=0) / sd - 1) < 0.5)


def selector_model(x_var, y_var):
    with pm.Model() as model:
        q = pm.Categorical("q", p=np.full(len(GRID), 1.0 / len(GRID)))
        pm.Normal("y", pt.as_tensor(GRID)[q] * x_var(), 1.0, observed=y_var())
    return model


def test_gibbs_draws_equal_in_memory(cluster, tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(scale=0.05, size=20_000)  # a posterior over several slopes of the grid
    y = 1.6 * x + rng.normal(size=20_000)
    group = write_group(tmp_path / "s.zarr", chunk=5000, x=x, y=y)
    draws = []
    for ooc in (True, False):
        if ooc:
            model = selector_model(
                lambda: pms.Data("x", group["x"]), lambda: pms.Data("yy", group["y"])
            )
        else:
            model = selector_model(lambda: pm.Data("x", x), lambda: pm.Data("yy", y))
        with model:
            step = pms.SubsampledCategoricalGibbs(
                [model["q"]],
                rng=0,
                race=RaceOptions(batches="random", batch_size=500, exact_fraction=0.5),
            )
            idata = pm.sample(step=[step], tune=0, draws=100, random_seed=1, **SAMPLE)
        draws.append(idata.posterior["q"].values.ravel())
    np.testing.assert_array_equal(draws[0], draws[1])
    assert len(np.unique(draws[0])) > 1


# -- the permuted copy ---------------------------------------------------------------------


def test_deal_table_margins():
    table = deal_table([7, 5, 9], [6, 6, 6, 3], seed=0)
    np.testing.assert_array_equal(table.sum(axis=1), [7, 5, 9])
    np.testing.assert_array_equal(table.sum(axis=0), [6, 6, 6, 3])


def test_deal_table_beyond_numpys_limit(monkeypatch):
    """10^9 rows and more (NumPy's multivariate hypergeometric stops below): drawn one group
    at a time, same margins, and the same law (means a_i b_j / N within 5 standard errors)."""
    from pymc_subsample.model import out_of_core_copy

    big = deal_table([4 * 10**8] * 3, [3 * 10**8] * 4, seed=0)
    np.testing.assert_array_equal(big.sum(axis=1), [4 * 10**8] * 3)
    np.testing.assert_array_equal(big.sum(axis=0), [3 * 10**8] * 4)
    monkeypatch.setattr(out_of_core_copy, "HYPERGEOMETRIC_LIMIT", 10)
    a, b = [7, 5, 9], [6, 6, 6, 3]
    draws = np.array([deal_table(a, b, seed=s) for s in range(2000)])
    assert (draws.sum(axis=2) == a).all() and (draws.sum(axis=1) == b).all()
    expected = np.outer(a, b) / sum(a)
    se = draws.std(axis=0) / np.sqrt(len(draws))
    assert (np.abs(draws.mean(axis=0) - expected) < 5 * se + 1e-9).all()


def test_permuted_copy_is_a_permutation_reused_and_atomic(cluster, tmp_path):
    from pymc_subsample.model.out_of_core_copy import permuted_copy

    n = 10_000
    x = np.arange(2 * n, dtype="f8").reshape(n, 2)
    y = np.arange(n, dtype="i4")
    arrays = [da.from_array(x, chunks=(1500, 2)), da.from_array(y, chunks=1500)]
    store = str(tmp_path / "copy.zarr")
    group = permuted_copy(arrays, ["x", "y"], store, "fp", seed=0, progress=False)
    px, py = group["x"][:], group["y"][:]
    np.testing.assert_array_equal(np.sort(py), y)  # every row once
    np.testing.assert_array_equal(px[:, 0], 2 * py)  # rows kept whole, inputs aligned
    assert np.mean(py == y) < 0.01  # shuffled
    # positions of the copy: uniform, e.g. the first 1000 hold each tenth of the rows evenly
    counts = np.bincount(py[:1000] // 1000, minlength=10)
    assert counts.min() > 60 and counts.max() < 140
    again = permuted_copy(arrays, ["x", "y"], store, "fp", seed=0, progress=False)
    np.testing.assert_array_equal(again["y"][:], py)  # reused, not redrawn
    # a failed write leaves no partial copy behind, and nothing is reused
    bad = da.map_blocks(_fail_on_third, arrays[1], dtype="i4")
    with pytest.raises(RuntimeError, match="chunk 3"):
        permuted_copy([arrays[0], bad], ["x", "y"], store, "other", seed=0, progress=False)
    left = os.listdir(os.path.join(store, "pymc_subsample_permuted"))
    assert not [f for f in left if "other" in f], left


def _fail_on_third(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 3:
        raise RuntimeError("chunk 3 unreadable")
    return block


def test_chunk_reader_detects_a_changed_chunk(tmp_path):
    group = write_group(tmp_path / "r.zarr", chunk=100, a=np.arange(1000.0))
    reader = ChunkReader([group["a"]], ["a"])
    crcs = [[zlib.crc32(reader.window(s, s + 100)[0].tobytes())] for s in range(0, 1000, 100)]
    reader = ChunkReader([group["a"]], ["a"], crcs=crcs, cache_bytes=0)
    np.testing.assert_array_equal(reader.take(np.array([5, 905, 5])), [[5.0, 905.0, 5.0]])
    group["a"][500] = -1.0  # a chunk not read yet
    with pytest.raises(DataChangedError, match="'a' changed"):
        reader.take(np.array([505]))


def test_chunk_reader_reads_shard_bytes_of_the_uncompressed_copy(tmp_path):
    from pymc_subsample.model.out_of_core_copy import LocalShards

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10_007, 3)).astype("f4")  # the last chunk and shard are partial
    y = rng.integers(0, 5, size=10_007).astype("i1")
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    arrays = []
    for name, value in (("x", x), ("y", y)):
        tail = value.shape[1:]
        out = group.create_array(
            name, shape=value.shape, chunks=(300, *tail), shards=(1200, *tail),
            dtype=value.dtype, compressors=None,
        )  # fmt: skip
        out[:] = value
        arrays.append(out)
    packed = write_group(tmp_path / "z.zarr", chunk=300, x=x)  # compressed, not sharded
    assert LocalShards.usable(arrays[0]) and LocalShards.usable(arrays[1])
    assert not LocalShards.usable(packed["x"])
    crcs = [
        [zlib.crc32(np.ascontiguousarray(v[s : s + 300]).tobytes()) for v in (x, y)]
        for s in range(0, len(y), 300)
    ]
    reader = ChunkReader(arrays, ["x", "y"], crcs=crcs, cache_bytes=0)
    assert all(s is not None for s in reader._shards)  # the fast path is taken
    pos = rng.integers(0, len(y), size=2000)
    got = reader.take(pos)
    np.testing.assert_array_equal(got[0], x[pos])
    np.testing.assert_array_equal(got[1], y[pos])
    for a, b in ((0, 10_007), (9_000, 10_007), (299, 301), (1_199, 2_401)):
        win = reader.window(a, b)
        np.testing.assert_array_equal(win[0], x[a:b])
        np.testing.assert_array_equal(win[1], y[a:b])
    assert win[0].flags.writeable
    arrays[0][600] = -1.0  # rewritten in place: caught by the CRC like a zarr read
    with pytest.raises(DataChangedError, match="'x' changed"):
        reader.take(np.array([601]))


# -- refusals ------------------------------------------------------------------------------


def test_refuses_chunks_along_columns(tmp_path):
    group = zarr.open_group(str(tmp_path / "c.zarr"), mode="w")
    arr = group.create_array("X", shape=(100, 4), chunks=(50, 2), dtype="f4")
    with pm.Model(), pytest.raises(ValueError, match=r"rechunk\(\{1: -1\}\)"):
        pms.Data("X", arr)


def test_refuses_numpy_and_non_numeric():
    with pm.Model():
        with pytest.raises(TypeError, match="use pm.Data"):
            pms.Data("X", np.zeros((10, 2)))
        with pytest.raises(ValueError, match="numeric"):
            pms.Data("s", da.from_array(np.array(["a", "b"], dtype=object), chunks=1))


def test_refuses_different_lengths(cluster, tmp_path):
    g1 = write_group(tmp_path / "a.zarr", chunk=100, X=np.zeros((300, 3), "f4"))
    g2 = write_group(tmp_path / "b.zarr", chunk=100, y=np.zeros(400, "i1"))
    with pm.Model():
        X = pms.Data("X", g1["X"])
        y = pms.Data("y", g2["y"])
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("obs", logit_p=(X @ b)[:1], observed=y[:1])
        with pytest.raises(ModelSplitError):
            pms.RacingMetropolis([b])


def test_refuses_nan_naming_the_chunk(cluster, tmp_path):
    x, y = logistic_data(1000)
    x[730, 1] = np.nan
    group = write_group(tmp_path / "n.zarr", chunk=250, X=x, y=y)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli(
            "obs", logit_p=pms.Data("X", group["X"]) @ b, observed=pms.Data("y", group["y"])
        )
        with pytest.raises(ModelSplitError, match=r"'X' holds missing values .* rows 500:750"):
            pms.RacingMetropolis([b])


def test_refuses_mixed_in_memory_rows(cluster, tmp_path):
    x, y = logistic_data(1000)
    group = write_group(tmp_path / "m.zarr", chunk=250, X=x)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("obs", logit_p=pms.Data("X", group["X"]) @ b, observed=pm.Data("y", y))
        with pytest.raises(ModelSplitError, match="put every per-observation input out of core"):
            pms.RacingMetropolis([b])


def test_other_steps_cannot_read_the_placeholder(cluster, tmp_path):
    x, y = logistic_data(1000)
    group = write_group(tmp_path / "p.zarr", chunk=250, X=x, y=y)
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli(
            "obs", logit_p=pms.Data("X", group["X"]) @ b, observed=pms.Data("y", group["y"])
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(OutOfCoreReadError, match="RacingMetropolis"):
                pm.sample(step=[pm.Metropolis([b])], tune=2, draws=2, **SAMPLE)
            with pytest.raises(OutOfCoreReadError, match="'X'|'y'"):
                model.compile_logp()(model.initial_point())


def test_store_modified_while_sampling_is_detected(cluster, tmp_path):
    x, y = logistic_data(4000)
    group = write_group(tmp_path / "w.zarr", chunk=500, X=x, y=y)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli(
            "obs", logit_p=pms.Data("X", group["X"]) @ b, observed=pms.Data("y", group["y"])
        )
        # every decision exact: a Dask pass over every chunk, each checked
        race = RaceOptions(batches="random", batch_size=500, exact_fraction=1e-9)
        step = pms.RacingMetropolis([b], race=race)
        group["y"][1000:1500] = 1 - y[1000:1500]  # the user rewrites a chunk
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(DataChangedError, match="'y' changed"):
                pm.sample(step=[step], tune=50, draws=50, random_seed=0, **SAMPLE)


def test_in_memory_path_does_not_import_dask():
    import subprocess
    import sys

    code = (
        "import sys, pymc_subsample; "
        "print(sorted(m for m in ('dask', 'zarr', 'distributed') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _peak_growth(path, n: int, chunk: int = 100_000) -> int:
    """Write n rows chunk by chunk, sample 100 draws; return the peak RSS growth (bytes)."""
    psutil = pytest.importorskip("psutil")
    group = zarr.open_group(str(path), mode="w")
    xs = group.create_array("X", shape=(n, 3), chunks=(chunk, 3), dtype="f4")
    ys = group.create_array("y", shape=(n,), chunks=(chunk,), dtype="i1")
    for i, s in enumerate(range(0, n, chunk)):  # never the whole data in memory
        rng = np.random.default_rng([0, i])
        x = rng.normal(size=(min(chunk, n - s), 3)).astype("f4")
        xs[s : s + len(x)] = x
        ys[s : s + len(x)] = (rng.random(len(x)) < 1 / (1 + np.exp(-x[:, 0]))).astype("i1")
    del x
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def watch():
        while not done.wait(0.01):
            peak[0] = max(peak[0], proc.memory_info().rss)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pm.Model():
            b = pm.Normal("b", 0, 1, shape=3)
            pm.Bernoulli("obs", logit_p=pms.Data("X", xs) @ b, observed=pms.Data("y", ys))
            step = pms.RacingMetropolis([b], race=RaceOptions(batches="windows"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pm.sample(step=[step], tune=50, draws=50, random_seed=0, **SAMPLE)
    finally:
        done.set()
        watcher.join()
    return peak[0] - before


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_n(cluster, tmp_path, monkeypatch):
    """The peak RSS growth of a run does not follow N (workers in this process, counted).

    The chunk cache holds up to CACHE_BYTES of the copy (64 MiB), more than the
    data at these N: it is set to 4 MiB here, so that what could grow with N shows.
    """
    from pymc_subsample.model import out_of_core_copy

    monkeypatch.setattr(out_of_core_copy, "CACHE_BYTES", 4 * 2**20)
    _peak_growth(tmp_path / "warm.zarr", 200_000)  # compiles what every run shares
    small = _peak_growth(tmp_path / "small.zarr", 1_000_000)
    large = _peak_growth(tmp_path / "large.zarr", 4_000_000)
    more_data = 3_000_000 * (3 * 4 + 1)
    print(f"peak RSS growth {small / 2**20:.1f} MiB at 1e6, {large / 2**20:.1f} MiB at 4e6")
    # in memory the data and their permuted copy: 2 * more_data more at 4e6
    assert large - small < 0.25 * more_data


def test_xarray_source_with_dims(cluster, tmp_path):
    xr = pytest.importorskip("xarray")
    x, y = logistic_data(2000)
    group = write_group(tmp_path / "x.zarr", chunk=500, X=x, y=y)
    source = xr.DataArray(da.from_zarr(group["X"]), dims=("obs", "feat"))
    with pm.Model(coords={"feat": ["a", "b", "c"]}) as model:
        copy_store = str(tmp_path / "copies.zarr")  # a Dask source has no store of its own
        X = pms.Data("X", source, dims=("obs", "feat"), copy_store=copy_store)  # noqa: N806
        b = pm.Normal("b", 0, 1, dims="feat")
        pm.Bernoulli("y", logit_p=X @ b, observed=pms.Data("yy", group["y"], dims="obs"))
        with pytest.raises(ModelSplitError, match=r"\['X'\] are Dask arrays not stored in zarr"):
            pms.RacingMetropolis([b], race=RaceOptions(batches="random"))
        step = pms.RacingMetropolis([b], race=RaceOptions(batches="windows", batch_size=500))
    assert os.listdir(os.path.join(copy_store, "pymc_subsample_permuted"))
    assert model.named_vars_to_dims["X"] == ("obs", "feat")
    assert len(model.coords["obs"] or ()) in (0, 2000) and step.terms.n_obs == 2000
    exact = step.terms.loglik_sum([np.array([[0.5, -1.0, 0.25]])], model.initial_point())
    eta = x.astype("f8") @ np.array([0.5, -1.0, 0.25])
    np.testing.assert_allclose(exact, [np.sum(y * eta - np.logaddexp(0, eta))], rtol=1e-10)


@pytest.mark.slow
def test_worker_processes_compile_the_pass_function(tmp_path):
    """Worker processes receive the pass function as its graph and compile it there."""
    x, y = logistic_data(2000)
    group = write_group(tmp_path / "w.zarr", chunk=500, X=x, y=y)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as lc,
        distributed.Client(lc) as client,
    ):
        out_of_core_passes.use_client(client)
        try:
            with pm.Model() as model:
                b = pm.Normal("b", 0, 1, shape=3)
                X = pms.Data("X", group["X"])  # noqa: N806
                pm.Bernoulli("obs", logit_p=X @ b, observed=pms.Data("y", group["y"]))
                step = pms.RacingMetropolis([b], race=RaceOptions(batches="windows"))
            beta = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]])
            sums = step.terms.loglik_sum([beta], model.initial_point())
        finally:
            out_of_core_passes.use_client(None)
    eta = x.astype("f8") @ beta.T
    expected = np.sum(y[:, None] * eta - np.logaddexp(0, eta), axis=0)
    np.testing.assert_allclose(sums, expected, rtol=1e-10)


def test_forked_chains_refused_not_hung(cluster, tmp_path):
    x, y = logistic_data(2000)
    group = write_group(tmp_path / "f.zarr", chunk=500, X=x, y=y)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli(
            "obs", logit_p=pms.Data("X", group["X"]) @ b, observed=pms.Data("y", group["y"])
        )
        race = RaceOptions(batches="windows", batch_size=500, exact_fraction=1e-9)
        step = pms.RacingMetropolis([b], race=race)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(Exception, match="sample with cores=1"):
                pm.sample(step=[step], tune=5, draws=5, chains=2, cores=2, progressbar=False)


def test_support_statistics_out_of_core_match_in_memory(cluster, tmp_path):
    """DiscreteUniform(1, M) on zarr rows: the data's maximum comes from one Dask pass (not a
    pass per decision); every candidate is judged as on pm.Data, no warning, no exact decisions,
    and no impossible M is drawn (the data's maximum sits in the last chunk)."""
    from pymc_subsample.model import row_support

    rng = np.random.default_rng(0)
    y = rng.integers(1, 13, 20_000).astype("i8")
    y[[4000, 10_000, 19_998]] = [40, 45, 50]
    group = write_group(tmp_path / "u.zarr", chunk=5000, y=y)
    steps = {}
    for where, data in (
        ("zarr", lambda: pms.Data("y", group["y"])),
        ("memory", lambda: pm.Data("y", y)),
    ):
        with pm.Model():
            m = pm.DiscreteUniform("m", 1, 60)
            pm.DiscreteUniform("obs", 1, m, observed=data())
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # no "every decision is exact"
                steps[where] = pms.SubsampledCategoricalGibbs([m], rng=0)
    cands = [np.arange(1, 61)]
    out = steps["zarr"].row_support.infeasible(cands, {})
    np.testing.assert_array_equal(out, steps["memory"].row_support.infeasible(cands, {}))
    np.testing.assert_array_equal(out, cands[0] < 50)
    assert steps["zarr"].row_support.mode == "bounds" and not steps["zarr"].decides_exactly
    before = len(row_support._OUT_OF_CORE_STATISTICS)
    step = steps["zarr"]
    point = {"m": np.array(55)}
    for _ in range(20):
        point, _ = step.step(point)
        assert point["m"] >= 50
    assert len(row_support._OUT_OF_CORE_STATISTICS) == before  # computed once


def test_grouped_support_statistics_out_of_core(cluster, tmp_path):
    """DiscreteUniform(1, M[g]) with the groups and the counts out of core: per-group maxima
    by a Dask pass, equal to the in-memory check on every candidate vector tried."""
    rng = np.random.default_rng(1)
    n = 12_000
    g = rng.integers(0, 3, n).astype("i8")
    y = rng.integers(1, 10, n).astype("i8")
    y[[5, 6, 11_990]], g[[5, 6, 11_990]] = [20, 14, 25], [0, 1, 2]
    group = write_group(tmp_path / "g.zarr", chunk=3000, g=g, y=y)
    checks = {}
    for where in ("zarr", "memory"):
        with pm.Model():
            gd = pms.Data("g", group["g"]) if where == "zarr" else pm.Data("g", g)
            yd = pms.Data("y", group["y"]) if where == "zarr" else pm.Data("y", y)
            m = pm.DiscreteUniform("m", 1, 30, shape=3)
            pm.DiscreteUniform("obs", 1, m[gd], observed=yd)
            step = pms.SubsampledCategoricalGibbs([m], rng=0)
        assert step.row_support.mode == "bounds"
        cands = [rng.integers(10, 30, size=(200, 3))]
        cands[0][:3] = [[20, 14, 25], [19, 14, 25], [20, 14, 24]]
        checks[where] = (step.row_support, cands)
    support, cands = checks["zarr"]
    expected = checks["memory"][0].infeasible(cands, {})
    np.testing.assert_array_equal(support.infeasible(cands, {}), expected)
    np.testing.assert_array_equal(expected[:3], [False, True, True])
    assert expected.any() and not expected.all()


def test_shuffle_every_and_set_data_refused_out_of_core(cluster, tmp_path):
    """The permutation out of core is drawn once (kept in the store): an explicit
    shuffle_every is refused; pm.set_data on a pymc_subsample.Data is PyMC's TypeError."""
    x, y = logistic_data(2000)
    group = write_group(tmp_path / "s.zarr", chunk=500, X=x, y=y)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=3)
        xd = pms.Data("X", group["X"])
        pm.Bernoulli("obs", logit_p=xd @ b, observed=pms.Data("y", group["y"]))
        with pytest.raises(ValueError, match="drawn once and kept in the store"):
            pms.RacingMetropolis([b], race=RaceOptions(batches="windows", shuffle_every=100))
        with pytest.raises(TypeError, match="SharedVariable"):
            pm.set_data({"X": x[:1000]})


def test_stage_two_frees_its_pieces_and_a_retry_refuses(tmp_path):
    """Stage two deletes the staged pieces it read (the copy's peak disk stays near the
    copy's size); a retried task finds them gone and raises, never reads them as zeros."""
    from pymc_subsample.model.out_of_core_copy import _stage_one, _stage_two

    y = np.zeros(40, dtype="i1")  # all zeros: a piece equal to the fill value is still staged
    group = zarr.open_group(str(tmp_path / "st.zarr"), mode="w")
    stage = group.create_array(
        "stage", shape=(2, 2, 20), chunks=(1, 1, 20), dtype="i1",
        config={"write_empty_chunks": True},
    )  # fmt: skip
    out = group.create_array("out", shape=(40,), chunks=(10,), dtype="i1")
    table = deal_table([20, 20], [20, 20], seed=0)
    for i in range(2):
        _stage_one(i, 0, table[i], [stage], y[20 * i : 20 * i + 20])
    crcs = _stage_two(0, 0, table[:, 0], 0, 10, [stage], [out])
    assert len(crcs) == 2
    assert not os.listdir(tmp_path / "st.zarr" / "stage" / "c" / "0" / "0")
    with pytest.raises(RuntimeError, match="staged rows of group 0"):
        _stage_two(0, 0, table[:, 0], 0, 10, [stage], [out])


def test_big_data_example_matches_its_dask_reference(cluster, tmp_path, monkeypatch):
    """examples/big_data.py at small N: each mean within 5 MCSE of the Dask Laplace fit."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "examples" / "big_data.py"
    spec = importlib.util.spec_from_file_location("big_data_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["big_data.py", "--n", "20000", "--chunk", "5000", "--tune", "150", "--draws", "300"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        example.main()
    assert (tmp_path / "big_data.png").stat().st_size > 10_000
    rows = [r for r in (tmp_path / "big_data.md").read_text().splitlines() if r.startswith("| b[")]
    assert len(rows) == len(example.BETA)
    for row in rows:
        z = float(row.split("|")[7])
        assert abs(z) < 5, row  # a wrong row read or a stale chunk moves the mean far more


def test_pass_function_is_called_by_one_thread_at_a_time():
    """A task unpickles a PassFunction as a callable under the lock of the compiled function
    object, shared by every PassFunction wrapping it: two worker threads of this process
    calling one function on the Python VM (whose storage is its own) get their own sums."""

    x = pt.dvector("x")
    out = [pt.max(x) + pt.sum(pt.log1p(x**2))]
    with pm.Model() as model:
        pass
    fn = model.compile_fn(out, inputs=[x], point_fn=False, mode="FAST_COMPILE")
    first = out_of_core_passes.PassFunction(fn, out, [x], {})
    second = out_of_core_passes.PassFunction(fn, out, [x], {})
    copies = [pickle.loads(pickle.dumps(p)) for p in (first, second)]
    assert copies[0]._lock is copies[1]._lock is first._lock
    wrong = []

    def work(k, call):
        v = np.full(20_000, float(k))
        want = k + v.size * np.log1p(k * k)
        for _ in range(200):
            got = call(v)[0]
            if not np.isclose(got, want):
                wrong.append((k, float(got)))

    threads = [
        threading.Thread(target=work, args=(k, c)) for k, c in zip((1, 2), copies, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []

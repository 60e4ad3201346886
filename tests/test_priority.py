"""The helper processes (compilations, the kernels' warm-up) run behind the sampling process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pymc_subsample import _priority

CHILD = """
import os
from pymc_subsample._priority import run_behind
before = os.nice(0)
run_behind()
print(before, os.nice(0), open("/proc/self/autogroup").read().split()[-1])
"""


@pytest.mark.skipif(
    not Path("/proc/self/autogroup").exists(), reason="no Linux autogroups on this system"
)
def test_a_helper_in_a_session_of_its_own_lowers_its_sessions_priority():
    # a process that leads its own session (as the helpers do, to outlive the run) gets
    # an equal share of the processor whatever its niceness unless its autogroup is niced
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    ).stdout.split()
    before, after, group = (int(v) for v in out)
    assert after == min(19, before + _priority.NICE)
    assert group == 19


def test_run_behind_survives_a_system_without_autogroups(tmp_path, monkeypatch):
    monkeypatch.setattr(_priority, "AUTOGROUP", tmp_path / "missing" / "autogroup")
    monkeypatch.setattr(os, "nice", lambda inc: 0)  # this test process keeps its priority
    _priority.run_behind()  # no error


def test_both_helpers_run_behind(tmp_path, monkeypatch):
    from pymc_subsample.model import background
    from pymc_subsample.racing import warmup

    calls = []
    for module in (background, warmup):
        name = module.__name__
        monkeypatch.setattr(
            module, "run_behind", lambda session=True, name=name: calls.append((name, session))
        )
    monkeypatch.setattr(warmup, "exercise", lambda: None)
    lock = tmp_path / "lock"
    lock.touch()
    assert warmup._main(str(lock)) == 0
    assert background._main([f"{tmp_path / 'no job'}\t{lock}\n"]) == 0  # a failed job: skipped
    assert not lock.exists()
    # the warm-up, which the steps wait for, keeps its session's share
    assert calls == [(warmup.__name__, False), (background.__name__, True)]


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


class _Running:
    """A warm-up process that runs until ``done``."""

    done = False

    def poll(self):
        return 0 if self.done else None


def test_a_pending_warm_up_leaves_it_a_core(monkeypatch, tmp_path):
    from pymc_subsample.racing import warmup

    before = _blas_threads()
    assert before, "numpy links a BLAS that threadpoolctl sees"
    process = _Running()
    state = {"ready": False, "process": None, "lock": None, "polled": 0.0, "restore": None}

    def start():
        state["lock"], state["process"] = tmp_path / "lock", process

    monkeypatch.setattr(warmup, "IN_BACKGROUND", True)
    monkeypatch.setattr(warmup, "_STATE", state)
    monkeypatch.setattr(warmup, "_held", lambda dispatcher: False)
    monkeypatch.setattr(warmup, "_start", start)
    try:
        assert not warmup.ready()
        cores = max(1, (os.cpu_count() or 1) - 1)
        assert all(n <= cores for n in _blas_threads())
        process.done = True
        assert warmup.ready()
        assert _blas_threads() == before
    finally:
        if state["restore"] is not None:
            state["restore"]()


def test_leave_a_core_never_stops_the_sampling(monkeypatch):
    import threadpoolctl

    def broken(**kwargs):
        raise RuntimeError("a BLAS threadpoolctl cannot handle")

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", broken)
    _priority.leave_a_core()()  # no error, and its restore does nothing

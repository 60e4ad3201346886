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
        monkeypatch.setattr(module, "run_behind", lambda name=name: calls.append(name))
    monkeypatch.setattr(warmup, "exercise", lambda: None)
    lock = tmp_path / "lock"
    lock.touch()
    assert warmup._main(str(lock)) == 0
    with pytest.raises(FileNotFoundError):
        background._main(str(tmp_path / "no job"), str(lock))
    assert calls == [warmup.__name__, background.__name__]

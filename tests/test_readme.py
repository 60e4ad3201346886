"""The README's Python code blocks run as written.

Every ```` ```python ```` block of README.md is executed, in order, in one
namespace. The main example samples N = 500,000 rows twice with PyMC's default
1,000 + 1,000 draws a chain; the slow test executes it as written, and the
default run executes it with two substitutions, both checked to apply: the line
``N = 500_000`` becomes ``N = 20_000``, and each ``pm.sample(`` call gets
``tune=300, draws=300`` first.
"""

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FULL_N = "N = 500_000"
SMALL_N = "N = 20_000"
SHORT = "tune=300, draws=300, "


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def main_example() -> str:
    (block,) = [b for b in python_blocks() if "pm.sample(" in b]
    return block


def run(code: str) -> dict:
    namespace = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
    return namespace


def check_main_example(ns: dict, *, saving: bool) -> None:
    table = ns["table"]
    exact, sub = table.loc["exact"], table.loc["subsampled"]
    # the same posterior: q is the simulated scale in every draw of both runs, means agree
    assert (ns["idata"].posterior["q"].values == 2).all()
    assert (ns["idata_exact"].posterior["q"].values == 2).all()
    for name in ("a", "b"):
        err = np.hypot(exact.loc[name, "mcse_mean"], sub.loc[name, "mcse_mean"])
        assert abs(exact.loc[name, "mean"] - sub.loc[name, "mean"]) < 5 * err, table
    if saving:  # at the README's N a racing draw reads a small share of the terms
        assert sub["mean_frac_evals"].iloc[0] < 0.05, table


def test_readme_has_the_blocks_this_test_expects():
    blocks = python_blocks()
    assert len(blocks) >= 2
    assert main_example().count(FULL_N) == 1


def test_small_python_blocks_run():
    for block in python_blocks():
        if block != main_example():
            run(block)


def test_main_example_runs_at_a_smaller_n():
    code = main_example()
    assert code.count("pm.sample(\n") == 2
    ns = run(code.replace(FULL_N, SMALL_N).replace("pm.sample(\n", "pm.sample(\n" + SHORT))
    assert ns["N"] == 20_000 and ns["idata"].posterior.sizes["draw"] == 300
    check_main_example(ns, saving=False)  # at N = 20,000 most draws are decided exactly


@pytest.mark.slow
def test_main_example_runs_as_written():
    ns = run(main_example())
    check_main_example(ns, saving=True)

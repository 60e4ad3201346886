"""Compare runs of the same model (subsampling steps against PyMC's exact steps)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .validation import ArgumentTypeError

__all__ = ["compare_runs"]


def _stat(sample_stats, name):
    if sample_stats is None or name not in sample_stats:
        return None
    return np.asarray(sample_stats[name].values)


def compare_runs(runs: Mapping[str, object], var_names: Sequence[str] | None = None):
    """Side-by-side posterior summary, efficiency and racing statistics of several runs.

    Parameters
    ----------
    runs : mapping of str to DataTree
        Results of ``pm.sample`` (ArviZ 1.x ``DataTree``), e.g.
        ``{"exact": idata_exact, "subsampled": idata_racing}``.
    var_names : sequence of str, optional
        Variables to summarize (default: all posterior variables).

    Returns
    -------
    pandas.DataFrame
        One row per (run, variable element) with the ArviZ summary columns
        (``mean``, ``sd``, ``ess_bulk``, ``ess_tail``, ``r_hat``, ...), plus
        ``sampling_time`` (seconds, from ``pm.sample``), ``ess_bulk_per_s``,
        and, for runs with racing steps, ``mean_frac_evals`` (the mean of
        their ``frac_evals`` stat: the share of the :math:`N` observations a
        decision read, 1 for an exact one; one meaning in every racing step,
        so the mean is over draws and over the racing steps of the run, each
        step's draws weighted alike), ``audited`` (number of audited draws,
        summed over the steps) and ``audit_error_rate`` (fraction of audited
        draws whose decision differed from the exact one). Columns that do
        not apply to a run are NaN.
    """
    import arviz as az
    import pandas as pd

    if not isinstance(runs, Mapping) or not runs:
        raise ArgumentTypeError(
            f"runs must be a non-empty dict of labels to pm.sample results, got {runs!r}; "
            "e.g. runs={'exact': idata_exact, 'subsampled': idata_racing}"
        )
    if not (var_names is None or isinstance(var_names, str | Sequence)):
        raise ArgumentTypeError(
            f"var_names must be a list of variable names or None, got {var_names!r}; "
            "e.g. var_names=['mu']"
        )
    frames = []
    for label, data in runs.items():
        summary = pd.DataFrame(az.summary(data, var_names=var_names, kind="all"))
        stats_group = data["sample_stats"] if "sample_stats" in data.children else None
        seconds = np.nan
        if stats_group is not None:
            seconds = float(stats_group.attrs.get("sampling_time", np.nan))
        summary.insert(0, "run", label)
        summary["sampling_time"] = seconds
        ess = pd.to_numeric(summary["ess_bulk"], errors="coerce")
        summary["ess_bulk_per_s"] = ess / seconds if seconds and seconds > 0 else np.nan
        ds = stats_group.to_dataset() if stats_group is not None else None
        frac = _stat(ds, "frac_evals")
        summary["mean_frac_evals"] = float(np.mean(frac)) if frac is not None else np.nan
        audit = _stat(ds, "audit_agree")
        if audit is not None:
            done = audit >= 0
            summary["audited"] = int(done.sum())
            summary["audit_error_rate"] = float((audit[done] == 0).mean()) if done.any() else np.nan
        else:
            summary["audited"] = 0
            summary["audit_error_rate"] = np.nan
        frames.append(summary)
    table = pd.concat(frames)
    table.index.name = "variable"
    return table.reset_index().set_index(["run", "variable"])

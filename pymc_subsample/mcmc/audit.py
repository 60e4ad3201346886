r"""Audits of racing decisions: the error-rate test and the diagnosis of its cause (pure numpy).

An audit compares a race's decision with the exact one for the same random
numbers, the exact one computed independently of the race's machinery: the
model's own joint log density on the original data, evaluated at every
candidate. With :math:`k` of :math:`n` audited decisions wrong, the races are
declared wrong when the one-sided binomial test rejects an error rate of
:math:`\delta`,

.. math:: P(\mathrm{Binomial}(n, \delta) \ge k) < \alpha,

and the step then decides exactly. Three causes are told apart from what the
audits measured (:func:`diagnose`):

- ``"structural"``: the exact decision from the race's own terms (its fused
  sums over the per-observation terms, as the race evaluates them) differs
  from the joint log density's: the terms are not the model's (observations
  coupled across rows, a stale copy of the data, an expansion that no longer
  holds). The step's exact decisions must then come from the joint density.
- ``"sparse"``: on the race's batches most per-row differences between
  candidates are exactly zero (e.g. a change point, where candidates differ
  on a few rows): a batch rarely sees the rows that decide.
- ``"heavy_tails"``: otherwise, a few rows carry large terms and the normal
  approximation of the race's bound fails.

A fourth cause needs no test: ``"support"``, a race that chose a value the exact
computation makes impossible (its log density :math:`-\infty`, or a probability
below any plausible error): a term is :math:`-\infty` on rows the race did not
read. One such audit suffices.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = [
    "CAUSES",
    "SCORE_RTOL",
    "SIGNIFICANCE",
    "SPARSE_SHARE",
    "diagnose",
    "error_rate_exceeds",
    "explain",
    "impossible_choice",
    "scores_differ",
    "zero_difference_share",
]

#: Level :math:`\alpha` of the binomial test of the audited error rate.
SIGNIFICANCE = 1e-3
#: A batch whose share of exactly-zero per-row differences exceeds this is "sparse".
SPARSE_SHARE = 0.5
#: The causes :func:`diagnose` tells apart.
CAUSES = ("structural", "sparse", "heavy_tails", "support")
#: Relative tolerance of :func:`scores_differ` (rounding of sums over many rows in
#: double precision; the steps use 1e-4 for a model in single precision).
SCORE_RTOL = 1e-8


def error_rate_exceeds(n_wrong: int, n_audits: int, delta: float) -> bool:
    r"""Return True when :math:`P(\mathrm{Binomial}(n, \delta) \ge k) <` :data:`SIGNIFICANCE`.

    ``n_wrong`` is :math:`k`, ``n_audits`` :math:`n`. False without a wrong decision.
    """
    if n_wrong <= 0:
        return False
    return bool(stats.binom.sf(n_wrong - 1, n_audits, delta) < SIGNIFICANCE)


def scores_differ(ours: np.ndarray, independent: np.ndarray, rtol: float = SCORE_RTOL) -> bool:
    r"""Return True when two exact scorings of the candidates differ by more than a constant.

    ``ours`` and ``independent`` are log densities of the candidates (shape
    ``(K,)``) that may differ by a constant (terms that do not involve the
    candidates). They agree when the same candidates are :math:`-\infty` and
    the differences to the best candidate,
    :math:`s_k - s_{\hat k}` with :math:`\hat k = \arg\max_k s^{\text{ind}}_k`,
    agree within ``rtol`` times the largest magnitude of either scoring (the
    rounding of sums over many rows). Any NaN disagrees.
    """
    ours = np.asarray(ours, dtype=np.float64)
    independent = np.asarray(independent, dtype=np.float64)
    if np.isnan(ours).any() or np.isnan(independent).any():
        return True
    finite = np.isfinite(independent)
    if not np.array_equal(finite, np.isfinite(ours)):
        return True
    if not finite.any():
        return False
    a, b = ours[finite], independent[finite]
    best = int(np.argmax(b))
    scale = max(1.0, float(np.abs(a).max()), float(np.abs(b).max()))
    return bool(np.abs((a - a[best]) - (b - b[best])).max() > rtol * scale)


def impossible_choice(scores: np.ndarray, chosen: int, min_prob: float = 1e-12) -> bool:
    r"""Return True when candidate ``chosen`` has exact probability below ``min_prob``.

    ``scores`` are the exact log densities of the candidates (shape ``(K,)``); the
    probability of :math:`k` is :math:`e^{s_k} / \sum_j e^{s_j}`. A race that chose
    such a value erred with certainty (an impossible value: :math:`s_k = -\infty`).
    """
    scores = np.asarray(scores, dtype=np.float64)
    if np.isneginf(scores[chosen]):
        return True
    finite = scores[np.isfinite(scores)]
    if finite.size == 0:
        return False
    top = finite.max()
    log_norm = top + np.log(np.exp(finite - top).sum())
    return bool(scores[chosen] - log_norm < np.log(min_prob))


def zero_difference_share(terms: np.ndarray) -> float:
    r"""Share of per-row differences between candidates that are exactly zero.

    ``terms`` has shape ``(K, m)``: :math:`\log f_n(\theta_k)` on a batch of
    :math:`m` rows. Over every pair of candidates :math:`k < l` and row
    :math:`n` where both terms are finite, the share with
    :math:`\log f_n(\theta_k) = \log f_n(\theta_l)`; 0 with fewer than two
    candidates or no finite pair.
    """
    terms = np.asarray(terms, dtype=np.float64)
    n_cands = terms.shape[0]
    zeros = total = 0
    for k in range(n_cands - 1):
        rest = terms[k + 1 :]
        both = np.isfinite(terms[k]) & np.isfinite(rest)
        zeros += int(np.count_nonzero((rest == terms[k]) & both))
        total += int(np.count_nonzero(both))
    return zeros / total if total else 0.0


def diagnose(n_structural: int, zero_share: float | None) -> str:
    """Name the likely cause of races that the audits found wrong (one of :data:`CAUSES`).

    Parameters
    ----------
    n_structural : int
        Audits at which the exact scoring from the race's own terms differed
        from the joint log density's (:func:`scores_differ`).
    zero_share : float or None
        Mean :func:`zero_difference_share` of batches at the wrong decisions
        (None: not measured).

    Returns
    -------
    str
        ``"structural"`` when any such audit was seen; else ``"sparse"`` when
        ``zero_share`` exceeds :data:`SPARSE_SHARE`; else ``"heavy_tails"``.
    """
    if n_structural > 0:
        return "structural"
    if zero_share is not None and zero_share > SPARSE_SHARE:
        return "sparse"
    return "heavy_tails"


def explain(
    cause: str, step: str, n_wrong: int, n_audits: int, delta: float, *, act: bool = True
) -> str:
    """Return the warning of a step that audits found wrong.

    With ``act`` the step now decides exactly; without (``AuditOptions(act=False)``)
    it keeps racing, and the warning says so.
    """
    head = (
        f"{step}: {n_wrong} of {n_audits} audited decisions differed from the exact ones, "
        f"significantly more than delta={delta:g}; "
    )
    if act:
        head += (
            "the step decides exactly (every observation) for the rest of its run, and its "
            "'audit_exact' stat is True from now on. "
        )
    else:
        head += "the step keeps racing, as audit=AuditOptions(act=False) asks. "
    if cause == "structural":
        joint = "Exact decisions now use the model's joint log density. " if act else ""
        return head + (
            "Cause: structural or stale terms. The likelihood terms as the step evaluates them "
            "(on its row-permuted copy of the data) do not sum to the model's log density: the "
            "observations are coupled across rows (e.g. a lag such as y[:-1] written by hand, "
            "a time series), the data changed without step.data_changed(), or a pm.Data input "
            f"is not indexed by observation. {joint}"
            "Do not subsample this model: use an exact PyMC step, or rewrite the "
            "likelihood with per-observation inputs (e.g. the lagged values as their own "
            "pm.Data column)"
        )
    if cause == "support":
        return (
            f"{step}: an audited decision chose a value that the exact computation makes "
            "impossible (log density -inf, or probability below 1e-12): the likelihood terms "
            "are -inf on rows the race did not read, for that value (a support bounded by "
            "the parameter, checked by no rule the step knows). "
            + (
                "The step decides exactly (every observation) for the rest of its run, and "
                "its 'audit_exact' stat is True from now on. "
                if act
                else "The step keeps racing, as audit=AuditOptions(act=False) asks. "
            )
            + "Use race=RaceOptions(bound='exact') or an exact PyMC step for this variable"
        )
    if cause == "sparse":
        return head + (
            "Cause: sparse differences. On the race's batches most observations give every "
            "candidate the same term (e.g. a change point, where candidates differ on a few "
            "rows), so a batch rarely sees the rows that decide. Subsampling cannot pay here: "
            "use race=RaceOptions(bound='exact') or an exact PyMC step for this variable"
        )
    return head + (
        "Cause: heavy tails. The normal approximation fails on these likelihood terms (heavy "
        "tails or rare large terms). Change a setting of this step: a larger first batch "
        "(e.g. race=RaceOptions(batch_size=500)), race=RaceOptions(bound='ebs', "
        "reward_range=<a bound on the terms' range>), or race=RaceOptions(bound='exact') for "
        "exact draws (a smaller delta helps only a little when the bound's assumption fails)"
    )

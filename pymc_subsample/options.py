"""Options objects: the rarely touched settings of the steps, grouped by concern and validated.

The common call of a step takes no options (``SubsampledCategoricalGibbs([q])``,
``RacingMetropolis([beta])``); each object here groups the knobs of one
concern, with one meaning and one default in every step that takes it, and
checks every field when it is built, so that a mistake costs no compilation:

- :class:`RaceOptions`: how each race runs (bound, variance, batches, the
  exact switch, back-off);
- :class:`AuditOptions`: how often decisions are replayed exactly, and
  whether a failed audit makes the step exact;
- :class:`ProposalOptions`: the tuning of :class:`~pymc_subsample.RacingMetropolis`'s
  proposals (everything but ``proposal`` and ``scaling``).

:func:`reject_moved_keywords` turns a keyword that moved into one of these
objects into an error that names its new place.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .racing.common import BOUNDS, VARIANCES
from .validation import (
    ArgumentTypeError,
    check_bool,
    check_choice,
    check_float,
    check_instance,
    check_int,
)

__all__ = [
    "AuditOptions",
    "BATCH_LAYOUTS",
    "ProposalOptions",
    "RaceOptions",
    "reject_moved_keywords",
]

#: Names accepted by ``RaceOptions.batches``: contiguous blocks of a row-permuted copy of
#: the data, independent random rows, or contiguous windows of the data in its own order.
BATCH_LAYOUTS = ("blocks", "random", "windows")


@dataclass(frozen=True)
class RaceOptions:
    """How each race of a step runs (Bardenet et al. 2014; Chen & Ghahramani 2016).

    Parameters
    ----------
    bound : {"normal", "ebs", "lilucb", "exact"}
        Concentration bound of the race: the normal (CLT) bound, the empirical
        Bernstein-Serfling bound, lil'UCB (Jamieson et al. 2014; Gibbs only),
        or ``"exact"`` (every decision on all the terms in one pass).
    variance : {"pairwise", "marginal"}
        Variance of the reward differences: of each pair of arms on the shared
        batch, or of each arm alone.
    batch_size : int or "auto"
        First mini-batch, at least 2; ``"auto"`` lets the step choose it (the
        Gibbs step by timing its looks at construction, RacingMetropolis 50).
    exact_fraction : float in (0, 1] or "auto"
        Share of the rows after which a race stops looking and decides on all
        of them; ``"auto"`` lets the step choose it (by timing, or 0.25).
    batches : {"blocks", "random", "windows"}
        Where the batches' rows come from (:data:`BATCH_LAYOUTS`).
    shuffle_every : int or "auto"
        Draws between redraws of the row permutation (``"auto"``: N / 10).
    reward_range : float or None
        A known bound on the range of a reward difference, used by the
        ``"ebs"`` bound; None estimates it from the batch.
    backoff : bool
        Switch to runs of exact decisions, doubling, while races do not pay.
    """

    bound: str = "normal"
    variance: str = "pairwise"
    batch_size: int | str = "auto"
    exact_fraction: float | str = "auto"
    batches: str = "blocks"
    shuffle_every: int | str = "auto"
    reward_range: float | None = None
    backoff: bool = True

    def __post_init__(self) -> None:
        check_choice("bound", self.bound, BOUNDS)
        check_choice("variance", self.variance, VARIANCES)
        _set(self, "batch_size", check_int(
            "batch_size", self.batch_size, low=2, example=50, special=("auto",),
            why=" (a variance needs two draws)",
        ))  # fmt: skip
        _set(self, "exact_fraction", check_float(
            "exact_fraction", self.exact_fraction, low=0.0, high=1.0, low_open=True,
            example=0.25, special=("auto",),
        ))  # fmt: skip
        check_choice("batches", self.batches, BATCH_LAYOUTS)
        _set(self, "shuffle_every", check_int(
            "shuffle_every", self.shuffle_every, low=1, example=1000, special=("auto",)
        ))  # fmt: skip
        _set(self, "reward_range", check_float(
            "reward_range", self.reward_range, low=0.0, low_open=True, example=10.0,
            special=(None,),
        ))  # fmt: skip
        _set(self, "backoff", check_bool("backoff", self.backoff))


@dataclass(frozen=True)
class AuditOptions:
    """How a step checks its own decisions against exact ones.

    Parameters
    ----------
    every : int or "auto"
        Replay one decision in ``every`` with the exact test; 0 turns audits
        off; ``"auto"`` spends a small share of the run's cost on them.
    act : bool
        When the audited error rate is significantly above ``delta``, switch
        the step to exact decisions for the rest of the run and warn (True),
        or only warn (False).
    """

    every: int | str = "auto"
    act: bool = True

    def __post_init__(self) -> None:
        _set(self, "every", check_int(
            "every", self.every, low=0, example=100, special=("auto",),
            why=" (0 turns audits off)",
        ))  # fmt: skip
        _set(self, "act", check_bool("act", self.act))


@dataclass(frozen=True)
class ProposalOptions:
    """Tuning of :class:`~pymc_subsample.RacingMetropolis`'s proposals.

    Parameters
    ----------
    covariance : ndarray or None
        Proposal covariance (d x d, symmetric positive definite); None uses the
        inverse Hessian of the surrogate at the mode.
    path_length : float
        Length of the HMC path on the surrogate, in units of the posterior sd.
    tune_interval : int
        Decisions between adaptations of the scale during tuning.
    gradient_batch : int or None
        Rows per Langevin gradient estimate; None uses the surrogate's gradient.
    target_accept : float in (0, 1) or None
        Acceptance the scale adaptation aims at; None uses the proposal's
        optimum (0.234 random walk, 0.574 Langevin, 0.8 HMC).
    elemwise : bool
        Update each coordinate on its own, with a race per coordinate.
    """

    covariance: np.ndarray | None = field(default=None, compare=False)
    path_length: float = 1.5
    tune_interval: int = 100
    gradient_batch: int | None = None
    target_accept: float | None = None
    elemwise: bool = False

    def __post_init__(self) -> None:
        if self.covariance is not None:
            check_instance(
                "covariance", self.covariance, (np.ndarray, list, tuple), example="np.eye(d)"
            )
            cov = np.atleast_2d(np.asarray(self.covariance, dtype=float))
            if cov.ndim != 2 or cov.shape[0] != cov.shape[1] or not np.all(np.isfinite(cov)):
                raise ValueError(
                    f"covariance must be a finite square matrix, got shape {cov.shape}; "
                    "e.g. covariance=np.eye(d)"
                )
            _set(self, "covariance", cov)
        _set(self, "path_length", check_float(
            "path_length", self.path_length, low=0.0, low_open=True, example=1.5
        ))  # fmt: skip
        _set(self, "tune_interval", check_int(
            "tune_interval", self.tune_interval, low=1, example=100
        ))  # fmt: skip
        _set(self, "gradient_batch", check_int(
            "gradient_batch", self.gradient_batch, low=1, example=1000, special=(None,)
        ))  # fmt: skip
        _set(self, "target_accept", check_float(
            "target_accept", self.target_accept, low=0.0, high=1.0, low_open=True,
            high_open=True, example=0.8, special=(None,),
        ))  # fmt: skip
        _set(self, "elemwise", check_bool("elemwise", self.elemwise, example=False))


def _set(obj, name: str, value) -> None:
    """Store the canonical form of a validated field on a frozen dataclass."""
    object.__setattr__(obj, name, value)


#: Where each keyword that left the steps' signatures went.
MOVED = {
    **{f.name: ("race", "RaceOptions") for f in fields(RaceOptions)},
    "audit_every": ("audit", "AuditOptions(every=...)"),
    **{f.name: ("proposal_options", "ProposalOptions") for f in fields(ProposalOptions)},
}


def reject_moved_keywords(step: str, kwargs: dict, accepted: tuple[str, ...]) -> None:
    """Raise for keywords a step no longer takes, naming where each one moved.

    Parameters
    ----------
    step : str
        The step's name, for the message.
    kwargs : dict
        The keywords the step did not recognise.
    accepted : tuple of str
        The options objects this step takes (``"race"``, ``"audit"``,
        ``"proposal_options"``).

    Raises
    ------
    TypeError
        For the first unknown keyword: where it moved, with an example, or
        that the step has no such keyword.
    """
    for name, value in kwargs.items():
        if name in MOVED and MOVED[name][0] in accepted:
            where, cls = MOVED[name]
            if "(" in cls:
                example = f"{where}={cls.replace('...', repr(value))}"
            else:
                example = f"{where}={cls}({name}={value!r})"
            raise ArgumentTypeError(
                f"{step} takes {name} in its {where} options: write {example} "
                "(from pymc_subsample.options)"
            )
        raise ArgumentTypeError(f"{step} got an unexpected keyword argument {name!r}")

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
from .racing.config import BATCH_LAYOUTS
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
    "ProposalOptions",
    "RaceOptions",
    "options_or_default",
    "reject_moved_keywords",
]


@dataclass(frozen=True)
class RaceOptions:
    r"""How each race of a step runs (Bardenet et al. 2014; Chen & Ghahramani 2016).

    The same names, meanings and defaults in
    :class:`~pymc_subsample.SubsampledCategoricalGibbs` and
    :class:`~pymc_subsample.RacingMetropolis`; pass one as ``race=``.

    Parameters
    ----------
    bound : {"normal", "ebs", "lilucb", "exact"}
        Concentration bound of the race (:func:`~pymc_subsample.racing.race`):
        the normal (CLT) bound, the empirical Bernstein-Serfling bound,
        lil'UCB (Jamieson et al. 2014; Gibbs only), or ``"exact"``: every
        decision on all :math:`N` observations (an exact Gibbs draw, plain MH).
    variance : {"pairwise", "marginal"}
        Variance of the reward differences: of each pair of arms on the shared
        batch, or of each arm alone (Gibbs only: an accept test's two arms
        are always paired).
    batch_size : int or "auto"
        First mini-batch :math:`m^{(1)}` of the doubling schedule, at least 2
        (the paper's 50 for Racing-Normal, 2 for Racing-EBS). ``"auto"``: the
        Gibbs step times the model once at construction and starts where a
        batch's terms cost about as much as the look's fixed cost (one
        compiled call and the race's bookkeeping): on cheap terms and large
        :math:`N` that is thousands of observations, since smaller batches
        only add looks; RacingMetropolis starts at 50. The value used is kept
        in the step's ``batch_size``.
    exact_fraction : float in (0, 1] or "auto"
        When a race stops subsampling: once it has drawn this fraction of the
        :math:`N` observations, its next look evaluates the surviving
        candidates on all observations in one fused pass (exact), so that a
        hard decision costs little more than an exact one. ``"auto"``: the
        Gibbs step times the model's batch and fused evaluations at
        construction and picks the largest look whose predicted race cost
        stays within half of an exact decision
        (:data:`~pymc_subsample.mcmc.cost.EXACT_SWITCH_BUDGET`)
        (:func:`~pymc_subsample.mcmc.cost.choose_exact_after`), or decides
        every draw exactly when even a first look would not pay (small
        :math:`N`); RacingMetropolis switches at 0.25. Timings vary, so two
        separately built Gibbs steps with ``"auto"`` may choose differently
        and their draws then differ for the same ``random_seed`` (a step
        object always reproduces its own runs); pass numbers for bit-for-bit
        reproducibility across builds. ``1`` races on the whole doubling
        schedule, as in the paper. The choice is kept in the step's
        ``exact_switch``.
    batches : {"blocks", "random", "windows"}
        How races read the data (:data:`~pymc_subsample.racing.config.BATCH_LAYOUTS`). ``"blocks"``
        (default): each race draws whole blocks of :math:`b` consecutive rows
        (16 to 128, growing with :math:`N`:
        :func:`~pymc_subsample.racing.schedule.block_rows`) of a row-permuted
        copy of the per-observation data (one more copy in memory, shuffled
        in place), uniformly at random without replacement
        (:class:`~pymc_subsample.racing.schedule.RandomBlocks`): a gather in
        runs, much cheaper than scattered rows, and a fresh sample among
        :math:`N/b` blocks for every race. ``"random"``: every race gathers
        its own scattered random rows, no copy (for data that do not fit
        twice in memory; dearer per term). ``"windows"``: contiguous windows
        of the permuted copy from a random start, no gather, but races that
        share a permutation read overlapping windows: a chain that keeps one
        permutation for many draws at small :math:`N` can exceed ``delta``
        (the permutation-reuse study on the results pages).
    shuffle_every : int or "auto"
        With ``"blocks"`` and ``"windows"``: draws between redraws of the
        row permutation (each redraw is one pass that moves every row).
        ``"auto"`` (default): :math:`N/10` draws. Races that share a
        permutation are slightly dependent; with blocks the dependence fades
        as :math:`N` grows (the permutation-reuse study on the results pages).
    reward_range : float or None
        A known bound on the range of a reward (difference) over the
        observations, used by ``"ebs"`` and ``"lilucb"`` and as
        Racing-Normal's rare-event floor; None estimates it from the batch.
    backoff : bool
        When most of a decision's recent races (a share above
        :data:`~pymc_subsample.mcmc.backoff.BACKOFF_SHARE`) gave up, that is
        evaluated at least half of an exact decision's terms, make the next
        decisions exactly, without a race, in runs that double (1, 2, 4, ...,
        :data:`~pymc_subsample.mcmc.backoff.MAX_BACKOFF`;
        :class:`~pymc_subsample.mcmc.backoff.Backoff`); a race that pays ends
        the doubling. An exact decision is exact, so this adds no error, and
        where races cannot win a decision then costs about what an exact one
        costs instead of a race plus an exact pass. False races every
        decision, as in the paper.
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
    """How a step checks its own decisions against exact ones; pass one as ``audit=``.

    An audited draw also makes the exact decision for the same random numbers
    (Gumbel noise, or :math:`u` and the proposal) from the model's own joint
    log density on the original data, independent of the race's terms, and
    records ``audit_agree``. Audits read no random numbers: they change the
    draws only when they act.

    Parameters
    ----------
    every : int or "auto"
        Audit one draw in ``every``; 0 turns audits off; ``"auto"`` (default)
        audits within a budget of 5% of the step's own time
        (:class:`~pymc_subsample.steps.base.RacingStep`).
    act : bool
        When the audited error rate is significantly above ``delta``
        (:func:`~pymc_subsample.mcmc.audit.error_rate_exceeds`), the step
        warns, naming the likely cause (structural or stale terms, sparse
        differences, heavy tails: :func:`~pymc_subsample.mcmc.audit.diagnose`).
        With ``act=True`` (default) it also decides exactly for the rest of
        its run (its ``audit_exact`` stat is then True), from the joint log
        density when the race's own sums were found not to be the model's;
        with ``act=False`` it keeps racing (to measure the error rate of a
        setting, say).
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
        An estimate of the block's posterior covariance in the flat value
        space (variables in block order, raveled; d x d, symmetric positive
        definite), e.g. from a pilot run: it replaces the Laplace covariance
        as the random walk's preconditioner and the HMC mass matrix's
        inverse. None uses the inverse Hessian of the surrogate at the mode.
    path_length : float
        ``"hmc"``: initial integration time, in units of the posterior scale
        (adapted during tuning, at most this value).
    tune_interval : int
        Draws between adaptations of the scale during tuning
        (``"normal"``, ``"langevin"``).
    gradient_batch : int or None
        ``"langevin"``: rows per mini-batch gradient; None uses the larger of
        the first batch and 100.
    target_accept : float in (0, 1) or None
        ``"langevin"``: acceptance its step size is tuned towards; None: 0.36.
        (The random walk's scale follows PyMC's Metropolis tuning; HMC tunes its
        step size on the surrogate, Hoffman & Gelman 2014.)
    elemwise : bool
        ``"normal"`` only: propose and race one coordinate at a time, each
        with its own tuned scale, as ``pm.Metropolis`` does for vectors.
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
            try:
                cov = np.atleast_2d(np.asarray(self.covariance, dtype=float))
            except (TypeError, ValueError) as err:
                raise ArgumentTypeError(
                    f"covariance must be a square matrix of numbers, got {self.covariance!r}; "
                    "e.g. covariance=np.eye(d)"
                ) from err
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


def options_or_default(name: str, value, cls: type):
    """Return ``value``, or ``cls()`` for None; raise unless it is a ``cls``.

    Raises
    ------
    ArgumentTypeError
        For anything else (a dict, a string), naming ``name`` and the class.
    """
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ArgumentTypeError(
            f"{name} must be a {cls.__name__} or None, got {value!r}; e.g. "
            f"{name}={cls.__name__}() (from pymc_subsample.options)"
        )
    return value


def _set(obj, name: str, value) -> None:
    """Store the canonical form of a validated field on a frozen dataclass."""
    object.__setattr__(obj, name, value)


#: Where each keyword that left the steps' signatures went.
MOVED = {
    **{f.name: ("race", "RaceOptions") for f in fields(RaceOptions)},
    "audit_every": ("audit", "AuditOptions(every=...)"),
    **{f.name: ("proposal_options", "ProposalOptions") for f in fields(ProposalOptions)},
}


def reject_moved_keywords(
    step: str, kwargs: dict, accepted: tuple[str, ...], renamed: dict[str, str] | None = None
) -> None:
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
    renamed : dict of str to str, optional
        Keywords of this step that have a new name (old name to new name).

    Raises
    ------
    TypeError
        For the first unknown keyword: where it moved, with an example, or
        that the step has no such keyword.
    """
    renamed = renamed or {}
    for name, value in kwargs.items():
        if name in renamed:
            raise ArgumentTypeError(
                f"{step}'s {name} is now called {renamed[name]}: write {renamed[name]}={value!r}"
            )
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

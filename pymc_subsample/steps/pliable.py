r"""PliableRejection: a PyMC step that draws a small block by pliable rejection sampling.

Design (Tierney 1994, "Metropolized rejection"). Let :math:`\pi` be the
block's full conditional and :math:`E` a pliable envelope
(:func:`~pymc_subsample.prs.build_envelope`, App. B of Erraqabi et al. 2016) built earlier,
possibly for other values of the rest of the model. One step:

1. Rejection-sample :math:`y` from :math:`E`: propose :math:`y \sim E/\int E`,
   accept with probability :math:`\min(1, \pi(y)/E(y))`, repeat. Then
   :math:`y \sim \min(\pi, E)`, independently of the current value :math:`x`.
2. Move to :math:`y` with probability

   .. math:: \alpha(x, y) = \min\Bigl(1, \frac{\pi(y)\,\min(\pi(x), E(x))}
             {\pi(x)\,\min(\pi(y), E(y))}\Bigr),

   else stay at :math:`x`.

This kernel leaves :math:`\pi` invariant for **any** envelope :math:`E` that
does not depend on :math:`x` (Tierney 1994, Sec. 2.3.4), so the step is exact
whether or not :math:`E` still bounds the conditional after the other
variables moved. Where :math:`E \ge \pi` everywhere, :math:`\alpha = 1` and the
draws are i.i.d. exact draws of :math:`\pi`. If no proposal is accepted within
``max_proposals`` the step stays put; that probability depends on :math:`E`
and :math:`\pi` only, so invariance holds.

The envelope is rebuilt from the current conditional at the first step of a
chain, during tuning whenever the step count reaches a power of two, and once
more when tuning ends; after tuning it is fixed (PyMC's convention for
adaptation), unless ``rebuild="always"`` rebuilds it every step (exact too:
it then depends on the rest of the model and fresh randomness only). A build
finds the conditional's modes and curvatures (Nelder–Mead from the initial
value, the current value and the modes earlier builds found), takes a mixture
of products of Student-t (2 d.o.f., 5 times the Laplace scale), one per mode, as
the initial proposal :math:`g` and runs the initial phase of EPRS from it. A
start that its optimization left far behind (Nelder–Mead running down the neck
of a funnel, where the mode is at infinity) keeps a component of its own, at
the start with the curvature there: without it the envelope can have no mass
near the chain. Every point the mode search evaluates is passed on with its
value (``known`` of :func:`~pymc_subsample.prs.build_envelope`): the envelope's
box spans those near the largest value found and the envelope covers them. On
a funnel the search runs down the neck, a ridge in the narrow coordinate far
thinner than a grid cell that draws of :math:`g` almost never hit; its path is
what puts the neck under the envelope.

Run-time checks. An independence proposal with almost no density near the
current point :math:`x` never leaves it (:math:`\alpha \approx E(x)/\pi(x)`).
So :math:`\pi(x) > E(x)` counts as an envelope violation, like a proposal
above :math:`E`; during tuning, :math:`\pi(x) > 100 E(x)` rebuilds the envelope
at the next step (the current point is a start of the mode search). After
``STUCK_WINDOW`` steps without a move, in or after tuning, the step warns once,
rebuilds the envelope with twice wider proposal components, and from then on
follows every Metropolized-rejection move by a random-walk Metropolis move on
the block (stat ``fallback``). Each kernel leaves :math:`\pi` invariant; the
rebuild and the walk's scale depend on the chain's state once, when it is
found stuck (a finite adaptation, like the rebuild at the end of tuning).
"""

from __future__ import annotations

import warnings

import numpy as np
from pymc.step_methods.compound import BlockedStep, Competence
from pymc.util import get_random_generator
from scipy import optimize, stats

from ..model.blocks import continuous_value_vars
from ..model.conditional import BlockConditional
from ..options import reject_moved_keywords
from ..prs import (
    MAX_DIM,
    MixtureProposal,
    build_envelope,
    check_envelope_settings,
    draw,
    refit_envelope,
)
from ..validation import check_bool, check_choice, check_int
from .base import check_step_context, step_rng

__all__ = ["PliableRejection"]

#: Modes of the conditional remembered between builds (each one a proposal component).
_MAX_MODES = 4

#: :math:`\log(\pi(x)/E(x))` at the current point above which the envelope is "far below"
#: the target there: the chain would then stay at :math:`x` for about 100 steps on average.
FAR_BELOW = float(np.log(100.0))

#: Consecutive steps without a move after which the step rebuilds its envelope (wider) and
#: adds a random-walk Metropolis move on the block to every step.
STUCK_WINDOW = 50

#: A start point farther than this many Laplace scales (in some coordinate) from the mode
#: its optimization found gets a proposal component of its own (the mode may be a ridge
#: running off to infinity, or a spike, that says nothing about the region of the start).
_FAR_FROM_MODE = 5.0

#: Largest factor by which stuck windows widen the proposal components.
_MAX_WIDEN = 64.0


class PliableRejection(BlockedStep):
    r"""Gibbs update of a small continuous block by Metropolized pliable rejection sampling.

    Parameters
    ----------
    vars : list
        Continuous variables of the block, total size at most ``max_dim``.

        One step proposes and accepts with :func:`~pymc_subsample.prs.draw`
        (``repair=False``) from an envelope made by
        :func:`~pymc_subsample.prs.build_envelope`, the same rejection loop as the
        standalone :class:`~pymc_subsample.prs.PliableRejectionSampler`.
    n_init : int, optional
        Evaluations of the conditional per envelope build (default 1000 per
        dimension).
    smoothness : float
        Smoothness :math:`s \in (0, 2]` of the conditional (Assumption 1 of
        Erraqabi et al. 2016), as in
        :class:`~pymc_subsample.prs.PliableRejectionSampler`.
    envelope_error : float
        The envelope's error level :math:`\delta \in (0, 1)` of Erraqabi et
        al. (2016), the sampler's ``delta``: it sets the envelope's bandwidth
        and floor rate. Not a per-draw error as the racing steps' ``delta``:
        the step is exact whether or not the envelope bounds the conditional.
    refine : bool
        Refine each new envelope on its conditional (about ``3 * n_init`` more
        evaluations per build) before using it: fewer rejections afterwards.
    max_dim : int
        Largest block size accepted (default and at most
        :data:`~pymc_subsample.prs.MAX_DIM`).
    rebuild : {"tune", "always"}
        When to rebuild the envelope (see the module notes).
    max_proposals : int
        Proposals per step before the step gives up and stays put.
    model, rng, initial_point, compile_kwargs, blocked
        PyMC's step arguments.
    **moved
        ``delta``, renamed ``envelope_error``, raises a ``TypeError`` that
        says so (:func:`~pymc_subsample.options.reject_moved_keywords`).

    Notes
    -----
    **Design** (Tierney 1994, Metropolized rejection). With :math:`\pi` the
    block's full conditional and :math:`E` a pliable envelope built earlier, a
    step draws :math:`y \sim \min(\pi, E)` by rejection from :math:`E` and moves
    to it with probability

    .. math:: \alpha(x, y) = \min\Bigl(1, \frac{\pi(y)\,\min(\pi(x), E(x))}
              {\pi(x)\,\min(\pi(y), E(y))}\Bigr).

    This leaves :math:`\pi` invariant for any :math:`E` that does not depend on
    the current value :math:`x`, so the step stays exact when the other
    variables have moved and :math:`E` no longer bounds the conditional; where
    :math:`E \ge \pi`, :math:`\alpha = 1` and the draws are i.i.d. The envelope
    is rebuilt at the first step, during tuning at steps 1, 2, 4, ... and when
    tuning ends, then fixed (``rebuild="always"``: every step, from the fixed
    initial value only). A build finds the conditional's modes (Nelder–Mead from
    the initial value, the current value and earlier modes), and runs App. B's
    initial phase from a mixture of Student-t products, one per mode; the
    points the search evaluated join it as known values, which the envelope's
    box spans and the envelope covers (a funnel's neck). If no
    proposal passes within ``max_proposals``, the step stays put (a probability
    that does not depend on :math:`x`, so invariance holds). A current point
    above the envelope, and a chain stuck for ``STUCK_WINDOW`` steps, are
    handled as the module notes say (rebuild; random-walk fallback and a warning).

    Sampler stats: ``accept`` (:math:`\alpha`), ``accepted`` (moved to the
    rejection draw), ``n_evals`` (evaluations of the conditional this step,
    builds included), ``accepted_first`` (the first proposal passed the
    rejection test), ``envelope_violations`` (proposals, and the current point,
    with :math:`\pi > E` this step), ``rebuilt``, ``fallback`` (a random-walk
    Metropolis move followed, since the chain was found stuck) and ``tune``.

    Raises ``ValueError`` at construction when PyTensor cannot evaluate the
    block's conditional at a batch of points (a latent ``pm.AR`` series, say),
    for a block of more than ``max_dim`` dimensions, and for a keyword of the
    wrong type or range (:mod:`pymc_subsample.validation`).
    """

    name = "pliable_rejection"
    stats_dtypes_shapes = {
        "accept": (np.float64, []),
        "accepted": (bool, []),
        "n_evals": (np.int64, []),
        "accepted_first": (bool, []),
        "envelope_violations": (np.int64, []),
        "rebuilt": (bool, []),
        "fallback": (bool, []),
        "tune": (bool, []),
    }

    def __init__(
        self,
        vars,
        *,
        n_init: int | None = None,
        smoothness: float = 2.0,
        envelope_error: float = 0.01,
        refine: bool = False,
        max_dim: int = MAX_DIM,
        rebuild: str = "tune",
        max_proposals: int = 10_000,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **moved,
    ):
        import pymc as pm

        reject_moved_keywords(type(self).__name__, moved, (), renamed={"delta": "envelope_error"})
        check_step_context(model, initial_point, compile_kwargs)
        model = pm.modelcontext(model)
        if initial_point is None:
            initial_point = model.initial_point()
        value_vars = continuous_value_vars(model, vars, "PliableRejection")
        check_choice("rebuild", rebuild, ("tune", "always"))
        n_init, smoothness, envelope_error, refine = check_envelope_settings(
            n_init, smoothness, envelope_error, refine, delta_name="envelope_error"
        )
        max_dim = check_int(
            "max_dim", max_dim, low=1, high=MAX_DIM, example=MAX_DIM,
            why=" (a tabulated envelope needs exponentially many cells in the dimension)",
        )  # fmt: skip
        max_proposals = check_int("max_proposals", max_proposals, low=1, example=10_000)
        blocked = check_bool("blocked", blocked)
        rng = step_rng(rng)
        dim = sum(int(np.size(initial_point[v.name])) for v in value_vars)
        if dim < 1:
            raise ValueError(
                f"the block {[v.name for v in value_vars]} has no elements (size 0): there is "
                "nothing to draw; leave it out of the step"
            )
        if dim > max_dim:  # before the build: nothing compiled for a block refused
            raise ValueError(
                f"the block has {dim} dimensions, above max_dim={max_dim}: "
                "rejection sampling needs a low-dimensional block; split it into smaller "
                "blocks (at most max_dim each) or use NUTS for it"
            )
        self.conditional = BlockConditional(model, value_vars, initial_point, compile_kwargs)
        self._start = self.conditional.flatten(initial_point)
        self.vars = self.conditional.vars
        self.dim = self.conditional.dim
        self.n_init = 1000 * self.dim if n_init is None else n_init
        self.smoothness = smoothness
        self.envelope_error = envelope_error
        self.refine = refine
        self.rebuild = rebuild
        self.max_proposals = max_proposals
        self.rng = rng
        self.blocked = blocked
        self.tune = True
        self._reset()

    def _reset(self) -> None:
        self.envelope = None
        self._modes = []
        self.n_steps = 0
        self._rebuild_due = True
        self._rate = 0.5
        self._since_move = 0
        self._widen = 1.0
        self._walk_scale = None  # the random-walk fallback's scale once it is on
        self._warned = False

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Reset per-chain state (rng, envelope, counters) before a chain starts."""
        self.rng = get_random_generator(rng)
        self.tune = tune > 0
        self._reset()

    def stop_tuning(self) -> None:
        """End tuning; the next step builds the envelope that stays fixed afterwards."""
        self.tune = False
        self._rebuild_due = True

    def reset_tuning(self) -> None:
        """Forget the envelope (PyMC calls this before a run)."""
        self._reset()

    @staticmethod
    def competence(var, has_grad):
        """Never chosen automatically: assign it with ``step=``."""
        return Competence.INCOMPATIBLE

    # -- envelope -----------------------------------------------------------------

    def _laplace(
        self, x0: np.ndarray, point: dict, seen: list | None = None
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Mode and Laplace scale of the conditional (Nelder–Mead, then :meth:`_local_scale`).

        Every point evaluated, with its log density, is appended to ``seen``.
        """
        seen = [] if seen is None else seen

        def neg(z):
            value = float(self.conditional(z[None, :], point)[0])
            seen.append((np.array(z, dtype=float), value))
            return -value

        res = optimize.minimize(
            neg, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6}
        )
        mode = res.x if np.isfinite(res.fun) else x0
        scale, used = self._local_scale(mode, point, seen)
        return mode, scale, int(res.nfev) + used

    def _local_scale(
        self, z: np.ndarray, point: dict, seen: list | None = None
    ) -> tuple[np.ndarray, int]:
        r"""Scale :math:`(-\partial_k^2 \log\pi(z))^{-1/2}` per coordinate (central differences).

        1 where the curvature is not positive (or not finite). Returns the scale and the
        evaluations used; the points evaluated are appended to ``seen``.
        """
        d = self.dim
        eye = np.eye(d)
        eps = 1e-3 * np.maximum(1.0, np.abs(z))
        pts = np.concatenate([z[None, :], z + eye * eps, z - eye * eps])
        lp = self.conditional(pts, point)
        if seen is not None:
            seen.extend(zip(pts, lp, strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            curv = -(lp[1 : d + 1] + lp[d + 1 :] - 2 * lp[0]) / eps**2
            scale = np.where(np.isfinite(curv) & (curv > 0), 1.0 / np.sqrt(np.abs(curv)), 1.0)
        return scale, len(pts)

    def _build(self, x: np.ndarray, point: dict) -> int:
        """Fit a new envelope to the conditional at ``point``; return evaluations used.

        Modes are searched from the initial value, from ``x`` and from the modes
        found by earlier builds of this chain (a conditional's distant mode, once
        visited, stays in the proposal); each mode contributes a Student-t
        component to the initial proposal. A start farther than
        ``_FAR_FROM_MODE`` scales from the mode it led to (an optimization that ran
        along a ridge to infinity, as in a funnel) contributes a component of its
        own, at the start with the curvature there. Component scales are
        5 times the Laplace scale, times ``self._widen`` (doubled each time the
        chain is found stuck). With ``rebuild="always"`` the envelope must not
        depend on ``x`` or the chain's past: only the initial value is used.
        """
        if self.rebuild == "always":
            starts = [self._start]
        else:
            starts = [x, self._start, *(m for m, _ in self._modes)]
        modes, local, n, seen = [], [], 0, []
        for start in starts:
            mode, scale, used = self._laplace(start, point, seen)
            n += used
            if all(np.any(np.abs(mode - m) > 3 * sc) for m, sc in modes):
                modes.append((mode, scale))
            far = np.any(np.abs(start - mode) > _FAR_FROM_MODE * scale)
            if far and not any(np.array_equal(start, z) for z, _ in local):
                start_scale, used = self._local_scale(start, point, seen)
                n += used
                local.append((start, start_scale))
        if self.rebuild != "always":
            self._modes = modes[:_MAX_MODES]
        widen = 5.0 * self._widen
        g = MixtureProposal(
            [
                [stats.t(df=2, loc=m, scale=widen * s) for m, s in zip(mode, scale, strict=True)]
                for mode, scale in modes[:_MAX_MODES] + local
            ]
        )
        env = build_envelope(
            lambda z: self.conditional(z, point),
            self.rng,
            self.n_init,
            proposal=g,
            smoothness=self.smoothness,
            delta=self.envelope_error,
            known=(np.array([z for z, _ in seen]), np.array([v for _, v in seen])),
        )
        used = env.n_evaluations
        if self.refine:  # sharpen the envelope on this conditional before using it
            while used < 4 * self.n_init:
                res = draw(
                    env,
                    lambda z: self.conditional(z, point),
                    self.rng,
                    self.n_init,
                    rate=0.5,
                    record=env.design,
                    max_batch=self.n_init,
                )
                used += res.n_evaluations
                env = refit_envelope(env)
        self.envelope = env
        self._rebuild_due = False
        return n + used

    # -- the step ---------------------------------------------------------------------

    def step(self, point):
        """Draw the block from its conditional given the rest of ``point``."""
        x = self.conditional.flatten(point)
        n_evals, rebuilt = 0, False
        if self._rebuild_due or self.rebuild == "always":
            n_evals += self._build(x, point)
            rebuilt = True
        cache: list[float] = []

        def logpdf(z):  # the current point rides along with the first proposals
            if cache:
                return self.conditional(z, point)
            lp = self.conditional(np.concatenate([x[None, :], z]), point)
            cache.append(float(lp[0]))
            return lp[1:]

        env = self.envelope
        res = draw(
            env,
            logpdf,
            self.rng,
            1,
            repair=False,
            rate=self._rate,
            max_proposals=self.max_proposals,
        )
        n_evals += res.n_evaluations + 1
        violations = res.violations
        tried = res.n_tried
        first = len(res.x) > 0 and tried == 1
        y = res.x[0] if len(res.x) else None
        lp_x = cache[0]
        log_e_x = float(env.log_value(x[None, :])[0])
        # the current point is a point where the target is known: E below it is a violation
        below = lp_x - log_e_x
        if below > 1e-12:
            violations += 1
            if self.tune and below > FAR_BELOW:  # rebuild around the current region
                self._rebuild_due = True
        self._rate = 0.9 * self._rate + 0.1 * (1.0 / max(tried, 1))
        self.n_steps += 1
        if self.tune and (self.n_steps & (self.n_steps - 1)) == 0:
            self._rebuild_due = True
        accept, moved = 0.0, False
        if y is not None:
            lp_y, log_e_y = float(res.log_f[0]), float(res.log_e[0])
            log_alpha = (lp_y + min(lp_x, log_e_x)) - (lp_x + min(lp_y, log_e_y))
            accept = float(np.exp(min(0.0, log_alpha))) if np.isfinite(lp_x) else 1.0
            moved = bool(self.rng.random() < accept)
        new, lp_new = (y, lp_y) if moved else (x, lp_x)
        walked, walk_on = False, self._walk_scale is not None
        if walk_on:  # a random-walk Metropolis move, pi-invariant too
            prop = new + self._walk_scale * self.rng.standard_normal(self.dim)
            lp_prop = float(self.conditional(prop[None, :], point)[0])
            n_evals += 1
            if np.log(self.rng.random()) < lp_prop - lp_new:
                new, walked = prop, True
        self._since_move = 0 if (moved or walked) else self._since_move + 1
        if self._since_move >= STUCK_WINDOW:
            n_evals += self._unstick(x, point, below)
        new_point = dict(point)
        new_point.update(self.conditional.unflatten(new))
        stats_ = {
            "accept": accept,
            "accepted": moved,
            "n_evals": n_evals,
            "accepted_first": first,
            "envelope_violations": violations,
            "rebuilt": rebuilt,
            "fallback": walk_on,
            "tune": self.tune,
        }
        return new_point, [stats_]

    def _unstick(self, x: np.ndarray, point: dict, below: float) -> int:
        r"""React to ``STUCK_WINDOW`` steps without a move; return the evaluations used.

        Rebuilds the envelope at the next step with proposal components twice as
        wide (around the current region too: the current point is a start of the
        mode search), and adds to every later step a random-walk Metropolis move on
        the block, :math:`N(0, (2.38^2/d)\,\mathrm{diag}(s^2))` with :math:`s` the
        Laplace scale at the current point. Both kernels leave the conditional
        invariant; each change is made once per stuck window (like the end of
        tuning, a finite adaptation). Warns once per chain.
        """
        scale, used = self._local_scale(x, point)
        self._walk_scale = 2.38 / np.sqrt(self.dim) * scale
        self._widen = min(2.0 * self._widen, _MAX_WIDEN)
        self._rebuild_due = True
        self._since_move = 0
        if not self._warned:
            self._warned = True
            names = [v.name for v in self.vars]
            if below > 0:
                why = (
                    f"the envelope is below the conditional there by a factor "
                    f"exp({below:.3g}), so the Metropolized independence proposal is "
                    "almost never accepted"
                )
            else:
                why = (
                    f"no proposal passed the rejection test within max_proposals="
                    f"{self.max_proposals}: the envelope is far above the conditional"
                )
            warnings.warn(
                f"PliableRejection on {names}: the chain did not move in {STUCK_WINDOW} "
                f"steps (at {x}: {why}). The envelope is rebuilt around the current "
                "region with twice wider proposal components, and every step now also "
                "makes a random-walk Metropolis move on the block (sampler stat "
                "'fallback'). Both keep the conditional invariant, but mixing may be "
                "slow: check the block's posterior, or use pm.NUTS for it",
                RuntimeWarning,
                stacklevel=3,
            )
        return used

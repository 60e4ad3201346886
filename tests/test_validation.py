"""Every public keyword of every step and sampler, given a bad value, is refused clearly.

One table: for each (step or sampler, keyword, bad value) the error type and a
message that names the argument and the value. Models are built once per
module (N = 50). Then the degenerate data (N = 0 refused, N = 1 and 2 drawn),
missing values (NaN or masked data by ``pm.set_data``, NumPy observed data
with NaN) and the models PliableRejection cannot serve.
"""

import re
import warnings

import numpy as np
import pymc as pm
import pytest

from pymc_subsample import (
    ModelSplitError,
    PliableRejection,
    RacingMetropolis,
    SubsampledCategoricalGibbs,
    compare_runs,
    race,
    sample_categorical,
)
from pymc_subsample.options import AuditOptions, ProposalOptions, RaceOptions
from pymc_subsample.prs import PliableRejectionSampler, build_envelope
from pymc_subsample.racing import race_independent
from pymc_subsample.validation import (
    ArgumentTypeError,
    check_bool,
    check_choice,
    check_float,
    check_int,
)

N_OBS = 50


def gibbs_model(n_obs=N_OBS, seed=0):
    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        y = pm.Data("y", rng.normal(size=n_obs))
        q = pm.Categorical("q", p=np.ones(3) / 3)
        z = pm.Normal("z", 0.0, 1.0)
        pm.Deterministic("zz", 2.0 * z)
        pm.Normal("obs", mu=pm.math.stack([-1.0, 0.0, 1.0])[q] + z, sigma=1.0, observed=y)
    return model


def regression_model(n_obs=N_OBS, seed=1):
    rng = np.random.default_rng(seed)
    with pm.Model() as model:
        x = pm.Data("x", rng.normal(size=n_obs))
        y = pm.Data("y", rng.normal(size=n_obs))
        a = pm.Normal("a", 0.0, 10.0)
        b = pm.Normal("b", 0.0, 10.0)
        pm.Normal("obs", a + b * x, 1.0, observed=y)
    return model


@pytest.fixture(scope="module")
def models():
    return {"gibbs": gibbs_model(), "regression": regression_model()}


def build(kind, models, **kwargs):
    """Construct one step or sampler with ``kwargs`` (the bad keyword) over good defaults."""
    if kind == "gibbs":
        m = models["gibbs"]
        kwargs.setdefault("model", m)
        return SubsampledCategoricalGibbs(kwargs.pop("vars", [m["q"]]), **kwargs)
    if kind == "metropolis":
        m = models["regression"]
        kwargs.setdefault("model", m)
        return RacingMetropolis(kwargs.pop("vars", [m["a"], m["b"]]), **kwargs)
    if kind == "pliable":
        m = models["regression"]
        kwargs.setdefault("model", m)
        return PliableRejection(kwargs.pop("vars", [m["a"]]), **kwargs)
    if kind == "prs":
        logpdf = kwargs.pop("logpdf", lambda x: -0.5 * (x**2).sum(axis=1))
        size = kwargs.pop("size", None)
        kwargs.setdefault("bounds", [(-5.0, 5.0)])
        sampler = PliableRejectionSampler(logpdf, n_init=kwargs.pop("n_init", 100), **kwargs)
        return sampler.rvs(size) if size is not None else sampler
    if kind == "build_envelope":
        rng = np.random.default_rng(0)
        n_init = kwargs.pop("n_init", 100)
        logpdf = lambda x: -0.5 * (x**2).sum(axis=1)  # noqa: E731
        return build_envelope(logpdf, rng, n_init, bounds=[(-5.0, 5.0)], **kwargs)
    table = np.random.default_rng(2).normal(size=(3, 40))

    def rewards(arms, idx):
        return table[arms][:, idx]

    if kind == "sample_categorical":
        n_obs = kwargs.pop("n_obs", 40)
        return sample_categorical(np.zeros(3), rewards, n_obs, rng=0, **kwargs)
    if kind == "race":
        n_arms = kwargs.pop("n_arms", 3)
        n_obs = kwargs.pop("n_obs", 40)
        return race(rewards, n_arms, n_obs, rng=0, **kwargs)
    if kind == "race_independent":

        def arm_rewards(arm, idx):
            return table[arm][idx]

        return race_independent(arm_rewards, [40, 30, 20], rng=0, **kwargs)
    if kind == "compare_runs":
        return compare_runs(**{"runs": {"exact": None}, **kwargs})
    if kind in OPTIONS:
        return OPTIONS[kind](**kwargs)
    raise AssertionError(kind)


OPTIONS = {
    "race_options": RaceOptions,
    "audit_options": AuditOptions,
    "proposal_options": ProposalOptions,
}


T, V = ArgumentTypeError, ValueError
RACING_STEP = [  # keywords of the shared base, for both racing steps
    ("delta", 0.0, V),
    ("delta", 1.5, V),
    ("delta", "0.05", T),
    ("race", "fast", T),
    ("race", {"bound": "exact"}, T),
    ("audit", 5, T),
    ("blocked", "yes", T),
    ("data", "y", T),
    ("data", ["nope"], V),  # was a bare KeyError
    ("data", [3], V),
    ("expand_in", 5, T),
    ("model", "model", T),
    ("initial_point", [0.0], T),
    ("compile_kwargs", "fast", T),
    ("rng", "seed", T),
]
RACE_OPTIONS = [  # RaceOptions, the same for both racing steps
    ("bound", "normall", V),
    ("bound", 3, T),
    ("variance", "pooled", V),
    ("batch_size", 1, V),
    ("batch_size", 2.5, V),
    ("batch_size", "50", T),
    ("batch_size", True, T),
    ("reward_range", -1.0, V),
    ("reward_range", float("nan"), V),
    ("reward_range", "big", T),
    ("exact_fraction", 0.0, V),
    ("exact_fraction", 1.5, V),
    ("exact_fraction", "all", T),
    ("batches", "rows", V),
    ("shuffle_every", 0, V),
    ("shuffle_every", "never", T),
    ("backoff", "no", T),  # bool("no") is True: was accepted as on
    ("backoff", 0, T),
]
AUDIT_OPTIONS = [
    ("every", -1, V),
    ("every", 1.5, V),
    ("every", "sometimes", T),
    ("act", "no", T),
]
PROPOSAL_OPTIONS = [
    ("covariance", "eye", T),
    ("covariance", [[1.0, 2.0], [3.0]], T),
    ("covariance", np.ones((2, 3)), V),
    ("path_length", 0.0, V),
    ("path_length", "long", T),
    ("tune_interval", 0, V),
    ("tune_interval", 2.5, V),
    ("gradient_batch", -3, V),  # was a ZeroDivisionError at sampling
    ("gradient_batch", "all", T),
    ("target_accept", 1.0, V),
    ("target_accept", "high", T),
    ("elemwise", "yes", T),
]
CASES = (
    [("gibbs", *case) for case in RACING_STEP]
    + [("metropolis", *case) for case in RACING_STEP]
    + [("race_options", *case) for case in RACE_OPTIONS]
    + [("audit_options", *case) for case in AUDIT_OPTIONS]
    + [("proposal_options", *case) for case in PROPOSAL_OPTIONS]
    + [
        ("gibbs", "control_variates", "no", T),
        ("gibbs", "control_variates", 1, T),
        ("metropolis", "proposal", "hmcc", V),
        ("metropolis", "proposal", 3, T),
        ("metropolis", "scaling", 0.0, V),
        ("metropolis", "scaling", "big", T),
        ("metropolis", "proposal_options", "hmc", T),
        ("metropolis", "control_variates", "no", T),
        ("pliable", "n_init", 0, V),  # was taken as "default"
        ("pliable", "n_init", 5, V),
        ("pliable", "n_init", "many", T),
        ("pliable", "smoothness", -1.0, V),  # was accepted
        ("pliable", "smoothness", 5.0, V),  # was accepted
        ("pliable", "smoothness", "smooth", T),
        ("pliable", "envelope_error", 0.0, V),
        ("pliable", "envelope_error", "0.01", T),
        ("pliable", "refine", "no", T),  # was accepted as on
        ("pliable", "max_dim", 10, V),
        ("pliable", "max_dim", 0, V),
        ("pliable", "max_dim", "3", T),
        ("pliable", "rebuild", "never", V),
        ("pliable", "max_proposals", 0, V),
        ("pliable", "max_proposals", "many", T),
        ("pliable", "blocked", "yes", T),
        ("pliable", "model", "model", T),
        ("pliable", "initial_point", [0.0], T),
        ("pliable", "compile_kwargs", "fast", T),
        ("prs", "logpdf", "normal", TypeError),
        ("prs", "delta", 1.5, V),
        ("prs", "smoothness", 3.0, V),
        ("prs", "smoothness", "2", T),
        ("prs", "envelope_scale", -1.0, V),
        ("prs", "n_init", 3, V),
        ("prs", "n_cells", 1, V),
        ("prs", "refine", "no", T),
        ("prs", "design", "grid", V),
        ("prs", "estimator", "spline", V),
        ("prs", "size", -1, V),
        ("prs", "size", 2.5, V),
        ("build_envelope", "n_init", 3, V),
        ("build_envelope", "design", "grid", V),
        ("sample_categorical", "n_obs", 0, V),
        ("sample_categorical", "delta", 2.0, V),
        ("sample_categorical", "bound", "normall", V),
        ("sample_categorical", "batch_size", 1, V),
        ("sample_categorical", "variance", "pooled", V),
        ("sample_categorical", "reward_range", -1.0, V),
        ("sample_categorical", "exact_after", -1, V),
        ("sample_categorical", "skew_guard", "no", T),
        ("race", "n_arms", 0, V),
        ("race", "n_obs", 0, V),
        ("race", "delta", 0.0, V),
        ("race", "reward_range", "big", T),
        ("race", "exact_after", 2.5, V),
        ("race", "skew_guard", "no", T),
        ("race_independent", "bound", "lilucb", V),
        ("race_independent", "quantile", "student", V),
        ("race_independent", "batch_size", 1, V),
        ("race_independent", "delta", 0.0, V),
        ("compare_runs", "runs", ["idata"], T),
        ("compare_runs", "var_names", 3, T),
    ]
)


@pytest.mark.parametrize(
    ("kind", "keyword", "value", "error"),
    CASES,
    ids=[f"{c[0]}-{c[1]}={c[2]!r}"[:60] for c in CASES],
)
def test_bad_keyword_is_refused_naming_it(models, kind, keyword, value, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            build(kind, models, **{keyword: value})
    message = str(info.value)
    assert keyword in message, message
    # arrays, callables, objects: named by type
    if keyword not in ("covariance", "logpdf", "rng", "race", "audit"):
        shown = value[0] if isinstance(value, list) else value  # the entry at fault
        assert repr(shown) in message or str(shown) in message, message


STEP_OPTIONS = [  # options that are valid alone and refused by the step they are given to
    ("metropolis", {"race": RaceOptions(bound="lilucb")}, V, "lilucb"),
    ("metropolis", {"race": RaceOptions(variance="marginal")}, V, "pairwise"),
    ("metropolis", {"proposal_options": ProposalOptions(covariance=np.eye(3))}, V, r"\(2, 2\)"),
    (
        "metropolis",
        {"proposal_options": ProposalOptions(covariance=np.array([[1.0, 2.0], [2.0, 1.0]]))},
        V,
        "positive definite",
    ),
    (
        "metropolis",
        {"proposal": "langevin", "proposal_options": ProposalOptions(elemwise=True)},
        V,
        r"elemwise=True\) needs proposal='normal'",
    ),
]


@pytest.mark.parametrize(("kind", "kwargs", "error", "match"), STEP_OPTIONS)
def test_options_the_step_cannot_use_are_refused(models, kind, kwargs, error, match):
    with pytest.raises(error, match=match):
        build(kind, models, **kwargs)


MOVED = [  # keywords that left the signatures: the error says where they went
    ("gibbs", "bound", "exact", "race=RaceOptions(bound='exact')"),
    ("gibbs", "batch_size", 500, "race=RaceOptions(batch_size=500)"),
    ("gibbs", "variance", "marginal", "race=RaceOptions(variance='marginal')"),
    ("gibbs", "exact_fraction", 1.0, "race=RaceOptions(exact_fraction=1.0)"),
    ("gibbs", "batches", "random", "race=RaceOptions(batches='random')"),
    ("gibbs", "shuffle_every", 10, "race=RaceOptions(shuffle_every=10)"),
    ("gibbs", "reward_range", 2.0, "race=RaceOptions(reward_range=2.0)"),
    ("gibbs", "backoff", False, "race=RaceOptions(backoff=False)"),
    ("gibbs", "audit_every", 5, "audit=AuditOptions(every=5)"),
    ("gibbs", "elemwise", True, "unexpected keyword argument 'elemwise'"),
    ("gibbs", "boundd", "exact", "unexpected keyword argument 'boundd'"),
    ("metropolis", "bound", "exact", "race=RaceOptions(bound='exact')"),
    ("metropolis", "audit_every", 0, "audit=AuditOptions(every=0)"),
    ("metropolis", "covariance", None, "proposal_options=ProposalOptions(covariance=None)"),
    ("metropolis", "path_length", 1.0, "proposal_options=ProposalOptions(path_length=1.0)"),
    ("metropolis", "tune_interval", 50, "proposal_options=ProposalOptions(tune_interval=50)"),
    ("metropolis", "gradient_batch", 100, "ProposalOptions(gradient_batch=100)"),
    ("metropolis", "target_accept", 0.5, "ProposalOptions(target_accept=0.5)"),
    ("metropolis", "elemwise", True, "proposal_options=ProposalOptions(elemwise=True)"),
    ("pliable", "delta", 0.01, "envelope_error=0.01"),
    ("pliable", "bound", "exact", "unexpected keyword argument 'bound'"),
]


@pytest.mark.parametrize(
    ("kind", "keyword", "value", "fix"),
    MOVED,
    ids=[f"{c[0]}-{c[1]}" for c in MOVED],
)
def test_moved_keyword_names_its_new_place(models, kind, keyword, value, fix):
    with pytest.raises(TypeError) as info:
        build(kind, models, **{keyword: value})
    assert fix in str(info.value), str(info.value)


def test_options_are_validated_once_and_canonical():
    """Fields come out in their canonical types; the objects compare by value."""
    race = RaceOptions(batch_size=np.int64(64), exact_fraction=np.float32(0.5))
    assert type(race.batch_size) is int and type(race.exact_fraction) is float
    assert race == RaceOptions(batch_size=64, exact_fraction=0.5)
    assert RaceOptions().batch_size == "auto" and AuditOptions().every == "auto"
    cov = ProposalOptions(covariance=[[2.0]]).covariance
    assert isinstance(cov, np.ndarray) and cov.shape == (1, 1)


def test_type_errors_are_value_errors_too():
    """Callers that caught the ValueError of the old checks still catch the type errors."""
    with pytest.raises(ValueError, match="backoff must be True or False, got 'no'"):
        check_bool("backoff", "no")
    assert issubclass(ArgumentTypeError, TypeError)


def test_checkers_accept_numpy_and_sentinels():
    assert check_bool("b", np.bool_(False)) is False
    assert check_int("n", np.int32(7), low=1) == 7
    assert check_int("n", 100.0, low=1) == 100
    assert check_int("n", "auto", low=1, special=("auto",)) == "auto"
    assert check_float("x", np.float32(0.5), low=0.0) == 0.5
    assert check_float("x", None, special=(None,)) is None
    assert check_choice("c", "a", ("a", "b")) == "a"
    for bad in ("yes", "no", "True", 1, 0, None, np.array([True])):
        with pytest.raises(ArgumentTypeError, match="must be True or False"):
            check_bool("flag", bad)
    with pytest.raises(ArgumentTypeError, match=r"n must be an integer >= 1, got True"):
        check_int("n", True, low=1)


def test_duplicate_block_variables_are_refused(models):
    gm, rm = models["gibbs"], models["regression"]
    with pytest.raises(ValueError, match="vars lists 'q' more than once"):
        SubsampledCategoricalGibbs([gm["q"], gm["q"]], model=gm)
    # was a PyTensor UnusedInputError
    with pytest.raises(ValueError, match="vars lists 'a' more than once"):
        RacingMetropolis([rm["a"], rm["a"]], model=rm)
    with pytest.raises(ValueError, match="vars lists 'a' more than once"):
        PliableRejection([rm["a"], rm["a"]], model=rm)
    with pytest.raises(ValueError, match="at least one variable|No free random variables"):
        RacingMetropolis([], model=rm)


def test_unknown_data_name_lists_the_data(models):
    with pytest.raises(ValueError, match=r"'nope' is not a variable of the model.*\['y'\]"):
        SubsampledCategoricalGibbs([models["gibbs"]["q"]], model=models["gibbs"], data=["nope"])


def test_unknown_deterministic_lists_them(models):
    m = models["gibbs"]
    with pytest.raises(ValueError, match=r"'nope' is not a variable.*\['zz'\]"):
        SubsampledCategoricalGibbs([m["q"]], model=m, control_variates=True, expand_in=["nope"])


def test_max_dim_message_names_the_limit_that_failed():
    """A 4-D block with the default max_dim (3): the message says which limit it broke."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0, shape=4)
        pm.Normal("obs", mu, 1.0, observed=np.zeros((5, 4)))
    with pytest.raises(ValueError, match=r"4 dimensions, above max_dim=3"):
        PliableRejection([mu], model=model)
    with pytest.raises(ValueError, match=r"max_dim must be an integer in \[1, 3\], got 10"):
        PliableRejection([mu], model=model, max_dim=10)  # was "4 dimensions, above max_dim=10"


def test_pliable_refuses_empty_and_discrete_blocks():
    with pm.Model() as model:
        empty = pm.Normal("empty", 0.0, 1.0, shape=0)
        k = pm.Bernoulli("k", 0.5)
        pm.Normal("obs", k, 1.0, observed=np.zeros(5))
    with pytest.raises(ValueError, match=r"\['empty'\] has no elements \(size 0\)"):
        PliableRejection([empty], model=model)
    with pytest.raises(ValueError, match="'k' is discrete.*SubsampledCategoricalGibbs"):
        PliableRejection([k], model=model)


# -- degenerate data ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gibbs", "metropolis"])
def test_no_observations_is_refused_at_construction(kind):
    """N = 0: was a ZeroDivisionError at the first draw."""
    model = gibbs_model(0) if kind == "gibbs" else regression_model(0)
    with pytest.raises(ModelSplitError, match=r"no observations \(N = 0\)"):
        build(kind, {"gibbs": model, "regression": model})


@pytest.fixture(scope="module")
def steps():
    """One racing step of each kind on its own model (N = 50), reused by the data tests."""
    built = {}
    for kind, model in (("gibbs", gibbs_model(seed=5)), ("metropolis", regression_model(seed=6))):
        built[kind] = (build(kind, {"gibbs": model, "regression": model}), model)
    return built


def set_rows(model, n_obs, seed=7):
    """Give every pm.Data input of the model ``n_obs`` new rows (one pm.set_data call)."""
    rng = np.random.default_rng(seed)
    names = [n for n in ("x", "y") if n in model.named_vars]
    with model:
        pm.set_data({n: rng.normal(size=n_obs) for n in names})


def draw(step, model, n_draws=3):
    point = dict(model.initial_point())
    for _ in range(n_draws):
        point, _ = step.step(point)
    return point


@pytest.mark.parametrize("kind", ["gibbs", "metropolis"])
def test_one_or_two_observations_draw(steps, kind):
    """N = 2, then N = 1 (new data taken up by the step): draws run and stay finite."""
    step, model = steps[kind]
    try:
        for n_obs in (2, 1):
            set_rows(model, n_obs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "the data changed": expected here
                point = draw(step, model)
            assert step.terms.n_obs == n_obs
            assert all(np.isfinite(v).all() for v in point.values())
    finally:
        set_rows(model, N_OBS)


def test_no_observations_by_set_data_is_refused(steps):
    step, model = steps["metropolis"]
    try:
        set_rows(model, 0)
        with pytest.raises(ValueError, match=r"no observations \(N = 0\)"):
            draw(step, model)
    finally:
        set_rows(model, N_OBS)


MISSING = {
    "nan": lambda y: np.where(np.arange(len(y)) == 3, np.nan, y),
    "masked": lambda y: np.ma.masked_array(y, mask=np.arange(len(y)) == 3),
}


@pytest.mark.parametrize("missing", sorted(MISSING))
@pytest.mark.parametrize("kind", ["gibbs", "metropolis"])
def test_missing_values_set_anew_get_one_clear_message(steps, kind, missing):
    """NaN or masked data by pm.set_data: was a NumbaTypeError on numpy.ma.MaskedArray."""
    step, model = steps[kind]
    y = model["y"].get_value()
    try:
        with model:
            pm.set_data({"y": MISSING[missing](y)})
        with pytest.raises(ModelSplitError, match=r"'y' holds missing values") as info:
            draw(step, model)
        assert "drop those rows" in str(info.value)
        assert "outside the subsampled likelihood" in str(info.value)
    finally:
        with model:
            pm.set_data({"y": y})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draw(step, model, 1)  # good data again: taken up at the next draw


@pytest.mark.parametrize("missing", sorted(MISSING))
def test_numpy_observed_with_missing_values_gets_the_real_options(missing):
    """PyMC imputes NumPy data with NaN; the advice is not 'wrap it in pm.Data' (refused too)."""
    y = MISSING[missing](np.random.default_rng(4).normal(size=20))
    with pm.Model() as model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = pm.Normal("a", 0.0, 1.0)
        pm.Normal("obs", a, 1.0, observed=y)
    with pytest.raises(ModelSplitError) as info:
        RacingMetropolis([a], model=model)
    message = str(info.value)
    assert "'obs'" in message and "missing values" in message
    assert "drop those rows" in message and "outside the subsampled likelihood" in message
    assert not re.search(r"wrap it in pm\.Data", message)

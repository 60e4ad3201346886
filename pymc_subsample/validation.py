"""Checks of the keywords of every step and sampler, with messages that say how to fix them.

Pure Python and NumPy (no PyMC import), so that :mod:`pymc_subsample.racing`
and :mod:`pymc_subsample.prs` use it too. Each checker takes the argument's
name and value, returns the value in its canonical type (``int``, ``float``,
``bool``) and raises, naming the argument, the value given and a valid
example:

- :class:`ArgumentTypeError` (a ``TypeError`` and a ``ValueError``) for a
  value of the wrong type, e.g. ``backoff="no"``, ``batch_size="50"``;
- ``ValueError`` for a value of the right type outside the accepted range or
  set, e.g. ``smoothness=5``, ``bound="normall"``.

Strings are never read as numbers or booleans, and booleans never as
numbers: ``"no"`` is not False and ``True`` is not 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "ArgumentTypeError",
    "check_bool",
    "check_choice",
    "check_float",
    "check_instance",
    "check_int",
    "check_probability",
]


class ArgumentTypeError(TypeError, ValueError):
    """A keyword of the wrong type.

    A ``TypeError``, and a ``ValueError`` as well, so that code that caught
    the ``ValueError`` these checks raised before keeps working.
    """


def _special(value, special: Sequence) -> bool:
    """Return True when ``value`` is one of the sentinels ``special`` (None, "auto")."""
    for s in special:
        if value is s or (isinstance(value, str) and isinstance(s, str) and value == s):
            return True
    return False


def _or_special(special: Sequence) -> str:
    return "".join(f" or {s!r}" for s in special)


def _is_number(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _range_text(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        left, right = ("(" if low_open else "["), (")" if high_open else "]")
        return f" in {left}{low:g}, {high:g}{right}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def check_int(
    name: str,
    value,
    *,
    low: int | None = None,
    high: int | None = None,
    example=None,
    special: Sequence = (),
    why: str = "",
):
    """Return ``value`` as an ``int``; raise unless it is an integer in ``[low, high]``.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value
        The value given. Python and NumPy integers are accepted, and floats
        with an integer value (``100.0``); booleans and strings are not.
    low, high : int, optional
        Inclusive bounds.
    example : optional
        A valid value, for the message (default: ``low``, else 1).
    special : sequence, optional
        Sentinels returned unchanged (``None``, ``"auto"``).
    why : str
        Appended to the message (the reason for the range, say).

    Returns
    -------
    int or a sentinel of ``special``

    Raises
    ------
    ArgumentTypeError
        For a value that is not an integer (nor a sentinel).
    ValueError
        For an integer outside ``[low, high]``.
    """
    if _special(value, special):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    example = (low if low is not None else 1) if example is None else example
    want = f"an integer{_range_text(low, high, False, False)}{_or_special(special)}"
    tail = f"; e.g. {name}={example!r}{why}"
    if not _is_number(value):
        raise ArgumentTypeError(f"{name} must be {want}, got {value!r}{tail}")
    if not math.isfinite(value) or int(value) != value:
        raise ValueError(f"{name} must be {want}, got {value!r}{tail}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {want}, got {value!r}{tail}")
    return value


def check_float(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    example=None,
    special: Sequence = (),
    why: str = "",
):
    """Return ``value`` as a ``float``; raise unless it is a finite number in the range.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value
        The value given: a Python or NumPy number (or a 0-d array of one);
        booleans and strings are refused.
    low, high : float, optional
        Bounds, inclusive unless ``low_open`` / ``high_open``.
    low_open, high_open : bool
        Exclude the bound itself.
    example : optional
        A valid value, for the message.
    special : sequence, optional
        Sentinels returned unchanged (``None``, ``"auto"``).
    why : str
        Appended to the message.

    Returns
    -------
    float or a sentinel of ``special``

    Raises
    ------
    ArgumentTypeError
        For a value that is not a number (nor a sentinel).
    ValueError
        For NaN, an infinity or a number outside the range.
    """
    if _special(value, special):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if example is None:
        example = 1.0 if low is None else (low + 1.0 if high is None else (low + high) / 2)
    want = f"a finite number{_range_text(low, high, low_open, high_open)}{_or_special(special)}"
    tail = f"; e.g. {name}={example!r}{why}"
    if not _is_number(value):
        raise ArgumentTypeError(f"{name} must be {want}, got {value!r}{tail}")
    value = float(value)
    bad = not math.isfinite(value)
    if low is not None:
        bad |= value <= low if low_open else value < low
    if high is not None:
        bad |= value >= high if high_open else value > high
    if bad:
        raise ValueError(f"{name} must be {want}, got {value!r}{tail}")
    return value


def check_probability(name: str, value, *, example: float = 0.05, special: Sequence = ()):
    """Return ``value`` as a ``float``; raise unless it lies in the open interval (0, 1).

    As :func:`check_float` with ``low=0, high=1`` both open: "``name`` must lie
    in (0, 1), got ...".
    """
    if _special(value, special):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    message = (
        f"{name} must lie in (0, 1){_or_special(special)}, got {value!r}; e.g. {name}={example!r}"
    )
    if not _is_number(value):
        raise ArgumentTypeError(message)
    if not 0.0 < float(value) < 1.0:  # NaN too
        raise ValueError(message)
    return float(value)


def check_bool(name: str, value, *, example: bool = True) -> bool:
    """Return ``value`` as a ``bool``; raise unless it is a Python or NumPy boolean.

    ``"no"``, ``"False"``, ``0`` and ``1`` are refused: ``bool("no")`` is True,
    so reading them as booleans would turn an intended "off" into "on".

    Raises
    ------
    ArgumentTypeError
        For anything but ``True``, ``False`` and NumPy booleans.
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise ArgumentTypeError(f"{name} must be True or False, got {value!r}; e.g. {name}={example!r}")


def check_choice(name: str, value, choices: Sequence, *, example=None):
    """Return ``value``; raise unless it is one of ``choices`` (strings, or None).

    Raises
    ------
    ArgumentTypeError
        For a value of another type than the choices (a number for a string).
    ValueError
        For a string that is not among them.
    """
    if any(_special(value, [c]) for c in choices):
        return value
    example = choices[0] if example is None else example
    text = ", ".join(repr(c) for c in choices)
    message = f"unknown {name} {value!r}: {name} must be one of {text}; e.g. {name}={example!r}"
    if not isinstance(value, str) and value is not None:
        raise ArgumentTypeError(message)
    raise ValueError(message)


def check_instance(name: str, value, kind: type | tuple, *, example: str, none_ok: bool = True):
    """Return ``value``; raise unless it is an instance of ``kind`` (or None with ``none_ok``).

    ``example`` is the text of a valid value in the message (e.g. ``"{'mode': 'FAST_RUN'}"``).

    Raises
    ------
    ArgumentTypeError
        For a value of another type.
    """
    if (value is None and none_ok) or isinstance(value, kind):
        return value
    kinds = kind if isinstance(kind, tuple) else (kind,)
    text = " or ".join(k.__name__ for k in kinds) + (" or None" if none_ok else "")
    raise ArgumentTypeError(f"{name} must be a {text}, got {value!r}; e.g. {name}={example}")

"""Checks of an environment's options (``env_cfg.env_kwargs``, ``--set env_kwargs.NAME=VALUE``)
against the options its source knows, shared by the adapters of JaxMARL, Brax and EnvPool.

Their constructors do not check for kitae: JaxMARL's MPE constructors take ``**kwargs`` and ignore
the names they do not read, a mistyped value passes until a program using it is compiled, and
EnvPool and Brax answer in pybind's or Python's words, naming neither ``env_kwargs`` nor what is
allowed. ``check_options`` refuses an unknown name or a value of another type than the option's
default before the environment is made; ``refused`` words an error the library's constructor
raised for the given options.
"""

from __future__ import annotations

import ast
import inspect
import numbers
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kitae.validation import closest_names

NO_DEFAULT = inspect.Parameter.empty
"""The default of an option whose type is not known: any value of it is let through."""

LIBRARY_REFUSALS = (AssertionError, KeyError, NotImplementedError, TypeError, ValueError)
"""What a library's constructor raises for an option value it does not take (JaxMARL's
``NotImplementedError`` for an unknown ``action_type``, its ``assert``s, Python's ``TypeError``)."""

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def constructor_options(cls: type) -> dict[str, Any]:
    """The keyword options ``cls(...)`` takes: name -> default (``NO_DEFAULT`` where it has none).

    They are the named parameters of ``cls.__init__`` (``self`` skipped) and, while each
    ``__init__`` takes ``**kwargs``, those of the base classes' ``__init__``s along the MRO (the
    first one met gives the default), with the names an ``__init__`` reads from its ``**kwargs``
    (``kwargs["rad"]``, ``"rad" in kwargs``, ``kwargs.get("rad")``: JaxMARL's ``SimpleMPE``).
    Empty where no constructor names any: nothing is learned, so ``check_options`` refuses no name.
    """
    options: dict[str, Any] = {}
    read: list[str] = []  # after the named ones: a base's parameter gives the type of a name read
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if klass is object or init is None:
            continue
        try:
            parameters = list(inspect.signature(init).parameters.values())[1:]
        except (TypeError, ValueError):  # a constructor written in C: no signature to read
            break
        for parameter in parameters:
            if parameter.kind in _NAMED:
                options.setdefault(parameter.name, parameter.default)
        var_keyword = [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
        if not var_keyword:  # the names stop here: nothing goes further up
            break
        read += _names_read(init, var_keyword[0])
    return {**dict.fromkeys(read, NO_DEFAULT), **options}


def _names_read(function: Any, kwargs: str) -> list[str]:
    """The constant keys ``function`` reads from its ``**kwargs`` dict named ``kwargs``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):  # no source (a compiled or generated function)
        return []

    def is_kwargs(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == kwargs

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_kwargs(node.value):
            key: ast.AST = node.slice
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and is_kwargs(node.comparators[0])
        ):
            key = node.left
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and is_kwargs(node.func.value)
            and node.args
        ):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.append(key.value)
    return names


def _kind(default: Any) -> tuple[str, tuple[type, ...]] | None:
    """``(what is allowed, the types allowed)`` for an option with this default; ``None`` for a
    default of another type (``None``, a tuple, an enum, an array: any value is let through)."""
    if isinstance(default, (bool, np.bool_)):
        return "a bool", (bool, np.bool_)
    if isinstance(default, numbers.Integral):
        return "an int", (numbers.Integral,)
    if isinstance(default, numbers.Real):
        return "a float or an int", (numbers.Real,)
    if isinstance(default, str):
        return "a str", (str,)
    return None


def check_options(
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    where: str,
    *,
    choices: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """Refuses options ``where`` (``"JaxMARL's 'MPE_simple_spread_v3'"``) does not take.

    Args:
        kwargs: the options given (``env_kwargs``).
        options: the options allowed, name -> default (``constructor_options``); a value must
            have its default's type (a bool, an int, a float or an int, a str; ``NO_DEFAULT`` or a
            default of another type: any). Empty: nothing known, no name refused.
        where: the source and environment, for the messages.
        choices: name -> the values allowed, where the source has a fixed set.

    Raises:
        ValueError: for names not in ``options`` (listing them, with the closest names), or a
            value not in its ``choices``.
        TypeError: for a value of another type than its option's default.
    """
    unknown = sorted(set(kwargs) - set(options)) if options else []
    if unknown:
        hint = closest_names(unknown[0], options) if len(unknown) == 1 else ""
        raise ValueError(
            f"env_kwargs {unknown} are not options of {where}; allowed: {', '.join(sorted(options))}{hint}"
        )
    for name, value in kwargs.items():
        kind = _kind(options.get(name, NO_DEFAULT))
        if kind is not None:
            what, types = kind
            if not isinstance(value, types) or (isinstance(value, (bool, np.bool_)) and what != "a bool"):
                raise TypeError(
                    f"env_kwargs.{name}={value!r} is not allowed; allowed: {what} "
                    f"(the type of its default, {options[name]!r}, in {where})"
                )
        allowed = (choices or {}).get(name)
        if allowed is not None and value not in allowed:
            hint = closest_names(value, allowed) if isinstance(value, str) else ""
            raise ValueError(
                f"env_kwargs.{name}={value!r} is not allowed; allowed: {' or '.join(map(repr, allowed))}{hint}"
            )


def refused(kwargs: Mapping[str, Any], where: str, error: BaseException) -> ValueError:
    """The ``ValueError`` to raise, ``from error``, where the library's constructor refused the
    options ``kwargs`` with ``error`` (one of ``LIBRARY_REFUSALS``): it names them and gives the
    library's own words, which say what was wrong."""
    given = ", ".join(f"env_kwargs.{name}={value!r}" for name, value in kwargs.items())
    verb, pronoun = ("is", "it") if len(kwargs) == 1 else ("are", "them")
    return ValueError(f"{given} {verb} not allowed: {where} refused {pronoun} ({type(error).__name__}: {error})")


__all__ = ["LIBRARY_REFUSALS", "NO_DEFAULT", "check_options", "constructor_options", "refused"]

"""PettingZoo environment ids: ``pettingzoo:<module path>``.

The id names the module that holds the environment's ``parallel_env`` maker, as PettingZoo's own
imports do, without the ``pettingzoo.`` prefix for PettingZoo's families:

* ``pettingzoo:mpe2.simple_spread_v3``: the Multi-Particle Environments, which moved from
  ``pettingzoo.mpe`` to the ``mpe2`` package (``from mpe2 import simple_spread_v3``);
* ``pettingzoo:sisl.pursuit_v5``, ``pettingzoo:butterfly.cooperative_pong_v6``: PettingZoo's
  families ``sisl``, ``butterfly``, ``classic``, ``atari`` (``from pettingzoo.sisl import
  pursuit_v5``); the long form ``pettingzoo:pettingzoo.sisl.pursuit_v5`` is accepted too.

Only these packages are looked in (an id from a config file never imports an arbitrary module).
The module must have a ``parallel_env`` function; keyword arguments for it (``N=3``,
``continuous_actions=True``, ``max_cycles=25``) go through ``make_vec_env(..., env_kwargs=...)``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Callable
from typing import Any

from kitae.envs.options import LIBRARY_REFUSALS, refused

PETTINGZOO_FAMILIES = ("atari", "butterfly", "classic", "sisl")
"""PettingZoo's own environment families (``pettingzoo.<family>.<env>``)."""
PACKAGES = ("mpe2",)
"""Packages of PettingZoo environments outside PettingZoo (``<package>.<env>``)."""

_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_FORMS = (
    "'pettingzoo:mpe2.<env>' (e.g. mpe2.simple_spread_v3) or 'pettingzoo:<family>.<env>' with family in "
    + ", ".join(PETTINGZOO_FAMILIES)
    + " (e.g. sisl.pursuit_v5)"
)


def _module_name(name: str) -> tuple[str, str]:
    """``"sisl.pursuit_v5"`` -> ``("pettingzoo.sisl.pursuit_v5", "pettingzoo.sisl")``: the module
    to import and its package."""
    if not isinstance(name, str) or not _MODULE_PATH.match(name):
        raise ValueError(f"PettingZoo environment {name!r} is not allowed; allowed: {_FORMS}")
    parts = name.split(".")
    if parts[0] == "pettingzoo":
        parts = parts[1:]
    if len(parts) == 2 and parts[0] in PACKAGES:
        return name, parts[0]
    if len(parts) == 2 and parts[0] in PETTINGZOO_FAMILIES:
        return f"pettingzoo.{parts[0]}.{parts[1]}", f"pettingzoo.{parts[0]}"
    raise ValueError(f"unknown PettingZoo environment {name!r}; allowed: {_FORMS}")


def _available(package: str) -> list[str]:
    try:
        module = importlib.import_module(package)
    except ImportError:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(getattr(module, "__path__", [])) if re.search(r"_v\d+$", m.name))


def parallel_env_maker(name: str) -> Callable[..., Any]:
    """The ``parallel_env`` function of a PettingZoo environment id's module.

    Args:
        name: the id without ``pettingzoo:``, e.g. ``"mpe2.simple_spread_v3"`` or ``"sisl.pursuit_v5"``.

    Raises:
        ValueError: for an id of another form, a package that is not installed (saying what to
            install), an unknown environment (listing the package's), or a module without
            ``parallel_env``.
    """
    module_name, package = _module_name(name)
    root = package.split(".")[0]
    if importlib.util.find_spec(root) is None:
        raise ValueError(
            f"PettingZoo environment {name!r} needs the {root!r} package, which is not installed: "
            "pip install 'kitae[pettingzoo]'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if not (module_name == missing or module_name.startswith(missing + ".")):  # a dependency of the env
            family = package.split(".")[1] if package.startswith("pettingzoo.") else ""
            extra = f" (PettingZoo's extra: pip install 'pettingzoo[{family}]==1.27.0')" if family else ""
            raise ValueError(
                f"PettingZoo environment {name!r} needs the package {error.name!r}{extra}: {error}"
            ) from None
        known = _available(package)
        raise ValueError(
            f"unknown PettingZoo environment {name!r}: no module {module_name!r}; "
            f"{package} has: {', '.join(known) if known else 'nothing importable here'}"
        ) from None
    maker = getattr(module, "parallel_env", None)
    if not callable(maker):
        raise ValueError(
            f"PettingZoo environment {name!r} has no parallel_env (an AEC-only environment); kitae trains "
            "PettingZoo's Parallel API"
        )
    return maker


def make_with_options(maker: Callable[..., Any], env_kwargs: dict[str, Any], name: str) -> Any:
    """``maker(**env_kwargs)``, where a refusal of the options by PettingZoo's constructor names
    them (``kitae.envs.options.refused``): its own words name neither ``env_kwargs`` nor the
    option (``'str' object cannot be interpreted as an integer`` for ``N='abc'``). Module-level, so
    that ``SubProcVecParallelEnv`` can send it to its workers."""
    try:
        return maker(**env_kwargs)
    except LIBRARY_REFUSALS as error:
        if not env_kwargs:
            raise
        raise refused(env_kwargs, f"PettingZoo's {name!r}", error) from error


def make_parallel_vec_env(
    name: str, n_envs: int, *, vectorization_mode: str = "sync", env_kwargs: dict[str, Any] | None = None
) -> Any:
    """``n_envs`` copies of a PettingZoo environment as a ``kitae.envs.parallel.VecParallelEnv``.

    Args:
        name: the id without ``pettingzoo:`` (module docstring).
        n_envs: copies (>= 1).
        vectorization_mode: ``"sync"`` (``SyncVecParallelEnv``, in this process) or ``"async"``
            (``SubProcVecParallelEnv``, one worker process per copy).
        env_kwargs: keyword arguments of the module's ``parallel_env``.

    Returns:
        The vector environment; its ``num_agents`` is what ``EnvConfig.n_agents`` wants.
    """
    from kitae.envs.parallel import SyncVecParallelEnv
    from kitae.envs.subproc import SubProcVecParallelEnv

    maker = parallel_env_maker(name)
    thunks = [functools.partial(make_with_options, maker, dict(env_kwargs or {}), name) for _ in range(n_envs)]
    if vectorization_mode == "sync":
        return SyncVecParallelEnv(thunks)
    return SubProcVecParallelEnv(thunks)

"""The built-in algorithms: A2C, DDPG, DQN, MPO, PPO, recurrent PPO (``ppo_lstm``), RND-PPO
(``rnd_ppo``), SAC (discrete SAC on a ``Discrete`` space) and TD3, each one module built from the
four factories.

``ALGORITHMS`` maps a name (what ``kitae train`` takes) to the agent class; ``get_algorithm(name)``
returns the agent class and its params class; ``algorithm_name(config)`` the name of a config's
algorithm. ``register_algorithm(name, agent_cls, params_cls)`` adds a user's own agent under a new
name, so the command line trains, resumes and evaluates it too (``kitae ... --import MODULE``).
Importing this package imports the algorithms' modules, which registers their params classes
(``kitae.config.register_algo_params``), so a saved ``config.yaml`` of any of them loads.
"""

from __future__ import annotations

from typing import Any

import kitae.algos.collections.sac_discrete  # noqa: F401  (registers discrete SAC with SAC)
from kitae.algos.collections.a2c import A2C, A2CParams
from kitae.algos.collections.ddpg import DDPG, DDPGParams
from kitae.algos.collections.dqn import DQN, DQNParams
from kitae.algos.collections.mpo import MPO, MPOParams
from kitae.algos.collections.ppo import PPO, PPOParams
from kitae.algos.collections.recurrent_ppo import RecurrentPPO, RecurrentPPOParams
from kitae.algos.collections.rnd_ppo import RNDPPO, RNDPPOParams
from kitae.algos.collections.sac import SAC, SACParams
from kitae.algos.collections.td3 import TD3, TD3Params
from kitae.config import algo_params_class

__all__ = ["ALGORITHMS", "get_algorithm", "algorithm_name", "register_algorithm"]

ALGORITHMS: dict[str, tuple[type, type]] = {
    "a2c": (A2C, A2CParams),
    "ddpg": (DDPG, DDPGParams),
    "dqn": (DQN, DQNParams),
    "mpo": (MPO, MPOParams),
    "ppo": (PPO, PPOParams),
    "ppo_lstm": (RecurrentPPO, RecurrentPPOParams),
    "rnd_ppo": (RNDPPO, RNDPPOParams),
    "sac": (SAC, SACParams),
    "td3": (TD3, TD3Params),
}
"""``{name: (agent class, params class)}``: the built-in algorithms, then those ``register_algorithm`` adds."""

BUILT_IN = tuple(ALGORITHMS)
"""The names of kitae's own algorithms (a registered one cannot take them)."""


def register_algorithm(name: str, agent_cls: type, params_cls: type) -> None:
    """Makes a custom agent an algorithm of the command line, under ``name``: ``kitae train NAME
    ENV --import MODULE`` (MODULE: where this call is made) trains it with its params class's
    defaults (there is no preset file: ``--config`` and ``--set`` give the rest), and ``kitae
    resume``, ``eval``, ``sweep`` and ``tune`` rebuild it from a run's ``config.yaml``, whose
    ``algo_params_class`` names ``params_cls``. Registers ``params_cls`` with
    ``kitae.config.register_algo_params`` too. Registering the same pair again does nothing.

    Args:
        name: lower-case letters, digits and ``_``, starting with a letter; not a built-in's.
        agent_cls: the agent class (a ``kitae.base.BaseAgent``, made as ``agent_cls(run_name,
            config, run_dir=...)`` or ``agent_cls(run_name, config)``).
        params_cls: its ``algo_params`` dataclass.

    Raises:
        ValueError: naming what is wrong: the name, a built-in's name or one taken by another
            pair, a class that is not an agent, params that are not a dataclass.
    """
    import dataclasses
    import re

    from kitae.base import BaseAgent
    from kitae.config import register_algo_params

    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(
            f"name={name!r} is not allowed; allowed: lower-case letters, digits and _, starting with a letter"
        )
    if not (isinstance(agent_cls, type) and issubclass(agent_cls, BaseAgent)):
        raise ValueError(f"agent_cls={agent_cls!r} is not allowed; allowed: a subclass of kitae.base.BaseAgent")
    if not (isinstance(params_cls, type) and dataclasses.is_dataclass(params_cls)):
        raise ValueError(f"params_cls={params_cls!r} is not allowed; allowed: a dataclass (the agent's algo_params)")
    if name in BUILT_IN:
        raise ValueError(f"name={name!r} is kitae's own algorithm; allowed: another name")
    if name in ALGORITHMS and ALGORITHMS[name] != (agent_cls, params_cls):
        taken = ALGORITHMS[name][0]
        raise ValueError(f"name={name!r} is registered already, for {taken.__module__}.{taken.__qualname__}")
    register_algo_params(params_cls)
    ALGORITHMS[name] = (agent_cls, params_cls)


def get_algorithm(name: str) -> tuple[type, type]:
    """``(agent class, params class)`` of an algorithm, built-in or registered (case-insensitive name).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[key]


def algorithm_name(config: Any) -> str | None:
    """The algorithm (built-in or registered) whose params class ``config.algo_params`` is, or ``None``."""
    for name, (_, params_cls) in ALGORITHMS.items():
        if type(config.algo_params) is params_cls:
            return name
    return None


def algorithm_of_params_name(name: str) -> str | None:
    """The algorithm (built-in or registered) whose params class ``config.yaml`` names ``name`` (its
    ``algo_params_class``, ``kitae.config.params_class_name``), or ``None``. The name is read as
    ``kitae.config.algo_params_class`` reads it, so a script's ``__main__:MyParams`` names the
    class of the module ``--import`` loaded from that script, as ``unserialize`` finds it."""
    try:
        cls = algo_params_class(name)
    except ValueError:  # no registered class of that name
        return None
    for algo, (_, params_cls) in ALGORITHMS.items():
        if params_cls is cls:
            return algo
    return None

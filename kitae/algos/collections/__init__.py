"""The built-in algorithms: A2C, DDPG, DQN, MPO, PPO, recurrent PPO (``ppo_lstm``), RND-PPO
(``rnd_ppo``), SAC (discrete SAC on a ``Discrete`` space) and TD3, each one module built from the
four factories.

``ALGORITHMS`` maps a name (what ``kitae train`` takes) to the agent class; ``get_algorithm(name)``
returns the agent class and its params class; ``algorithm_name(config)`` the name of a config's
algorithm. Importing this package imports the four modules, which registers their params classes
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
from kitae.config import params_class_name

__all__ = ["ALGORITHMS", "get_algorithm", "algorithm_name"]

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
"""``{name: (agent class, params class)}``."""


def get_algorithm(name: str) -> tuple[type, type]:
    """``(agent class, params class)`` of a built-in algorithm (case-insensitive name).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[key]


def algorithm_name(config: Any) -> str | None:
    """The built-in algorithm whose params class ``config.algo_params`` is, or ``None``."""
    for name, (_, params_cls) in ALGORITHMS.items():
        if type(config.algo_params) is params_cls:
            return name
    return None


def algorithm_of_params_name(name: str) -> str | None:
    """The built-in algorithm whose params class ``config.yaml`` names ``name`` (its
    ``algo_params_class``, ``kitae.config.params_class_name``), or ``None``."""
    for algo, (_, params_cls) in ALGORITHMS.items():
        if params_class_name(params_cls) == name:
            return algo
    return None

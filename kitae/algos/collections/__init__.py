"""The built-in algorithms: DQN, PPO, SAC and TD3, each one module built from the four factories.

``ALGORITHMS`` maps a name to the module that holds it; ``get_algorithm(name)`` returns the
agent class and its params class.
"""

from __future__ import annotations

import importlib

ALGORITHMS = {
    "dqn": ("kitae.algos.collections.dqn", "DQN", "DQNParams"),
    "ppo": ("kitae.algos.collections.ppo", "PPO", "PPOParams"),
    "sac": ("kitae.algos.collections.sac", "SAC", "SACParams"),
    "td3": ("kitae.algos.collections.td3", "TD3", "TD3Params"),
}


def get_algorithm(name: str) -> tuple[type, type]:
    """``(agent class, params class)`` of a built-in algorithm (case-insensitive name).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}")
    module_name, agent_name, params_name = ALGORITHMS[key]
    module = importlib.import_module(module_name)
    return getattr(module, agent_name), getattr(module, params_name)

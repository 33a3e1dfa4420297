"""The stateless functional agent API of seed 002 (``kitae.functional``).

Agents that are nothing but pure functions over explicit parameters, policy state and optimizer
state, for users who write their own loop: ``init_params(rng)``, ``init_policy(rng)``,
``init_optimizer(params, rng)``, ``predict(params, policy_state, obs, key, evaluation)``,
``update(params, optimizer_state, data)`` and ``jit()``. Each is a thin layer over the
collection's algorithm (``kitae.algos.collections``): one implementation, two faces. Guide:
``docs/functional.md``.
"""

from kitae.functional.a2c import A2C
from kitae.functional.base import BaseAgent, Network, OptimState, make_network
from kitae.functional.ddpg import DDPG
from kitae.functional.dqn import DQN
from kitae.functional.mpo import MPO
from kitae.functional.ppo import PPO
from kitae.functional.rnd_ppo import RNDPPO
from kitae.functional.sac import SAC
from kitae.functional.td3 import TD3

__all__ = [
    "BaseAgent",
    "OptimState",
    "Network",
    "make_network",
    "A2C",
    "DDPG",
    "DQN",
    "MPO",
    "PPO",
    "RNDPPO",
    "SAC",
    "TD3",
]

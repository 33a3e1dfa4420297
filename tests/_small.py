"""Small networks and batches for tests that train through the command line.

A test of a run's bits (determinism, resume, checkpoints) does not need the presets' [256, 256]
networks and batches of 256: with them, most of such a test's time is arithmetic. ``small(algo)``
gives the ``--set`` arguments that shrink one algorithm's networks and batch, so the test keeps to
its point.
"""

from __future__ import annotations

_FIELDS: dict[str, tuple[str, ...]] = {
    "sac": ("algo_params.policy_hidden=[32]", "algo_params.q_hidden=[32]", "update_cfg.batch_size=32"),
    "td3": ("algo_params.actor_hidden=[32]", "algo_params.critic_hidden=[32]", "update_cfg.batch_size=32"),
    "ddpg": ("algo_params.actor_hidden=[32]", "algo_params.critic_hidden=[32]", "update_cfg.batch_size=32"),
    "mpo": ("algo_params.actor_hidden=[32]", "algo_params.critic_hidden=[32]", "update_cfg.batch_size=32"),
}


def small(algo: str) -> list[str]:
    """``["--set", "FIELD=VALUE", ...]`` shrinking ``algo``'s networks and batch (``algo`` one of
    ``sac``, ``td3``, ``ddpg``, ``mpo``)."""
    return [arg for field in _FIELDS[algo] for arg in ("--set", field)]

"""Episode returns and lengths, tracked from rewards and episode ends.

One function serves both loops: the host loop calls it with numpy arrays, the compiled loop with
traced JAX arrays (``xp`` is the array module). kitae tracks episodes itself rather than reading
Gymnasium's ``RecordEpisodeStatistics``: in gymnasium 1.3 that wrapper drops the first reward of
every episode after the first when the vector environment resets in ``SAME_STEP`` mode.
"""

from __future__ import annotations

from typing import Any


def track_episodes(xp: Any, returns: Any, lengths: Any, rewards: Any, ended: Any) -> tuple[Any, Any, Any, Any]:
    """Adds one step to each environment's running episode.

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        returns: ``(E,)`` running returns before this step.
        lengths: ``(E,)`` running lengths before this step.
        rewards: ``(E,)`` this step's rewards.
        ended: ``(E,)`` bool: the episode terminated or was truncated at this step.

    Returns:
        ``(returns, lengths, episode_returns, episode_lengths)``: the running values after the
        step (zero where an episode ended) and each environment's finished episode's return and
        length (meaningful where ``ended``).
    """
    episode_returns = returns + rewards
    episode_lengths = lengths + 1
    return (
        xp.where(ended, 0.0, episode_returns).astype(returns.dtype),
        xp.where(ended, 0, episode_lengths).astype(lengths.dtype),
        episode_returns,
        episode_lengths,
    )

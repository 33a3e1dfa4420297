"""Recurrent cores: Flax's LSTM and GRU cells with the hidden state an explicit input and output.

A recurrent policy remembers through its hidden state; kitae keeps that state OUTSIDE the
network, as an array the executors carry from one step to the next (one per environment, and per
agent in multi-agent environments), so every function stays pure. The rule every executor
follows, written once here: where an episode STARTS, the state the core reads is the initial one.
``reset`` is that flag, per row: ``True`` for the first observation of an episode (after a
termination and after a truncation alike).

- ``RecurrentCore`` (a ``flax.linen`` module): one step, ``(hidden, x, reset) -> (hidden, y)``,
  for a batch of rows ``(B, ...)``.
- ``initial_hidden(kind, features, batch)``: the initial state (zeros), ``(B, F)`` for a GRU,
  ``((B, F), (B, F))`` (cell, hidden) for an LSTM.
- ``run_core(apply, params, hidden, xs, resets)``: the core over a sequence ``(T, B, ...)`` from a
  stored state, a ``jax.lax.scan`` of the one-step function: what a recurrent update re-runs over
  stored sequences. The same function stepped one step at a time gives the same outputs.

Example::

    import jax, jax.numpy as jnp
    from kitae.modules.recurrent import RecurrentCore, initial_hidden, run_core

    core = RecurrentCore("lstm", 32)
    hidden = initial_hidden("lstm", 32, 4)                      # 4 environments
    params = core.init(jax.random.PRNGKey(0), hidden, jnp.zeros((4, 2)), jnp.zeros(4, bool))
    hidden, y = core.apply(params, hidden, jnp.ones((4, 2)), jnp.array([1, 0, 0, 0], bool))  # y: (4, 32)
    xs, resets = jnp.ones((16, 4, 2)), jnp.zeros((16, 4), bool)
    last, ys = run_core(core.apply, params, hidden, xs, resets)   # ys: (16, 4, 32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from kitae.modules import initializers

__all__ = ["CORES", "RecurrentCore", "initial_hidden", "reset_hidden", "run_core"]

CORES = ("lstm", "gru")
"""The recurrent cores kitae builds (``RecurrentCore.kind``)."""


def initial_hidden(kind: str, features: int, batch: int | tuple[int, ...]) -> Any:
    """The initial hidden state of ``batch`` rows: zeros, float32.

    Returns:
        GRU: ``(*batch, features)``; LSTM: ``(cell, hidden)``, each ``(*batch, features)``.
    """
    _check_kind(kind)
    shape = (batch,) if isinstance(batch, int) else tuple(batch)
    zeros = jnp.zeros((*shape, features), jnp.float32)
    return (zeros, zeros) if kind == "lstm" else zeros


def reset_hidden(hidden: Any, reset: jax.Array) -> Any:
    """``hidden`` with the rows where ``reset`` holds set to the initial state (zeros).

    Args:
        hidden: leaves ``(*B, F)``.
        reset: ``(*B,)`` bool: the row's observation is the first of an episode.
    """
    reset = jnp.asarray(reset, bool)
    return jax.tree_util.tree_map(lambda h: jnp.where(reset[..., None], jnp.zeros_like(h), h), hidden)


class RecurrentCore(nn.Module):
    """One step of an LSTM (``nn.OptimizedLSTMCell``) or GRU (``nn.GRUCell``) over a batch of rows.

    Attributes:
        kind: ``"lstm"`` or ``"gru"``.
        features: the hidden size ``F``.

    ``__call__(hidden, x, reset) -> (hidden, y)``: ``x`` ``(B, D)``, ``reset`` ``(B,)`` bool
    (where it holds the step starts from the initial state, ``reset_hidden``), ``y`` ``(B, F)``;
    ``hidden`` as ``initial_hidden`` gives it.
    """

    kind: str = "lstm"
    features: int = 128

    def setup(self) -> None:
        """Builds the cell of ``kind`` with ``features`` units.

        Raises:
            ValueError: ``kind`` is not one of ``CORES``.
        """
        _check_kind(self.kind)
        cell = nn.OptimizedLSTMCell if self.kind == "lstm" else nn.GRUCell
        # flax's default recurrent kernel init, jax's orthogonal, as kitae's: the same values, and
        # no batched QR under vmap (kitae.modules.initializers says why)
        self.cell = cell(self.features, recurrent_kernel_init=initializers.orthogonal())

    def __call__(self, hidden: Any, x: jax.Array, reset: jax.Array) -> tuple[Any, jax.Array]:
        """One step of the cell.

        Args:
            hidden: the state before the step, as ``initial_hidden`` gives it: ``(B, F)`` (GRU) or
                ``(cell, hidden)``, each ``(B, F)`` (LSTM).
            x: the inputs ``(B, D)``, cast to float32.
            reset: ``(B,)`` bool: where it holds, the row starts from the initial state (zeros).

        Returns:
            ``(hidden, y)``: the state after the step (as ``hidden``) and the outputs ``(B, F)``.
        """
        hidden = reset_hidden(hidden, reset)
        hidden, y = self.cell(hidden, jnp.asarray(x, jnp.float32))
        return hidden, y


def run_core(
    apply: Callable[..., tuple[Any, jax.Array]], params: Any, hidden: Any, xs: jax.Array, resets: jax.Array
) -> tuple[Any, jax.Array]:
    """Runs one step function over a sequence with ``jax.lax.scan``.

    Args:
        apply: ``apply(params, hidden, x, reset) -> (hidden, y)`` (a ``RecurrentCore``'s
            ``apply``, or a network's method that steps one).
        params: its parameters.
        hidden: the state before the first step, leaves ``(B, F)``.
        xs: ``(T, B, ...)`` inputs.
        resets: ``(T, B)`` bool: the observation at step ``t`` starts an episode.

    Returns:
        ``(hidden after the last step, ys (T, B, ...))``.
    """

    def step(h: Any, inputs: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
        x, reset = inputs
        return apply(params, h, x, reset)

    return jax.lax.scan(step, hidden, (xs, resets))


def _check_kind(kind: str) -> None:
    if kind not in CORES:
        raise ValueError(f"recurrent core kind={kind!r} is not allowed; allowed: {', '.join(CORES)}")

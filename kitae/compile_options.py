"""How kitae compiles the programs that run once in a run.

A run's starting state (the agent's first parameters and optimizer state, the environments'
reset, an empty buffer) is made by small programs, each run once. Nearly all of their time is
XLA:CPU compiling them, by default with LLVM's full optimisation, which buys nothing for a
program that runs once. ``jit_once`` compiles them at LLVM optimisation level 1 instead: the
starting states of every built-in algorithm (A2C, DDPG, DQN, MPO, PPO, recurrent PPO, RND-PPO,
SAC, TD3; seeds 0, 1, 7) compiled in 15-34 % less time (PPO on gymnax CartPole-v1: 1.08 s ->
0.77 s) and gave the same bits as the default (``benchmarks/probe_start_compile.py``).
The bits matter: a run's starting state must not depend on how it was compiled (a host, compiled
or distributed run of one seed starts from the same parameters); level 0 compiles faster still
but changed the initial parameters' bits, so it is not used. ``tests/test_cold_start.py`` checks
the bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["ONCE_OPTIONS", "jit_once"]

ONCE_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 1}
"""XLA compiler options of the programs that run once (``jax.jit``'s ``compiler_options``)."""


def jit_once(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """``jax.jit(fn, **kwargs)`` compiled with ``ONCE_OPTIONS``: for programs that run once (a
    run's starting state), whose compile time is most of their cost."""
    return jax.jit(fn, compiler_options=ONCE_OPTIONS, **kwargs)

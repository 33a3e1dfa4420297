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

Nor may it depend on the process's thread settings. Orthogonal initialisation takes a QR
decomposition, which XLA:CPU hands to LAPACK: jaxlib's LAPACK kernels call the OpenBLAS that SciPy
bundles, whose blocked QR splits its work by its thread count. A [256, 256] layer's initial
weights came out with other bits under ``OMP_NUM_THREADS=1`` or ``OPENBLAS_NUM_THREADS=1`` than
with the default (which Ray sets in its workers, and cluster job scripts often do). The programs
``jit_once`` makes therefore run with OpenBLAS limited to one thread (``one_blas_thread``; a
jitted [256, 256] QR took 3.5 ms on one thread against 5.0 ms by default on a 2-core machine,
median of 50 calls): the same seed gives the same parameters whatever those variables say
(``tests/test_cold_start.py``, in subprocesses).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax

__all__ = ["ONCE_OPTIONS", "jit_once", "once_options", "one_blas_thread", "with_one_blas_thread"]


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limits the BLAS libraries loaded in the process (the OpenBLAS of jaxlib's LAPACK kernels)
    to one thread inside the block, and restores their counts after it.

    threadpoolctl finds and sets the libraries (written by hand, it would mean locating each
    OpenBLAS build's symbols ourselves). It only sees libraries already loaded, and jaxlib loads
    SciPy's LAPACK lazily, at the first LAPACK operation it lowers: SciPy's linalg is imported
    first so that the limit reaches it.
    """
    import scipy.linalg  # noqa: F401  (loads the OpenBLAS that jaxlib's LAPACK kernels call)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def once_options(xla_flags: str | None = None) -> dict[str, Any]:
    """XLA compiler options for the programs that run once (``jax.jit``'s ``compiler_options``).

    LLVM optimisation level 1, unless ``xla_flags`` (default: the ``XLA_FLAGS`` environment
    variable) already chooses a backend optimisation level: then every program of the process
    keeps that one, starting states included. Level 1 gives the default level's bits for a
    starting state, but another level need not (level 0 does not): with a level of their own a
    run's paths must still start from the same state (the agent's first state, the compiled
    loop's, a distributed worker's), so they all compile at it. The test suite runs so
    (``tests/conftest.py``)."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    return {} if "xla_backend_optimization_level" in flags else {"xla_backend_optimization_level": 1}


ONCE_OPTIONS: dict[str, Any] = once_options()
"""``once_options()`` for this process's ``XLA_FLAGS`` (read once, as XLA reads them)."""


def jit_once(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """``jax.jit(fn, **kwargs)`` compiled with ``ONCE_OPTIONS``: for programs that run once (a
    run's starting state), whose compile time is most of their cost. A call runs under
    ``one_blas_thread`` and waits for its result (outside a trace), so that the program's LAPACK
    calls have run before the limit is lifted."""
    return with_one_blas_thread(jax.jit(fn, compiler_options=ONCE_OPTIONS, **kwargs), wraps=fn)


def with_one_blas_thread(fn: Callable[..., Any], wraps: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``fn`` run under ``one_blas_thread``, waiting for its result before the limit is lifted
    (JAX dispatches asynchronously: the LAPACK calls must have run by then); inside a trace the
    result is a tracer and nothing is waited for. ``wraps``: the function whose name and docstring
    the wrapper takes (default ``fn``)."""

    @functools.wraps(wraps or fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with one_blas_thread():
            out = fn(*args, **kwargs)
            leaves = jax.tree_util.tree_leaves(out)
            if not any(isinstance(x, jax.core.Tracer) for x in leaves):
                jax.block_until_ready(out)
            return out

    call.one_blas_thread = True  # type: ignore[attr-defined]
    return call

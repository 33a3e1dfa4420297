"""MPO's critic on N sampled actions per observation: each observation encoded once, against the
observations repeated N times (how ``mpo._sample_values`` computed it before), in one process.

MPO scores ``N`` actions for each of the ``B`` observations of a batch, twice per update (the
target policy's samples at the next observations, and at the observations for the E-step).
``ContinuousQValue`` now takes actions ``(N, B, D)`` with observations ``(B, ...)`` and broadcasts
the encoded features over the ``N`` actions; before, the observations were repeated to ``N * B``
rows and the encoder (an image's CNN) ran on every copy. For a vector observation and for a small
image (the 10x10x4 uint8 of the tests' image environments), MPO's preset sizes (``N = 20``,
``B = 256``, critic 256 x 256), ``--rounds`` times, alternating:

* **run**: each jitted function called ``--calls`` times, each call waited for, median ms;
* **compile**: each function lowered and compiled with the in-memory caches cleared, seconds (set
  ``KITAE_NO_COMPILATION_CACHE=1`` so that the persistent cache does not answer).

Also checks that the two give the same values to the bit (they are the same arithmetic: the same
features concatenated with the same actions).

Run: ``KITAE_NO_COMPILATION_CACHE=1 .venv/bin/python benchmarks/probe_mpo_critic.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.modules.modules import init_params
from kitae.modules.qvalue import qvalue_factory

N, B = 20, 256
ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
SPACES = {
    "vector (3,)": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    "image (10, 10, 4) uint8": gym.spaces.Box(0, 255, (10, 10, 4), np.uint8),
}


def _observations(space: gym.spaces.Box) -> jax.Array:
    rng = np.random.default_rng(0)
    if space.dtype == np.uint8:
        return jnp.asarray(rng.integers(0, 256, size=(B, *space.shape), dtype=np.uint8))
    return jnp.asarray(rng.uniform(-1, 1, size=(B, *space.shape)).astype(np.float32))


def _median_ms(fn, *args, calls: int) -> float:
    fn(*args).block_until_ready()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()

    for name, space in SPACES.items():
        critic = qvalue_factory(space, ACTIONS, hidden=(256, 256), n_critics=1)
        params = init_params(jax.random.key(0), critic, [space.shape, ACTIONS.shape])
        observations = _observations(space)
        actions = jax.random.uniform(jax.random.key(1), (N, B, 2), minval=-1.0, maxval=1.0)

        def once(params, observations, actions, critic=critic):
            return critic.apply(params, observations, actions)

        def repeated(params, observations, actions, critic=critic):
            rows = jnp.broadcast_to(observations[None], (N, *observations.shape)).reshape(
                N * B, *observations.shape[1:]
            )
            return critic.apply(params, rows, actions.reshape(N * B, -1)).reshape(N, B)

        fns = {"encoded once": jax.jit(once), "repeated N times": jax.jit(repeated)}
        same = bool(
            jnp.array_equal(
                fns["encoded once"](params, observations, actions),
                fns["repeated N times"](params, observations, actions),
            )
        )
        run: dict[str, list[float]] = {k: [] for k in fns}
        compile_s: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for label, fn in fns.items():
                jax.clear_caches()
                start = time.perf_counter()
                fn.lower(params, observations, actions).compile()
                compile_s[label].append(time.perf_counter() - start)
                run[label].append(_median_ms(fn, params, observations, actions, calls=args.calls))
        print(f"{name}: N={N}, B={B}, bit-identical: {same}")
        for label in fns:
            print(
                f"  {label:17s} run median {statistics.median(run[label]):8.2f} ms"
                f" (rounds {min(run[label]):.2f}-{max(run[label]):.2f});"
                f" compile median {statistics.median(compile_s[label]):.2f} s"
            )
        ratio = [r / o for r, o in zip(run["repeated N times"], run["encoded once"], strict=True)]
        print(
            f"  repeated / once, per round: median {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
        )


if __name__ == "__main__":
    main()

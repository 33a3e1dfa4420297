"""What one host-loop act call costs back to back and between environment steps.

A jitted act of the size of rl-zoo's CartPole PPO (a 4-64-64-2 tanh MLP and a categorical sample
on 8 observations) is called 5 × 2,000 times, once with no work between calls and once after
``--gap`` µs of NumPy work (about one step of 8 Gymnasium CartPoles), and the median of the five
per-call means is printed in µs. ``--pin main`` pins the calling thread to the last CPU once JAX
has started, ``--pin all`` every thread of the process; pinning the whole process from the start
is ``taskset -c 0 .venv/bin/python ...``.

Run: ``.venv/bin/python benchmarks/probe_act_gap.py``
     ``taskset -c 0 .venv/bin/python benchmarks/probe_act_gap.py``
     ``.venv/bin/python benchmarks/probe_act_gap.py --pin all``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _act(params: list[jax.Array], key: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(key, actions (8,))`` from ``obs (8, 4)``: the MLP's logits, one categorical sample each."""
    key, sub = jax.random.split(key)
    h = jnp.tanh(obs @ params[0])
    h = jnp.tanh(h @ params[1])
    return key, jax.random.categorical(sub, h @ params[2])


def _busy(microseconds: float) -> None:
    """NumPy work on the calling thread for about ``microseconds``."""
    until = time.perf_counter() + microseconds * 1e-6
    x = np.zeros(8)
    while time.perf_counter() < until:
        x += 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap", type=float, default=130.0, help="µs of NumPy work before each call")
    parser.add_argument("--pin", choices=["none", "main", "all"], default="none")
    args = parser.parse_args()

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [jax.random.normal(k, shape) for k, shape in zip(keys, [(4, 64), (64, 64), (64, 2)])]
    act = jax.jit(_act)
    key, obs = jax.random.PRNGKey(1), np.zeros((8, 4), np.float32)
    key, actions = act(params, key, obs)
    np.asarray(actions)  # compiled and run once before timing

    cpu = {max(os.sched_getaffinity(0))}
    if args.pin == "main":
        os.sched_setaffinity(0, cpu)  # 0: the calling thread only, on Linux
    elif args.pin == "all":
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), cpu)

    for gap in (0.0, args.gap):
        means = []
        for _ in range(5):
            total = 0.0
            for _ in range(2000):
                if gap:
                    _busy(gap)
                start = time.perf_counter()
                key, actions = act(params, key, obs)
                np.asarray(actions)
                total += time.perf_counter() - start
            means.append(total / 2000 * 1e6)
        print(f"pin {args.pin}, gap {gap:.0f} µs: act {statistics.median(means):.1f} µs", [round(m) for m in means])


if __name__ == "__main__":
    main()

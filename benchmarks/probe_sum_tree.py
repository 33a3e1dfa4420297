"""The sum tree of prioritized replay: kitae's own (``kitae.replay.sum_tree``) against flashbax's
(``flashbax.buffers.sum_tree``, the maintained JAX replay library), on this CPU.

Each is timed on what prioritized replay does per gradient step at capacity 100k and batch 256:
one stratified sample of 256 items and one batched update of their 256 priorities, jitted, the
tree carried through a ``lax.scan`` of 100 such steps (so no host round trip is timed). Median
of ``--repeats`` calls of each after a warm-up, the two alternating. Also reported: how far each
tree's root drifts from the true sum of its leaves after those updates (flashbax adds deltas up
the tree; kitae recomputes each ancestor from its two children).

Run (flashbax is not a kitae dependency: ``.venv/bin/pip install flashbax==0.1.3`` first)::

    .venv/bin/python benchmarks/probe_sum_tree.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from kitae.replay import sum_tree as kt

CAPACITY, BATCH, STEPS = 100_000, 256, 100


def kitae_steps(tree, key):
    def step(tree, key):
        sample_key, value_key = jax.random.split(key)
        idx = kt.sum_tree_sample(tree, sample_key, BATCH)
        return kt.sum_tree_set(tree, idx, jax.random.uniform(value_key, (BATCH,)) + 0.01), None

    tree, _ = jax.lax.scan(step, tree, jax.random.split(key, STEPS))
    return tree


def flashbax_steps(state, key):
    from flashbax.buffers import sum_tree as fb

    def step(state, key):
        sample_key, value_key = jax.random.split(key)
        idx = fb.stratified_sample(state, BATCH, sample_key)
        return fb.set_batch_bincount(state, idx, jax.random.uniform(value_key, (BATCH,)) + 0.01), None

    state, _ = jax.lax.scan(step, state, jax.random.split(key, STEPS))
    return state


def time_alternating(functions: dict, repeats: int) -> dict[str, float]:
    """Median seconds per step of each ``name: (jitted fn, start)``, called in turn ``repeats``
    times after a warm-up (alternating, so a load on the machine falls on both)."""
    key = jax.random.PRNGKey(0)
    for fn, start in functions.values():
        jax.block_until_ready(fn(start, key))  # compile
    times: dict[str, list[float]] = {name: [] for name in functions}
    for i in range(repeats):
        for name, (fn, start) in functions.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(start, jax.random.fold_in(key, i)))
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) / STEPS for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from flashbax.buffers import sum_tree as fb

    values = jax.random.uniform(jax.random.PRNGKey(1), (CAPACITY,)) + 0.01
    tree = kt.sum_tree_set(kt.sum_tree_init(CAPACITY), jnp.arange(CAPACITY), values)
    state = fb.set_batch_bincount(fb.init(CAPACITY), jnp.arange(CAPACITY), values)
    functions = {"kitae": (jax.jit(kitae_steps), tree), "flashbax": (jax.jit(flashbax_steps), state)}
    seconds = time_alternating(functions, args.repeats)
    report: dict = {}
    for name, (fn, start) in functions.items():
        nodes = fn(start, jax.random.PRNGKey(7)).nodes
        first_leaf = kt.SumTree(nodes).leaves_offset if name == "kitae" else (nodes.shape[0] + 1) // 2 - 1
        root = float(nodes[1] if name == "kitae" else nodes[0])
        truth = float(np.sum(np.asarray(nodes[first_leaf:], np.float64)))
        report[name] = {"us_per_sample_and_update": seconds[name] * 1e6, "root_minus_leaf_sum": root - truth}
    report["ratio_flashbax_over_kitae"] = seconds["flashbax"] / seconds["kitae"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""The host loop's PPO update against a hand-written one with the same shapes, in one process.

compare_sb3.py's PPO task (rl-zoo's CartPole-v1 settings: 8 envs x 32 steps, 20 epochs of one
minibatch of 256, two tanh MLPs 4-64-64-{2,1}, Adam with global-norm clipping at 0.5) trains for
2,048 steps so that kitae's compiled update and one of its real arguments can be captured. Then,
``--rounds`` times, alternating:

* **run**: each update called 60 times, each call waited for (as the host loop waits), median ms;
* **compile**: each update lowered and compiled with the in-memory caches cleared, seconds (set
  ``KITAE_NO_COMPILATION_CACHE=1`` so that the persistent cache does not answer).

The hand-written update (``minimal_update`` below) is the least a PPO update of these shapes does:
GAE over the rollout, then per epoch a permutation, the clipped surrogate and the value loss on the
256 rows, their gradients, clipping and Adam. It has none of kitae's additions (approximate KL and
clip fraction, the entropy term, the learning-rate schedule, the divergence check and keeping or
dropping the update, the update's metrics): the gap between the two is what those cost.

Run: ``KITAE_NO_COMPILATION_CACHE=1 .venv/bin/python benchmarks/probe_ppo_update.py [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

T, E, EPOCHS, GAMMA, LAMBDA, CLIP = 32, 8, 20, 0.98, 0.8, 0.2


def _mlp_params(key: jax.Array, sizes: list[int]) -> list[tuple[jax.Array, jax.Array]]:
    layers = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        key, layer_key = jax.random.split(key)
        layers.append((jax.nn.initializers.orthogonal()(layer_key, (m, n)), jnp.zeros(n)))
    return layers


def _mlp(layers: list[tuple[jax.Array, jax.Array]], x: jax.Array) -> jax.Array:
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = jnp.tanh(x)
    return x


_optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3))


def _loss(params: dict, batch: tuple) -> jax.Array:
    obs, actions, old_log_probs, advantages, returns = batch
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(_mlp(params["pi"], obs)), actions[:, None], 1)[:, 0]
    ratio = jnp.exp(log_probs - old_log_probs)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - CLIP, 1 + CLIP) * advantages).mean()
    value_loss = jnp.square(_mlp(params["v"], obs)[:, 0] - returns).mean()
    return policy_loss + 0.5 * value_loss


@jax.jit
def minimal_update(params: dict, opt_state: optax.OptState, key: jax.Array, rollout: tuple) -> tuple:
    """GAE over ``rollout`` (leaves ``(T, E, ...)``), then ``EPOCHS`` gradient steps on the shuffled
    ``T * E`` rows."""
    obs, actions, rewards, dones, log_probs, next_obs = rollout
    values, next_values = _mlp(params["v"], obs)[..., 0], _mlp(params["v"], next_obs)[..., 0]
    deltas = rewards + GAMMA * next_values * (1 - dones) - values

    def gae_step(carry: jax.Array, x: tuple) -> tuple[jax.Array, jax.Array]:
        delta, done = x
        carry = delta + GAMMA * LAMBDA * (1 - done) * carry
        return carry, carry

    _, advantages = jax.lax.scan(gae_step, jnp.zeros(E), (deltas, dones), reverse=True)
    rows = tuple(x.reshape(T * E, *x.shape[2:]) for x in (obs, actions, log_probs, advantages, advantages + values))

    def epoch(carry: tuple, epoch_key: jax.Array) -> tuple[tuple, None]:
        params, opt_state = carry
        permutation = jax.random.permutation(epoch_key, T * E)
        grads = jax.grad(_loss)(params, tuple(jnp.take(x, permutation, 0) for x in rows))
        updates, opt_state = _optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, EPOCHS))
    return params, opt_state


def _run_ms(fn, args: tuple, calls: int = 60) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _compile_s(fn, args: tuple) -> float:
    jax.clear_caches()
    start = time.perf_counter()
    fn.lower(*args).compile()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import compare_sb3

    from kitae.loops import collect, host

    captured: dict = {}

    def capturing_steps(agent):  # the host loop's compiled steps, the update's first arguments kept
        steps = collect.compiled_steps(agent)

        def update(*call_args):
            captured.setdefault("args", call_args)
            return steps.update(*call_args)

        captured["update"] = steps.update
        return collect.CompiledSteps(act=steps.act, update=update)

    host.compiled_steps = capturing_steps
    compare_sb3.TASKS["ppo-cartpole"]["steps"] = 2048
    compare_sb3._kitae("ppo-cartpole", 0)
    kitae_update, kitae_args = captured["update"], captured["args"]

    key = jax.random.PRNGKey(0)
    keys = jax.random.split(key, 4)
    params = {"pi": _mlp_params(keys[0], [4, 64, 64, 2]), "v": _mlp_params(keys[1], [4, 64, 64, 1])}
    obs = jax.random.normal(keys[2], (T, E, 4))
    rollout = (
        obs,
        jax.random.randint(keys[3], (T, E), 0, 2),
        jnp.ones((T, E)),
        jnp.zeros((T, E)),
        jnp.full((T, E), -0.69),
        obs,
    )
    minimal_args = (params, _optimizer.init(params), key, rollout)

    rows = []
    for i in range(args.rounds):
        row = {
            "kitae_run_ms": _run_ms(kitae_update, kitae_args),
            "minimal_run_ms": _run_ms(minimal_update, minimal_args),
            "kitae_compile_s": _compile_s(kitae_update, kitae_args),
            "minimal_compile_s": _compile_s(minimal_update, minimal_args),
        }
        rows.append(row)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("medians: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    print(
        f"kitae / hand-written: run {medians['kitae_run_ms'] / medians['minimal_run_ms']:.2f}, "
        f"compile {medians['kitae_compile_s'] / medians['minimal_compile_s']:.2f}"
    )


if __name__ == "__main__":
    main()

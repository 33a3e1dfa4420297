"""The NatureCNN's gradient step on the CPU: called on its own, unrolled, and inside a rolled
``jax.lax.scan`` (what PPO's update does over epochs and minibatches), with flax's convolution and
with ``kitae.modules.conv.Conv`` (whose gradients are written channels-last).

Four gradient steps on minibatches of 256 uint8 84x84x4 frames through the Atari preset's
network (three convolutions, a 512-unit layer, 6 outputs), each way, after one warm-up call; the
whole network's forward pass is timed too. Run it as is and with XLA's YNNPACK convolutions off,
to compare:

``.venv/bin/python benchmarks/probe_conv_loop.py``, then with
``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=dot,reduce,individual_dot`` before the command.
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from kitae.modules.conv import Conv


class NatureCNN(nn.Module):
    """The Atari network: ``(B, 84, 84, 4)`` uint8 -> ``(B, 6)``, its convolutions ``layer``."""

    layer: type[nn.Module] = nn.Conv

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32) / 255.0
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(self.layer(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
        x = nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))
        return nn.Dense(6)(x)


def _seconds(fn, *args) -> float:
    jax.block_until_ready(fn(*args))  # compiled and run once before timing
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def compare(model: nn.Module, params: object, frames: jax.Array) -> None:
    """Prints the seconds of four plain gradient steps of ``model`` on ``frames`` (leaves ``(4, B,
    ...)``: one minibatch per step) as four calls, one unrolled and one rolled ``lax.scan``."""

    def step(p, x):  # one plain gradient step
        grads = jax.grad(lambda q: model.apply(q, x).sum())(p)
        return jax.tree_util.tree_map(lambda a, b: a - 1e-6 * b, p, grads)

    single = jax.jit(step)

    def four_calls(p, xs):
        for i in range(4):
            p = single(p, xs[i])
        return p

    rolled = jax.jit(lambda p, xs: jax.lax.scan(lambda q, x: (step(q, x), None), p, xs)[0])
    unrolled = jax.jit(lambda p, xs: jax.lax.scan(lambda q, x: (step(q, x), None), p, xs, unroll=True)[0])
    print(f"4 gradient steps, one call each: {_seconds(four_calls, params, frames):.3f} s")
    print(f"4 gradient steps, one unrolled scan: {_seconds(unrolled, params, frames):.3f} s")
    print(f"4 gradient steps, one rolled scan: {_seconds(rolled, params, frames):.3f} s")


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 255, (4, 256, 84, 84, 4), np.uint8))
    for layer in (nn.Conv, Conv):
        print(f"{layer.__module__}.{layer.__name__}:")
        model = NatureCNN(layer)
        params = model.init(jax.random.PRNGKey(0), frames[0, :1])
        forward = jax.jit(lambda p, x, model=model: model.apply(p, x))
        print(f"forward pass (256 frames): {_seconds(forward, params, frames[0]) * 1e3:.0f} ms")
        compare(model, params, frames)


if __name__ == "__main__":
    main()

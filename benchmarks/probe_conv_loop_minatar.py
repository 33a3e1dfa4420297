"""``probe_conv_loop.py``'s comparison for kitae's ``MinAtarCNN`` (one 3x3 stride-1 convolution,
Dense(128)) with 3 outputs, on minibatches of 1,024 ``(10, 10, 4)`` frames (the MinAtar PPO
preset's minibatch size): four gradient steps as four calls, one unrolled and one rolled
``lax.scan``.

Run: ``.venv/bin/python benchmarks/probe_conv_loop_minatar.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_conv_loop import _seconds

from kitae.modules.encoders import MinAtarCNN


class Net(nn.Module):
    """``MinAtarCNN`` and 3 outputs."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(3)(MinAtarCNN()(x))


def main() -> None:
    model = Net()
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 2, (4, 1024, 10, 10, 4)).astype(np.float32))
    params = model.init(jax.random.PRNGKey(0), frames[0, :1])

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


if __name__ == "__main__":
    main()

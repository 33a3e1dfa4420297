"""``probe_conv_loop.py``'s comparison for kitae's ``MinAtarCNN`` (one 3x3 stride-1 convolution,
Dense(128)) with 3 outputs, on minibatches of 1,024 ``(10, 10, 4)`` frames (the MinAtar PPO
preset's minibatch size): four gradient steps as four calls, one unrolled and one rolled
``lax.scan``.

Run: ``.venv/bin/python benchmarks/probe_conv_loop_minatar.py``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_conv_loop import compare

from kitae.modules.encoders import MinAtarCNN


class Net(nn.Module):
    """``MinAtarCNN`` and 3 outputs."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(3)(MinAtarCNN()(x))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    model = Net()
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 2, (4, 1024, 10, 10, 4)).astype(np.float32))
    compare(model, model.init(jax.random.PRNGKey(0), frames[0, :1]), frames)


if __name__ == "__main__":
    main()

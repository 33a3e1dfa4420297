"""A 2-D convolution whose gradients XLA:CPU runs fast inside loops.

XLA:CPU runs a convolution as a library call only in its canonical layout (channels last for the
input, the kernel and the output). JAX's gradients of a convolution are convolutions in other
layouts; XLA rewrites them to the canonical one before compiling, but not inside a loop's body,
where they compile to plain loops about eight times slower (JAX issue #12868, open since 2022;
BENCHMARKS.md, EnvPool section). kitae's updates run their minibatches in ``jax.lax.scan``, and the
compiled loop runs a whole training run in one, so ``conv`` writes its gradients itself, as
canonical convolutions: the same sums as JAX's own (the same values outside a loop, where XLA
rewrites JAX's gradients to these), run as library calls everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv", "Conv"]

_LAYOUT = ("NHWC", "HWIO", "NHWC")

Padding = str | Sequence[tuple[int, int]]
"""``"VALID"``, ``"SAME"`` or one ``(low, high)`` pair per spatial axis."""


def _pairs(
    padding: Padding, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int]
) -> list[tuple[int, int]]:
    """``padding`` as explicit ``(low, high)`` pairs, as ``lax.conv_general_dilated`` reads it."""
    if isinstance(padding, str):
        return [tuple(p) for p in lax.padtype_to_pads(sizes, kernel, strides, padding)]  # type: ignore[misc]
    return [(int(lo), int(hi)) for lo, hi in padding]


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding) -> jax.Array:
    """``lax.conv_general_dilated`` with channels last: ``x (N, H, W, C)``, ``kernel (kh, kw, C,
    O)`` -> ``(N, H', W', O)``; ``strides`` and ``padding`` as there (static, so hashable:
    explicit padding as a tuple of ``(low, high)`` pairs)."""
    return lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=_LAYOUT)


def _conv_forward(x: jax.Array, kernel: jax.Array, strides: tuple[int, int], padding: Padding) -> tuple:
    return conv(x, kernel, strides, padding), (x, kernel)


def _conv_backward(strides: tuple[int, int], padding: Padding, saved: tuple, grad: jax.Array) -> tuple:
    x, kernel = saved
    sizes, window, out = x.shape[1:3], kernel.shape[:2], grad.shape[1:3]
    pads = _pairs(padding, sizes, window, strides)
    # the input's gradient: the output's, spread out by the strides, convolved with the kernel
    # flipped and its input and output channels swapped
    flipped = jnp.transpose(jnp.flip(kernel, (0, 1)), (0, 1, 3, 2))
    input_pads = []
    for n, k, s, o, (lo, _) in zip(sizes, window, strides, out, pads):
        spread = (o - 1) * s + 1
        input_pads.append((k - 1 - lo, n + lo - spread))
    dx = lax.conv_general_dilated(grad, flipped, (1, 1), input_pads, lhs_dilation=strides, dimension_numbers=_LAYOUT)
    # the kernel's gradient: the input's channels as the batch, convolved with the output's
    # gradient as the kernel, spread out by the strides
    kernel_pads = []
    for n, k, s, o, (lo, _) in zip(sizes, window, strides, out, pads):
        spread = (o - 1) * s + 1
        kernel_pads.append((lo, k - 1 - (n + lo - spread)))
    dk = lax.conv_general_dilated(
        jnp.transpose(x, (3, 1, 2, 0)),
        jnp.transpose(grad, (1, 2, 0, 3)),
        (1, 1),
        kernel_pads,
        rhs_dilation=strides,
        dimension_numbers=_LAYOUT,
    )
    return dx, jnp.transpose(dk, (1, 2, 0, 3))


conv.defvjp(_conv_forward, _conv_backward)


class Conv(nn.Module):
    """A 2-D convolution with a bias, channels last, through ``conv``: the parameters (``kernel``
    ``(kh, kw, C, features)``, ``bias`` ``(features,)``), their initialisation and the forward
    values of ``flax.linen.Conv`` with the same arguments.

    Attributes:
        features: output channels.
        kernel_size: ``(kh, kw)``.
        strides: ``(sh, sw)``.
        padding: ``"VALID"``, ``"SAME"`` or ``(low, high)`` pairs.
        kernel_init, bias_init: initialisers, flax's defaults by default.
    """

    features: int
    kernel_size: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    padding: Padding = "SAME"
    kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
    bias_init: Callable[..., Any] = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(N, H, W, C)`` -> ``(N, H', W', features)``."""
        kernel = self.param("kernel", self.kernel_init, (*self.kernel_size, x.shape[-1], self.features))
        bias = self.param("bias", self.bias_init, (self.features,))
        padding = self.padding if isinstance(self.padding, str) else tuple(map(tuple, self.padding))
        return conv(x, kernel, tuple(self.strides), padding) + bias

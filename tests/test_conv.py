"""``kitae.modules.conv``: a convolution whose gradients are JAX's own values, written so that
XLA:CPU runs them as library calls inside loops too."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kitae.modules.conv import Conv, conv

LAYOUT = ("NHWC", "HWIO", "NHWC")
CASES = [  # (N, H, W, C, k, O, stride, padding)
    (2, 84, 84, 4, 8, 8, 4, "VALID"),  # the Atari torso's first layer (fewer filters)
    (2, 20, 20, 8, 4, 6, 2, "VALID"),
    (2, 10, 10, 4, 3, 16, 1, "VALID"),  # MinAtar's
    (2, 11, 13, 3, 3, 4, 2, "SAME"),  # odd sizes, padded
    (2, 10, 9, 3, 4, 4, 3, "VALID"),  # sizes the stride does not divide
    (1, 7, 7, 2, 2, 3, 2, ((1, 0), (0, 2))),  # explicit, uneven padding
]


def _inputs(case, seed=0):
    n, h, w, c, k, o, _, _ = case
    rng = np.random.default_rng(seed)
    return (
        jnp.asarray(rng.normal(size=(n, h, w, c)), jnp.float32),
        jnp.asarray(rng.normal(size=(k, k, c, o)), jnp.float32),
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("jit", [False, True])
def test_values_and_gradients_are_jaxs_own(case, jit):
    x, kernel = _inputs(case)
    stride, padding = (case[6], case[6]), case[7]

    def reference(x, kernel):
        return (lax.conv_general_dilated(x, kernel, stride, padding, dimension_numbers=LAYOUT) ** 2).sum()

    def ours(x, kernel):
        return (conv(x, kernel, stride, padding) ** 2).sum()

    grad = jax.jit(jax.grad(ours, (0, 1))) if jit else jax.grad(ours, (0, 1))
    np.testing.assert_allclose(ours(x, kernel), reference(x, kernel), rtol=1e-5)
    for got, want in zip(grad(x, kernel), jax.grad(reference, (0, 1))(x, kernel)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.abs(want).max()))


def test_gradients_under_vmap_are_each_rows_own():
    case = CASES[2]
    xs = jnp.stack([_inputs(case, seed)[0] for seed in (1, 2, 3)])
    kernel = _inputs(case)[1]

    def loss(x, kernel):
        return jnp.tanh(conv(x, kernel, (1, 1), "VALID")).sum()

    batched = jax.jit(jax.vmap(jax.grad(loss, 1), (0, None)))(xs, kernel)
    for row, x in zip(batched, xs):
        np.testing.assert_allclose(row, jax.grad(loss, 1)(x, kernel), rtol=1e-4, atol=1e-5)


def test_the_module_is_flaxs_conv_in_parameters_and_values():
    x = _inputs(CASES[3])[0]
    ours, flax_conv = (cls(4, (3, 3), strides=(2, 2), padding="SAME") for cls in (Conv, nn.Conv))
    params = ours.init(jax.random.PRNGKey(0), x)
    theirs = flax_conv.init(jax.random.PRNGKey(0), x)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours.apply(params, x), flax_conv.apply(theirs, x))


def test_inside_a_rolled_loop_every_gradient_convolution_is_channels_last():
    """What the module is for: in a ``lax.scan`` body XLA:CPU compiles a convolution as a library
    call only in the canonical layout; JAX's own gradients there keep other layouts (checked
    too, so that the test notices the day XLA rewrites them itself)."""
    x, kernel = _inputs(CASES[0])
    xs = jnp.stack([x, x])

    def layouts(convolve):
        def step(k, x):
            return k - 1e-3 * jax.grad(lambda k: (convolve(x, k) ** 2).sum())(k), None

        text = jax.jit(lambda k, xs: jax.lax.scan(step, k, xs)[0]).lower(kernel, xs).compile().as_text()
        return set(re.findall(r"convolution\(.*?dim_labels=([\w>-]+)", text))

    ours = layouts(lambda x, k: conv(x, k, (4, 4), "VALID"))
    assert ours == {"b01f_01io->b01f"}, ours
    jaxs = layouts(lambda x, k: lax.conv_general_dilated(x, k, (4, 4), "VALID", dimension_numbers=LAYOUT))
    assert jaxs != {"b01f_01io->b01f"}, jaxs

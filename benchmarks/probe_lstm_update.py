"""Where recurrent PPO's update time goes (issue 12): one gradient of an LSTM over a minibatch of
sequences, three ways, ``jax.jit`` compiled, medians of 5 x N calls (milliseconds).

- ``flax two cores``: two ``nn.OptimizedLSTMCell`` of 64 (actor and critic) with [64] heads
  scanned over ``L`` steps of ``B`` sequences, as ``ppo_lstm``'s update does;
- ``hoisted``: the same two cores with the input projections computed for all steps at once
  outside the scan;
- ``flax one core`` / ``custom VJP one core``: one LSTM, scanned as Flax does it, and with a
  hand-written backward pass (the weight gradients as one matmul after the scan). A probe only:
  kitae does not use it (see BENCHMARKS.md).

Run: ``.venv/bin/python benchmarks/probe_lstm_update.py --steps 32 --batch 8`` (and ``--steps 8
--batch 32``). The XLA flag probes ran the same command with ``XLA_FLAGS`` set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

F, D = 64, 2


class Core(nn.Module):
    @nn.compact
    def __call__(self, h, x, r):
        h = jax.tree_util.tree_map(lambda a: jnp.where(r[:, None], 0.0, a), h)
        h, y = nn.OptimizedLSTMCell(F)(h, x)
        return h, nn.Dense(1)(nn.relu(nn.Dense(64)(y)))[:, 0]


class TwoCores(nn.Module):
    def setup(self):
        self.actor, self.critic = Core(), Core()

    def __call__(self, h, x, r):
        ha, ya = self.actor(h[0], x, r)
        hc, yc = self.critic(h[1], x, r)
        return (ha, hc), ya + yc


def _gates(cell):
    wi = jnp.concatenate([cell[f"i{g}"]["kernel"] for g in "ifgo"], -1)
    wh = jnp.concatenate([cell[f"h{g}"]["kernel"] for g in "ifgo"], -1)
    b = jnp.concatenate([cell[f"h{g}"]["bias"] for g in "ifgo"], -1)
    return wi, wh, b


@jax.custom_vjp
def lstm_sequence(wi, wh, b, xs, keep):
    return _forward(wi, wh, b, xs, keep)[0]


def _forward(wi, wh, b, xs, keep):
    zero = jnp.zeros((xs.shape[1], wh.shape[0]))

    def step(carry, inputs):
        c, h = carry
        xi, k = inputs
        c, h = c * k, h * k
        i, f, g, o = jnp.split(xi + h @ wh + b, 4, -1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c_new = f * c + i * g
        h_new = o * jnp.tanh(c_new)
        return (c_new, h_new), (c_new, h_new, c, h, jnp.concatenate([i, f, g, o], -1))

    _, (cs, hs, c_prev, h_prev, gates) = jax.lax.scan(step, (zero, zero), (xs @ wi, keep))
    return hs, (wi, wh, xs, keep, cs, c_prev, h_prev, gates)


def _backward(res, dhs):
    wi, wh, xs, keep, cs, c_prev, h_prev, gates = res
    zero = jnp.zeros_like(cs[0])

    def step(carry, inputs):
        dc, dh = carry
        dh_t, c, cp, g4, k = inputs
        dh = dh + dh_t
        i, f, g, o = jnp.split(g4, 4, -1)
        tc = jnp.tanh(c)
        dc = dc + dh * o * (1 - tc * tc)
        dz = jnp.concatenate(
            [dc * g * i * (1 - i), dc * cp * f * (1 - f), dc * i * (1 - g * g), dh * tc * o * (1 - o)], -1
        )
        return (dc * f * k, (dz @ wh.T) * k), dz

    _, dz = jax.lax.scan(step, (zero, zero), (dhs, cs, c_prev, gates, keep), reverse=True)
    return (
        jnp.einsum("lbd,lbg->dg", xs, dz),
        jnp.einsum("lbf,lbg->fg", h_prev, dz),
        dz.sum((0, 1)),
        jnp.einsum("lbg,dg->lbd", dz, wi),
        None,
    )


lstm_sequence.defvjp(_forward, _backward)


def timed(fn, *args, calls=200):
    jax.block_until_ready(fn(*args))
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        rounds.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    steps, batch = args.steps, args.batch
    key = jax.random.PRNGKey(0)
    xs, resets = jax.random.normal(key, (steps, batch, D)), jax.random.bernoulli(key, 0.1, (steps, batch))
    zero = jnp.zeros((batch, F))
    two = TwoCores()
    params = two.init(key, ((zero, zero), (zero, zero)), xs[0], resets[0])

    def flax_loss(p):
        def step(h, inputs):
            return two.apply(p, h, *inputs)

        return jnp.mean(jax.lax.scan(step, ((zero, zero), (zero, zero)), (xs, resets))[1] ** 2)

    def hoisted_loss(p):
        total = 0.0
        for name in ("actor", "critic"):
            core = p["params"][name]
            wi, wh, b = _gates(core["OptimizedLSTMCell_0"])

            def step(carry, inputs, wh=wh, b=b):
                c, h = carry
                xi, r = inputs
                c, h = jnp.where(r[:, None], 0.0, c), jnp.where(r[:, None], 0.0, h)
                i, f, g, o = jnp.split(xi + h @ wh + b, 4, -1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (c, h), h

            _, hs = jax.lax.scan(step, (zero, zero), (xs @ wi, resets))
            # Core builds Dense(1) before Dense(64): Dense_0 is the output layer, Dense_1 the hidden one
            y = nn.relu(hs @ core["Dense_1"]["kernel"] + core["Dense_1"]["bias"])
            total = total + (y @ core["Dense_0"]["kernel"] + core["Dense_0"]["bias"])[..., 0]
        return jnp.mean(total**2)

    cell = nn.OptimizedLSTMCell(F)
    cell_params = cell.init(key, (zero, zero), xs[0])["params"]

    def one_flax(p):
        def step(h, inputs):
            x, r = inputs
            h = jax.tree_util.tree_map(lambda a: jnp.where(r[:, None], 0.0, a), h)
            h, y = cell.apply({"params": p}, h, x)
            return h, y

        return jnp.mean(jnp.sin(jax.lax.scan(step, (zero, zero), (xs, resets))[1]) ** 2)

    def one_custom(p):
        wi, wh, b = _gates(p)
        return jnp.mean(jnp.sin(lstm_sequence(wi, wh, b, xs, (~resets)[..., None].astype(xs.dtype))) ** 2)

    report = {
        "steps": steps,
        "batch": batch,
        "flax two cores: forward ms": timed(jax.jit(flax_loss), params),
        "flax two cores: gradient ms": timed(jax.jit(jax.grad(flax_loss)), params),
        "hoisted two cores: gradient ms": timed(jax.jit(jax.grad(hoisted_loss)), params),
        "flax one core: gradient ms": timed(jax.jit(jax.grad(one_flax)), cell_params),
        "custom VJP one core: gradient ms": timed(jax.jit(jax.grad(one_custom)), cell_params),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

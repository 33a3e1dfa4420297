"""Tests of kitae.modules: encoders, heads, factories and init_params."""

import re

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.distributions import Categorical, DiagNormal, TanhNormal
from kitae.modules.encoders import (
    MLP,
    DictEncoder,
    DiscreteEncoder,
    FlattenMLP,
    NatureCNN,
    encoder_factory,
    space_input_shape,
)
from kitae.modules.modules import init_params
from kitae.modules.policy import (
    CategoricalHead,
    DeterministicHead,
    NormalHead,
    TanhNormalHead,
    policy_factory,
    scale_action,
    unscale_action,
)
from kitae.modules.qvalue import qvalue_factory
from kitae.modules.value import ValueHead, value_factory

BATCH = 5
KEY = jax.random.key(0)

OBS_SPACES = {
    "box": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
    "discrete": gym.spaces.Discrete(3),
    "image": gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
    "dict": gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (4,), np.float32), "cell": gym.spaces.Discrete(3)}),
}
DISCRETE_ACTIONS = gym.spaces.Discrete(3)
BOX_ACTIONS = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def batch_obs(space, batch=(BATCH,), seed=0):
    """A batch of valid observations of ``space``, shape ``(*batch, *obs_shape)`` (dict for Dict)."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Dict):
        return {k: batch_obs(s, batch, seed) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return jnp.asarray(rng.integers(space.start, space.start + space.n, size=batch))
    if space.dtype == np.uint8:
        return jnp.asarray(rng.integers(0, 256, size=batch + space.shape, dtype=np.uint8))
    return jnp.asarray(rng.uniform(-1, 1, size=batch + space.shape).astype(np.float32))


# NatureCNN's orthogonal init of its 3136x512 dense kernel is a costly QR on CPU, so the
# parametrised factory tests use the cheap spaces and ``test_image_factories`` covers images once.
FAST_OBS = ["box", "discrete", "dict"]


def shapes(tree):
    return jax.tree.map(jnp.shape, tree)


# ------------------------------------------------------------------------------------------------
# Encoders
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cls, features",
    [("box", MLP, 64), ("discrete", DiscreteEncoder, 64), ("dict", DictEncoder, 64)],
)
def test_encoder_factory(name, cls, features):
    space = OBS_SPACES[name]
    encoder = encoder_factory(space)
    assert isinstance(encoder, cls)
    params = init_params(KEY, encoder, [space_input_shape(space)])
    out = encoder.apply(params, batch_obs(space))
    assert out.shape == (BATCH, features)
    assert np.all(np.isfinite(np.asarray(out)))


def test_mlp_acts_on_last_axis_and_options():
    mlp = MLP(hidden=(8, 16), activation="relu", layer_norm=True)
    params = init_params(KEY, mlp, [(3,)])
    assert shapes(params["params"]["Dense_0"]) == {"kernel": (3, 8), "bias": (8,)}
    assert "LayerNorm_0" in params["params"]
    assert mlp.apply(params, jnp.ones((2, 7, 3))).shape == (2, 7, 16)
    custom = MLP(hidden=(4,), activation=nn.gelu, orthogonal=False)
    assert custom.apply(init_params(KEY, custom, [(3,)]), jnp.ones((3,))).shape == (4,)
    identity = MLP(hidden=())
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(identity.apply(init_params(KEY, identity, [(3,)]), x), x)
    with pytest.raises(ValueError, match="bogus"):
        MLP(activation="bogus").apply(params, jnp.ones((1, 3)))


@pytest.mark.parametrize("shape", [(10, 5), (), (2, 3, 4, 5)], ids=str)
def test_a_box_of_other_axes_is_flattened_then_an_mlp(shape):
    """bsuite's Catch board ``(10, 5)`` (int32), a scalar, four axes: flattened, as SB3's
    ``FlattenExtractor``; the same as the MLP on the flattened observations, jitted and vmapped."""
    space = gym.spaces.Box(0, 1, shape, np.int32 if shape == (10, 5) else np.float32)
    encoder = encoder_factory(space, hidden=(16,))
    assert isinstance(encoder, FlattenMLP) and encoder.obs_ndim == len(shape)
    params = init_params(KEY, encoder, [space_input_shape(space)])
    size = int(np.prod(shape))
    assert params["params"]["MLP_0"]["Dense_0"]["kernel"].shape == (size, 16)
    obs = jax.random.bernoulli(KEY, 0.5, (BATCH, 3, *shape)).astype(space.dtype)
    out = jax.jit(encoder.apply)(params, obs)
    assert out.shape == (BATCH, 3, 16)
    mlp = MLP(hidden=(16,))
    flat = obs.reshape(BATCH, 3, size)
    np.testing.assert_allclose(out, mlp.apply({"params": params["params"]["MLP_0"]}, flat), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(lambda o: encoder.apply(params, o))(obs), out, rtol=1e-6)
    assert encoder.apply(params, obs[0, 0]).shape == (16,)  # one observation


def test_nature_cnn_shapes_and_uint8_scaling():
    cnn = NatureCNN(orthogonal=False)
    params = init_params(KEY, cnn, [(84, 84, 4)])
    p = params["params"]
    assert p["Conv_0"]["kernel"].shape == (8, 8, 4, 32)
    assert p["Conv_1"]["kernel"].shape == (4, 4, 32, 64)
    assert p["Conv_2"]["kernel"].shape == (3, 3, 64, 64)
    assert p["Dense_0"]["kernel"].shape == (7 * 7 * 64, 512)
    frames = batch_obs(OBS_SPACES["image"], batch=(2, 3))
    out = cnn.apply(params, frames)
    assert out.shape == (2, 3, 512)
    scaled = cnn.apply(params, frames.astype(jnp.float32) / 255.0)
    np.testing.assert_allclose(out, scaled, rtol=1e-5, atol=1e-5)
    assert cnn.apply(params, frames[0, 0]).shape == (512,)  # unbatched


def test_dict_encoder_sorted_keys_and_concatenation():
    space = OBS_SPACES["dict"]
    encoder = encoder_factory(space, hidden=())
    assert tuple(encoder.keys) == ("cell", "pos")
    obs = {"pos": jnp.full((BATCH, 4), 0.5), "cell": jnp.array([0, 1, 2, 0, 1])}
    out = encoder.apply(init_params(KEY, encoder, [space_input_shape(space)]), obs)
    expected = np.concatenate([np.eye(3)[[0, 1, 2, 0, 1]], np.full((BATCH, 4), 0.5)], axis=-1)
    np.testing.assert_allclose(out, expected)


def test_discrete_encoder_respects_start():
    encoder = encoder_factory(gym.spaces.Discrete(3, start=-1), hidden=())
    out = encoder.apply({}, jnp.array([-1, 0, 1]))
    np.testing.assert_array_equal(out, np.eye(3))


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(0, 255, (2, 10, 3), np.uint8),  # too small even for MinAtarCNN
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
        gym.spaces.Dict({"bad": gym.spaces.MultiBinary(3)}),
    ],
    ids=str,
)
def test_encoder_factory_rejects_unsupported_spaces(space):
    with pytest.raises(ValueError) as info:
        encoder_factory(space)
    message = str(info.value)
    assert "accepted" in message
    target = space["bad"] if isinstance(space, gym.spaces.Dict) else space
    assert str(target) in message
    if isinstance(space, gym.spaces.Dict):  # the entry is named by its key (it was not)
        assert message.startswith("observation_space['bad']: Unsupported observation space MultiBinary(3)")


def test_a_nested_dict_entry_is_named_by_its_keys():
    space = gym.spaces.Dict(x=gym.spaces.Dict(a=gym.spaces.MultiDiscrete([3, 4])), b=gym.spaces.Box(0, 1, (2,)))
    with pytest.raises(ValueError, match=re.escape("observation_space['x']['a']: Unsupported observation space")):
        encoder_factory(space)


# ------------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------------


def test_categorical_head_with_mask():
    head = CategoricalHead(4)
    params = init_params(KEY, head, [(6,)])
    feats = jax.random.normal(KEY, (BATCH, 6))
    dist = head.apply(params, feats)
    assert isinstance(dist, Categorical) and dist.logits.shape == (BATCH, 4)
    mask = jnp.array([True, False, True, False])
    masked = head.apply(params, feats, jnp.broadcast_to(mask, (BATCH, 4)))
    assert np.all(np.isin(np.asarray(masked.mode()), [0, 2]))
    assert np.all(np.isin(np.asarray(masked.sample(KEY)), [0, 2]))


def test_normal_head_state_independent_and_dependent_std():
    head = NormalHead(3, log_std_init=-0.5)
    params = init_params(KEY, head, [(6,)])
    assert params["params"]["log_std"].shape == (3,)
    dist = head.apply(params, jnp.ones((BATCH, 6)))
    assert isinstance(dist, DiagNormal)
    assert dist.loc.shape == dist.scale.shape == (BATCH, 3)
    np.testing.assert_allclose(dist.scale, np.exp(-0.5), rtol=1e-6)

    dep = NormalHead(3, state_dependent_std=True)
    dparams = init_params(KEY, dep, [(6,)])
    assert dparams["params"]["log_std"]["kernel"].shape == (6, 3)
    ddist = dep.apply(dparams, jax.random.normal(KEY, (BATCH, 6)))
    assert ddist.scale.shape == (BATCH, 3)


def test_tanh_normal_head_log_std_range():
    head = TanhNormalHead(2, log_std_min=-5.0, log_std_max=2.0)
    params = init_params(KEY, head, [(6,)])
    dist = head.apply(params, 100.0 * jax.random.normal(KEY, (BATCH, 6)))
    assert isinstance(dist, TanhNormal)
    log_std = np.log(np.asarray(dist.scale))
    assert np.all(log_std >= -5.0 - 1e-4) and np.all(log_std <= 2.0 + 1e-4)
    x, logp = dist.sample_and_log_prob(KEY)
    assert x.shape == (BATCH, 2) and logp.shape == (BATCH,)


def test_deterministic_and_value_heads():
    det = DeterministicHead(2)
    a = det.apply(init_params(KEY, det, [(6,)]), 100.0 * jnp.ones((BATCH, 6)))
    assert a.shape == (BATCH, 2) and np.all(np.abs(np.asarray(a)) <= 1.0)
    vh = ValueHead()
    assert vh.apply(init_params(KEY, vh, [(6,)]), jnp.ones((BATCH, 6))).shape == (BATCH,)


def test_scale_unscale_action():
    low, high = jnp.array([-2.0, 0.0]), jnp.array([2.0, 10.0])
    a = jnp.array([[-1.0, -1.0], [0.0, 0.5], [1.0, 1.0]])
    scaled = scale_action(a, low, high)
    np.testing.assert_allclose(scaled, [[-2.0, 0.0], [0.0, 7.5], [2.0, 10.0]])
    np.testing.assert_allclose(unscale_action(scaled, low, high), a, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Factories
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obs_name", FAST_OBS)
def test_policy_factory_discrete(obs_name):
    space = OBS_SPACES[obs_name]
    policy = policy_factory(space, DISCRETE_ACTIONS)
    params = init_params(KEY, policy, [space_input_shape(space)])
    dist = policy.apply(params, batch_obs(space))
    assert isinstance(dist, Categorical) and dist.logits.shape == (BATCH, 3)
    mask = jnp.broadcast_to(jnp.array([False, True, False]), (BATCH, 3))
    np.testing.assert_array_equal(policy.apply(params, batch_obs(space), mask).mode(), np.ones(BATCH))


@pytest.mark.parametrize("obs_name", FAST_OBS)
@pytest.mark.parametrize("kind, cls", [(None, DiagNormal), ("tanh_normal", TanhNormal)])
def test_policy_factory_box(obs_name, kind, cls):
    space = OBS_SPACES[obs_name]
    policy = policy_factory(space, BOX_ACTIONS, kind=kind, hidden=(32,))
    params = init_params(KEY, policy, [space_input_shape(space)])
    dist = jax.jit(policy.apply)(params, batch_obs(space))
    assert isinstance(dist, cls)
    x, logp = dist.sample_and_log_prob(KEY)
    assert x.shape == (BATCH, 2) and logp.shape == (BATCH,)


def test_policy_factory_deterministic():
    space = OBS_SPACES["box"]
    assert isinstance(policy_factory(space, BOX_ACTIONS, kind="normal").head, NormalHead)
    policy = policy_factory(space, BOX_ACTIONS, kind="deterministic")
    actions = policy.apply(init_params(KEY, policy, [(4,)]), batch_obs(space))
    assert actions.shape == (BATCH, 2) and np.all(np.abs(np.asarray(actions)) <= 1.0)
    with pytest.raises(ValueError, match="mask"):
        policy.apply(init_params(KEY, policy, [(4,)]), batch_obs(space), jnp.ones((BATCH, 2), bool))


@pytest.mark.parametrize(
    "action_space, kind",
    [
        (gym.spaces.MultiDiscrete([[2, 3], [2, 3]]), None),  # one axis only (a 1-D one is accepted)
        (gym.spaces.Box(-1, 1, (2, 2)), None),
        (gym.spaces.MultiBinary([3, 2]), None),
        (gym.spaces.MultiBinary(3), "normal"),
        (DISCRETE_ACTIONS, "normal"),
        (BOX_ACTIONS, "categorical"),
        (BOX_ACTIONS, "beta"),
        (gym.spaces.Box(-np.inf, np.inf, (2,)), "tanh_normal"),
    ],
    ids=str,
)
def test_policy_factory_rejects(action_space, kind):
    with pytest.raises(ValueError) as info:
        policy_factory(OBS_SPACES["box"], action_space, kind=kind)
    assert str(action_space) in str(info.value)
    assert "accepted" in str(info.value)


@pytest.mark.parametrize("obs_name", FAST_OBS)
def test_value_factory(obs_name):
    space = OBS_SPACES[obs_name]
    value = value_factory(space)
    params = init_params(KEY, value, [space_input_shape(space)])
    assert value.apply(params, batch_obs(space)).shape == (BATCH,)


@pytest.mark.parametrize("obs_name, n_critics", [("box", 1), ("box", 2), ("discrete", 1), ("dict", 2)])
def test_qvalue_factory(obs_name, n_critics):
    space = OBS_SPACES[obs_name]
    obs = batch_obs(space)
    lead = (n_critics,) if n_critics > 1 else ()

    q_disc = qvalue_factory(space, DISCRETE_ACTIONS, hidden=(32,), n_critics=n_critics)
    params = init_params(KEY, q_disc, [space_input_shape(space)])
    assert q_disc.apply(params, obs).shape == lead + (BATCH, 3)

    q_box = qvalue_factory(space, BOX_ACTIONS, hidden=(32, 32), n_critics=n_critics)
    params = init_params(KEY, q_box, [space_input_shape(space), (2,)])
    q = q_box.apply(params, obs, jnp.zeros((BATCH, 2)))
    assert q.shape == lead + (BATCH,)
    if n_critics > 1:
        for leaf in jax.tree.leaves(params):
            assert leaf.shape[0] == n_critics


def test_image_factories():
    space = OBS_SPACES["image"]
    obs = batch_obs(space)
    shape = space_input_shape(space)
    assert shape == (84, 84, 4)
    assert isinstance(encoder_factory(space), NatureCNN)

    policy = policy_factory(space, DISCRETE_ACTIONS)
    params = init_params(KEY, policy, [shape])
    assert params["params"]["encoder"]["Dense_0"]["kernel"].shape == (3136, 512)
    dist = policy.apply(params, obs)
    assert isinstance(dist, Categorical) and dist.logits.shape == (BATCH, 3)

    value = value_factory(space)
    assert value.apply(init_params(KEY, value, [shape]), obs).shape == (BATCH,)

    q_box = qvalue_factory(space, BOX_ACTIONS, hidden=(32,), n_critics=2)
    params = init_params(KEY, q_box, [shape, (2,)])
    assert params["params"]["encoder"]["Dense_0"]["kernel"].shape == (2, 3136, 512)
    assert q_box.apply(params, obs, jnp.zeros((BATCH, 2))).shape == (2, BATCH)


def test_qvalue_ensemble_critics_differ_and_sac_input_layout():
    space = OBS_SPACES["box"]
    q = qvalue_factory(space, BOX_ACTIONS, n_critics=3)
    params = init_params(KEY, q, [(4,), (2,)])
    # Default hidden (256, 256); observation (4) and action (2) concatenated at the input.
    assert params["params"]["MLP_0"]["Dense_0"]["kernel"].shape == (3, 6, 256)
    assert params["params"]["MLP_0"]["Dense_1"]["kernel"].shape == (3, 256, 256)
    values = np.asarray(q.apply(params, batch_obs(space), jnp.ones((BATCH, 2))))
    assert values.shape == (3, BATCH)
    assert not np.allclose(values[0], values[1])
    kernels = np.asarray(params["params"]["MLP_0"]["Dense_0"]["kernel"])
    assert not np.allclose(kernels[0], kernels[1])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("n_critics", [1, 2])
@pytest.mark.parametrize(
    "space",
    [OBS_SPACES["box"], OBS_SPACES["dict"], gym.spaces.Box(0, 255, (10, 10, 4), np.uint8)],
    ids=["box", "dict", "small-image"],
)
def test_n_actions_per_observation_score_as_the_observation_repeated(space, n_critics, jit):
    # MPO scores N sampled actions per observation: actions (N, B, D) with observations (B, ...)
    # give (N, B), each observation encoded once; the values are those of the observations
    # repeated N times (the way it was computed before, with an image's CNN run N * B times).
    n = 5
    q = qvalue_factory(space, BOX_ACTIONS, hidden=(16, 16), n_critics=n_critics)
    params = init_params(KEY, q, [space_input_shape(space), (2,)])
    obs = batch_obs(space)
    actions = jax.random.uniform(jax.random.key(1), (n, BATCH, 2), minval=-1.0, maxval=1.0)
    repeated = jax.tree.map(lambda x: jnp.broadcast_to(x[None], (n, *x.shape)).reshape(n * BATCH, *x.shape[1:]), obs)
    apply = jax.jit(q.apply) if jit else q.apply
    values = np.asarray(apply(params, obs, actions))
    expected = np.asarray(apply(params, repeated, actions.reshape(n * BATCH, 2)))
    lead = (n_critics,) if n_critics > 1 else ()
    assert values.shape == lead + (n, BATCH)
    np.testing.assert_allclose(values, expected.reshape(lead + (n, BATCH)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("action_space", [gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Box(-1, 1, (2, 2))], ids=str)
def test_qvalue_factory_rejects(action_space):
    with pytest.raises(ValueError) as info:
        qvalue_factory(OBS_SPACES["box"], action_space)
    assert str(action_space) in str(info.value)
    with pytest.raises(ValueError, match="n_critics"):
        qvalue_factory(OBS_SPACES["box"], BOX_ACTIONS, n_critics=0)


# ------------------------------------------------------------------------------------------------
# init_params
# ------------------------------------------------------------------------------------------------


def test_init_params_tabulate_prints(capsys):
    policy = policy_factory(OBS_SPACES["box"], DISCRETE_ACTIONS)
    params = init_params(KEY, policy, [(4,)], tabulate=True)
    out = capsys.readouterr().out
    assert "Dense" in out and "params" in out.lower()
    assert "params" in params
    init_params(KEY, policy, [(4,)])
    assert capsys.readouterr().out == ""


def test_init_params_deterministic_in_key():
    space = OBS_SPACES["dict"]
    value = value_factory(space)
    p1 = init_params(jax.random.key(1), value, [space_input_shape(space)])
    p2 = init_params(jax.random.key(1), value, [space_input_shape(space)])
    p3 = init_params(jax.random.key(2), value, [space_input_shape(space)])
    jax.tree.map(np.testing.assert_array_equal, p1, p2)
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), p1, p3))
    assert any(diffs)
    assert jax.tree.structure(p1) == jax.tree.structure(p3)


def test_init_params_builds_batch_one_zeros():
    class Recorder(nn.Module):
        @nn.compact
        def __call__(self, a, b):
            self.param("a", nn.initializers.zeros, a.shape)
            self.param("b", nn.initializers.zeros, b.shape)
            return a

    variables = init_params(KEY, Recorder(), [(3,), (2, 4)])
    assert shapes(variables["params"]) == {"a": (1, 3), "b": (1, 2, 4)}


# --------------------------------------------------------------------------------------------
# kitae.modules.initializers.orthogonal: jax's values, QRs one matrix at a time under vmap
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 64), (4, 256), (256, 3), (3, 3, 4, 8)])
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("raw_key", [False, True])
def test_orthogonal_gives_jaxs_values_alone_vmapped_and_nested(shape, jit, raw_key):
    from kitae.modules.initializers import orthogonal

    ours, jaxs = orthogonal(0.5), jax.nn.initializers.orthogonal(0.5)
    key = jax.random.PRNGKey(3) if raw_key else jax.random.key(3)
    wrap = jax.jit if jit else (lambda f: f)

    def both(fn):
        return wrap(fn(ours))(key), wrap(fn(jaxs))(key)

    alone = both(lambda init: lambda k: init(k, shape))
    vmapped = both(lambda init: lambda k: jax.vmap(lambda kk: init(kk, shape))(jax.random.split(k, 3)))
    nested = both(  # seeds x critics: the rule runs at both levels
        lambda init: (
            lambda k: jax.vmap(jax.vmap(lambda kk: init(kk, shape)))(
                jax.random.split(k, 6).reshape(2, 3, *(2,) * raw_key)
            )
        )
    )
    shared = both(lambda init: lambda k: jax.vmap(lambda _: init(k, shape))(jnp.arange(2)))  # one key, unbatched
    for mine, theirs in (alone, vmapped, nested, shared):
        assert mine.dtype == theirs.dtype == jnp.float32
        np.testing.assert_array_equal(mine, theirs)
    assert alone[0].shape == shape and vmapped[0].shape == (3, *shape) and nested[0].shape == (2, 3, *shape)
    np.testing.assert_array_equal(shared[0][0], alone[0])
    flat = np.asarray(alone[0]).reshape(-1, shape[-1])  # orthonormal columns or rows, times the scale
    gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(gram, 0.25 * np.eye(len(gram)), atol=1e-5)


_FOUR_VMAPPED_LAYERS = """
import jax
from {module} import orthogonal
init = orthogonal()
def layers(key):  # four independent vmapped layers: XLA runs their QRs at once
    return [jax.vmap(lambda k: init(k, (64, 64)))(jax.random.split(k, 2)) for k in jax.random.split(key, 4)]
program = jax.jit(layers)
for i in range(50):
    jax.block_until_ready(program(jax.random.key(i)))
print("finished")
"""


def test_vmapped_orthogonal_layers_do_not_deadlock_xlas_thread_pool():
    """jax's own initialiser hangs here on a 2-core machine (in every try here: both intra-op
    threads wait in batched QRs for tasks no thread is left to run; with more cores, and so more
    pool threads, it may not); kitae's runs each matrix's QR alone. In a child process, so that a
    hang fails this test without stopping the worker."""
    import subprocess
    import sys

    code = _FOUR_VMAPPED_LAYERS.format(module="kitae.modules.initializers")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr[-2000:]


def qr_ranks(jaxpr) -> list[int]:
    """The operand rank of every QR decomposition in ``jaxpr`` and the jaxprs inside it: 2 for one
    matrix, 3 for a batch of them (one batched LAPACK call)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "qr":
            found.append(eqn.invars[0].aval.ndim)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += qr_ranks(inner)
    return found


def test_dense_init_and_the_recurrent_cores_batch_no_qr():
    """Every orthogonal kernel kitae's modules make (dense layers, an LSTM's or GRU's recurrent
    kernels) is kitae's initialiser: under vmap, no QR takes a batch (jax's takes one)."""
    from kitae.modules.encoders import dense_init
    from kitae.modules.recurrent import RecurrentCore, initial_hidden

    keys = jax.random.split(jax.random.key(1), 2)
    np.testing.assert_array_equal(
        dense_init(None)(keys[0], (8, 4)), jax.nn.initializers.orthogonal(2**0.5)(keys[0], (8, 4))
    )
    jaxs = jax.vmap(lambda k: jax.nn.initializers.orthogonal()(k, (8, 4)))
    assert qr_ranks(jax.make_jaxpr(jaxs)(keys).jaxpr) == [3]  # what the test looks for
    assert qr_ranks(jax.make_jaxpr(jax.vmap(lambda k: dense_init(1.0)(k, (8, 4))))(keys).jaxpr) == [2]
    x, reset = jnp.zeros((3, 5)), jnp.zeros(3, bool)
    for kind in ("lstm", "gru"):
        core = RecurrentCore(kind, 8)
        init = jax.vmap(lambda k, core=core, kind=kind: core.init(k, initial_hidden(kind, 8, 3), x, reset))
        ranks = qr_ranks(jax.make_jaxpr(init)(keys).jaxpr)
        assert ranks and set(ranks) == {2}, (kind, ranks)

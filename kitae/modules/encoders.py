"""Observation encoders: flax.linen modules mapping observations to feature vectors ``(..., F)``.

* ``MLP`` acts on the last axis: ``(..., D) -> (..., hidden[-1])`` (identity when ``hidden=()``).
* ``NatureCNN`` encodes images laid out as ``(..., H, W, C)`` into ``(..., 512)`` (``H, W >= 36``).
* ``MinAtarCNN`` encodes small images ``(..., H, W, C)`` (``H, W >= 3``, e.g. MinAtar's 10x10)
  into ``(..., 128)``.
* ``DiscreteEncoder`` one-hot encodes integer observations ``(...)`` and applies an ``MLP``.
* ``DictEncoder`` encodes a dict of observations, one encoder per key, and concatenates.
* ``encoder_factory`` picks one of the above from a gymnasium observation space.

Images: ``uint8`` pixels are scaled to ``[0, 1]`` INSIDE the network (``image_to_float``), so
buffers keep ``uint8`` observations (4x less memory than float32). An ``"action_mask"`` entry of
a ``Dict`` observation is never encoded (see ``kitae.action_masks``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from kitae.action_masks import ACTION_MASK_KEY
from kitae.modules import initializers
from kitae.modules.conv import Conv

Activation = str | Callable[[jax.Array], jax.Array]
"""An activation: a name understood by ``get_activation`` or a callable ``(...) -> (...)``."""

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": nn.tanh,
    "relu": nn.relu,
    "gelu": nn.gelu,
    "elu": nn.elu,
    "silu": nn.silu,
    "swish": nn.swish,
    "leaky_relu": nn.leaky_relu,
    "sigmoid": nn.sigmoid,
    "identity": lambda x: x,
}

NATURE_CNN_MIN_SIZE = 36
"""Smallest height / width ``NatureCNN`` accepts (its three VALID convolutions need >= 36 pixels).
``encoder_factory`` picks ``MinAtarCNN`` for smaller images."""

SMALL_CNN_MIN_SIZE = 3
"""Smallest height / width ``MinAtarCNN`` accepts (its 3x3 VALID convolution)."""


def image_to_float(x: jax.Array) -> jax.Array:
    """Images to float32: ``uint8`` pixels are divided by 255 (to ``[0, 1]``); ``bool`` and other
    integer images are cast as they are (0/1 planes stay 0/1); float images are unchanged (float64
    too). Elementwise: any shape, e.g. ``(B, H, W, C)``, and the result has ``x``'s shape."""
    x = jnp.asarray(x)
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.float32)
    return x


def get_activation(activation: Activation) -> Callable[[jax.Array], jax.Array]:
    """Resolves an activation given by name (``"tanh"``, ``"relu"``, ``"gelu"``, ``"elu"``,
    ``"silu"``, ``"swish"``, ``"leaky_relu"``, ``"sigmoid"``, ``"identity"``) or returns a callable
    unchanged. Raises ``ValueError`` for an unknown name."""
    if callable(activation):
        return activation
    try:
        return _ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(
            f"Unknown activation {activation!r}; expected a callable or one of {sorted(_ACTIVATIONS)}."
        ) from None


def dense_init(scale: float | None, orthogonal: bool = True):
    """Kernel initialiser: ``orthogonal(scale)`` when ``orthogonal`` (``scale=None`` -> sqrt(2)),
    else flax's default ``lecun_normal``. The orthogonal one is ``kitae.modules.initializers``'s:
    jax's values, with QRs that cannot deadlock XLA:CPU under ``vmap``."""
    if not orthogonal:
        return nn.initializers.lecun_normal()
    return initializers.orthogonal(math.sqrt(2.0) if scale is None else scale)


class MLP(nn.Module):
    """Multi-layer perceptron on the last axis: ``(..., D) -> (..., hidden[-1])``.

    Each layer is ``Dense -> [LayerNorm] -> activation``. With ``hidden=()`` it is the identity.

    Attributes:
        hidden: sizes of the hidden layers.
        activation: activation name (see ``get_activation``) or callable.
        layer_norm: apply ``LayerNorm`` after each ``Dense`` (before the activation).
        orthogonal: orthogonal kernel init with scale sqrt(2) and zero biases (as in CleanRL);
            ``False`` uses flax's default init.
    """

    hidden: Sequence[int] = (64, 64)
    activation: Activation = "tanh"
    layer_norm: bool = False
    orthogonal: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(..., D)`` -> ``(..., hidden[-1])`` (``x`` unchanged if ``hidden`` is empty)."""
        act = get_activation(self.activation)
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.float32)
        for size in self.hidden:
            x = nn.Dense(size, kernel_init=dense_init(None, self.orthogonal))(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = act(x)
        return x


class FlattenMLP(nn.Module):
    """An ``MLP`` over observations of several axes (or none) flattened into one, as SB3's
    ``FlattenExtractor`` and PureJaxRL do: ``(..., *obs_shape) -> (..., hidden[-1])``. For ``Box``
    spaces that are neither vectors nor images, such as bsuite's ``Catch`` board ``(10, 5)``.

    Attributes:
        obs_ndim: how many trailing axes one observation has (the rest are batch axes).
        hidden, activation: as ``MLP``'s.
    """

    obs_ndim: int
    hidden: Sequence[int] = (64, 64)
    activation: Activation = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(..., *obs_shape)`` -> ``(..., hidden[-1])`` (``(..., prod(obs_shape))`` with no hidden layer)."""
        x = jnp.asarray(x)
        batch = x.shape[: x.ndim - self.obs_ndim]
        return MLP(hidden=self.hidden, activation=self.activation)(x.reshape(*batch, -1))


class NatureCNN(nn.Module):
    """The DQN convolutional torso of Mnih et al. (2015).

    ``Conv(32, 8x8, stride 4) -> Conv(64, 4x4, stride 2) -> Conv(64, 3x3, stride 1) -> flatten
    -> Dense(512)``, all VALID padding and ReLU.

    Input layout is channels-last: ``(..., H, W, C)`` with any number of leading batch dims (or
    none); ``H, W >= 36``. ``uint8`` frames are cast to float and scaled by 1/255; other inputs
    are cast to float as they are (``image_to_float``). Output: ``(..., features)``.

    Attributes:
        features: size of the final dense layer (512 in the paper).
        orthogonal: orthogonal init with scale sqrt(2) and zero biases; ``False`` uses flax defaults.
        convs: the convolutions, ``(filters, kernel size, stride)`` each.
    """

    features: int = 512
    orthogonal: bool = True
    convs: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(..., H, W, C)`` -> ``(..., features)``."""
        return _conv_torso(x, self.convs, self.features, self.orthogonal)


def _conv_torso(x: jax.Array, convs: tuple[tuple[int, int, int], ...], features: int, orthogonal: bool) -> jax.Array:
    """``image_to_float`` -> ``Conv(f, k x k, stride s, VALID) -> ReLU`` for each ``(f, k, s)`` in
    ``convs`` -> flatten -> ``Dense(features) -> ReLU``, leading batch dims kept. Called from a
    module's ``nn.compact`` ``__call__``, so the layers are that module's (``Conv_0``, ...).
    ``kitae.modules.conv.Conv``: flax's ``Conv``, with gradients XLA:CPU runs fast in loops."""
    x = image_to_float(x)
    kinit = dense_init(None, orthogonal)
    batch = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    for n_filters, kernel, stride in convs:
        x = nn.relu(Conv(n_filters, (kernel, kernel), strides=(stride, stride), padding="VALID", kernel_init=kinit)(x))
    x = x.reshape(batch + (-1,))
    return nn.relu(nn.Dense(features, kernel_init=kinit)(x))


class MinAtarCNN(nn.Module):
    """The small convolutional torso of the MinAtar paper (Young & Tian, 2019), for small images.

    ``Conv(16, 3x3, stride 1, VALID) -> ReLU -> flatten -> Dense(128) -> ReLU``.

    Input layout is channels-last ``(..., H, W, C)`` with any number of leading batch dims, ``H, W
    >= 3`` (MinAtar: ``(10, 10, C)``). Inputs go through ``image_to_float`` (``uint8`` scaled by
    1/255, 0/1 planes kept). Output: ``(..., features)``.

    Attributes:
        features: size of the dense layer (128 in the paper).
        orthogonal: orthogonal init with scale sqrt(2) and zero biases; ``False`` uses flax defaults.
        convs: the convolutions, ``(filters, kernel size, stride)`` each.
    """

    features: int = 128
    orthogonal: bool = True
    convs: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(..., H, W, C)`` -> ``(..., features)``."""
        return _conv_torso(x, self.convs, self.features, self.orthogonal)


class DiscreteEncoder(nn.Module):
    """Encodes integer observations of a ``Discrete(n, start)`` space.

    ``(...)`` integers in ``[start, start + n)`` -> one-hot ``(..., n)`` -> ``MLP`` ->
    ``(..., hidden[-1])`` (``(..., n)`` when ``hidden=()``).

    Attributes:
        n: number of observation values.
        start: smallest observation value (``Discrete.start``).
        hidden, activation, layer_norm, orthogonal: as in ``MLP``.
    """

    n: int
    start: int = 0
    hidden: Sequence[int] = (64, 64)
    activation: Activation = "tanh"
    layer_norm: bool = False
    orthogonal: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: ``(...)`` integers -> ``(..., F)``."""
        x = jnp.asarray(x).astype(jnp.int32) - self.start
        onehot = jax.nn.one_hot(x, self.n, dtype=jnp.float32)
        return MLP(self.hidden, self.activation, self.layer_norm, self.orthogonal)(onehot)


class DictEncoder(nn.Module):
    """Encodes a dict of observations: ``encoders[i]`` preprocesses ``obs[keys[i]]`` (a vector as
    it is, an image through its CNN, a ``Discrete`` value one-hot), the features are concatenated
    along the last axis in the order of ``keys``, and ``head`` (an ``MLP``) reads them together, so
    the keys' features can interact (a goal-conditioned agent compares ``desired_goal`` with
    ``achieved_goal``: features encoded apart and only added up cannot).

    Every entry must share the same leading batch dims; each encoder maps its entry to ``(..., F_i)``,
    and the output is ``head``'s, ``(..., hidden[-1])`` (``(..., sum_i F_i)`` with no hidden layers).
    Entries of ``obs`` whose key is not in ``keys`` (such as ``"action_mask"``) are ignored.

    Attributes:
        keys: the dict keys, in concatenation order (``encoder_factory`` sorts them).
        encoders: one module per key.
        head: the module applied to the concatenated features (default: none).
    """

    keys: Sequence[str]
    encoders: Sequence[nn.Module]
    head: nn.Module | None = None

    def __call__(self, obs: dict[str, jax.Array]) -> jax.Array:
        """obs: ``{key: array}`` -> ``(..., F)``."""
        missing = [k for k in self.keys if k not in obs]
        if missing:
            raise KeyError(f"DictEncoder: observation is missing keys {missing}; got {sorted(obs)}.")
        feats = [enc(obs[k]) for k, enc in zip(self.keys, self.encoders)]
        features = jnp.concatenate(feats, axis=-1)
        return features if self.head is None else self.head(features)


def _accepted() -> str:
    return (
        "accepted observation spaces: Box with shape (D,) -> MLP, Box with shape (H, W, C) "
        f"(channels last) -> NatureCNN when H, W >= {NATURE_CNN_MIN_SIZE}, MinAtarCNN when "
        f"{SMALL_CNN_MIN_SIZE} <= min(H, W) < {NATURE_CNN_MIN_SIZE}, Discrete -> one-hot + MLP, "
        f"Box of any other number of axes -> flattened, then MLP, "
        f"Dict of these -> per-key encoders concatenated (its {ACTION_MASK_KEY!r} key is not encoded)"
    )


def encoder_factory(
    observation_space: gym.Space,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: Activation = "tanh",
) -> nn.Module:
    """Builds an encoder for a gymnasium observation space.

    * ``Box`` of shape ``(D,)`` -> ``MLP(hidden, activation)``: ``(..., D) -> (..., hidden[-1])``.
    * ``Box`` of shape ``(H, W, C)`` with ``H, W >= 36`` -> ``NatureCNN()``: ``(..., H, W, C) ->
      (..., 512)``; with ``3 <= min(H, W) < 36`` -> ``MinAtarCNN()``: ``(..., 128)``. The layout
      must be channels-last; transpose channels-first ``(C, H, W)`` observations first (a shape
      with ``min(H, W) < 36`` and ``C >= 36``, such as ``(4, 84, 84)``, is refused as looking
      channels-first). ``hidden`` and ``activation`` do not apply. ``uint8`` images are scaled to
      ``[0, 1]`` inside.
    * ``Box`` of any other number of axes (``()``, ``(H, W)``, 4 or more) -> ``FlattenMLP``: the
      observation's axes flattened into one, then ``MLP(hidden, activation)``.
    * ``Discrete(n, start)`` -> ``DiscreteEncoder``: ``(...)`` -> one-hot -> ``MLP``.
    * ``Dict`` -> ``DictEncoder``: one encoder per key (keys sorted, built recursively with no
      hidden layers: vectors as they are, images through their CNN, ``Discrete`` one-hot), the
      features concatenated, then ``MLP(hidden, activation)`` over them all (as SB3's
      ``CombinedExtractor`` with its MLP). The ``"action_mask"`` key (``kitae.action_masks``) is
      left out: masks are never encoded.

    With ``hidden=()`` the MLPs are the identity, so the encoder only preprocesses (one-hot, concat).

    Raises:
        ValueError: for any other space (naming it and listing the accepted ones).
    """
    hidden = tuple(hidden)
    if isinstance(observation_space, gym.spaces.Box):
        shape = observation_space.shape
        if len(shape) == 1:
            return MLP(hidden=hidden, activation=activation)
        if len(shape) != 3:  # a scalar, a board (H, W), or more axes: flattened, then the MLP
            return FlattenMLP(obs_ndim=len(shape), hidden=hidden, activation=activation)
        if len(shape) == 3:
            if min(shape[0], shape[1]) < SMALL_CNN_MIN_SIZE:
                raise ValueError(
                    f"Unsupported observation space {observation_space}: image height and width must "
                    f"be >= {SMALL_CNN_MIN_SIZE} (layout (H, W, C)); {_accepted()}."
                )
            if min(shape[0], shape[1]) < NATURE_CNN_MIN_SIZE:
                if shape[2] >= NATURE_CNN_MIN_SIZE:  # e.g. (4, 84, 84): frames stacked channels-first
                    raise ValueError(
                        f"Unsupported observation space {observation_space}: it looks channels-first "
                        f"(C, H, W) (a small height or width, {shape[2]} channels); kitae's CNNs read "
                        f"(H, W, C): transpose the observations to {(shape[1], shape[2], shape[0])} "
                        "(np.moveaxis(obs, 0, -1); "
                        f"kitae.envs.envpool_env.EnvPoolVectorEnv does with channels_last=True); {_accepted()}."
                    )
                return MinAtarCNN()
            return NatureCNN()
    elif isinstance(observation_space, gym.spaces.Discrete):
        return DiscreteEncoder(
            n=int(observation_space.n),
            start=int(observation_space.start),
            hidden=hidden,
            activation=activation,
        )
    elif isinstance(observation_space, gym.spaces.Dict):
        keys = sorted(k for k in observation_space.spaces if k != ACTION_MASK_KEY)
        if not keys:
            raise ValueError(
                f"Unsupported observation space {observation_space}: a Dict with nothing to encode "
                f"(empty, or only {ACTION_MASK_KEY!r}); {_accepted()}."
            )
        encoders = []
        for k in keys:
            try:
                encoders.append(encoder_factory(observation_space.spaces[k], hidden=(), activation=activation))
            except ValueError as error:  # named by its key: a Dict of several spaces says which one
                text, at = str(error), f"observation_space[{k!r}]"
                nested = text.startswith("observation_space[")  # a Dict inside: its own key follows
                raise ValueError(at + text[len("observation_space") :] if nested else f"{at}: {text}") from None
        return DictEncoder(keys=tuple(keys), encoders=tuple(encoders), head=MLP(hidden=hidden, activation=activation))
    if isinstance(observation_space, gym.spaces.Tuple):
        raise ValueError(
            f"Unsupported observation space {observation_space}: a Tuple is read as a Dict of its entries; make "
            "the environments with kitae.envs.make.make_vec_env (which does) or wrap each one with "
            f"kitae.envs.wrappers.tuple_as_dict; {_accepted()}."
        )
    raise ValueError(f"Unsupported observation space {observation_space}; {_accepted()}.")


def space_input_shape(space: gym.Space):
    """Shape(s) of one observation of ``space``, for ``init_params``: ``space.shape`` for ``Box``
    and ``Discrete`` (``()`` for the latter), and a dict ``{key: shape}`` for ``Dict`` spaces."""
    if isinstance(space, gym.spaces.Dict):
        return {k: space_input_shape(s) for k, s in space.spaces.items()}
    if space.shape is None:
        raise ValueError(f"Space {space} has no shape.")
    return tuple(int(d) for d in space.shape)


__all__ = [
    "MLP",
    "FlattenMLP",
    "NatureCNN",
    "MinAtarCNN",
    "DiscreteEncoder",
    "DictEncoder",
    "encoder_factory",
    "get_activation",
    "dense_init",
    "space_input_shape",
    "image_to_float",
]

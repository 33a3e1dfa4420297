"""Configuration dataclasses: what an agent is, what it trains on and how it updates.

Why this module is long: every config section (environment, update, training, replay,
distribution), its validation and its YAML round trip live together, and a config with traced
values for sweeps (``traced_config``) next to the fields it may vary, so the whole contract of
``config.yaml`` is read in one file.

Every config validates its fields when it is made and raises ``TypeError`` (wrong type) or
``ValueError`` (value out of range, unknown field) with a message naming the field, the value
and what is allowed. Configs round-trip through YAML (``AlgoConfig.to_yaml`` /
``AlgoConfig.from_yaml``) without pickle: spaces become plain dicts and the algorithm's params
class is looked up by name in a registry (``register_algo_params``), never imported from the file.

Units. Every step count (``TrainConfig.n_env_steps``, ``save_frequency``, an off-policy agent's
``start_step`` and ``skip_steps``) counts environment transitions summed over all environments:
one call to a vector environment of 16 environments is 16 steps. ``UpdateConfig.max_buffer_size``
is a buffer length per environment: the buffer holds ``max_buffer_size * n_envs * n_agents``
transitions (for on-policy agents, the rollout length).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

import gymnasium as gym
import yaml

from kitae.envs.spaces import space_from_dict, space_to_dict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

# float32's largest finite value: a learning rate above it is inf in the optimizer's float32 maths
FLOAT32_MAX = 3.4028234663852886e38

# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is gym.Space:
        return "gymnasium.spaces.Space"
    return getattr(tp, "__name__", str(tp))


def _coerce(field_path: str, value: Any, tp: Any) -> Any:
    """Checks ``value`` against the annotation ``tp``; returns it (ints widened to float)."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(field_path, value, option)
            except TypeError:
                continue
        raise TypeError(_type_message(field_path, value, tp))
    if tp is type(None):
        if value is None:
            return None
    elif tp is tuple or origin is tuple:  # YAML has no tuples: a loaded list becomes a tuple again
        if isinstance(value, (list, tuple)):
            return tuple(value)
    elif origin is dict:  # the keys and values are the field's own checks
        if isinstance(value, dict):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(tp, type):
        if isinstance(value, tp):
            return value
    else:  # other typing constructs are not checked
        return value
    raise TypeError(_type_message(field_path, value, tp))


_NUMBERS_TEXT = re.compile(r"^[(\[]?\s*-?\d+(?:\s*[,\s]\s*-?\d+)*\s*,?\s*[)\]]?$")


def _allows(tp: Any, kind: type) -> bool:
    """Whether the annotation ``tp`` takes values of ``kind`` (``tuple[int, ...] | None``: tuple)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return any(_allows(option, kind) for option in typing.get_args(tp))
    return tp is kind or typing.get_origin(tp) is kind


def _type_message(field_path: str, value: Any, tp: Any) -> str:
    """The refusal of ``value`` for a field annotated ``tp``, with how to write it in YAML where
    the value is what YAML makes of Python's or a shell's spelling: ``None`` (the text 'None';
    YAML's is ``null``), ``(64, 64)`` or ``64,64`` (text; a list is ``[64, 64]``), ``no``/``off``
    (YAML 1.1's booleans, for a text field)."""
    message = f"{field_path}={value!r} has type {type(value).__name__}; allowed: {_type_name(tp)}"
    if isinstance(value, str) and value.strip() in ("None", "none") and _allows(tp, type(None)):
        return f"{message} (YAML writes None as null)"
    if isinstance(value, str) and _allows(tp, tuple) and _NUMBERS_TEXT.match(value.strip()):
        numbers = re.findall(r"-?\d+", value)
        return f"{message} (YAML writes a list as [{', '.join(numbers)}])"
    if isinstance(value, str) and value.strip() in ("None", "none"):
        return f"{message} (None is not allowed here)"
    if isinstance(value, bool) and _allows(tp, str):
        return f"{message} (YAML reads yes, no, on and off as true and false: null for none, or quote a text)"
    return message


def validate_types(obj: Any, prefix: str = "") -> None:
    """Checks (and widens int to float) every field of a dataclass against its annotation."""
    try:
        hints = typing.get_type_hints(type(obj))
    except Exception:  # annotations that cannot be resolved (a class defined in a function) are not checked
        hints = {}
    for f in dataclasses.fields(obj):
        value = _coerce(f"{prefix}{f.name}", getattr(obj, f.name), hints.get(f.name, Any))
        object.__setattr__(obj, f.name, value)


def _require(condition: bool, field_path: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ValueError(f"{field_path}={value!r} is not allowed; allowed: {allowed}")


def check_algo_param(condition: bool, field: str, value: Any, allowed: str) -> None:
    """For params dataclasses' ``__post_init__``: raises ``ValueError`` naming
    ``algo_params.<field>``, the value and what is allowed, unless ``condition`` holds."""
    _require(condition, f"algo_params.{field}", value, allowed)


def unknown_field_message(field: Any, where: str, names: list[str], prefix: str = "") -> str:
    """``"unknown field update_cfg.learnig_rate in UpdateConfig; did you mean
    update_cfg.learning_rate?; allowed fields: ..."``: the closest name, where one is close."""
    close = difflib.get_close_matches(str(field), names, n=1, cutoff=0.75)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    return f"unknown field {prefix}{field} in {where}{hint}; allowed fields: {', '.join(names)}"


def hint_unknown_keywords(cls: type[D]) -> type[D]:
    """Makes a dataclass's constructor refuse an unknown keyword with ``unknown_field_message``
    (``UpdateConfig(learnig_rate=1e-3)``: "unknown field learnig_rate in UpdateConfig; did you mean
    learning_rate?; allowed fields: ...") instead of Python's bare "unexpected keyword argument";
    still a ``TypeError``. Applied to every config section and, by ``register_algo_params``, to
    every algorithm's params."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(unknown_field_message(unknown[0], cls.__name__, names))
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _fields_text(names: list[str]) -> str:
    """``"the field a"`` or ``"the fields a, b"``: every missing field named at once, not the first only."""
    return f"the field {names[0]}" if len(names) == 1 else f"the fields {', '.join(names)}"


def require_mapping(what: str, data: Any) -> None:
    """Raises ``TypeError`` ("update_cfg must be a mapping of fields, got 3") unless ``data`` is a
    dict: a config section read from YAML."""
    if not isinstance(data, dict):
        raise TypeError(f"{what} must be a mapping of fields, got {data!r}")


def _from_mapping(cls: type[D], data: Any, prefix: str) -> D:
    """Builds a dataclass from a mapping, rejecting unknown keys by name."""
    require_mapping(prefix.rstrip(".") or cls.__name__, data)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(unknown_field_message(unknown[0], cls.__name__, names, prefix))
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{cls.__name__} is missing {_fields_text([prefix + name for name in missing])}")
    return cls(**data)


# ---------------------------------------------------------------------------------------------
# Algorithm params registry
# ---------------------------------------------------------------------------------------------

_ALGO_PARAMS_REGISTRY: dict[str, type] = {}


def _is_builtin(cls: type) -> bool:
    return cls.__module__ == "kitae" or cls.__module__.startswith("kitae.")


def params_class_name(cls: type) -> str:
    """The name ``config.yaml`` stores for a params class (its ``algo_params_class``).

    kitae's own classes are named by their class name (``DQNParams``); any other by
    ``module:qualname`` (``__main__:DQNParams``, ``mypkg.agents:MyParams``), so that a user's class
    that happens to share a built-in's name (the custom-agent guide's ``DQNParams``) is never read
    back as kitae's.
    """
    return cls.__qualname__ if _is_builtin(cls) else f"{cls.__module__}:{cls.__qualname__}"


def register_algo_params(cls: type[T]) -> type[T]:
    """Registers a params dataclass so that ``AlgoConfig.from_yaml`` can rebuild it by name.

    Use as a decorator. The name stored in YAML is ``params_class_name(cls)``; loading a config
    never imports a module named in the file. Registering a class of the same module and name
    again (a notebook cell run twice) replaces the earlier one.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"register_algo_params expects a dataclass, got {cls!r}")
    hint_unknown_keywords(cast(Any, cls))
    _ALGO_PARAMS_REGISTRY[params_class_name(cls)] = cls
    return cls


def algo_params_class(name: str) -> type:
    """Returns the registered params class called ``name`` (``params_class_name``).

    Params classes register themselves when their module is imported
    (``@register_algo_params``); kitae's built-in algorithms are all imported with ``kitae``. A
    script's class is also found under the other name of its file, when it is the only registered
    class of that name outside kitae: ``__main__:MyParams`` (written by ``python train.py``) read
    where ``train`` is imported, and the other way round; and so is a plain ``MyParams``, which
    kitae before 2026-11-29 wrote for any class.
    """
    if name in _ALGO_PARAMS_REGISTRY:
        return _ALGO_PARAMS_REGISTRY[name]
    module, _, qualname = name.rpartition(":")
    same_name = [
        cls
        for cls in _ALGO_PARAMS_REGISTRY.values()
        if not _is_builtin(cls)
        and cls.__qualname__ == qualname
        and "__main__" in (module or "__main__", cls.__module__)
    ]
    if len(same_name) == 1:
        return same_name[0]
    known = ", ".join(sorted(_ALGO_PARAMS_REGISTRY)) or "none"
    ambiguous = (
        f"; several registered classes are called {qualname!r} ({', '.join(map(params_class_name, same_name))})"
        if same_name
        else ""
    )
    raise ValueError(
        f"algo_params class {name!r} is not registered{ambiguous}; registered: {known}. Import the module that "
        "defines it (decorated with kitae.config.register_algo_params) or pass algo_params_type= when loading"
    )


# ---------------------------------------------------------------------------------------------
# The configs
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class AlgoParams:
    """Base class of an algorithm's hyperparameters. Inheriting from it is optional: any
    dataclass works as ``AlgoConfig.algo_params``.

    A params class may define ``unread_fields(self, config) -> dict[str, str]``: the fields that
    a run of ``config`` does not read (PPO's ``vtrace_rho_bar`` without
    ``advantage_estimator="vtrace"``), each with what would make it read them. Sweeps and searches
    (``sweepable_keys``) refuse those fields: varying one trains the same run every time."""


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain YAML data: a scalar, or a list or str-keyed dict of such."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@hint_unknown_keywords
@dataclasses.dataclass
class EnvConfig:
    """What the agent trains on.

    Attributes:
        task_name: the environment id, e.g. ``"CartPole-v1"`` or ``"gymnax:CartPole-v1"``.
        observation_space: the space of ONE agent's observation in ONE environment.
        action_space: the space of ONE agent's action in ONE environment.
        n_envs: number of environments stepped together (>= 1).
        n_agents: number of agents per environment (>= 1); more than one turns on the
            parallel (multi-agent, shared-parameter) mode.
        env_kwargs: keyword arguments the environments are made with (the source's constructor:
            ``gymnasium.make``, a PettingZoo module's ``parallel_env``, EnvPool's options,
            ``gymnax.make``, ``BraxEnv``, JaxMARL's ``make``): names to plain values (bool, int,
            float, str, null, or lists and dicts of these), so that ``config.yaml`` holds them and
            every environment of the run (training, evaluation, video, Ray workers) is made alike.
    """

    task_name: str
    observation_space: gym.Space
    action_space: gym.Space
    n_envs: int = 1
    n_agents: int = 1
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_types(self, "env_cfg.")
        _require(self.n_envs >= 1, "env_cfg.n_envs", self.n_envs, "an int >= 1")
        _require(self.n_agents >= 1, "env_cfg.n_agents", self.n_agents, "an int >= 1")
        for name, value in self.env_kwargs.items():
            _require(
                isinstance(name, str) and name.isidentifier(),
                "env_cfg.env_kwargs",
                name,
                "keyword names (Python identifiers)",
            )
            _require(
                _plain(value),
                f"env_cfg.env_kwargs.{name}",
                value,
                "a bool, int, float, str or null, or a list or dict of these (what config.yaml holds)",
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values (the spaces as ``space_to_dict``'s mappings;
        ``env_kwargs`` only when there are some), what ``config.yaml`` holds under ``env_cfg``."""
        return {
            "task_name": self.task_name,
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "n_envs": self.n_envs,
            "n_agents": self.n_agents,
            **({"env_kwargs": copy.deepcopy(self.env_kwargs)} if self.env_kwargs else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvConfig:
        """Rebuilds a config from ``to_dict``'s output (spaces given as mappings are rebuilt).

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type.
            ValueError: an unknown or missing field, or a value out of range (named ``env_cfg.<field>``).
        """
        require_mapping("env_cfg", data)  # before dict(): dict(["ab"]) is {"a": "b"}
        data = dict(data)
        for key in ("observation_space", "action_space"):
            if isinstance(data.get(key), dict):
                data[key] = space_from_dict(data[key])
        return _from_mapping(cls, data, "env_cfg.")


@hint_unknown_keywords
@dataclasses.dataclass
class UpdateConfig:
    """How the agent's parameters are updated.

    Attributes:
        learning_rate: optimizer step size (> 0).
        learning_rate_annealing: decay the learning rate linearly to 0 over training.
        max_grad_norm: clip gradients to this global norm (> 0), or ``None`` for no clipping.
        max_buffer_size: buffer length per environment (>= 1); the buffer holds
            ``max_buffer_size * n_envs * n_agents`` transitions. For on-policy agents this is
            the rollout length.
        batch_size: transitions per minibatch (>= 1, at most what the buffer can hold).
        n_epochs: on-policy: passes over each rollout; off-policy: gradient steps per update (>= 1).
        shared_encoder: actor and critic share one observation encoder.
    """

    learning_rate: float = 3e-4
    learning_rate_annealing: bool = False
    max_grad_norm: float | None = 0.5
    max_buffer_size: int = 128
    batch_size: int = 64
    n_epochs: int = 1
    shared_encoder: bool = False

    def __post_init__(self) -> None:
        validate_types(self, "update_cfg.")
        # float32's range: the optimizer computes in float32, where 1e300 is inf
        _require(
            0 < self.learning_rate <= FLOAT32_MAX,
            "update_cfg.learning_rate",
            self.learning_rate,
            "a finite float > 0 (at most float32's 3.4e38)",
        )
        _require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "update_cfg.max_grad_norm",
            self.max_grad_norm,
            "a float > 0 or None",
        )
        _require(self.max_buffer_size >= 1, "update_cfg.max_buffer_size", self.max_buffer_size, "an int >= 1")
        _require(self.batch_size >= 1, "update_cfg.batch_size", self.batch_size, "an int >= 1")
        _require(self.n_epochs >= 1, "update_cfg.n_epochs", self.n_epochs, "an int >= 1")

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values, what ``config.yaml`` holds under ``update_cfg``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpdateConfig:
        """Rebuilds a config from ``to_dict``'s output.

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type.
            ValueError: an unknown or missing field, or a value out of range (named ``update_cfg.<field>``).
        """
        return _from_mapping(cls, data, "update_cfg.")


MAX_ENV_STEPS = 2**31 - 1
"""The longest run: JAX counts in int32 unless x64 is on (kitae leaves it off: float64 would double
every array), so the step counters of the compiled loop, the schedules and the update gates would
wrap around past it (negative steps, learning rates annealed the wrong way)."""


@hint_unknown_keywords
@dataclasses.dataclass
class TrainConfig:
    """How long to train and how often to save.

    Attributes:
        n_env_steps: environment transitions to train for, summed over all environments (>= 1).
        save_frequency: save a checkpoint every this many environment transitions (>= 1), or -1
            to save only at the end of training.
        log_frequency: the host loop writes ``losses/<name>`` (the mean over the updates since the
            last point) once every this many environment transitions, and at the end (>= 1).
            Writing every update of an off-policy agent costs more than its acting does.
        eval_episodes: at every checkpoint (every ``save_frequency`` transitions and at the end),
            evaluate each seed's deterministic policy over this many episodes, as ``kitae eval``
            does, into ``metrics.jsonl`` (``eval_return``), TensorBoard
            (``eval/episodic_return``) and ``summary.json``, and keep the best-evaluated
            checkpoint beside the newest ones (``keep_checkpoints``; ``kitae eval RUN_DIR
            --checkpoint best``); 0 (the default) evaluates nothing.
        keep_checkpoints: keep the newest this many checkpoints (>= 1; older ones are deleted as
            new ones are saved, except the best-evaluated one), or -1 to keep every one.
        stop_return: stop training, with a checkpoint, once every seed's return has reached this
            (a finite float), or ``None`` (the default) to train all ``n_env_steps``. The return
            is the mean of the seed's last 10 training episodes (the ``final_return`` of
            ``summary.json``; checked after every host step, or every compiled segment), or with
            ``eval_episodes`` its latest evaluation (checked at each checkpoint), as
            Stable-Baselines3's ``StopTrainingOnRewardThreshold`` does with its ``EvalCallback``.
    """

    n_env_steps: int = 100_000
    save_frequency: int = -1
    log_frequency: int = 1_000
    eval_episodes: int = 0
    keep_checkpoints: int = 3
    stop_return: float | None = None

    def __post_init__(self) -> None:
        validate_types(self, "train_cfg.")
        _require(
            1 <= self.n_env_steps <= MAX_ENV_STEPS,
            "train_cfg.n_env_steps",
            self.n_env_steps,
            f"an int >= 1 and <= {MAX_ENV_STEPS:,} (step counters are int32 in JAX)",
        )
        _require(
            self.save_frequency == -1 or self.save_frequency >= 1,
            "train_cfg.save_frequency",
            self.save_frequency,
            "-1 (only at the end) or an int >= 1",
        )
        _require(self.log_frequency >= 1, "train_cfg.log_frequency", self.log_frequency, "an int >= 1")
        _require(
            self.eval_episodes >= 0, "train_cfg.eval_episodes", self.eval_episodes, "0 (no evaluation) or an int >= 1"
        )
        _require(
            self.keep_checkpoints == -1 or self.keep_checkpoints >= 1,
            "train_cfg.keep_checkpoints",
            self.keep_checkpoints,
            "-1 (keep every one) or an int >= 1",
        )
        _require(
            self.stop_return is None or math.isfinite(self.stop_return),
            "train_cfg.stop_return",
            self.stop_return,
            "null (train every step) or a finite float",
        )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values, what ``config.yaml`` holds under ``train_cfg``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Rebuilds a config from ``to_dict``'s output.

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type.
            ValueError: an unknown or missing field, or a value out of range (named ``train_cfg.<field>``).
        """
        return _from_mapping(cls, data, "train_cfg.")


HER_STRATEGIES = ("future", "final", "episode")


@hint_unknown_keywords
@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """What an off-policy agent's replay buffer feeds its updates (``kitae.replay``; guide:
    ``docs/replay.md``). The default is uniform one-step sampling.

    Attributes:
        prioritized: proportional prioritized replay (Schaul et al. 2016): transitions are sampled
            with probability ``p_i^alpha / sum_j p_j^alpha``, ``p_i = |TD error| + priority_epsilon``
            from the update that last sampled them (new transitions get the largest priority seen),
            and each loss is weighted by ``(N P(i))^-beta`` over the batch's largest weight.
        priority_exponent: ``alpha``, in ``[0, 1]`` (0: uniform).
        importance_exponent: ``beta`` at the start, in ``[0, 1]``; annealed linearly to 1 over the
            run's gradient steps.
        priority_epsilon: added to ``|TD error|`` so no transition's priority is 0, a float > 0.
        n_step: each sampled transition carries the discounted sum of up to ``n_step`` rewards and
            the observation to bootstrap from after them, cut at termination (no bootstrap) and
            truncation (bootstrap from the real final observation), an int >= 1 (1: one step).
        her: hindsight experience replay's goal strategy for goal-conditioned environments
            (``Dict`` observations with ``observation``, ``achieved_goal``, ``desired_goal``):
            ``"future"``, ``"final"``, ``"episode"``, or ``None`` (no relabelling).
        her_ratio: the fraction of sampled transitions relabelled, in ``(0, 1]`` (0.8: HER's
            ``k = 4`` relabelled goals per real one).
        her_horizon: rows looked at on each side of a sampled transition to find its episode's
            bounds, an int >= 1: at least the environment's longest episode (a longer episode's
            goals are drawn from within this many steps).
    """

    prioritized: bool = False
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    priority_epsilon: float = 1e-6
    n_step: int = 1
    her: str | None = None
    her_ratio: float = 0.8
    her_horizon: int = 256

    def __post_init__(self) -> None:
        validate_types(self, "replay.")
        _require(
            0.0 <= self.priority_exponent <= 1.0,
            "replay.priority_exponent",
            self.priority_exponent,
            "a float in [0, 1]",
        )
        _require(
            0.0 <= self.importance_exponent <= 1.0,
            "replay.importance_exponent",
            self.importance_exponent,
            "a float in [0, 1]",
        )
        _require(self.priority_epsilon > 0.0, "replay.priority_epsilon", self.priority_epsilon, "a float > 0")
        _require(self.n_step >= 1, "replay.n_step", self.n_step, "an int >= 1")
        _require(
            self.her is None or self.her in HER_STRATEGIES, "replay.her", self.her, f"None or one of {HER_STRATEGIES}"
        )
        _require(0.0 < self.her_ratio <= 1.0, "replay.her_ratio", self.her_ratio, "a float in (0, 1]")
        _require(self.her_horizon >= 1, "replay.her_horizon", self.her_horizon, "an int >= 1")
        _require(
            self.her is None or self.n_step == 1,
            "replay.n_step",
            self.n_step,
            "1 with replay.her (relabelled goals change every reward of an n-step sum)",
        )

    @property
    def uniform_one_step(self) -> bool:
        """Nothing but uniform one-step sampling (the default)."""
        return not self.prioritized and self.n_step == 1 and self.her is None

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values, what ``config.yaml`` holds under ``replay``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayConfig:
        """Rebuilds a config from ``to_dict``'s output.

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type.
            ValueError: an unknown or missing field, or a value out of range (named ``replay.<field>``).
        """
        return _from_mapping(cls, data, "replay.")


def _distributed_count(name: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"distributed.{name}={value!r} is not allowed; allowed: an int >= {least}")


@hint_unknown_keywords
@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """The layout of a distributed run (``kitae train ... --workers N``).

    Attributes:
        workers: collection workers (Ray actors), each stepping ``n_envs / workers`` of the run's
            environments; an int >= 1 that divides ``env_cfg.n_envs``.
        gradient_workers: gradient workers, an int >= 1. One synchronous gradient worker runs each
            update whole; several split each gradient step's minibatch between them (synchronous)
            or take gradient steps as they come free (asynchronous).
        async_collection: collection workers never wait for the updater: each iteration is built
            from the first ``workers`` batches to arrive, collected with whatever weights each
            worker last received (the policy lag says how old). ``False``: every worker collects
            one batch with the current weights, then the update.
        async_gradients: gradients are applied as they arrive (the gradient lag says how stale
            they are); ``False``: each gradient step waits for every gradient worker and applies
            their mean.
        address: ``None`` to start a local Ray runtime (127.0.0.1, token authentication) and stop
            it at the end, or ``"HOST:PORT"`` of an existing cluster's head.
        max_restarts: dead workers the run replaces before it stops (with a checkpoint), int >= 0.
    """

    workers: int = 1
    gradient_workers: int = 1
    async_collection: bool = False
    async_gradients: bool = False
    address: str | None = None
    max_restarts: int = 3

    def __post_init__(self) -> None:
        _distributed_count("workers", self.workers, 1)
        _distributed_count("gradient_workers", self.gradient_workers, 1)
        _distributed_count("max_restarts", self.max_restarts, 0)
        for name in ("async_collection", "async_gradients"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"distributed.{name}={getattr(self, name)!r} is not allowed; allowed: true or false")
        if self.address is not None and (not isinstance(self.address, str) or ":" not in self.address):
            raise ValueError(
                f"distributed.address={self.address!r} is not allowed; allowed: null (start a local runtime) "
                "or 'HOST:PORT' of a Ray head"
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values, what ``config.yaml`` holds under ``distributed``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DistributedConfig:
        """Rebuilds a config from ``to_dict``'s output.

        Raises:
            TypeError: ``data`` is not a mapping, or a field has the wrong type.
            ValueError: an unknown or missing field, or a value out of range (named ``distributed.<field>``).
        """
        return _from_mapping(cls, data, "distributed.")


@hint_unknown_keywords
@dataclasses.dataclass
class AlgoConfig:
    """The whole configuration of an agent.

    Attributes:
        seed: the one seed that decides the run (an int in [0, 2**32)).
        algo_params: the algorithm's hyperparameters, a dataclass instance.
        update_cfg: an ``UpdateConfig``.
        train_cfg: a ``TrainConfig``.
        env_cfg: an ``EnvConfig``.
        distributed: a ``DistributedConfig`` to train on Ray (``kitae.distributed``), or ``None``
            (the host or compiled loop, picked from the environment).
        replay: a ``ReplayConfig``: how an off-policy agent samples its buffer (uniform one-step
            transitions by default).
    """

    seed: int
    algo_params: Any
    update_cfg: UpdateConfig
    train_cfg: TrainConfig
    env_cfg: EnvConfig
    distributed: DistributedConfig | None = None
    replay: ReplayConfig = dataclasses.field(default_factory=ReplayConfig)

    def __post_init__(self) -> None:
        validate_types(self)
        _require(0 <= self.seed < 2**32, "seed", self.seed, "an int in [0, 2**32)")
        if not dataclasses.is_dataclass(self.algo_params) or isinstance(self.algo_params, type):
            raise TypeError(f"algo_params={self.algo_params!r} is not allowed; allowed: a dataclass instance")
        validate_types(self.algo_params, "algo_params.")
        if self.distributed is not None and self.distributed.gradient_workers > 1 and self.replay.prioritized:
            raise ValueError(
                f"replay.prioritized=True is not allowed with distributed.gradient_workers="
                f"{self.distributed.gradient_workers}: priorities change at every gradient step, which one worker "
                "makes; allowed: distributed.gradient_workers=1 (or uniform replay)"
            )
        if self.distributed is not None and self.distributed.gradient_workers > 1:
            workers, batch = self.distributed.gradient_workers, self.update_cfg.batch_size
            _require(
                batch % workers == 0,
                "distributed.gradient_workers",
                workers,
                f"a divisor of update_cfg.batch_size={batch} (each gradient worker takes an equal part of every "
                "minibatch)",
            )
        # an n-step sum reads up to n_step consecutive rows of one environment's ring buffer: a
        # longer sum than the ring would wrap onto the rows it started from
        _require(
            self.replay.n_step <= self.update_cfg.max_buffer_size,
            "replay.n_step",
            self.replay.n_step,
            f"at most update_cfg.max_buffer_size={self.update_cfg.max_buffer_size} (the buffer's length per "
            "environment: an n-step sum reads n_step consecutive rows of one environment's buffer)",
        )
        capacity = self.update_cfg.max_buffer_size * self.env_cfg.n_envs * self.env_cfg.n_agents
        _require(
            self.update_cfg.batch_size <= capacity,
            "update_cfg.batch_size",
            self.update_cfg.batch_size,
            f"at most the buffer capacity max_buffer_size * n_envs * n_agents = "
            f"{self.update_cfg.max_buffer_size} * {self.env_cfg.n_envs} * {self.env_cfg.n_agents} = {capacity} "
            "('rollout' in a preset, a config file or --set gives that capacity)",
        )

    # -- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python values (what ``to_yaml`` writes)."""
        return {
            "seed": self.seed,
            "algo_params_class": params_class_name(type(self.algo_params)),
            "algo_params": _algo_params_to_dict(self.algo_params),
            "update_cfg": self.update_cfg.to_dict(),
            "train_cfg": self.train_cfg.to_dict(),
            "env_cfg": self.env_cfg.to_dict(),
            **({"distributed": self.distributed.to_dict()} if self.distributed is not None else {}),
            "replay": self.replay.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], algo_params_type: type | None = None) -> AlgoConfig:
        """Rebuilds a config from ``to_dict``'s output.

        Args:
            data: the mapping.
            algo_params_type: the params dataclass; if ``None``, the class named by
                ``algo_params_class`` is looked up in the registry (``register_algo_params``).
        """
        if not isinstance(data, dict):
            raise TypeError(f"a config must be a mapping, got {type(data).__name__}")
        data = dict(data)
        class_name = data.pop("algo_params_class", None)
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(unknown_field_message(unknown[0], "AlgoConfig", allowed))
        missing = [name for name in allowed if name not in data and name not in ("distributed", "replay")]
        if missing:
            raise ValueError(f"AlgoConfig is missing {_fields_text(missing)}")
        params_cls = algo_params_type
        if params_cls is None:
            if class_name is None:
                raise ValueError("algo_params_class is missing: cannot tell which params class to build")
            params_cls = algo_params_class(class_name)
        return cls(
            seed=data["seed"],
            algo_params=_from_mapping(params_cls, data["algo_params"], "algo_params."),
            update_cfg=UpdateConfig.from_dict(data["update_cfg"]),
            train_cfg=TrainConfig.from_dict(data["train_cfg"]),
            env_cfg=EnvConfig.from_dict(data["env_cfg"]),
            distributed=DistributedConfig.from_dict(data["distributed"]) if data.get("distributed") else None,
            replay=ReplayConfig.from_dict(data["replay"]) if data.get("replay") else ReplayConfig(),
        )

    def to_yaml(self, path: str | Path | None = None) -> str:
        """Writes the config as YAML (to ``path`` if given) and returns the text."""
        text = yaml_text(self.to_dict())
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path_or_text: str | Path, algo_params_type: type | None = None) -> AlgoConfig:
        """Reads a config written by ``to_yaml`` (a path, or the YAML text itself).

        Uses ``load_yaml`` (``yaml.safe_load`` reading ``3e-4`` as a float): loading runs no code
        from the file.
        """
        text = Path(path_or_text).read_text() if _is_path(path_or_text) else str(path_or_text)
        try:
            data = load_yaml(text)
        except yaml.YAMLError as error:
            raise ValueError(f"malformed YAML config: {yaml_error_text(error)}") from None
        if not isinstance(data, dict):
            raise ValueError(f"malformed YAML config: expected a mapping of fields, got {type(data).__name__}")
        return cls.from_dict(data, algo_params_type=algo_params_type)


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no code runs) reading floats as Python does: ``3e-4``, ``1e6`` and
    ``inf`` are floats (as ``.inf``). PyYAML follows YAML 1.1, whose floats need a dot (``3.0e-4``)
    and whose infinity is ``.inf`` only, and read ``learning_rate: 3e-4`` in a config file as the
    string ``'3e-4'``, refused as "has type str"."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping, refusing a key given twice: PyYAML keeps the last silently, so a config file with
    two ``update_cfg:`` sections lost the first one's fields. Keys a merge (``<<: *base``) brings
    may be overridden, as YAML allows."""
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping refuses it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found the key {key!r} twice (the second one would replace the first)",
                key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_implicit_resolver(  # PyYAML's float pattern; the dot optional before an exponent and in inf/nan, -.5 signed
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.?(?:inf|Inf|INF)
        |\.?(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789.iInN"),
)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, except that ``3e-4``, ``1e6`` and ``inf`` are floats and a key
    given twice in a mapping is refused (``_Loader``): how kitae reads config files, presets, run
    directories' ``config.yaml`` and ``--set`` values.

    Raises:
        yaml.YAMLError: for text that is not YAML.
    """
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no code runs


def yaml_error_text(error: yaml.YAMLError) -> str:
    """A YAML error in one line, where it is and what is wrong: ``"line 3, column 1: found the key
    'update_cfg' twice (...)"`` (PyYAML's own text spans several lines and quotes the source)."""
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(error).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


class _PlainDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` without anchors and aliases: a list two fields share (SAC's
    ``policy_hidden`` and ``q_hidden`` made from one default) is written out twice, so that editing
    one in the file does not change the other."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def yaml_text(data: Any) -> str:
    """``data`` (plain mappings, lists and scalars) as YAML in the order given, every value written
    out where it is (no ``&id001`` anchors): the text of config files people edit."""
    return yaml.dump(data, Dumper=_PlainDumper, sort_keys=False)


def _is_path(value: str | Path) -> bool:
    if isinstance(value, Path):
        return True
    # A one-line string ending in .yaml/.yml is a path (a missing file raises FileNotFoundError);
    # YAML text written by to_yaml always ends with a newline.
    return "\n" not in value and Path(value).suffix in (".yaml", ".yml")


def _algo_params_to_dict(params: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, Callable) and not isinstance(value, type):  # type: ignore[arg-type]
            raise TypeError(
                f"algo_params.{f.name}={value!r} is a function and cannot be written to YAML; "
                "use a named schedule or a number"
            )
        out[f.name] = value
    return out


# ---------------------------------------------------------------------------------------------
# Configs with traced values (sweeps)
# ---------------------------------------------------------------------------------------------

SWEEP_SECTIONS = ("algo_params", "update_cfg", "replay")
"""The config sections whose float fields a sweep may vary."""


def unread_float_keys(config: AlgoConfig) -> dict[str, str]:
    """The dotted keys of float fields ``config`` holds but its run does not read, each with what
    would make the run read it (``{"replay.her_ratio": "read only with replay.her=future or final or episode"}``).

    Replay's: the prioritized ones without ``replay.prioritized``, ``her_ratio`` without
    ``replay.her``; the algorithm's: what its params class's ``unread_fields(config)`` names
    (``AlgoParams``), decided on ``config`` as given (a field swept with the switch that reads it
    set in the same config is read). A sweep of one of them trained the same run in every row."""
    unread: dict[str, str] = {}
    if not config.replay.prioritized:
        for name in ("priority_exponent", "importance_exponent", "priority_epsilon"):
            unread[f"replay.{name}"] = "read only with replay.prioritized=true"
    if config.replay.her is None:
        unread["replay.her_ratio"] = f"read only with replay.her={' or '.join(HER_STRATEGIES)}"
    hook = getattr(config.algo_params, "unread_fields", None)
    if callable(hook):
        for name, why in hook(config).items():
            unread[f"algo_params.{name}"] = why
    return unread


def sweepable_keys(config: AlgoConfig) -> list[str]:
    """The dotted keys of ``config`` a sweep may vary: its float fields (``update_cfg.learning_rate``,
    ``algo_params.clip_coef``...), which the agent reads as numbers in its computations. Integers,
    booleans, strings and ``None`` decide shapes or the program's structure: one program cannot
    vary them. Floats count only where the run reads them (``unread_float_keys``: replay's
    prioritized ones with ``replay.prioritized``, ``her_ratio`` with ``replay.her``, PPO's
    ``vtrace_*`` with ``advantage_estimator="vtrace"``...): a sweep of one unused changed nothing,
    every row the same."""
    unused = unread_float_keys(config)
    keys = []
    for section in SWEEP_SECTIONS:
        obj = getattr(config, section)
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            key = f"{section}.{field.name}"
            if isinstance(value, float) and key not in unused:
                keys.append(key)
    return sorted(keys)


def not_sweepable_reason(config: AlgoConfig, key: str, settable: set[str] | list[str]) -> str:
    """Why the dotted ``key`` is not in ``sweepable_keys(config)``, for a sweep's or a search's
    refusal: not a field (``settable``: the config's settable keys), a float field the run does not
    read (and what would make it read it), or not a float field."""
    unread = unread_float_keys(config)
    if key not in settable:
        return "not a field of the config"
    if key in unread and isinstance(config_value(config, key), float):
        return f"a float field this run does not read ({unread[key]})"
    return "not a float field (it decides shapes or the program's structure)"


def config_value(config: AlgoConfig, key: str) -> Any:
    """The value of the dotted ``key`` (``"update_cfg.learning_rate"``) in ``config``."""
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def traced_config(config: AlgoConfig, values: dict[str, Any]) -> AlgoConfig:
    """``config`` with ``values`` (``{dotted key: value}``) put in place WITHOUT validation, so the
    values may be JAX tracers (inside ``jax.vmap``/``jax.jit``): what ``BaseAgent.with_config``
    builds a sweep's agent from. Validate each concrete value first (``dataclasses.replace``).

    Raises:
        ValueError: for a key that ``sweepable_keys`` does not list.
    """
    allowed = sweepable_keys(config)
    out = copy.copy(config)
    sections: dict[str, Any] = {}
    for key, value in values.items():
        if key not in allowed:
            raise ValueError(f"{key!r} cannot be swept; allowed: {', '.join(allowed)}")
        section, _, name = key.partition(".")
        if section not in sections:
            sections[section] = copy.copy(getattr(config, section))
        object.__setattr__(sections[section], name, value)  # ReplayConfig is frozen
    for section, obj in sections.items():
        setattr(out, section, obj)
    return out

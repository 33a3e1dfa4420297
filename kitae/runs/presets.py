"""Hyperparameter presets and overrides: from an algorithm name and an environment id to a config.

Presets are YAML files in ``kitae/presets/<algo>.yaml`` (rl-zoo style): a ``default`` section and
one section per environment id, each with any of ``n_envs``, ``n_env_steps``, ``algo_params``
and ``update_cfg``. The environment's section is laid over ``default``; then a ``--config`` file
(same keys, or a run directory's ``config.yaml``) and ``--set KEY=VALUE`` overrides. A learning
rate written ``lin_3e-4`` means 3e-4 annealed linearly to 0; ``batch_size: rollout`` the whole
rollout (``max_buffer_size x n_envs x n_agents``, counted once the environments are made).

Override keys (``--set``) are dotted paths: ``seed``, ``n_envs``, ``n_env_steps``,
``train_cfg.save_frequency``, ``update_cfg.<field>``, ``algo_params.<field>``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

import kitae.config as cfg
from kitae.algos.collections import ALGORITHMS, algorithm_of_params_name
from kitae.envs.make import EnvSpec

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
SECTION_KEYS = (
    "n_envs",
    "n_env_steps",
    "env_kwargs",
    "algo_params",
    "update_cfg",
    "train_cfg",
    "seed",
    "distributed",
    "replay",
)
ENV_KWARGS_KEY = "env_kwargs.NAME"  # how --set's list of keys names the environment's arguments


def _check_section(section: Any, where: str, params_cls: type | None = None) -> dict:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ValueError(f"{where} must be a mapping with keys among {', '.join(SECTION_KEYS)}, got {section!r}")
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        keys = set(SECTION_KEYS) | settable_keys(params_cls)
        key = str(unknown[0])
        section_name, _, name = key.partition(".")
        if key in keys and name:  # a --set key written in a file
            hint = f"; a file nests it: {section_name}: {{{name}: ...}}"
        else:
            hint = did_you_mean(key, keys)
        raise ValueError(f"unknown key {unknown[0]!r} in {where}{hint}; allowed: {', '.join(SECTION_KEYS)}")
    return section


def merge(base: dict, override: dict) -> dict:
    """Deep-merges ``override`` into a copy of ``base`` (mappings merged, other values replaced)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def preset_path(algo: str) -> Path:
    """Where ``algo``'s preset file is (``kitae/presets/<algo>.yaml``; it may not exist: a custom
    agent's algorithm has none)."""
    return PRESETS_DIR / f"{algo.lower()}.yaml"


def _preset_sections(algo: str) -> dict[str, Any]:
    """The sections of ``algo``'s preset file by normalised id (``CartPole-v1`` is read as
    ``gymnasium:CartPole-v1``), ``default`` as it is; empty where there is no file."""
    path = preset_path(algo)
    if not path.exists():
        return {}
    data = cfg.load_yaml(path.read_text()) or {}
    return {EnvSpec.parse(k).id if k != "default" else k: v for k, v in data.items()}


def preset_ids(algo: str) -> list[str]:
    """The environment ids ``algo``'s preset file has a section of its own for (tuned
    hyperparameters), sorted; ``default`` is not one of them."""
    return sorted(k for k in _preset_sections(algo) if k != "default")


def load_preset(algo: str, env: EnvSpec) -> dict:
    """The preset for ``algo`` on ``env``: ``default`` with the environment's section over it
    (the file's section ids are read like any id: ``CartPole-v1`` is ``gymnasium:CartPole-v1``)."""
    sections = _preset_sections(algo)
    if not sections:
        return {}
    name = preset_path(algo).name
    preset = _check_section(sections.get("default"), f"{name}: default")
    return merge(preset, _check_section(sections.get(env.id), f"{name}: {env.id}"))


def load_config_file(path: str | Path, params_cls: type | None = None) -> dict:
    """Reads a ``--config`` file, refusing what it cannot use: the keys of a preset section (what
    ``kitae tune`` writes), or a run directory's ``config.yaml``, so ``kitae train ALGO ENV --config
    RUN_DIR/config.yaml`` trains again with a run's whole config (``params_cls``: ALGO's params
    class, which such a file must name)."""
    path = Path(path)
    if path.is_dir():
        hint = f"; a run directory's is {str(path / 'config.yaml')!r}" if (path / "config.yaml").is_file() else ""
        raise FileNotFoundError(f"config file {str(path)!r} is a directory; allowed: a YAML file{hint}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        data = cfg.load_yaml(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"malformed YAML in {str(path)!r}, {cfg.yaml_error_text(error)}") from None
    if isinstance(data, dict) and "algo_params_class" in data:
        data = _from_run_config(data, path, params_cls)
    data = _check_section(data, str(path), params_cls)
    _check_algo_params_owner(data.get("algo_params"), str(path), params_cls)
    train = data.get("train_cfg")
    if isinstance(train, dict) and "n_env_steps" in train:
        # One key for the budget, so that --steps and --set n_env_steps, merged after the file,
        # override it (a train_cfg.n_env_steps left in the file would be read last and win).
        train = dict(train)
        steps = train.pop("n_env_steps")
        if "n_env_steps" in data and data["n_env_steps"] != steps:
            raise ValueError(
                f"{str(path)!r} gives n_env_steps={data['n_env_steps']!r} and train_cfg.n_env_steps={steps!r}; "
                "allowed: one of them, or the same value"
            )
        data = {**data, "train_cfg": train, "n_env_steps": steps}
    return data


def params_owners(names: list[str] | set[str]) -> list[str]:
    """The registered algorithms (``kitae.algos.collections.ALGORITHMS``) whose params dataclass
    has every field in ``names``: ``["ppo", "rnd_ppo"]`` for ``{"clip_coef", "gae_lambda"}``."""
    return [
        algo
        for algo, (_, params_cls) in ALGORITHMS.items()
        if set(names) <= {f.name for f in dataclasses.fields(params_cls)}
    ]


def _owners_text(owners: list[str]) -> str:
    """``"ppo's (also ppo_lstm's, rnd_ppo's)"``: the first algorithm, then the others."""
    possessives = [f"{name}'s" for name in owners]
    others = f" (also {', '.join(possessives[1:])})" if len(owners) > 1 else ""
    return possessives[0] + others


def _check_algo_params_owner(section: Any, where: str, params_cls: type | None) -> None:
    """A file's ``algo_params`` written for another algorithm (a ``kitae tune`` best.yaml of PPO
    given to DQN): refused with the algorithms they are fields of. Other unknown fields are left
    to the params dataclass, which names the allowed ones."""
    if params_cls is None or not isinstance(section, dict) or not section:
        return
    fields = {f.name for f in dataclasses.fields(params_cls)}
    unknown = sorted(str(k) for k in set(section) - fields)
    if unknown and all(_is_sizes_name(name) for name in unknown):
        # PPO's hidden_sizes given to DQN: a name for what DQN calls hidden, not a PPO file
        hint = did_you_mean(f"algo_params.{unknown[0]}", {f"algo_params.{name}" for name in fields})
        if hint:
            raise ValueError(f"algo_params.{unknown[0]} in {where} is not a field of {params_cls.__name__}{hint}")
    owners = params_owners(unknown) if unknown else []
    if owners:
        shown = ", ".join(unknown[:4]) + (", ..." if len(unknown) > 4 else "")
        raise ValueError(
            f"the algo_params of {where} ({shown}) are not fields of {params_cls.__name__} but "
            f"{_owners_text(owners)}: give {owners[0]} as ALGO, or drop them"
        )


def _from_run_config(data: dict, path: Path, params_cls: type | None) -> dict:
    """A run's ``config.yaml`` (``AlgoConfig.to_yaml``) as a preset section: its algorithm must be
    ALGO's; of ``env_cfg`` only ``n_envs`` is read (the spaces are the environment's, and the
    environment is the command's ENV, which may be another than the run's)."""
    data = dict(data)
    kind = data.pop("algo_params_class")
    if params_cls is not None and kind != cfg.params_class_name(params_cls):
        if ":" in str(kind):  # params_class_name of a class outside kitae
            raise ValueError(
                f"{str(path)!r} is the config of a custom agent's run (algo_params_class {kind}), not of "
                f"{params_cls.__name__}: give that agent's name, registered with "
                "kitae.algos.collections.register_algorithm in a module given to --import"
            )
        algo = algorithm_of_params_name(str(kind))
        raise ValueError(
            f"{str(path)!r} is the config of a run with algo_params_class {kind}; it cannot configure "
            f"{params_cls.__name__}: give the algorithm of that run{f' ({algo})' if algo else ''}"
        )
    env_cfg = data.pop("env_cfg", None) or {}
    if isinstance(env_cfg, dict) and "n_envs" in env_cfg:
        data.setdefault("n_envs", env_cfg["n_envs"])
    if isinstance(env_cfg, dict) and env_cfg.get("env_kwargs"):  # how the run made its environments
        data.setdefault("env_kwargs", env_cfg["env_kwargs"])
    if data.get("distributed") is None:
        data.pop("distributed", None)
    return data


def parse_value(text: str) -> Any:
    """A ``--set`` value: YAML scalars (``true``, ``null``, ``[64, 64]``), read as config files are
    (``kitae.config.load_yaml``: ``1e-3`` and ``inf`` are floats); text that is not YAML stays text."""
    try:
        return cfg.load_yaml(text)
    except yaml.YAMLError:
        return text


def parse_sets(items: list[str], params_cls: type) -> dict:
    """``["update_cfg.learning_rate=1e-3", ...]`` -> a nested override mapping.

    Raises:
        ValueError: for an item without ``=`` or an unknown key, naming the allowed keys.
    """
    allowed = settable_keys(params_cls)
    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r} is not KEY=VALUE")
        section, _, name = key.partition(".")
        if key not in allowed and not (section == "env_kwargs" and name.isidentifier()):
            # config.yaml keeps the environment's arguments under env_cfg: a key copied from it
            # (env_cfg.env_kwargs.continuous_actions) is meant as env_kwargs.continuous_actions
            _, kwargs_part, kwarg = key.partition("env_kwargs.")
            hint = f"; did you mean {'env_kwargs.' + kwarg!r}?" if kwargs_part and kwarg.isidentifier() else ""
            raise ValueError(
                f"unknown --set key {key!r}{hint or did_you_mean(key, allowed)}; allowed keys: "
                f"{', '.join(sorted(allowed | {ENV_KWARGS_KEY}))}"
            )
        path = key.split(".")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = parse_value(text)
    return out


RL_ZOO_KEYS: dict[str, tuple[str, ...]] = {
    "n_timesteps": ("n_env_steps",),
    "n_steps": ("update_cfg.max_buffer_size",),
    "buffer_size": ("update_cfg.max_buffer_size",),
    "gradient_steps": ("update_cfg.n_epochs",),
    "ent_coef": ("algo_params.entropy_coef", "algo_params.alpha"),
    "vf_coef": ("algo_params.value_coef",),
    "clip_range": ("algo_params.clip_coef",),
    "clip_range_vf": ("algo_params.value_clip_coef",),
    "learning_starts": ("algo_params.start_step",),
    "train_freq": ("algo_params.skip_steps",),
    "exploration_initial_eps": ("algo_params.exploration",),
    "exploration_final_eps": ("algo_params.exploration_final",),
    "target_policy_noise": ("algo_params.policy_noise",),
    "target_noise_clip": ("algo_params.noise_clip",),
    "normalize": ("algo_params.normalize_observations",),
}
"""rl-zoo's (Stable-Baselines3's) hyperparameter names whose kitae keys are spelled otherwise, for
the hint of a key copied from an rl-zoo file; ``policy_kwargs`` points at the network's sizes."""


def _is_sizes_name(name: str) -> bool:
    """Whether an algo_params field's name is a name of network sizes (``hidden``, ``q_hidden``,
    ``hidden_sizes``, rl-zoo's ``net_arch``)."""
    return "hidden" in name or name == "net_arch"


def did_you_mean(key: str, allowed: set[str]) -> str:
    """``"; did you mean 'update_cfg.learning_rate'?"`` for a near miss of a dotted key, else ``""``.

    An rl-zoo name (``RL_ZOO_KEYS``: ``n_timesteps``, ``ent_coef``, ``policy_kwargs``...) names
    kitae's key for it; another algorithm's name for the networks' sizes (``hidden``,
    ``hidden_sizes``, ``q_hidden``, ``net_arch``) names this algorithm's. Else the key's last part
    is matched against the fields' names: the same name under another section
    (``learning_rate``, ``algo_params.batch_size``), else the closest spelling
    (``algo_params.gama``), in the key's own section where it has one there.
    """
    section, _, last = key.rpartition(".")
    sizes = sorted(k for k in allowed if k.startswith("algo_params.") and "hidden" in k)
    if last == "policy_kwargs":
        zoo = sizes
    else:
        zoo = [k for k in RL_ZOO_KEYS.get(last, ()) if k in allowed]
    if zoo:
        return "; did you mean " + " or ".join(repr(k) for k in zoo) + f" (rl-zoo's {last})?"
    if section == "algo_params" and _is_sizes_name(last) and sizes:
        # the networks' sizes are named per algorithm (DQN's hidden, PPO's hidden_sizes, SAC's
        # q_hidden and policy_hidden): another algorithm's name points at this one's
        return "; this algorithm's network sizes are " + " and ".join(repr(k) for k in sizes)
    by_field: dict[str, list[str]] = {}
    for k in sorted(allowed):
        by_field.setdefault(k.rpartition(".")[2], []).append(k)
    names = difflib.get_close_matches(last, sorted(by_field), n=3, cutoff=0.75)
    if not names:
        owners = params_owners([last]) if section == "algo_params" else []
        return f"; it is a field of {_owners_text(owners)} algo_params, not this algorithm's" if owners else ""
    close = by_field[names[0]]
    if last not in by_field:
        # A misspelling: the closest name in the key's own section, where it has one there.
        own = [k for name in names for k in by_field[name] if k.rpartition(".")[0] == section]
        close = own[:1] or close
    return "; did you mean " + " or ".join(repr(k) for k in close) + "?"


def settable_keys(params_cls: type | None) -> set[str]:
    """Every dotted key ``--set`` takes for an algorithm whose params dataclass is ``params_cls``
    (``None``: the keys of every section but ``algo_params``)."""
    keys = {"seed", "n_envs", "n_env_steps"}
    keys |= {f"train_cfg.{f.name}" for f in dataclasses.fields(cfg.TrainConfig)}
    keys |= {f"update_cfg.{f.name}" for f in dataclasses.fields(cfg.UpdateConfig)}
    if params_cls is not None:
        keys |= {f"algo_params.{f.name}" for f in dataclasses.fields(params_cls)}
    keys |= {f"distributed.{f.name}" for f in dataclasses.fields(cfg.DistributedConfig)}
    keys |= {f"replay.{f.name}" for f in dataclasses.fields(cfg.ReplayConfig)}
    return keys


def _learning_rate(value: Any) -> tuple[Any, bool | None]:
    """``"lin_3e-4"`` -> ``(3e-4, True)``; other values unchanged.

    Raises:
        ValueError: for any other text (``linear_3e-4``), with rl-zoo's ``lin_`` spelling.
    """
    if not isinstance(value, str):
        return value, None
    try:
        if value.startswith("lin_"):
            return float(value[4:]), True
    except ValueError:
        pass
    raise ValueError(
        f"update_cfg.learning_rate={value!r} is not allowed; allowed: a float, or 'lin_<float>' "
        "(lin_3e-4: 3e-4 annealed linearly to 0)"
    )


def _rollout_batch(update: dict, n_envs: int, n_agents: int, off_policy: bool) -> int:
    """``batch_size: rollout``: the whole rollout, ``max_buffer_size x n_envs x n_agents`` (what
    A2C's one gradient step takes), counted once the environments are known, so ``--n-envs`` and
    multi-agent environments keep it right. An off-policy algorithm has no rollout (its
    ``max_buffer_size`` is the replay buffer's capacity): refused."""
    if update["batch_size"] != "rollout":
        raise ValueError(
            f"update_cfg.batch_size={update['batch_size']!r} is not allowed; allowed: an int >= 1 or 'rollout' "
            "(the whole rollout: max_buffer_size x n_envs x n_agents)"
        )
    if off_policy:
        raise ValueError(
            "update_cfg.batch_size='rollout' is not allowed for an off-policy algorithm (its minibatches are "
            "sampled from the replay buffer, whose capacity max_buffer_size is); allowed: an int >= 1"
        )
    return int(update.get("max_buffer_size", cfg.UpdateConfig.max_buffer_size)) * n_envs * n_agents


def build_config(
    params_cls: type, env_spec: EnvSpec, env: Any, resolved: dict, *, off_policy: bool = False
) -> cfg.AlgoConfig:
    """Builds the ``AlgoConfig`` from a resolved section and the environment's spaces.

    ``off_policy``: the algorithm learns from a replay buffer (``batch_size: rollout`` is refused).

    Raises:
        TypeError: a section that is not a mapping of fields (``update_cfg: 3`` in a config file).
    """
    for name in ("update_cfg", "train_cfg", "distributed"):  # read with dict() below: checked first
        if resolved.get(name) is not None:
            cfg.require_mapping(name, resolved[name])
    algo_params: Any = cfg._from_mapping(params_cls, resolved.get("algo_params") or {}, "algo_params.")
    update = dict(resolved.get("update_cfg") or {})
    if "learning_rate" in update:
        update["learning_rate"], annealing = _learning_rate(update["learning_rate"])
        if annealing is not None:
            update["learning_rate_annealing"] = annealing
    train = dict(resolved.get("train_cfg") or {})
    train.setdefault("n_env_steps", resolved["n_env_steps"])
    layout = resolved.get("distributed")
    # PettingZoo vector envs (num_agents) and multi-agent JAX envs (n_agents) say how many
    n_agents = getattr(env, "num_agents", getattr(env, "n_agents", 1))
    if isinstance(update.get("batch_size"), str):
        update["batch_size"] = _rollout_batch(update, env.num_envs, n_agents, off_policy)
    return cfg.AlgoConfig(
        seed=resolved["seed"],
        algo_params=algo_params,
        update_cfg=cfg.UpdateConfig.from_dict(update),
        train_cfg=cfg.TrainConfig.from_dict(train),
        env_cfg=cfg.EnvConfig(
            task_name=env_spec.id,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=env.num_envs,
            n_agents=n_agents,
            env_kwargs=resolved.get("env_kwargs") or {},
        ),
        distributed=cfg.DistributedConfig.from_dict(layout) if layout else None,
        replay=cfg.ReplayConfig.from_dict(resolved.get("replay") or {}),
    )


def resolve(
    algo: str,
    params_cls: type,
    env: EnvSpec,
    *,
    config_file: str | None = None,
    sets: list[str] | None = None,
    overrides: dict | None = None,
) -> dict:
    """Preset, then config file, then ``overrides`` (from command-line flags), then ``--set``.

    Args:
        algo: the algorithm's name (its preset file).
        params_cls: its params dataclass (the ``--set algo_params.<field>`` keys).
        env: the environment.
        config_file: a ``--config`` YAML file (``load_config_file``), or ``None``.
        sets: ``--set`` items, ``["update_cfg.learning_rate=1e-3", ...]`` (``parse_sets``), or
            ``None``.
        overrides: the command-line flags' values as a nested mapping of the same keys (entries
            ``None`` or ``{}``, flags not given, are dropped), or ``None``.

    A ``distributed`` section (``--workers``, a config file's, ``--set distributed.workers=2``)
    asks for the distributed executor; its collection workers share ``n_envs``: when ``n_envs``
    comes from the preset only, it is multiplied by ``workers`` (each worker steps the preset's).
    With asynchronous collection, an algorithm whose params offer V-trace
    (``ADVANTAGE_ESTIMATORS``: PPO's) uses it unless ``algo_params.advantage_estimator`` is given.

    Returns:
        A mapping with ``seed``, ``n_envs``, ``n_env_steps``, ``algo_params``, ``update_cfg``,
        ``train_cfg`` and possibly ``env_kwargs`` and ``distributed``.

    Raises:
        TypeError: for a ``seed``, ``n_envs`` or ``n_env_steps`` that is not an int.
        ValueError: for ``n_envs`` or ``n_env_steps`` < 1, a ``--set`` item that is not allowed,
            or a ``distributed`` section that is not.
    """
    resolved: dict[str, Any] = {
        "seed": 0,
        "n_envs": 1,
        "n_env_steps": 100_000,
        "algo_params": {},
        "update_cfg": {},
        "train_cfg": {},
    }
    resolved = merge(resolved, load_preset(algo, env))
    given_n_envs = False  # n_envs said by the user (not the preset): a distributed run's total
    if config_file is not None:
        from_file = load_config_file(config_file, params_cls)
        given_n_envs = "n_envs" in from_file
        resolved = merge(resolved, from_file)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None and v != {}}
    given_n_envs = given_n_envs or "n_envs" in overrides
    resolved = merge(resolved, overrides)
    set_values = parse_sets(sets or [], params_cls)
    given_n_envs = given_n_envs or "n_envs" in set_values
    if "n_env_steps" in set_values.get("train_cfg", {}):
        set_values["n_env_steps"] = set_values["train_cfg"].pop("n_env_steps")
    resolved = merge(resolved, set_values)
    if "n_env_steps" in resolved.get("train_cfg", {}):
        resolved["n_env_steps"] = resolved["train_cfg"].pop("n_env_steps")
    budget = resolved["n_env_steps"]
    if isinstance(budget, float) and budget.is_integer():  # 1e6 in a file or --set, as --steps takes it
        resolved["n_env_steps"] = int(budget)
    for key in ("seed", "n_envs", "n_env_steps"):
        value = resolved[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{key}={value!r} has type {type(value).__name__}; allowed: int")
    if resolved["n_env_steps"] < 1:
        raise ValueError(f"n_env_steps={resolved['n_env_steps']} is not allowed; allowed: an int >= 1")
    if resolved["n_envs"] < 1:
        raise ValueError(f"n_envs={resolved['n_envs']} is not allowed; allowed: an int >= 1")
    layout = resolved.get("distributed")
    if layout:
        distributed = cfg.DistributedConfig.from_dict(layout)  # checks the section
        if not given_n_envs:  # each collection worker steps the preset's environments
            resolved["n_envs"] *= distributed.workers
        if distributed.async_collection and "vtrace" in getattr(params_cls, "ADVANTAGE_ESTIMATORS", ()):
            # rollouts gathered while the policy moves on: V-trace corrects for the lag, unless said otherwise
            resolved["algo_params"] = {"advantage_estimator": "vtrace", **(resolved.get("algo_params") or {})}
    return resolved

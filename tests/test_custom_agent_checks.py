"""A custom agent whose factories return the wrong thing is refused early, in one line naming the
function, what it returned and what is allowed: at trace time (acting and the update step, in
both loops) or when the agent is made (the factories' outputs)."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import jax.numpy as jnp
import numpy as np
import pytest
from _agents import (
    TinyA2C,
    TinyA2CParams,
    TinyDQN,
    TinyDQNParams,
    make_config,
    tiny_a2c_explore_factory,
    tiny_a2c_process_factory,
    tiny_a2c_state_factory,
    tiny_a2c_update_factory,
    tiny_dqn_explore_factory,
    tiny_dqn_process_factory,
    tiny_dqn_state_factory,
    tiny_dqn_update_factory,
)

from kitae.base import OffPolicyAgent, OnPolicyAgent
from kitae.envs.make import make_jax_env, make_vec_env
from kitae.loops.collect import check_act_output
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.host import HostExecutor

pytestmark = pytest.mark.timeout(120)

N_ENVS, STEPS = 4, 64


def _factory_agent(name: str, agent_cls: type, kind: type, factories: tuple) -> type:
    """``agent_cls`` made from the factories given as keywords (``state``, ``explore``,
    ``process``, ``update``; its own ``factories`` by default) through ``kind.__init__``."""

    def __init__(self, run_name, config, **kwargs):
        made = dict(zip(("state", "explore", "process", "update"), factories, strict=True))
        made.update({key: kwargs.pop(key) for key in list(made) if key in kwargs})
        kind.__init__(self, run_name, config, *made.values(), **kwargs)

    doc = f"``{agent_cls.__name__}`` made from the factories given."
    return type(name, (agent_cls,), {"__init__": __init__, "__doc__": doc})


FactoryDQN = _factory_agent(
    "FactoryDQN",
    TinyDQN,
    OffPolicyAgent,
    (tiny_dqn_state_factory, tiny_dqn_explore_factory, tiny_dqn_process_factory, tiny_dqn_update_factory),
)
FactoryA2C = _factory_agent(
    "FactoryA2C",
    TinyA2C,
    OnPolicyAgent,
    (tiny_a2c_state_factory, tiny_a2c_explore_factory, tiny_a2c_process_factory, tiny_a2c_update_factory),
)


def _env(loop: str):
    return make_jax_env("gymnax:CartPole-v1", N_ENVS) if loop == "compiled" else make_vec_env("CartPole-v1", N_ENVS)


def _train(loop: str, kind: str = "dqn", **factories):
    """A few vector steps of a tiny agent of ``kind`` in ``loop``, with an update in them."""
    env = _env(loop)
    if kind == "dqn":
        config = make_config(env, TinyDQNParams(start_step=0, skip_steps=16), batch_size=8, n_env_steps=STEPS)
        agent = FactoryDQN("checks", config, run_dir="unused", **factories)
    else:
        config = make_config(env, TinyA2CParams(), max_buffer_size=8, batch_size=16, n_env_steps=STEPS)
        agent = FactoryA2C("checks", config, run_dir="unused", **factories)
    executor = CompiledExecutor() if loop == "compiled" else HostExecutor()
    return executor.run(agent, env, STEPS)


# ---------------------------------------------------------------------------------------------
# 1. What acting returns
# ---------------------------------------------------------------------------------------------


def _explore_with_an_extra_axis(config):
    explore_fn = tiny_dqn_explore_factory(config)

    def wrong_explore_fn(state, key, observations, exploration):
        actions, log_probs = explore_fn(state, key, observations, exploration)
        return actions[:, None], log_probs  # (E, 1) for a Discrete space

    return wrong_explore_fn


@pytest.mark.parametrize("loop", ["host", "compiled"])
def test_explore_actions_of_the_wrong_shape_are_refused_by_name(loop):
    # before: gymnasium's "AssertionError: array([0], dtype=int32) ... invalid" (host), and
    # "TypeError: Cannot concatenate arrays with different numbers of dimensions" (compiled)
    with pytest.raises(ValueError) as error:
        _train(loop, explore=_explore_with_an_extra_axis)
    assert str(error.value) == (
        "FactoryDQN.explore (explore_fn) returned actions of shape (4, 1); allowed for Discrete(2) with "
        "4 environments: (4,)"
    )


def _agent(action_space: gym.Space, n_agents: int = 1):
    """What ``check_act_output`` reads of an agent: its config's action space and agents."""

    class Agent:
        config = SimpleNamespace(env_cfg=SimpleNamespace(action_space=action_space, n_agents=n_agents))

    return Agent()


def test_act_output_is_checked_against_every_action_space():
    obs = np.zeros((3, 5), np.float32)
    box, multi = gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.MultiDiscrete([3, 4])
    check_act_output(_agent(box), obs, (jnp.zeros((3, 2)), jnp.zeros(3)))
    check_act_output(_agent(multi), obs, (jnp.zeros((3, 2), jnp.int32), jnp.zeros(3)))
    check_act_output(_agent(gym.spaces.MultiBinary(4)), obs, (jnp.zeros((3, 4), jnp.int32), jnp.zeros(3)))
    check_act_output(_agent(gym.spaces.Discrete(2)), obs, (jnp.zeros(3, jnp.int32), jnp.zeros(3), None), True)
    with pytest.raises(ValueError, match=r"^Agent.act returned actions of shape \(3,\); allowed for Box\(.*\) with "):
        check_act_output(_agent(box), obs, (jnp.zeros(3), jnp.zeros(3)))
    with pytest.raises(
        ValueError, match=r"actions of shape \(3, 1\); allowed for MultiDiscrete\(\[3 4\]\) .*: \(3, 2\)"
    ):
        check_act_output(_agent(multi), obs, (jnp.zeros((3, 1), jnp.int32), jnp.zeros(3)))
    with pytest.raises(ValueError, match=r"log_probs of shape \(3, 2\); allowed with 3 environments: \(3,\)$"):
        check_act_output(_agent(box), obs, (jnp.zeros((3, 2)), jnp.zeros((3, 2))))
    with pytest.raises(
        TypeError, match=r"^Agent.act returned an array of shape \(3, 2\); allowed: \(actions, log_probs\)$"
    ):
        check_act_output(_agent(box), obs, jnp.zeros((3, 2)))
    with pytest.raises(
        TypeError, match=r"^Agent.act_recurrent returned a tuple of 2; allowed: \(actions, log_probs, hidden\)"
    ):
        check_act_output(_agent(box), obs, (jnp.zeros((3, 2)), jnp.zeros(3)), True)


def test_multi_agent_act_output_is_checked_per_agent():
    obs = {"a": np.zeros((3, 5), np.float32), "b": np.zeros((3, 5), np.float32)}
    agent = _agent(gym.spaces.Discrete(2), n_agents=2)
    log_probs = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    check_act_output(agent, obs, ({"a": jnp.zeros(3, jnp.int32), "b": jnp.zeros(3, jnp.int32)}, log_probs))
    with pytest.raises(ValueError) as error:
        check_act_output(agent, obs, ({"a": jnp.zeros(3, jnp.int32), "b": jnp.zeros((3, 1), jnp.int32)}, log_probs))
    assert str(error.value) == (
        "Agent.act returned actions['b'] of shape (3, 1); allowed for Discrete(2) with 3 environments per agent: (3,)"
    )
    with pytest.raises(TypeError, match=r"actions as an array of shape \(3,\); allowed in a multi-agent environment"):
        check_act_output(agent, obs, (jnp.zeros(3, jnp.int32), log_probs))


# ---------------------------------------------------------------------------------------------
# 2. What the update step returns
# ---------------------------------------------------------------------------------------------


def _update_returning(make_info=None, whole_state=True, base=tiny_dqn_update_factory):
    def factory(config):
        update_fn = base(config)

        def wrong_update_fn(state, key, batch):
            new_state, info = update_fn(state, key, batch)
            if make_info is not None:
                info = make_info(info, batch)
            return (new_state if whole_state else new_state.qvalue), info

        return wrong_update_fn

    return factory


@pytest.mark.parametrize(("loop", "kind"), [("host", "dqn"), ("compiled", "dqn"), ("host", "a2c")])
def test_an_update_step_without_info_is_refused_by_name(loop, kind):
    # before: "AttributeError: 'NoneType' object has no attribute 'items'" in the host loop, and a
    # compiled run that trained without logging a loss
    base = tiny_dqn_update_factory if kind == "dqn" else tiny_a2c_update_factory
    with pytest.raises(TypeError) as error:
        _train(loop, kind, update=_update_returning(lambda info, batch: None, base=base))
    name = "FactoryDQN" if kind == "dqn" else "FactoryA2C"
    assert str(error.value) == (
        f"{name}'s update step (update_step_factory's update_fn) returned (state, None); allowed: (state, info) "
        "with info a dict of scalars (each logged as losses/<name>)"
    )


def test_an_update_step_with_an_info_entry_that_is_not_a_scalar_is_refused():
    per_sample = _update_returning(lambda info, batch: {**info, "error": batch[2][:, 0]})  # (B,)
    with pytest.raises(
        ValueError, match=r"returned info\['error'\] of shape \(8,\); allowed: \(state, info\) with info a"
    ):
        _train("host", update=per_sample)


def test_a_td_error_that_is_not_one_per_transition_is_refused_under_prioritized_replay():
    """Prioritized replay takes ``info["td_error"]`` as the minibatch's new priorities, one per
    transition: another shape is refused naming it (the update's info check lets it through)."""
    import dataclasses

    import kitae.config as cfg

    env = _env("host")
    config = make_config(env, TinyDQNParams(start_step=0, skip_steps=16), batch_size=8, n_env_steps=STEPS)
    config = dataclasses.replace(config, replay=cfg.ReplayConfig(prioritized=True))
    td_error = _update_returning(lambda info, batch: {**info, "td_error": jnp.zeros((8, 2))})
    prioritized_dqn = type("FactoryDQN", (FactoryDQN,), {"replay_features": frozenset({"prioritized"})})
    agent = prioritized_dqn("checks", config, run_dir="unused", update=td_error)
    with pytest.raises(ValueError) as error:
        HostExecutor().run(agent, env, STEPS)
    assert str(error.value) == (
        "FactoryDQN's update step returned info['td_error'] of shape (8, 2); allowed: (8,), one TD error per "
        "transition of its minibatch (replay.prioritized=True)"
    )


def test_an_update_step_that_returns_part_of_the_state_is_refused():
    with pytest.raises(
        TypeError,
        match=r"returned a state \(TrainState, 26 leaves\) of another structure than the state it was given "
        r"\(TinyDQNState, 26 leaves\); allowed: the state it updated, as \(state, info\)",
    ):
        _train("host", update=_update_returning(whole_state=False))


# ---------------------------------------------------------------------------------------------
# 3. What the factories make, when the agent is made
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["explore", "process", "update"])
def test_a_factory_that_makes_no_function_is_refused_when_the_agent_is_made(factory):
    # before: explore_factory returning None failed at the first step ("'NoneType' object is not
    # callable" inside train)
    env = make_vec_env("CartPole-v1", N_ENVS)
    config = make_config(env, TinyDQNParams(), batch_size=8)
    names = {"explore": "explore_factory", "process": "process_experience_factory", "update": "update_step_factory"}
    with pytest.raises(TypeError, match=rf"^{names[factory]}\(config\) returned None; allowed: a function "):
        FactoryDQN("checks", config, run_dir="unused", **{factory: lambda config: None})
    with pytest.raises(
        TypeError, match=rf"^{names[factory]}\(config\) returned 3 \(of type int\); allowed: a function "
    ):
        FactoryDQN("checks", config, run_dir="unused", **{factory: lambda config: 3})
    env.close()


def test_a_state_factory_that_returns_no_state_is_refused_when_the_agent_is_made():
    env = make_vec_env("CartPole-v1", N_ENVS)
    config = make_config(env, TinyDQNParams(), batch_size=8)

    def no_return(key, config, *, preprocess_fn=None, tabulate=False):
        tiny_dqn_state_factory(key, config, preprocess_fn=preprocess_fn, tabulate=tabulate)

    with pytest.raises(TypeError, match=r"^train_state_factory returned None; allowed: the agent's state"):
        FactoryDQN("checks", config, run_dir="unused", state=no_return)

    def with_a_name(key, config, *, preprocess_fn=None, tabulate=False):
        return {"state": tiny_dqn_state_factory(key, config), "name": "dqn"}

    with pytest.raises(TypeError, match=r"^train_state_factory returned a state holding a str at \['name'\]"):
        FactoryDQN("checks", config, run_dir="unused", state=with_a_name)
    env.close()


def test_the_distributed_update_of_a_guide_style_agent_is_checked_too():
    """``AgentAlgorithm.compute_gradients`` runs a guide-style agent's update step itself (its
    "gradients" are the change the step makes): the same refusal as in the loops (before:
    ``AttributeError: 'NoneType' object has no attribute 'items'``)."""
    import jax

    from kitae.buffer import ReplayBuffer
    from kitae.distributed import AgentAlgorithm

    env = make_vec_env("CartPole-v1", N_ENVS)
    config = make_config(env, TinyDQNParams(start_step=0, skip_steps=16), batch_size=8, n_env_steps=STEPS)
    agent = FactoryDQN("checks", config, run_dir="unused", update=_update_returning(lambda info, batch: None))
    algorithm = AgentAlgorithm(agent)
    buffer = ReplayBuffer(64)
    obs, _ = env.reset(seed=0)
    for _ in range(4):
        action, clipped, _, other = algorithm.acting_step(obs, None, np.zeros(N_ENVS))
        next_obs, reward, terminated, truncated, _ = env.step(clipped)
        buffer.add(
            agent.experience_type(
                observation=obs,
                action=action,
                reward=np.asarray(reward, np.float32),
                done=terminated,
                next_observation=next_obs,
                log_prob=other["log_prob"],
                truncated=truncated,
            )
        )
        obs = next_obs
    batch, key = algorithm.gradient_batch(jax.random.PRNGKey(0), buffer.state)
    with pytest.raises(TypeError, match=r"FactoryDQN's update step .* returned \(state, None\); allowed"):
        algorithm.compute_gradients(batch, key=key)
    env.close()

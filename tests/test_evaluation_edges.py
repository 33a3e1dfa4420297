"""The edges of ``kitae eval``'s videos: a folder given as a str, and the refusal of an environment
that cannot be filmed naming all that can."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitae.envs.make import EnvSpec
from kitae.runs.errors import RunError
from kitae.runs.evaluation import _filmable, record_video

pytestmark = pytest.mark.timeout(120)  # a hung compilation fails instead of stalling the run


def test_a_video_goes_into_a_folder_given_as_a_str(tmp_path):
    """``folder`` as a str failed with ``'str' object has no attribute 'mkdir'``."""
    from kitae.runs import preset_agent

    agent, env = preset_agent("ppo", "gymnax:CartPole-v1", steps=256, run_dir=tmp_path / "run")
    env.close()
    path = record_video(agent, EnvSpec.parse("gymnax:CartPole-v1"), "vids", "mine", 0)  # the test runs in tmp_path
    assert path == Path("vids") / "mine-episode-0.mp4"
    assert (tmp_path / path).stat().st_size > 1000


def test_the_refusal_to_film_names_the_gymnax_ids_filmed_through_their_gymnasium_twin(tmp_path):
    """The list left out gymnax:CartPole-v1 and the others that Gymnasium films."""
    import gymnasium as gym
    import gymnax

    twins = [f"gymnax:{name}" for name in gymnax.registered_envs if name in gym.registry]
    assert twins and all(_filmable(EnvSpec.parse(env_id)) for env_id in twins)
    with pytest.raises(RunError, match=r"--video: gymnax:BernoulliBandit-misc cannot be filmed; allowed: ") as error:
        record_video(None, EnvSpec.parse("gymnax:BernoulliBandit-misc"), tmp_path / "videos", "x")
    message = str(error.value)
    assert [env_id for env_id in twins if env_id not in message] == []
    assert "\n" not in message

"""``kitae eval``: a run's agent, evaluated with its deterministic policy (or ``--stochastic``, as
it explores at the end of training), and a video of it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from kitae.envs.jax_env import GYMNAX_DRAWN
from kitae.envs.make import EnvSpec, render_offscreen
from kitae.loops.evaluate import play_episode
from kitae.runs.errors import RunError
from kitae.runs.load import load_agent, run_seeds
from kitae.runs.resolve import resolve_run_dir
from kitae.runs.rundir import add_to_summary, check_run_dir

__all__ = ["eval_run", "record_video", "gymnasium_twin"]


def gymnasium_twin(env: EnvSpec) -> str | None:
    """The Gymnasium id that renders ``env``: its own name for Gymnasium ids, the id of the same
    name for gymnax ids whose environment Gymnasium also has (CartPole-v1, Pendulum-v1,
    Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0), else ``None``."""
    import gymnasium as gym

    return env.name if env.name in gym.registry else None


def _filmable(env: EnvSpec) -> bool:
    """Whether ``kitae eval --video`` can film ``env``: an id with a Gymnasium twin, a PettingZoo
    or Brax id, a JaxMARL MPE id, a gymnax id gymnax's visualizer draws, an EnvPool Atari id."""
    if env.source == "jaxmarl":
        return env.name.startswith("MPE_")
    if env.source == "gymnax" and env.name in GYMNAX_DRAWN:
        return True
    return env.source in ("pettingzoo", "brax") or _envpool_atari(env) or gymnasium_twin(env) is not None


def _envpool_atari(env: EnvSpec) -> bool:
    """An EnvPool Atari id: filmed in EnvPool itself (the agent reads EnvPool's preprocessed frames)."""
    if env.source != "envpool":
        return False
    from kitae.envs.envpool_env import check_envpool_id, is_atari

    try:
        check_envpool_id(env.name)
    except ValueError:
        return False
    return is_atari(env.name)


def _not_filmable(env: EnvSpec) -> RunError:
    return RunError(
        f"--video: {env.id} cannot be filmed; allowed: Gymnasium, PettingZoo and Brax ids, JaxMARL's MPE_* ids, "
        "EnvPool's Atari ids, gymnax ids whose environment Gymnasium has (gymnax:CartPole-v1, gymnax:Pendulum-v1, "
        "gymnax:Acrobot-v1, gymnax:MountainCar-v0, gymnax:MountainCarContinuous-v0), the gymnax ids that gymnax's "
        "visualizer draws (MinAtar, Catch-bsuite, the mazes...), and EnvPool ids whose environment Gymnasium has "
        "(CartPole-v1, ...)"
    )


def _filming_env(env: EnvSpec, does_not_render: str) -> Any:
    """One environment of ``env`` that draws frames: PettingZoo's and Gymnasium's made with
    ``render_mode="rgb_array"``, an ``EnvPoolEnv``, or a ``BraxEnv``, ``JaxMARLEnv`` or
    ``GymnaxEnv`` (which draw their states)."""
    kwargs = env.env_kwargs  # the run's env_cfg.env_kwargs
    if env.source == "brax":
        from kitae.envs.brax_env import BraxEnv

        return BraxEnv(env.name, **kwargs)
    if env.source == "jaxmarl":
        from kitae.envs.jaxmarl_env import JaxMARLEnv

        return JaxMARLEnv(env.name, **kwargs)
    if env.source == "gymnax" and gymnasium_twin(env) is None:  # GYMNAX_DRAWN: gymnax's visualizer
        from kitae.envs.jax_env import GymnaxEnv

        return GymnaxEnv(env.name, **kwargs)
    if _envpool_atari(env):  # whole games with raw scores, as kitae eval plays them
        from kitae.envs.envpool_env import EnvPoolEnv, evaluation_kwargs

        return EnvPoolEnv(env.name, env_kwargs={**kwargs, **evaluation_kwargs(env.name)})
    if kwargs and env.source not in ("gymnasium", "pettingzoo"):  # gymnax's or EnvPool's arguments, not the twin's
        raise RunError(
            f"--video: {env.id} is filmed through its Gymnasium twin {gymnasium_twin(env)}, which does not take "
            f"the run's env_cfg.env_kwargs ({', '.join(sorted(kwargs))}); allowed: a run without them"
        )
    with warnings.catch_warnings():  # Gymnasium warns of a mode the environment does not list
        warnings.simplefilter("ignore")
        try:
            if env.source == "pettingzoo":
                from kitae.envs.pettingzoo_envs import parallel_env_maker

                return parallel_env_maker(env.name)(render_mode="rgb_array", **kwargs)
            import gymnasium as gym

            from kitae.envs.wrappers import tuple_as_dict

            # Tuple observations read as Dict ones, as the run's own environments (make_vec_env)
            return tuple_as_dict(gym.make(str(gymnasium_twin(env)), render_mode="rgb_array", **kwargs))
        except TypeError as error:  # a constructor without render_mode
            raise RunError(f"{does_not_render}: {error}") from None


def _first_frame(single: Any, seed: int) -> Any:
    """The frame of a fresh episode (``None`` where the environment draws none): drawn before the
    episode is played, so that an environment that cannot draw here fails before it plays."""
    if hasattr(single, "step_without_reset"):  # a JAX environment: BraxEnv, JaxMARLEnv, GymnaxEnv
        import jax

        # compiled, as play_episode resets: op by op, a Brax reset dispatched ~270 small programs (20 s)
        frame = single.render(jax.jit(single.reset)(jax.random.PRNGKey(seed), single.default_params)[1])
        single.close()  # frees only the drawing: the episode's frames start afresh (gymnax counts them)
        return frame
    single.reset(seed=seed)
    return single.render()


def record_video(
    agent: Any, env: EnvSpec, folder: str | Path, prefix: str, seed: int = 0, explore_step: int | None = None
) -> Path:
    """Records one episode of the agent's deterministic policy (with ``explore_step``, of the
    exploring one; ``kitae.loops.evaluate.play_episode``,
    which carries a recurrent agent's hidden state) as ``folder/<prefix>-episode-0.mp4``, from
    the environment's ``rgb_array`` frames at its ``render_fps``: a Gymnasium environment (a
    gymnax one through its Gymnasium twin, ``gymnasium_twin``), a PettingZoo one (the team's
    episode), a Brax one (its states drawn by MuJoCo, ``BraxEnv.render``), a JaxMARL MPE one
    (drawn by JaxMARL's ``MPEVisualizer``, ``JaxMARLEnv.render``), a gymnax one without a twin
    that gymnax's ``Visualizer`` draws (``GymnaxEnv.render``: MinAtar, ...) or an EnvPool Atari one (its
    screen, ``EnvPoolEnv``; a whole game, as ``kitae eval`` plays it). MuJoCo draws through
    OpenGL: without a display, through EGL or OSMesa (``kitae.envs.make.render_offscreen``).
    ``folder``: a path or a str (made if missing). Returns the file."""
    folder = Path(folder)
    render_offscreen()
    if not _filmable(env):
        raise _not_filmable(env)
    does_not_render = f"--video: {env.id} does not render frames (render_mode='rgb_array')"
    single = _filming_env(env, does_not_render)
    frames: list = []
    try:
        try:
            with warnings.catch_warnings():  # GLFW's warning, then the error that says the same
                warnings.simplefilter("ignore")
                first = _first_frame(single, seed)
        except Exception as error:  # OpenGL's, MuJoCo's, pygame's errors: no common base class
            hint = ""
            if env.source == "brax" or "mujoco" in type(error).__module__ or "OpenGL" in str(error):
                hint = (
                    f" (MUJOCO_GL={os.environ.get('MUJOCO_GL', 'unset')}; without a display MuJoCo draws with "
                    "MUJOCO_GL=egl or osmesa and their system library)"
                )
            raise RunError(
                f"--video: {env.id} could not draw a frame here{hint}: {type(error).__name__}: {error}"
            ) from None
        if first is None:
            raise RunError(f"{does_not_render}: its render() returned no frame")
        play_episode(agent, single, seed, frames=frames, explore_step=explore_step)
        fps = getattr(single, "render_fps", None) or (getattr(single, "metadata", None) or {}).get("render_fps") or 30
    finally:
        single.close()
    if any(frame is None for frame in frames):
        raise RunError(f"{does_not_render}: its render() returned no frame")
    try:
        from moviepy import ImageSequenceClip  # what Gymnasium's RecordVideo writes with
    except ImportError:
        raise RunError("--video needs moviepy: pip install moviepy") from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}-episode-0.mp4"
    ImageSequenceClip([np.asarray(frame) for frame in frames], fps=fps).write_videofile(str(path), logger=None)
    return path


def eval_run(
    run_dir: str | Path,
    episodes: int = 10,
    video: bool = False,
    seed: int = 0,
    checkpoint: int | str | None = None,
    stochastic: bool = False,
) -> dict:
    """Evaluates the run's agent(s) with the deterministic policy over ``episodes`` episodes (the
    executor's ``evaluate``) and writes ``eval_return`` (mean raw return; one per seed for runs of
    several seeds), ``eval_return_std``, ``eval_episodes``, ``eval_step`` (the checkpoint's
    step; one per seed for runs of several seeds) and ``eval_policy`` into ``summary.json``
    (a ``summary.json`` that is not a JSON object is left as it is, with a warning).

    With ``video``, records one episode to ``<run_dir>/videos/``. ``checkpoint``: which one, as
    in ``load_agent`` (``None``: the newest; ``"best"``; a step). ``stochastic``: the policy as it
    explores at the checkpoint's step instead (sampled actions, DQN's epsilon then, TD3's noise),
    as rl-zoo's ``enjoy --stochastic``.
    """
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise RunError(f"--episodes {episodes} is not allowed; allowed: an int >= 1")
    run_dir = check_run_dir(run_dir)
    run = resolve_run_dir(run_dir)
    if video and not _filmable(run.env):
        raise _not_filmable(run.env)
    seeds = run_seeds(run_dir)
    means, stds, all_returns, steps, video_path = [], [], [], [], None
    for index in range(len(seeds) if seeds else 1):
        agent = load_agent(run_dir, index, checkpoint=checkpoint)
        explore_step = int(agent.env_step) if stochastic else None  # the checkpoint's step
        returns = run.executor.evaluate(agent, run.env, episodes, seed, explore_step=explore_step)
        means.append(float(np.mean(returns)))
        stds.append(float(np.std(returns)))
        all_returns.append(returns.tolist())
        steps.append(agent.checkpoint_step)
        if video and index == 0:
            prefix = f"eval-step{steps[0]}" + ("-stochastic" if stochastic else "")
            video_path = record_video(agent, run.env, run_dir / "videos", prefix, seed, explore_step)
    written = add_to_summary(
        run_dir,
        eval_return=means if seeds else means[0],
        eval_return_std=stds if seeds else stds[0],
        eval_episodes=episodes,
        eval_step=steps if seeds else steps[0],
        eval_policy="stochastic" if stochastic else "deterministic",
    )
    if written is None:  # rewritten with the eval fields alone, the run's own figures would be lost for good
        warnings.warn(
            f"{run_dir / 'summary.json'} is not a JSON object as kitae writes it; left as it is, without this "
            "evaluation",
            stacklevel=2,
        )
    return {
        "run_dir": str(run_dir),
        "env": run.env.id,
        "seeds": seeds,
        "episodes": episodes,
        "step": steps,
        "mean": means,
        "std": stds,
        "returns": all_returns,
        "video": str(video_path) if video_path else None,
        "policy": "stochastic" if stochastic else "deterministic",
    }

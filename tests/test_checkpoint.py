"""Checkpoints: the whole training state, written atomically, checked on restore, no pickle."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from _agents import TinyA2C, TinyA2CParams, TinyDQN, TinyDQNParams, make_config

from kitae.envs.make import make_jax_env, make_vec_env
from kitae.loops.callbacks import Callback
from kitae.loops.compiled import compiled_train, loop_state_shape, segment_capacity
from kitae.loops.state import apply_loop_state
from kitae.runs.callbacks import CheckpointSaver
from kitae.runs.checkpoints import (
    CheckpointCorrupt,
    Checkpointer,
    CheckpointError,
    CheckpointMismatch,
    CheckpointWarning,
)
from kitae.runs.load import restore_target
from kitae.runs.rundir import state_fingerprint


def _equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y) for x, y in zip(la, lb)
    )


def _dqn_config(env, save_frequency=-1, **kwargs):
    config = make_config(env, TinyDQNParams(start_step=32, skip_steps=2), max_buffer_size=64, batch_size=16, **kwargs)
    return dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, save_frequency=save_frequency))


def _target(agent):
    """``restore_latest``'s target for a checkpoint of ``agent`` (without environments)."""
    return lambda meta: restore_target(agent, meta)


@pytest.fixture(scope="module")
def trained_dqn(tmp_path_factory):
    """A TinyDQN trained 200 steps in the host loop, checkpointing every 50 steps."""
    directory = tmp_path_factory.mktemp("dqn") / "checkpoints"
    env = make_vec_env("CartPole-v1", 2)
    agent = TinyDQN("t", _dqn_config(env, save_frequency=50), run_dir=directory.parent)
    agent.train(env, 200)  # the run directory's checkpoints: the newest 3 kept
    return agent, directory


def _fresh_dqn():
    return TinyDQN("t", _dqn_config(make_vec_env("CartPole-v1", 2)), run_dir="unused")


def test_host_checkpoint_holds_the_whole_training_state(trained_dqn):
    agent, directory = trained_dqn
    checkpointer = Checkpointer(directory)
    assert checkpointer.all_steps() == [100, 150, 200]  # every 50 steps, the newest 3 kept
    assert checkpointer.latest_step() == 200
    fresh = _fresh_dqn()
    assert not _equal(fresh.state, agent.state)
    restored = checkpointer.restore(200, restore_target(fresh, checkpointer.read_meta(200)))
    apply_loop_state(fresh, restored.items["loop_state"])
    assert _equal(fresh.state, agent.state)  # params, target params, optimizer state
    assert state_fingerprint(fresh.state) == state_fingerprint(agent.state)
    assert _equal(fresh.buffer.state, agent.buffer.state)  # the replay buffer
    np.testing.assert_array_equal(fresh.key, agent.key)  # the loop key
    assert fresh.env_step == agent.env_step == 200 and fresh.n_updates == agent.n_updates > 0
    # the restored agent goes on exactly as the original: same keys, same buffer, same update
    assert _equal(fresh.nextkey(), agent.nextkey())
    observations = np.zeros((2, 4), np.float32)
    assert _equal(fresh.explore(observations), agent.explore(observations))
    fresh.update(fresh.buffer)
    agent.update(agent.buffer)
    assert _equal(fresh.state, agent.state)


def test_checkpoints_are_json_and_orbax_arrays_never_pickle(trained_dqn, monkeypatch):
    _, directory = trained_dqn
    step_dir = directory / "200"
    meta = json.loads((step_dir / "meta" / "metadata").read_text())
    assert meta["format"] == "kitae-checkpoint/2" and meta["executor"] == "host" and meta["env_step"] == 200
    assert meta["env_saved"] is False and meta["n_updates"] > 0
    entry = meta["items"]["loop_state"][0]
    assert set(entry) == {"path", "shape", "dtype", "sha256"} and entry["path"].startswith(".agent_state.qvalue")
    paths = {e["path"] for e in meta["items"]["loop_state"]}
    assert {".buffer.data.observation", ".buffer.position", ".buffer.size", ".agent_key", ".env_step"} <= paths

    def no_pickle(*args, **kwargs):
        raise AssertionError("a checkpoint must never be unpickled")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    fresh = _fresh_dqn()
    Checkpointer(directory).restore(200, restore_target(fresh, meta))


def test_writes_go_to_a_temporary_folder_renamed_when_complete(tmp_path, monkeypatch):
    from orbax.checkpoint._src.path import async_path

    renames = []
    original = async_path.rename

    async def spy(src, dst):
        renames.append((Path(src).name, Path(dst).name))
        return await original(src, dst)

    monkeypatch.setattr(async_path, "rename", spy)
    agent = _fresh_dqn()
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.save(7, agent)
    assert renames and renames[-1][1] == "7" and "tmp" in renames[-1][0], renames
    # an unfinished write (a process killed while saving) is a temporary folder: never listed
    (tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp-123").mkdir()
    (tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp-123" / "junk").write_text("x")
    assert checkpointer.all_steps() == [7] and checkpointer.latest_step() == 7
    assert Checkpointer(tmp_path / "checkpoints").restore_latest(_target(_fresh_dqn())).step == 7


def _copy_checkpoints(directory: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "checkpoints"
    shutil.copytree(directory, copy)
    return copy


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_checkpoint_is_detected_and_the_previous_one_used(trained_dqn, tmp_path, damage):
    agent, directory = trained_dqn
    copy = _copy_checkpoints(directory, tmp_path)
    files = sorted(p for p in (copy / "200").rglob("*") if p.is_file() and p.stat().st_size > 0)
    data_files = [p for p in files if p.parent.name == "d"]
    for path in data_files:
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        elif damage == "flip":  # flip bits in the middle of each array file: only a checksum can tell
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x5A
            path.write_bytes(bytes(data))
        else:
            path.unlink()
    checkpointer = Checkpointer(copy)
    fresh = _fresh_dqn()
    with pytest.raises(CheckpointCorrupt, match="step 200"):
        checkpointer.restore(200, restore_target(fresh, checkpointer.read_meta(200)))
    with pytest.warns(CheckpointWarning, match=r"checkpoint step 200 .*using checkpoint step 150"):
        restored = checkpointer.restore_latest(_target(fresh))
    assert restored.step == 150 and restored.meta["env_step"] == 150
    # the damaged checkpoint is left on disk as it was (restoring changes nothing)
    assert checkpointer.all_steps() == [100, 150, 200]


def test_no_readable_checkpoint_is_one_clear_error(trained_dqn, tmp_path):
    _, directory = trained_dqn
    copy = _copy_checkpoints(directory, tmp_path)
    for step in (100, 150, 200):
        (copy / str(step) / "meta" / "metadata").write_text("{not json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing could be restored
        with pytest.raises(CheckpointError, match="no readable checkpoint.*step 200.*step 150.*step 100"):
            Checkpointer(copy).restore_latest(_target(_fresh_dqn()))
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        Checkpointer(tmp_path / "empty").restore_latest(_target(_fresh_dqn()))


def test_a_checkpoint_of_another_configuration_is_a_mismatch_not_a_fallback(trained_dqn):
    _, directory = trained_dqn
    env = make_vec_env("Acrobot-v1", 2)  # 6 observations, 3 actions: other shapes
    other = TinyDQN("t", _dqn_config(env), run_dir="unused")
    with pytest.raises(CheckpointMismatch, match="does not match"):
        Checkpointer(directory).restore_latest(_target(other))


def test_max_to_keep_and_replacing_a_step(tmp_path):
    agent = _fresh_dqn()
    checkpointer = Checkpointer(tmp_path / "c", max_to_keep=2)
    for step in (1, 2, 3):
        agent.env_step = step
        checkpointer.save(step, agent)
    assert checkpointer.all_steps() == [2, 3]
    agent.env_step = 99
    checkpointer.save(2, agent)  # a resumed run saving a step again replaces it
    assert checkpointer.read_meta(2)["env_step"] == 99
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path / "c", max_to_keep=0)


def test_the_best_evaluated_checkpoint_is_kept_beside_the_newest(tmp_path):
    agent = _fresh_dqn()
    checkpointer = Checkpointer(tmp_path / "c", max_to_keep=2)
    assert checkpointer.best_step() is None
    # eval_return per step; step 6 was saved without an evaluation, step 7's is not finite
    evaluations = {1: 10.0, 2: 50.0, 3: 20.0, 4: 50.0, 5: 30.0, 6: None, 7: float("nan")}
    kept = {1: [1], 2: [1, 2], 3: [2, 3], 4: [2, 3, 4], 5: [2, 4, 5], 6: [2, 5, 6], 7: [2, 6, 7]}
    for step, value in evaluations.items():
        checkpointer.save(step, agent, extra=None if value is None else {"eval_return": value})
        assert checkpointer.all_steps() == kept[step], step  # the newest 2 and the best (of equals, the first)
        assert checkpointer.best_step() == (1 if step == 1 else 2)
    assert Checkpointer(tmp_path / "c").best_step() == 2  # read back from the metadata alone
    # seeds trained together: one value per seed, ranked by their mean; an unevaluated seed (None) is no candidate
    several = Checkpointer(tmp_path / "s", max_to_keep=1)
    for step, values in {1: [0.0, 100.0], 2: [60.0, 60.0], 3: [100.0, None], 4: [0.0, 0.0]}.items():
        several.save(step, agent, extra={"eval_return": values})
    assert several.all_steps() == [2, 4] and several.best_step() == 2  # the mean, not one seed or the highest


def test_a_run_keeps_as_many_checkpoints_as_its_train_cfg_says(tmp_path):
    from kitae.config import TrainConfig

    agent = _fresh_dqn()
    every = Checkpointer.for_run(tmp_path / "every", TrainConfig(keep_checkpoints=-1))
    one = Checkpointer.for_run(tmp_path / "one", TrainConfig(keep_checkpoints=1))
    for step, value in enumerate([1.0, 9.0, 2.0, 3.0, 4.0], start=1):
        every.save(step, agent)
        one.save(step, agent, extra={"eval_return": value})
    assert every.all_steps() == [1, 2, 3, 4, 5]
    assert one.all_steps() == [2, 5]  # the newest and the best-evaluated


# ---------------------------------------------------------------------------------------------
# The compiled loop: segments and loop states
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def a2c_setup():
    env = make_jax_env("gymnax:CartPole-v1", 4)
    config = make_config(
        env, TinyA2CParams(), max_buffer_size=16, batch_size=32, n_epochs=2, task_name="gymnax:CartPole-v1"
    )
    config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, save_frequency=128))
    return env, config


STEPS = 64 * 7  # 7 iterations of 16 vector steps of 4 environments


@pytest.fixture(scope="module")
def whole_run(a2c_setup):
    env, config = a2c_setup
    return compiled_train(TinyA2C("c", config, run_dir="unused"), env, STEPS)


def test_segments_give_the_bits_of_one_program(a2c_setup, whole_run):
    env, config = a2c_setup
    cut = compiled_train(TinyA2C("c", config, run_dir="unused"), env, STEPS, segment_iterations=2)
    assert state_fingerprint(whole_run.state) == state_fingerprint(cut.state)
    assert _equal(whole_run.metrics, cut.metrics)
    seeds = compiled_train(TinyA2C("c", config, run_dir="unused"), env, STEPS, seeds=[0, 1])
    seeds_cut = compiled_train(TinyA2C("c", config, run_dir="unused"), env, STEPS, seeds=[0, 1], segment_iterations=3)
    assert state_fingerprint(seeds.state) == state_fingerprint(seeds_cut.state)


def test_segment_capacity_rounds_up_to_a_power_of_two_of_at_least_64():
    assert [segment_capacity(n) for n in (1, 2, 63, 64, 65, 128, 129, 6250)] == [64, 64, 64, 64, 128, 128, 256, 8192]
    with pytest.raises(ValueError, match="length"):
        segment_capacity(0)


def test_a_resumed_run_and_a_shorter_one_load_the_training_program_from_the_cache(a2c_setup, caplog):
    """Segments are a twentieth of the whole run, resumed or not, and their program holds rows for
    ``segment_capacity`` iterations: resuming a run, or training a shorter run of the same
    configuration, loads the compiled segment program from the persistent cache (on in the tests:
    ``KITAE_CACHE_DIR``) instead of compiling it again, and ends with the same bits."""
    env, config = a2c_setup
    config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, save_frequency=-1))
    steps = 64 * 60  # 60 iterations: segments of 3

    class StopAfterTen(Callback):
        calls = 0

        def should_stop(self) -> bool:
            self.calls += 1
            return self.calls >= 10

    def train(n_env_steps, callback, start=None):
        """The run, and the persistent cache's misses and hits for the segment program."""
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="jax._src.compiler"):
            result = compiled_train(
                TinyA2C("c", config, run_dir="u"), env, n_env_steps, callbacks=[callback], start=start
            )
        found = [r.getMessage() for r in caplog.records if "'jit_segment'" in r.getMessage()]
        misses = sum(m.startswith("PERSISTENT COMPILATION CACHE MISS for") for m in found)
        return result, misses, sum(m.startswith("Persistent compilation cache hit for") for m in found)

    full, _, _ = train(steps, Callback())  # compiled here, or found if another test made it
    first, misses, hits = train(steps, StopAfterTen())
    assert first.stopped and first.env_steps == 64 * 30 and (misses, hits) == (0, 1)
    # what is left (30 iterations) would have been cut into segments of 2 before
    rest, misses, hits = train(steps, Callback(), start=first.state)
    assert rest.env_steps == steps and (misses, hits) == (0, 1)
    assert state_fingerprint(rest.state) == state_fingerprint(full.state)
    shorter, misses, hits = train(steps // 3, Callback())  # segments of 1 iteration, the same program
    assert shorter.env_steps == steps // 3 and (misses, hits) == (0, 1)


def test_a_compiled_run_restored_from_its_loop_state_ends_where_it_would_have(a2c_setup, whole_run, tmp_path):
    env, config = a2c_setup
    steps, full = STEPS, whole_run

    class StopAfterTwo(Callback):  # stop after the second segment
        calls = 0

        def should_stop(self) -> bool:
            self.calls += 1
            return self.calls >= 2

    agent = TinyA2C("c", config, run_dir="unused")
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    part = compiled_train(
        agent, env, steps, callbacks=[CheckpointSaver(checkpointer), StopAfterTwo()], segment_iterations=2
    )
    assert part.stopped and part.env_steps == 256  # saves every 128 steps: segments of 2 iterations
    assert checkpointer.all_steps() == [128, 256]

    again = TinyA2C("c", config, run_dir="unused")
    restored = checkpointer.restore_latest({"loop_state": loop_state_shape(again, env)})
    assert restored.meta["executor"] == "compiled" and restored.meta["env_saved"] and restored.meta["env_step"] == 256
    assert _equal(restored.items["loop_state"], part.state)  # environment state, buffer, keys...
    rest = compiled_train(
        again,
        env,
        steps,
        callbacks=[CheckpointSaver(checkpointer)],
        start=restored.items["loop_state"],
        segment_iterations=2,
    )
    assert rest.start_step == 256 and rest.env_steps == steps and not rest.stopped
    assert state_fingerprint(rest.state) == state_fingerprint(full.state)
    assert again.n_updates == 7 and again.env_step == steps
    assert checkpointer.all_steps() == [256, 384, 448]
    loaded = TinyA2C("c", config, run_dir="unused")
    apply_loop_state(loaded, restored.items["loop_state"])  # a loaded agent takes its state
    assert _equal(loaded.state, part.state.agent_state)

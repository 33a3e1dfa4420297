"""``flush_to_disk``: what the run's TensorBoard writer was given is in its file before a
checkpoint appears (tensorboardX's own ``flush`` leaves its queue unwritten)."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kitae.runs.tensorboard import flush_to_disk, tensorboard_writer


def _steps(logs):
    events = EventAccumulator(str(logs))
    events.Reload()
    return [e.step for e in events.Scalars("x")] if "x" in events.Tags()["scalars"] else []


def test_every_event_added_before_the_flush_is_on_disk_and_the_writer_goes_on(tmp_path):
    with tensorboard_writer(tmp_path) as writer:
        for step in range(3000):  # more than the writing thread keeps up with
            writer.add_scalar("x", float(step), step)
        flush_to_disk(writer)
        assert _steps(tmp_path / "logs") == list(range(3000))
        writer.add_scalar("x", 1.0, 3000)
        flush_to_disk(writer)
        assert _steps(tmp_path / "logs")[-1] == 3000
    assert len(list((tmp_path / "logs").iterdir())) == 1  # one event file throughout

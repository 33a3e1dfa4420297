"""A stop request reaches the compiled loop while a segment runs, not only at its end."""

import os
import signal
import threading
import time

import pytest

from kitae.loops.callbacks import Callback
from kitae.loops.compiled import CompiledExecutor
from kitae.runs.resolve import preset_agent
from kitae.runs.signals import stop_on_signals


class _InterruptTwiceInThirdSegment(Callback):
    """Times the second segment (between the first two progress reports), then, a fifth of that
    into the third, sends SIGINT, waits for the handler to record it and sends a second one."""

    def __init__(self) -> None:
        self.reports: list[float] = []
        self.segment = self.acknowledged = None
        self.stop = None
        self.ended = threading.Event()  # set when the test's run is over: no SIGINT after it

    def on_progress(self, progress) -> None:
        self.reports.append(time.monotonic())
        if len(self.reports) == 2:
            self.segment = self.reports[1] - self.reports[0]
            threading.Thread(target=self._interrupt, daemon=True).start()

    def _interrupt(self) -> None:
        if self.ended.wait(self.segment / 5):  # the main thread is waiting for the third segment by now
            return
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
        deadline = sent + 120
        while not self.stop() and time.monotonic() < deadline:
            if self.ended.wait(0.001):  # the run ended without it (a failed test): none into the next test
                return
        self.acknowledged = time.monotonic() - sent
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_ctrl_c_is_acknowledged_during_a_segment_and_a_second_one_aborts_at_once():
    # segments of 200 iterations (102,400 steps of PPO on gymnax CartPole), a second or more each
    agent, env = preset_agent("ppo", "gymnax:CartPole-v1", steps=2_048_000)
    probe = _InterruptTwiceInThirdSegment()
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt), stop_on_signals() as stop:
            probe.stop = stop
            CompiledExecutor().run(agent, env, 2_048_000, callbacks=[stop, probe], segment_iterations=200)
    finally:
        probe.ended.set()
    assert signal.getsignal(signal.SIGINT) is before
    # before, the main thread waited for a segment's results in one blocking call: the handler
    # ran when the segment ended, and the second SIGINT, sent meanwhile, was lost (the run then
    # stopped at the segment end with a checkpoint)
    assert probe.acknowledged is not None, probe.segment
    assert probe.acknowledged < probe.segment / 2, (probe.acknowledged, probe.segment)
    assert len(probe.reports) == 2  # aborted within the third segment

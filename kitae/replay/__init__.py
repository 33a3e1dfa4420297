"""Replay: what an off-policy learner is fed (prioritized sampling, n-step returns, hindsight
relabelling), pure functions over ``kitae.buffer.BufferState``."""

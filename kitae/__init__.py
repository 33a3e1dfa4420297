"""kitae: reinforcement-learning agents as four pure JAX functions."""

__version__ = "0.1.0"

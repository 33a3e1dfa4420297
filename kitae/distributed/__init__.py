"""Distributed training on Ray (``docs/distributed.md``).

- ``Algorithm``: the interface of seed 003; ``AgentAlgorithm``: its one implementation over any
  kitae agent.
- ``DistributedConfig`` (also ``kitae.config.DistributedConfig``): the layout of a run.
- ``DistributedExecutor``: collection workers, gradient workers and one updater.
"""

from kitae.config import DistributedConfig
from kitae.distributed.algorithm import AgentAlgorithm, Algorithm
from kitae.distributed.executor import DistributedExecutor

__all__ = ["Algorithm", "AgentAlgorithm", "DistributedConfig", "DistributedExecutor"]

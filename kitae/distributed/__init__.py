"""Distributed training: the ``Algorithm`` interface of seed 003 (``kitae.distributed.Algorithm``)
and ``AgentAlgorithm``, its one implementation over any kitae agent (``docs/distributed.md``)."""

from kitae.distributed.algorithm import AgentAlgorithm, Algorithm

__all__ = ["Algorithm", "AgentAlgorithm"]

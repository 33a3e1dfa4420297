"""``DistributedConfig``: how a distributed run is laid out (workers, modes, cluster address)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DistributedConfig"]


def _count(name: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"distributed.{name}={value!r} is not allowed; allowed: an int >= {least}")


@dataclass(frozen=True)
class DistributedConfig:
    """The layout of a distributed run (``kitae train ... --workers N``).

    Attributes:
        workers: collection workers (Ray actors), each stepping ``n_envs / workers`` of the run's
            environments; an int >= 1 that divides ``env_cfg.n_envs``.
        gradient_workers: gradient workers, an int >= 1. One synchronous gradient worker runs each
            update whole; several split each gradient step's minibatch between them (synchronous)
            or take gradient steps as they come free (asynchronous).
        async_collection: collection workers never wait for the updater: each iteration is built
            from the first ``workers`` batches to arrive, collected with whatever weights each
            worker last received (the policy lag says how old). ``False``: every worker collects
            one batch with the current weights, then the update.
        async_gradients: gradients are applied as they arrive (the gradient lag says how stale
            they are); ``False``: each gradient step waits for every gradient worker and applies
            their mean.
        address: ``None`` to start a local Ray runtime (127.0.0.1, token authentication) and stop
            it at the end, or ``"HOST:PORT"`` of an existing cluster's head.
        max_restarts: dead workers the run replaces before it stops (with a checkpoint), int >= 0.
    """

    workers: int = 1
    gradient_workers: int = 1
    async_collection: bool = False
    async_gradients: bool = False
    address: str | None = None
    max_restarts: int = 3

    def __post_init__(self) -> None:
        _count("workers", self.workers, 1)
        _count("gradient_workers", self.gradient_workers, 1)
        _count("max_restarts", self.max_restarts, 0)
        for name in ("async_collection", "async_gradients"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"distributed.{name}={getattr(self, name)!r} is not allowed; allowed: true or false")
        if self.address is not None and (not isinstance(self.address, str) or ":" not in self.address):
            raise ValueError(
                f"distributed.address={self.address!r} is not allowed; allowed: null (start a local runtime) "
                "or 'HOST:PORT' of a Ray head"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DistributedConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"distributed has unknown fields {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**data)

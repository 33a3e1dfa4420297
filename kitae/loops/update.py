"""``kitae.loops.update`` (seed 001's path): minibatch epochs as one ``jax.lax.scan``.

The implementation is ``kitae.algos.update``, beside the agents whose update it is; this module
keeps the documented import path.
"""

from kitae.algos.update import batchify, rebuild_experience, update_epoch

__all__ = ["batchify", "rebuild_experience", "update_epoch"]

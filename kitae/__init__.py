"""kitae: reinforcement-learning agents as four pure JAX functions.

Importing ``kitae`` imports its layers (``docs/architecture.md``) up to ``kitae.runs``, which
installs the run service that ``agent.train``, ``agent.resume``, ``agent.save`` and
``Agent.unserialize`` use: a run started from Python writes the same run directory as one
started from the command line.
"""

import kitae.runs  # noqa: F401  (installs the run service of kitae.base)
from kitae.version import __version__ as __version__

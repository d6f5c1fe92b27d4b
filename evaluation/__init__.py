"""Retrieval evaluation (``kb eval``, ``kb calibrate``): measures the engine, never used by it.

Imports ``core`` and ``index``; nothing but the CLI and ``bench/`` imports this package.
"""

# The bluff budget `kb eval` recommends a threshold for and `kb calibrate`
# proposes one for, unless told otherwise: at most 10 % of out-of-domain
# questions may get an answer.
DEFAULT_MAX_BLUFF_RATE = 0.10

"""Retrieval evaluation (``kb eval``, ``kb calibrate``): measures the engine, never used by it.

Imports ``core`` and ``index``; nothing but the CLI and ``bench/`` imports this package.
"""

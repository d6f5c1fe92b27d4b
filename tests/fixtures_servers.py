"""Pytest fixtures for the local protocol servers of ``tests/servers.py``.

Enable with ``pytest_plugins = ["tests.fixtures_servers"]`` in ``tests/conftest.py``.
Each fixture starts a fresh server for one test and stops it afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.servers import OpenAICompatServer


@pytest.fixture
async def openai_server() -> AsyncIterator[OpenAICompatServer]:
    """A running :class:`OpenAICompatServer`; use ``openai_server.url`` as ``OPENAI_BASE_URL``."""
    async with OpenAICompatServer() as server:
        yield server

"""Pytest fixture for engines over a test module's own knowledge base.

Enabled in ``tests/conftest.py``; the module using it defines ``kb``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from core.answer import Engine, build_engine
from core.config import EngineConfig, LLMConfig
from index.knowledge_base import KnowledgeBase
from tests.servers import OpenAICompatServer


@pytest.fixture
async def engine_for(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> AsyncIterator[Callable[..., Engine]]:
    """Build engines over ``kb`` answering through ``openai_server``, each closed after the test.

    Keyword arguments are ``EngineConfig`` fields.
    """
    opened: list[Engine] = []

    def build(**kw: Any) -> Engine:
        config = EngineConfig(
            llm=LLMConfig(base_url=openai_server.url, max_retries=0, timeout=2.0),
            link_base_url="https://kb.example.com",
            **kw,
        )
        opened.append(build_engine(config, kb))
        return opened[-1]

    yield build
    for engine in opened:
        await engine.aclose()

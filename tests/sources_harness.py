"""What every source's tests share: the people, the texts, a knowledge base, Slack, a sync,
and searching or asking as a person through the real access rule.

Each source's tests (``tests/test_sources_*.py``) start their own mock of the source's
API; the rest is here. A test module binds the fixtures it uses by name
(``kb = sources_harness.kb``), so pytest finds them there and nowhere else: the bot's own
``slack`` fixture (``tests/conftest_bot.py``) stays what other tests get.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from bot.access import Access, Person, SlackDirectory, SourceGrants, Where, web_client
from bot.cli import main
from core.answer import Answer, Engine, SourceRef
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.sources import (
    Acl,
    Connector,
    SourceSyncReport,
    is_source_scope,
    source_scope,
    sync_source,
)
from tests.clocks import Waits
from tests.servers import MockSlackAPI

__all__ = [
    "ALICE",
    "BOB",
    "CAROL",
    "CHILD",
    "HOME",
    "NOMAIL",
    "SECRET",
    "SECRET_Q",
    "AsPeople",
    "access_over",
    "acl_of",
    "kb",
    "kb_cli",
    "live_titles",
    "slack",
    "sync",
    "titles_searched",
]

ALICE = "U0ALICE001"  # alice@example.com: reads the secret page wherever the source grants it
BOB = "U0BOB00001"  # bob@example.com: in the organisation, granted nothing secret
CAROL = "U0CAROL001"  # carol@elsewhere.example: an email no source knows
NOMAIL = "U0NOMAIL01"  # Slack shows no confirmed email for them

HOME = "Office hours: the Copenhagen office opens at eight and closes at six on weekdays."
SECRET = "Project Nightjar: the launch budget is 4 million euros, approved by the board."
CHILD = "Project Nightjar hiring: three engineers join the Nightjar team in March."
SECRET_Q = "What is the launch budget of Project Nightjar?"


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    """A real knowledge base (SQLite, FAISS, the bundled model) in the test's data dir."""
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


@pytest.fixture
async def slack() -> AsyncIterator[MockSlackAPI]:
    """The mock Slack Web API, knowing alice, bob, carol (another domain) and nomail."""
    async with MockSlackAPI() as server:
        server.set_user(ALICE, name="alice")
        server.set_user(BOB, name="bob")
        carol = server.set_user(CAROL, name="carol")
        carol["profile"]["email"] = "carol@elsewhere.example"
        nomail = server.set_user(NOMAIL, name="nomail")
        nomail["is_email_confirmed"] = False
        yield server


def sync(
    kb: KnowledgeBase,
    source: str,
    kind: str,
    settings: dict[str, Any],
    connector: Connector,
    waits: Waits | None = None,
) -> SourceSyncReport:
    """One sync of ``source`` through ``connector`` (added as ``kind`` first if new, else
    recorded with ``settings``, as the connector opened from its record would be), on
    ``waits``' clock when given."""
    if not any(r.name == source for r in kb.store.sources.all()):
        kb.store.sources.add(source, kind, settings)
    else:
        kb.store.sources.set_settings(source, settings)
    extra = {"clock": waits.clock} if waits is not None else {}
    return sync_source(kb, source, connector, **extra)


def live_titles(kb: KnowledgeBase) -> dict[str, int]:
    """Each indexed document of a source, by title: its id."""
    return {
        d.title: d.id
        for d in kb.documents()
        if d.state == DocState.INDEXED and is_source_scope(d.scope)
    }


def acl_of(kb: KnowledgeBase, source: str, item: str) -> Acl:
    """Who may read ``item`` of ``source``, as the store holds it."""
    return Acl.from_entries(kb.store.sources.acl_rows(source_scope(source, item)))


def kb_cli(index_dir: Path, *args: str) -> Result:
    """``kb --data-dir index_dir ARGS``, in process."""
    return CliRunner().invoke(main, ["--data-dir", str(index_dir), *args])


def access_over(slack: MockSlackAPI, kb: KnowledgeBase) -> Access:
    """The access rule every surface asks, with Slack as the directory of people."""
    client = web_client(slack.bot_token, slack.api_url)
    return Access(SlackDirectory(client), allow_external=False, grants=SourceGrants(kb.store))


async def titles_searched(
    engine: Engine, kb: KnowledgeBase, scopes: frozenset[str], question: str = SECRET_Q
) -> set[str]:
    """The titles of every document a search with ``scopes`` finds, before any gate."""
    found = await asyncio.to_thread(engine.retrieve, question, scopes=scopes, k=50)
    rows = kb.store.chunks_by_id([c.chunk_id for c in found])
    return {kb.store.document(r.document_id).title for r in rows.values()}


class AsPeople:
    """Searches and questions as a Slack user, with the scopes the access rule gives them."""

    def __init__(self, slack: MockSlackAPI, kb: KnowledgeBase, engine: Engine) -> None:
        self.access = access_over(slack, kb)
        self.kb = kb
        self.engine = engine

    async def scopes(self, user: str, where: Where | None = None) -> frozenset[str]:
        """What ``user`` may search (``where``: shown there, to everyone in it)."""
        return await self.access.search_scopes(Person(user), where)

    async def titles(
        self, user: str, where: Where | None = None, question: str = SECRET_Q
    ) -> set[str]:
        """The titles a search as ``user`` finds, before any gate."""
        return await titles_searched(self.engine, self.kb, await self.scopes(user, where), question)

    async def answer(self, user: str, question: str = SECRET_Q) -> Answer:
        """The engine's answer to ``question`` asked by ``user``."""
        return await self.engine.ask(question, scopes=await self.scopes(user))

    async def shown(self, user: str, question: str = SECRET_Q) -> list[SourceRef]:
        """Every passage an answer shows ``user``: cited, kept and beside."""
        answer = await self.answer(user, question)
        return answer.sources + answer.kept + answer.beside

    def cited(self, answer: Answer, document: str, anchor: str = "#char=") -> SourceRef:
        """The answer's first citation, checked: ``document``'s, linked by ``anchor``, and
        quoting the exact characters of the document's canonical text it points at."""
        cited = answer.sources[0]
        assert cited.document == document and anchor in cited.url
        text = self.kb.canonical_text(cited.document_id)
        assert text[cited.start : cited.end] == cited.quote
        return cited

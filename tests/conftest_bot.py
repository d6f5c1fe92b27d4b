"""Fixtures for the Slack bot tests: the real app over HTTP, a mock Slack, a local model.

Registered for every test module by ``tests/conftest.py``.

Every test gets a fresh data dir holding a few small Markdown documents
ingested through the real ``KnowledgeBase`` (with the session's embedding
model), a :class:`MockSlackAPI`, an :class:`OpenAICompatServer`, and the bot's
aiohttp application served on loopback by pytest-aiohttp's test client.
Requests are signed the way Slack signs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from aiohttp import web, web_protocol
from aiohttp.test_utils import TestClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bot.app import SERVICES, create_app
from bot.settings import Settings
from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID
from bot.slack.services import Services
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.records import DocumentRow
from tests.servers import (
    CHANNEL_ID,
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    event_body,
    slack_headers,
)

PUBLIC_URL = "http://kb.test"
# A canary like the servers' tokens (tests/canaries.py): it must never reach a log or a file.
LINK_SECRET = "canary-link-secret-a6f4b2c8"
THRESHOLD = 0.6
ADMIN_ID = "U0ADMIN001"

HANDBOOK = b"""# Employee handbook

## Expenses

Submit expense claims within 30 days, with a photo of every receipt attached.

Conference tickets need the manager's approval email.

## VPN

When internal sites do not load over the VPN, set the DNS server to 10.20.0.53 and reconnect.
"""

SECURITY = b"""# Security policy

## API keys

Production API keys are rotated every 90 days by the platform team. Request a new key in the #platform-keys channel.

## Laptops

Laptops must use full-disk encryption and lock after five minutes idle.
"""

# A document that tries to ping everyone and forge a link when quoted.
ONCALL = b"""# On-call guide

## Escalation

If the pager fires twice in an hour, write <!channel> and <@U123> in #incidents and follow <https://evil.example|the runbook> & wait.
"""

# Visible only in CHANNEL_ID.
FALCON = b"""# Project Falcon

## Launch

Project Falcon launches on 14 March at the Berlin office.
"""

IN_DOMAIN = "How long do I have to submit an expense claim?"
OUT_OF_DOMAIN = "What is the capital of Australia?"
PAGER = "What do I do when the pager fires twice?"
FALCON_Q = "When does Project Falcon launch?"

LINK_RE = re.compile(r"<(https?://[^|>]+)\|\[(\d+)\]>")

# aiohttp serves each connection in a task that lives as long as the client
# keeps the connection alive: the server's own, not work a request started.
_CONNECTION_LOOP = web_protocol.RequestHandler.start.__code__


def make_settings(**fields: Any) -> Settings:
    """Settings from field names, passed under their environment names (what every version accepts)."""
    aliases = {}
    for name, value in fields.items():
        alias = Settings.model_fields[name].validation_alias
        key = alias.choices[0] if alias is not None else name  # type: ignore[union-attr]
        aliases[str(key)] = value
    return Settings(**aliases)


def default_reply(messages: list[dict[str, Any]]) -> str:
    """The model's answer: one cited sentence."""
    return "Here is what the documents say [1]."


@pytest.fixture
async def slack() -> AsyncIterator[MockSlackAPI]:
    """A running mock Slack Web API that knows one workspace admin."""
    async with MockSlackAPI(admins=[ADMIN_ID]) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[OpenAICompatServer]:
    """A running OpenAI-compatible server answering :func:`default_reply`."""
    async with OpenAICompatServer(reply=default_reply, api_key=DEFAULT_OPENAI_API_KEY) as server:
        yield server


@pytest.fixture
def settings_for(
    index_dir: Path, slack: MockSlackAPI, llm: OpenAICompatServer
) -> Callable[..., Settings]:
    """Build the bot's settings pointed at the local servers, with overrides."""

    def build(**overrides: Any) -> Settings:
        fields: dict[str, Any] = {
            "data_dir": index_dir,
            "slack_bot_token": slack.bot_token,
            "slack_signing_secret": DEFAULT_SIGNING_SECRET,
            "openai_api_key": DEFAULT_OPENAI_API_KEY,
            "link_secret": LINK_SECRET,
            "slack_api_url": slack.api_url,
            "openai_base_url": llm.url,
            "llm_max_retries": 0,
            "llm_timeout": 5.0,
            "threshold": THRESHOLD,
            "public_url": PUBLIC_URL,
            "admin_users": "",
            "slack_admins_are_admins": False,
        }
        fields.update(overrides)
        return make_settings(**fields)

    return build


@pytest.fixture
def bot_settings(settings_for: Callable[..., Settings]) -> Settings:
    """The default settings."""
    return settings_for()


def ingest_fixture_documents(kb: KnowledgeBase) -> dict[str, DocumentRow]:
    """Add the fixture documents; returns their rows by file name."""
    rows = {
        name: kb.ingest_bytes(data, name, uploader="fixture").document
        for name, data in (
            ("handbook.md", HANDBOOK),
            ("security.md", SECURITY),
            ("oncall.md", ONCALL),
        )
    }
    rows["falcon.md"] = kb.ingest_bytes(
        FALCON, "falcon.md", uploader="fixture", scope=CHANNEL_ID
    ).document
    assert all(r.state == "indexed" for r in rows.values()), rows
    return rows


@pytest.fixture(scope="session")
def fixture_data_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    """A data dir with the fixture documents, built once; tests get a copy."""
    data_dir = tmp_path_factory.mktemp("bot-fixture-kb")
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    ingest_fixture_documents(kb)
    # Everything into the main database file, so a plain copy is complete.
    kb.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # Closed now: closed whenever the collector gets to it, SQLite deletes the -wal and
    # -shm files, and a copy under way then fails on the files it listed.
    kb.store.close()
    return data_dir


@dataclass
class Bot:
    """The running app, its HTTP client and the servers around it."""

    http: TestClient
    app: web.Application
    slack: MockSlackAPI
    llm: OpenAICompatServer
    settings: Settings
    # Tasks already running once the bot had started (server start-up, Socket
    # Mode): long-lived, so :meth:`idle` must not wait for them.
    startup_tasks: frozenset[asyncio.Task[Any]] = frozenset()

    @property
    def services(self) -> Services:
        """What the listeners use (knowledge base, engine, jobs...)."""
        return self.app[SERVICES]

    @property
    def kb(self) -> KnowledgeBase:
        """The knowledge base."""
        return self.services.kb

    async def post(
        self,
        body: bytes,
        *,
        retry_num: int | None = None,
        timestamp: int | None = None,
        secret: str = DEFAULT_SIGNING_SECRET,
    ) -> aiohttp.ClientResponse:
        """POST a signed Slack request to ``/slack/events``."""
        headers = slack_headers(secret, body, retry_num=retry_num, timestamp=timestamp)
        return await self.http.post("/slack/events", data=body, headers=headers)

    async def event(self, event: dict[str, Any], **kwargs: Any) -> aiohttp.ClientResponse:
        """Deliver an Events API event."""
        envelope = {k: kwargs.pop(k) for k in ("event_id", "is_ext_shared_channel") if k in kwargs}
        if event.get("type") in {"message", "app_mention"}:
            self.slack.add_person_message(event)  # Slack keeps it in its thread
        resp = await self.post(event_body(event, **envelope), **kwargs)
        assert resp.status == 200, await resp.text()
        return resp

    async def answer(self, count: int = 1, timeout: float = 15.0) -> dict[str, Any]:
        """Wait for the ``count``-th answer shown; return its ``chat.postMessage`` / ``chat.update``.

        An answer is posted when it came in one piece, or edited into the
        message that showed it being written; progress is never an answer.
        """
        deadline = time.monotonic() + timeout
        while True:
            shown = [p for m, p in self.slack.log if _is_answer(m, p)]
            if len(shown) >= count:
                return self._with_ts(shown[count - 1])
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} answers, got {len(shown)}: {shown}")
            await asyncio.sleep(0.02)

    def answers_shown(self) -> int:
        """How many answers the bot has shown so far (see :meth:`answer`)."""
        return sum(_is_answer(m, p) for m, p in self.slack.log)

    def _with_ts(self, params: dict[str, Any]) -> dict[str, Any]:
        """A recorded call with the ``ts`` of its message (a post's ``ts`` is in Slack's reply)."""
        if "ts" in params:
            return params
        ts = next(
            ts
            for (channel, ts), message in self.slack.messages.items()
            if message.get("blocks") is params.get("blocks") and channel == params.get("channel")
        )
        return {**params, "ts": ts}

    async def settle(self, finished: int = 1, timeout: float = 15.0) -> list[str]:
        """Wait until ``finished`` file statuses reached a final state; return every status text.

        The view submission is acknowledged before its listener posts the
        statuses and starts the jobs, so waiting on the jobs alone could race.
        """
        deadline = time.monotonic() + timeout
        while True:
            texts = self.statuses()
            done = [t for t in texts if any(word in t for word in FINAL_WORDS)]
            if len(done) >= finished and not self.services.jobs:
                return texts
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {finished} final file statuses, got {texts}")
            await asyncio.sleep(0.02)

    async def idle(self, timeout: float = 15.0) -> None:
        """Wait until all the work the requests so far started has finished.

        Bolt acknowledges Slack first and runs the listener afterwards in a task
        nobody awaits (``process_before_response`` is off), and uploads continue
        in ``services.jobs``: a check that the bot posted nothing is only
        meaningful once all of that is over, however slow the machine.
        Fails the test when the work is still running after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                while (busy := self._started_tasks()) or self.services.jobs:
                    if busy:
                        # asyncio.wait never cancels what it waits for, even on timeout.
                        await asyncio.wait(busy)
                    # Shielded: a timeout must not cancel the jobs drain() gathers.
                    await asyncio.shield(self.services.jobs.drain())
        except TimeoutError:
            names = sorted(_describe(t) for t in self._started_tasks())
            raise AssertionError(
                f"the bot was still busy after {timeout} s: tasks {names}, "
                f"{len(self.services.jobs)} background jobs"
            ) from None

    def _started_tasks(self) -> set[asyncio.Task[Any]]:
        """Unfinished tasks started since the bot came up, except the caller and connections."""
        current = asyncio.current_task()
        return {
            task
            for task in asyncio.all_tasks()
            if task is not current
            and task not in self.startup_tasks
            and getattr(task.get_coro(), "cr_code", None) is not _CONNECTION_LOOP
        }

    def statuses(self) -> list[str]:
        """Texts of every message the bot posted or updated, in order."""
        return [m for _, m in sorted(_message_events(self.slack))]


def _is_answer(method: str, params: dict[str, Any]) -> bool:
    if method not in {"chat.postMessage", "chat.update"}:
        return False
    # Not ASCII-escaped: the sentences compared below hold "…".
    blocks = json.dumps(params.get("blocks", []), ensure_ascii=False)
    if FEEDBACK_ACTION_ID in blocks:
        return True
    # An answer that could not be logged has no feedback buttons; it is still an edit.
    progress = params.get("text") == messages.PLACEHOLDER or messages.WRITING in blocks
    return method == "chat.update" and not progress


FINAL_WORDS = (": indexed,", ": failed:", "already in the knowledge base", ": not added.")


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', coro)})"


def _message_events(slack: MockSlackAPI) -> list[tuple[int, str]]:
    out = []
    for i, (method, params) in enumerate(slack.log):
        if method in {"chat.postMessage", "chat.update"}:
            out.append((i, str(params.get("text", ""))))
    return out


BotFactory = Callable[..., Awaitable[Bot]]


def create_bot_app(
    settings: Settings, embedder: Embedder, fixture_data_dir: Path, *, documents: bool = True
) -> web.Application:
    """The bot's app for ``settings``, on a copy of the fixture documents unless told otherwise."""
    if documents and not (settings.data_dir / "kb.sqlite").exists():
        shutil.copytree(fixture_data_dir, settings.data_dir, dirs_exist_ok=True)
    return create_app(settings, kb=KnowledgeBase(settings.index_config(), embedder=embedder))


@pytest.fixture
def make_bot(
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    embedder: Embedder,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    fixture_data_dir: Path,
) -> BotFactory:
    """Start the bot with setting overrides, on a copy of the fixture documents.

    ``prepare`` gets the app before it starts.
    """

    async def start(
        *,
        documents: bool = True,
        prepare: Callable[[web.Application], None] | None = None,
        **overrides: Any,
    ) -> Bot:
        settings = settings_for(**overrides)
        app = create_bot_app(settings, embedder, fixture_data_dir, documents=documents)
        if prepare is not None:
            prepare(app)  # before the app starts: e.g. Socket Mode, which connects on start
        http = await aiohttp_client(app)
        return Bot(http, app, slack, llm, settings, frozenset(asyncio.all_tasks()))

    return start


@pytest.fixture
async def bot(make_bot: BotFactory) -> Bot:
    """The bot with default settings and the fixture documents."""
    return await make_bot()


EndpointBot = Callable[..., Awaitable[Bot]]


@pytest.fixture
def on_the_endpoint(
    tmp_path: Path,
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> EndpointBot:
    """Makes the bot on a knowledge base embedded by ``llm``'s endpoint (a slow one is
    waited for 120 s unless told otherwise), holding one document; keyword arguments are
    more settings."""

    async def make(**more: Any) -> Bot:
        settings = settings_for(
            data_dir=tmp_path / "kb",
            embedding_model="openai:test-embed",
            embedding_base_url=llm.url,
            **{"embedding_timeout": 120.0, **more},
        )
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "bikes.md").write_text("# Bicycles\n\nBicycle storage is in the basement.\n")
        kb = await asyncio.to_thread(KnowledgeBase, settings.index_config())
        await asyncio.to_thread(kb.ingest_paths, [docs])
        app = create_app(settings, kb=kb)
        client = await aiohttp_client(app)  # its own tasks are the bot's from the start
        return Bot(client, app, slack, llm, settings, frozenset(asyncio.all_tasks()))

    return make


def everything_posted(slack: MockSlackAPI) -> str:
    """Every message text and block the bot sent, as one JSON string."""
    calls = (
        slack.calls("chat.postMessage")
        + slack.calls("chat.update")
        + slack.calls("chat.postEphemeral")
    )
    return json.dumps(calls, ensure_ascii=False) + json.dumps(slack.responses(), ensure_ascii=False)


def links(message: dict[str, Any]) -> list[tuple[str, int]]:
    """The server's ``<url|[n]>`` links in a recorded message's blocks."""
    return [(url, int(n)) for url, n in LINK_RE.findall(json.dumps(message.get("blocks", [])))]


@contextlib.asynccontextmanager
async def mcp_session(bot: Bot, name: str, user_id: str) -> AsyncIterator[ClientSession]:
    """The official MCP client on the bot's ``/mcp``, with a token ``name`` issued for ``user_id``."""
    token, _ = bot.kb.store.mcp_tokens.issue(name, user_id=user_id)
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(str(bot.http.make_url("/mcp")), http_client=http) as (r, w),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        yield session

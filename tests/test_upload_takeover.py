"""An upload whose replica is killed half-way is finished by another replica, once.

Replica A is a real ``kb serve`` process; replica B is the real app in the test's
process; they share one store (one SQLite data dir, then a real PostgreSQL
server with a data dir each), the local mock Slack Web API and the local
OpenAI-compatible server (embeddings too, so that indexing can be held) of
``tests/servers.py``. A takes an upload and is stopped at a known point: its
download of the file held open by the mock Slack, or its embedding request
held open by the model server. While A lives, its claim is renewed past the
lease and B takes nothing (neither its sweep nor Slack's redelivery). Then A
is SIGKILLed and B finishes the upload: after Slack's redelivery once A's claim
lapsed, or by its own sweep. What is checked is what the person sees in Slack
and what the store holds: the status message A posted edited to "indexed, N
chunks" and no other final status, one document, indexed, and nothing left
for anyone to take over.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from slack_sdk.web.async_client import AsyncWebClient

from bot.app import create_app
from bot.settings import Settings
from bot.slack import app as slack_app
from bot.slack.blocks import RETRY_ACTION_ID, UPLOAD_CALLBACK_ID
from bot.slack.uploads import MAX_ATTEMPTS, UploadRequest
from bot.slack.words import words_for
from index.models import EVERYONE, Publish
from index.storage import APPROVAL, INTERRUPTED, Store

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import ADMIN_ID, FINAL_WORDS, Bot, BotFactory  # noqa: E402
from tests.replicas import replica_env, start_replica, until_ready  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_SIGNING_SECRET,
    DM_CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    block_actions_body,
    button_action,
    event_body,
    file_input_state,
    file_share_event,
    slack_headers,
    view_submission_body,
)

EMBEDDING_MODEL = "openai:test-embed"  # the model server's: indexing is a request it can hold
# Short, so that the killed replica's claim lapses within the test (15 s by default), and
# long enough that a live replica's renewals, late on a loaded machine, still hold it.
LEASE_S = 3.0
# The lease, B's sweep and the indexing of a small file, on a loaded 2-core machine.
DONE_TIMEOUT_S = 60.0
FILE_ID = "F0HANDBOOK"
NAME = "travel-policy.md"
POLICY = b"""# Travel policy

## Booking

Book trains and flights through the travel desk at least two weeks ahead.

## Hotels

Hotels up to 150 EUR a night are approved without asking; above that, ask your manager first.

## Expenses

Submit travel expenses within 30 days, with every receipt attached.
"""


@dataclass(frozen=True)
class Scenario:
    """Where replica A is killed, and what makes B take the upload over."""

    upload: str  # "file_share": sent in a DM; "kb-upload": the modal's submission
    killed_in: str  # "download" or "indexing"
    taken_by: str  # "redelivery": Slack's, once A's claim lapsed; "sweep": B's own


SCENARIOS = [
    Scenario("file_share", "download", "redelivery"),
    Scenario("kb-upload", "indexing", "sweep"),
]


@pytest.fixture
def bot_on_model_server(
    settings_for: Callable[..., Settings],
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> Callable[..., Awaitable[Bot]]:
    """Start the real app in this process with setting overrides, indexing with the model
    server's embeddings."""

    async def start(**overrides: Any) -> Bot:
        settings = settings_for(embedding_model=EMBEDDING_MODEL, **overrides)
        # In a thread: opening it asks the model server (on this loop) for the vectors' size.
        app = await asyncio.to_thread(create_app, settings)
        http = await aiohttp_client(app)
        return Bot(http, app, slack, llm, settings, frozenset(asyncio.all_tasks()))

    return start


async def _deliver(
    http: aiohttp.ClientSession, url: str, body: bytes, retry: int | None = None
) -> None:
    headers = slack_headers(DEFAULT_SIGNING_SECRET, body, retry_num=retry)
    async with http.post(f"{url}/slack/events", data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()


def _upload_body(scenario: Scenario, file: dict[str, Any]) -> bytes:
    if scenario.upload == "file_share":
        return event_body(file_share_event([file]))
    view = {
        "callback_id": UPLOAD_CALLBACK_ID,
        "private_metadata": json.dumps({"channel": CHANNEL_ID}),
        "state": file_input_state("files", "files", [file]),
    }
    return view_submission_body(view)


def _claims(store: Store) -> dict[str, float]:
    """The deliveries claimed and not answered, with when each was last claimed or renewed."""
    rows = store.db.execute(
        "SELECT key, seen_at FROM deliveries WHERE key NOT LIKE 'answered:%'"
    ).fetchall()
    return {str(key): float(seen) for key, seen in rows}


async def _held_past_a_lease(store: Store) -> str:
    """Wait until the one claim in the store was renewed a lease after it was first seen; its key.

    Its holder is working on it, alive: the claim must not lapse, however long that takes.
    """
    deadline = time.monotonic() + DONE_TIMEOUT_S
    first: dict[str, float] = {}
    while True:
        claims = await asyncio.to_thread(_claims, store)
        for key, seen in claims.items():
            first.setdefault(key, seen)
            if seen >= first[key] + LEASE_S:
                return key
        assert time.monotonic() < deadline, (
            f"the upload's claim was not renewed for a lease while replica A worked on it: {claims}"
        )
        await asyncio.sleep(0.02)


def _status_of(slack: MockSlackAPI) -> tuple[str, str]:
    """Where the file's status message is (the one replica A posted)."""
    [(channel, ts)] = [
        key for key, message in slack.messages.items() if NAME in str(message.get("text", ""))
    ]
    return channel, ts


def _shown_for_file(slack: MockSlackAPI, method: str) -> list[dict[str, Any]]:
    return [p for m, p in slack.log if m == method and NAME in str(p.get("text", ""))]


def _messages_sent(slack: MockSlackAPI, since: int) -> list[tuple[str, dict[str, Any]]]:
    """The messages posted or edited since the ``since``-th call."""
    return [(m, p) for m, p in slack.log[since:] if m in {"chat.postMessage", "chat.update"}]


async def _until(predicate: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "scenario",
    SCENARIOS,
    ids=[f"{s.upload}-killed-in-{s.killed_in}-taken-by-{s.taken_by}" for s in SCENARIOS],
)
async def test_an_upload_whose_replica_is_killed_is_finished_by_another_once(
    scenario: Scenario,
    database_url: str,
    tmp_path: Path,
    bot_on_model_server: Callable[..., Awaitable[Bot]],
) -> None:
    shared = tmp_path / "data"
    a_dir, b_dir = (shared, shared) if not database_url else (tmp_path / "a", tmp_path / "b")
    b = await bot_on_model_server(
        data_dir=b_dir,
        database_url=database_url,
        admin_users=USER_ID,
        slack_claim_lease=LEASE_S,
        # Only Slack's redelivery may take it over in that scenario (the start-up sweep aside).
        upload_sweep_seconds=3600.0 if scenario.taken_by == "redelivery" else 0.2,
    )
    slack, llm = b.slack, b.llm
    b_client = b.app[slack_app.BOLT].client
    store = b.kb.store
    file = slack.add_file(FILE_ID, NAME, POLICY, "text/markdown")
    async with aiohttp.ClientSession() as http:
        settings = {"KB_EMBEDDING_MODEL": EMBEDDING_MODEL, "KB_SLACK_CLAIM_LEASE": str(LEASE_S)}
        a = start_replica(
            "replica-a", replica_env(a_dir, database_url, slack, llm, settings), tmp_path
        )
        try:
            await until_ready(a, http)
            # Replica A takes the upload and stops at a known point.
            if scenario.killed_in == "download":
                slack.hold_download(FILE_ID)
            else:
                llm.hold_embeddings()
            body = _upload_body(scenario, file)
            await _deliver(http, a.url, body)
            if scenario.killed_in == "download":
                await slack.wait_for_held_download(FILE_ID, timeout=DONE_TIMEOUT_S)
            else:
                await llm.wait_for_held_embeddings(1, timeout=DONE_TIMEOUT_S)
            channel, ts = _status_of(slack)
            # The servers' requests held open are A's, not work B must finish before idling.
            b = replace(b, startup_tasks=frozenset(asyncio.all_tasks()))

            # Alive, A keeps its claim past a lease: B takes nothing, by sweep or redelivery.
            delivery = await _held_past_a_lease(store)
            shown = len(slack.log)
            assert await b.services.uploader.take_over(b_client) == 0
            if scenario.upload == "file_share":
                assert (await b.post(body, retry_num=1)).status == 200
            await b.idle()
            assert _messages_sent(slack, shown) == [], "B took over an upload A still holds"

            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(timeout=30)
        finally:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait(timeout=30)
            slack.release_downloads()
            llm.release_embeddings()

        # B finishes it: after Slack's redelivery once A's claim lapsed, or by its own sweep.
        if scenario.taken_by == "redelivery":
            await _until(
                lambda: store.uploads.lapsed(lease_seconds=LEASE_S) != [],
                lambda: "replica A's claim never lapsed after it was killed",
            )
            assert (await b.post(body, retry_num=2)).status == 200
        await _until(
            lambda: any(w in str(slack.messages[(channel, ts)].get("text")) for w in FINAL_WORDS),
            lambda: f"the status stayed at {slack.messages[(channel, ts)].get('text')!r}",
        )
        await b.idle()

    [doc] = [d for d in store.documents() if d.name == NAME]
    assert doc.state == "indexed" and doc.chunk_count == len(store.chunk_rows(doc.id)) > 0
    final = str(slack.messages[(channel, ts)]["text"])
    assert NAME in final and final.endswith(f"indexed, {doc.chunk_count} chunks."), final
    # One status message (A's, edited by B), and one final status in all.
    assert len(_shown_for_file(slack, "chat.postMessage")) == 1
    finals = [
        p
        for method in ("chat.postMessage", "chat.update")
        for p in _shown_for_file(slack, method)
        if any(w in str(p.get("text")) for w in FINAL_WORDS)
    ]
    assert [(p["channel"], p["ts"]) for p in finals] == [(channel, ts)]
    if scenario.upload == "file_share":
        assert channel == DM_CHANNEL_ID
    # Killed in indexing, the original A stored is indexed: the file is not fetched again.
    fetched = 2 if scenario.killed_in == "download" else 1
    assert slack.downloads == [(FILE_ID, True)] * fetched

    # Done: nothing left to take over, and a late redelivery changes nothing.
    assert store.uploads.lapsed(lease_seconds=0.0) == []
    assert all(u.done for u in store.uploads.of([delivery]))
    shown = len(slack.log)
    assert await b.services.uploader.take_over(b_client) == 0
    if scenario.upload == "file_share":
        assert (await b.post(body, retry_num=3)).status == 200
    await b.idle()
    assert _messages_sent(slack, shown) == []
    assert [d.name for d in store.documents()].count(NAME) == 1


# ------------------------------------------------------------------ what a takeover finds


def _client(bot: Bot) -> AsyncWebClient:
    return AsyncWebClient(token=bot.slack.bot_token, base_url=bot.slack.api_url)


async def _left_unfinished(bot: Bot, *, attempts: int, publish: Publish = Publish.DIRECT) -> int:
    """An upload as a process that died indexing it leaves it: its file recorded, its status
    message at "indexing…", its document stored and marked ``indexing`` by a lock nobody
    holds any more, no live claim; its document's id."""
    kb = bot.kb
    doc = kb.add_bytes(POLICY, NAME, uploader=USER_ID, publish=publish).document
    with kb.store.worker.working(doc.id) as holder:
        kb.store.mark_indexing(doc.id, holder)  # then its process stopped working on it
    words = words_for("en")
    posted = await _client(bot).chat_postMessage(
        channel=DM_CHANNEL_ID, text=words.upload_indexing(NAME)
    )
    file = bot.slack.add_file(FILE_ID, NAME, POLICY, "text/markdown")
    request = UploadRequest(DM_CHANNEL_ID, USER_ID, EVERYONE, publish, words)
    [upload] = kb.uploads.record(["event:Ev0DEAD"], [(FILE_ID, request.record(file, title=None))])
    kb.uploads.set_status(upload, str(posted["channel"]), str(posted["ts"]))
    kb.uploads.set_document(upload, doc.id)
    for _ in range(attempts):
        kb.uploads.started(upload)
    return doc.id


@pytest.mark.parametrize("attempts", [MAX_ATTEMPTS - 1, MAX_ATTEMPTS])
async def test_a_document_whose_indexing_keeps_being_cut_short_is_failed_not_indexed_again(
    bot: Bot, attempts: int
) -> None:
    doc_id = await _left_unfinished(bot, attempts=attempts)
    [status] = bot.slack.calls("chat.postMessage")
    assert await bot.services.uploader.take_over(_client(bot)) == 1
    await bot.idle()

    doc = bot.kb.document(doc_id)
    final = bot.slack.messages[(status["channel"], bot.slack.calls("chat.update")[-1]["ts"])]
    assert len(bot.slack.calls("chat.postMessage")) == 1, "the same status message, edited"
    assert bot.slack.downloads == [], "the stored original is indexed"
    if attempts < MAX_ATTEMPTS:
        assert doc.state == "indexed" and doc.chunk_count > 0
        assert final["text"].endswith(f"indexed, {doc.chunk_count} chunks.")
        return
    # Each process that took it up died indexing it: the next one does not try again.
    assert doc.state == "failed" and doc.failure_reason == INTERRUPTED
    assert bot.kb.store.chunk_rows(doc_id) == []
    assert final["text"].endswith(f"failed: {INTERRUPTED}")
    [button] = [e for b in final["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert button["action_id"] == RETRY_ACTION_ID and button["value"] == str(doc_id)
    assert await bot.services.uploader.take_over(_client(bot)) == 0


async def test_a_takeover_does_not_ask_the_admins_twice(make_bot: BotFactory) -> None:
    bot = await make_bot(admin_users=ADMIN_ID)
    doc_id = await _left_unfinished(bot, attempts=1, publish=Publish.APPROVAL)
    # The process that died had indexed it and asked the admin, then died before reporting.
    assert bot.kb.index_document(doc_id).state == "awaiting_approval"
    asked = await _client(bot).chat_postMessage(channel=ADMIN_ID, text="approve?")
    bot.kb.messages.record(doc_id, APPROVAL, str(asked["channel"]), str(asked["ts"]))
    posts = len(bot.slack.calls("chat.postMessage"))
    assert await bot.services.uploader.take_over(_client(bot)) == 1
    await bot.idle()
    assert len(bot.slack.calls("chat.postMessage")) == posts
    [update] = bot.slack.calls("chat.update")[-1:]
    assert "sent to the knowledge-base admins for approval" in update["text"]
    assert bot.kb.document(doc_id).state == "awaiting_approval"


async def test_an_upload_cut_short_by_a_shutdown_is_handed_over_at_once(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    file = bot.slack.add_file(FILE_ID, NAME, POLICY, "text/markdown")
    bot.slack.hold_download(FILE_ID)
    await bot.event(file_share_event([file]))
    await bot.slack.wait_for_held_download(FILE_ID)
    lease = bot.services.deliveries.lease_seconds
    assert bot.kb.uploads.lapsed(lease_seconds=lease) == [], "held while it works"
    # The server stops before the upload is done (past its grace period): nothing is settled.
    await bot.services.jobs.cancel_all()
    bot.slack.release_downloads()
    [keys] = bot.kb.uploads.lapsed(lease_seconds=lease)
    assert not any(": indexed," in s or ": failed:" in s for s in bot.statuses())

    # Let go, not left to lapse: whoever looks next takes it over, well within the lease.
    assert await bot.services.uploader.take_over(_client(bot)) == 1
    await bot.settle()
    [doc] = [d for d in bot.kb.documents() if d.name == NAME]
    assert doc.state == "indexed"
    assert bot.statuses()[-1].endswith(f"indexed, {doc.chunk_count} chunks.")
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert all(u.done for u in bot.kb.uploads.of(keys))


async def test_a_retry_cut_short_is_finished_on_its_status_message_by_the_next_to_look(
    tmp_path: Path, bot_on_model_server: Callable[..., Awaitable[Bot]]
) -> None:
    bot = await bot_on_model_server(
        data_dir=tmp_path / "data", embedding_max_retries=0, publishers=USER_ID
    )
    slack, llm = bot.slack, bot.llm
    # The embeddings endpoint is down for the upload: it fails, with a Retry.
    llm.fail_with(500, times=1)
    await bot.event(file_share_event([slack.add_file(FILE_ID, NAME, POLICY, "text/markdown")]))
    await bot.settle()
    [doc] = [d for d in bot.kb.documents() if d.name == NAME]
    assert doc.state == "failed"
    [status] = bot.slack.calls("chat.postMessage")
    channel, ts = status["channel"], bot.slack.calls("chat.update")[-1]["ts"]

    llm.hold_embeddings()
    click = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(doc.id))], channel_id=channel, message_ts=ts
    )
    assert (await bot.post(click)).status == 200
    await llm.wait_for_held_embeddings(1)
    lease = bot.services.deliveries.lease_seconds
    assert bot.kb.uploads.lapsed(lease_seconds=lease) == [], "held while it works"
    # The server stops mid-retry (past its grace period): the retry is handed over.
    await bot.services.jobs.cancel_all()
    [keys] = bot.kb.uploads.lapsed(lease_seconds=lease)
    [upload] = bot.kb.uploads.of(keys)
    assert (upload.document_id, upload.status_channel, upload.status_ts) == (doc.id, channel, ts)
    llm.release_embeddings()

    assert await bot.services.uploader.take_over(_client(bot)) == 1
    await bot.settle()
    doc = bot.kb.document(doc.id)
    assert doc.state == "indexed"
    assert bot.slack.messages[(channel, ts)]["text"].endswith(f"indexed, {doc.chunk_count} chunks.")
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert [d.name for d in bot.kb.documents()].count(NAME) == 1
    assert bot.kb.uploads.lapsed(lease_seconds=0.0) == []
